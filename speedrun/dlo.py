"""DLO: depth expansion of a trained checkpoint and per-token routed MLP skipping (study flags --dlo-*, docs/dlo.md)."""

from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from speedrun.checkpoint import load_model_weights
from speedrun.errors import UsageError
from speedrun.layers import norm, padded_vocab
from speedrun.study import Flag, ModelPart, Study

# The paper's policies: new layers appended to each group, built from the group's layers (block scalars reset).
GROUP_POLICIES = ("random", "copy", "identity", "merge", "slerp", "strict-identity")
# The expansion baselines of the paper's Table 4 (our readings, docs/dlo.md): exact duplicates of existing layers,
# their per-layer scalars included. duplicate: each group's last P layers again after them (SD-Stack);
# dus: SOLAR's depth up-scaling, the stack joined with itself so that one middle block of G*P layers repeats.
EXPANSION_BASELINES = ("duplicate", "dus")
DLO_POLICIES = GROUP_POLICIES + EXPANSION_BASELINES


def dlo_expansion_layout(L, G, P, policy):
    """Where the checkpoint's L layers go and which layer each new one repeats: (position of original layer i,
    {new layer's position: its source layer}, {new layer's position: its group's original layers})."""
    if policy == "dus":  # layers [0, L-m) then [m, L), m = (L - G*P) / 2: layers m..L-m-1 run twice in a row
        added, m = G * P, (L - G * P) // 2
        position = [i if i < L - m else i + added for i in range(L)]
        sources = {L - m + j: m + j for j in range(added)}
        return position, sources, {q: [s] for q, s in sources.items()}
    n = L // G
    position = [(i // n) * (n + P) + i % n for i in range(L)]
    sources = {g * (n + P) + n + k: g * n + (n - P + k if policy == "duplicate" else n - 1)
               for g in range(G) for k in range(P)}
    members = {q: list(range(s - s % n, s - s % n + n)) for q, s in sources.items()}
    return position, sources, members


def dlo_layer_pattern(cfg, layer_pattern):
    """Per-layer structure of the expanded model (layout: dlo_expansion_layout). Every layer of the expanded model
    has a source layer of the checkpoint (itself, or the layer a new one is built from) and inherits the source's
    value embedding, window length and attention presence; U-net pairs connect the expanded positions of the
    original pairs, and a track's backout layer (backout_layer, #18's) moves to its expanded position.
    layer_pattern: the track's function num_layers -> pattern (no_attention_layer None: attention everywhere)."""
    L = cfg.dlo_base_layers
    base = layer_pattern(L)
    position, new_layers, members = dlo_expansion_layout(L, cfg.dlo_groups, cfg.dlo_add, cfg.dlo_init)
    source = {position[i]: i for i in range(L)} | new_layers
    total = len(source)
    no_attention = base["no_attention_layer"]
    moved = {key: position[base[key]] for key in ("backout_layer",) if key in base}
    return dict(**moved, num_value_embeds=base["num_value_embeds"],
                ve_index=[base["ve_index"][source[j]] for j in range(total)],
                long_window_layers=[j for j in range(total) if source[j] in base["long_window_layers"]],
                no_attention_layer=None if no_attention is None else position[no_attention],
                no_attention_layers=[j for j in range(total) if source[j] == no_attention],
                unet_pairs=[(position[s], position[d]) for s, d in base["unet_pairs"]],
                dlo_position=position, dlo_new_layers=new_layers, dlo_group_members=members)


def dlo_skip_rate(step, start, target, anneal_steps):
    """Overall skip rate at a step: linear from `start` to `target` over `anneal_steps`, then constant."""
    if anneal_steps <= 0:
        return target
    return start + (target - start) * min(1.0, step / anneal_steps)


def similarity_labels(similarity, skip_rate, per_layer=False):
    """Router labels (True = active) for a [layers, tokens] similarity table: the round((1 - skip_rate) * count)
    least similar entries are active, ranked over all layers and tokens together (layer-wise skip rates emerge),
    or with per_layer each layer's tokens on their own (the same skip rate in every layer). Static shapes."""
    rows = similarity if per_layer else similarity.reshape(1, -1)
    count = rows.shape[1]
    num_active = torch.round((1 - torch.as_tensor(skip_rate, dtype=torch.float64, device=rows.device)) * count)
    order = rows.argsort(dim=1)
    ranks = torch.arange(count, device=rows.device).repeat(rows.shape[0], 1)
    return (torch.empty_like(order).scatter_(1, order, ranks) < num_active).view_as(similarity)


def skip_loss(router_logits, labels):
    """The router supervision: binary cross-entropy of sigmoid(logit) against the similarity-induced labels."""
    return F.binary_cross_entropy_with_logits(router_logits, labels.to(router_logits.dtype))


def forward_flops_per_token(cfg, pattern, window_blocks, seq_len, mlp_active=None, routers=False):
    """Forward FLOPs per token (2 per multiply-add) counted by hand: per layer with attention the q/k/v/o
    projections and the score and value products over the keys a query may see (its window, capped at the
    sequence; causal and document masking are ignored); each MLP times its active fraction (1 if not given);
    the routers' dot products when `routers`; the lm head over the padded vocabulary."""
    D, hdim = cfg.model_dim, cfg.num_heads * cfg.head_dim
    keys = dict(long=min(window_blocks * cfg.block_size, seq_len),
                short=min(max(window_blocks // 2, 1) * cfg.block_size, seq_len))
    no_attention = pattern.get("no_attention_layers", [pattern["no_attention_layer"]])
    total = 2 * D * padded_vocab(cfg.vocab_size)
    for i in range(cfg.num_layers):
        if i not in no_attention:
            k = keys["long"] if i in pattern["long_window_layers"] else keys["short"]
            total += 2 * 4 * hdim * D + 2 * 2 * hdim * k
        total += (1.0 if mlp_active is None else mlp_active[i]) * 2 * 2 * D * cfg.mlp_ratio * D
        if routers:
            total += 2 * D
    return total


def gate_range(score, scale):
    """(lowest gate, gate at a zero logit) of a score form: "rescaled" 1 + scale (sigmoid - 1/2), or the plain
    "sigmoid" (the paper's ablation without rescaling)."""
    return (1 - scale / 2, 1.0) if score == "rescaled" else (0.0, 0.5)


class DLORouters(ModelPart):
    """One linear router (D -> 1, no bias) per layer of the expanded model, gating its MLP.

    gate = 1 + scale * (sigmoid(w . norm(h) / sqrt(D)) - 0.5) ("rescaled"): exactly 1 at zero weights, in
    (1 - scale/2, 1 + scale/2) otherwise; or sigmoid(w . norm(h) / sqrt(D)) ("sigmoid", no rescaling). Weights
    start at zero, or ("uniform") as PyTorch's default Linear: the effective weight w / sqrt(D) ~ U(+-1/sqrt(D)).
    Training: h + gate * MLP(norm(h)) ("soft") or, with hard gating, only where gate >= threshold.
    Evaluation: only tokens with gate >= threshold go through the MLP (gathered, scattered back).
    """

    routes_mlp = True

    def __init__(self, model, cfg):
        super().__init__()
        L, D = cfg.num_layers, cfg.model_dim
        self.num_layers, self.dim = L, D
        self.scale, self.threshold = cfg.dlo_score_scale, cfg.dlo_threshold
        self.skip_loss_weight, self.hard_gating = cfg.dlo_skip_loss_weight, cfg.dlo_train_gating == "hard"
        self.rescaled, self.labels_per_layer = cfg.dlo_score == "rescaled", cfg.dlo_skip_allocation == "uniform"
        # One flat 1-D vector, so the baseline's optimiser split sends it to Adam (not Muon).
        self.router_w = nn.Parameter(torch.zeros(L * D))
        if cfg.dlo_router_init == "uniform":
            nn.init.uniform_(self.router_w, -1.0, 1.0)
        for name, shape, dtype in [("skip_rate", (), torch.float64), ("label_active_sum", (L,), torch.float32),
                                   ("label_count", (), torch.float32), ("val_active", (L,), torch.int64),
                                   ("val_tokens", (), torch.int64), ("val_window", (), torch.int64),
                                   ("val_seq_len", (), torch.int64)]:
            self.register_buffer(name, torch.zeros(shape, dtype=dtype), persistent=False)

    def router_logits(self, layer, z):
        w = self.router_w[layer * self.dim:(layer + 1) * self.dim]
        return (z.float() @ w) * self.dim ** -0.5

    def gate(self, logits):
        if not self.rescaled:
            return torch.sigmoid(logits)
        return 1 + self.scale * (torch.sigmoid(logits) - 0.5)

    def routed_mlp(self, layer, block, h, records):
        z = norm(h)
        logits = self.router_logits(layer, z)
        gate = self.gate(logits)
        if self.training:
            m = block.mlp(z)
            if self.hard_gating:
                gate = gate * (gate >= self.threshold)
            with torch.no_grad():  # the label feature: the residual stream before and after the (ungated) MLP
                similarity = F.cosine_similarity(h.float(), (h + m).float(), dim=-1)
            records.append((logits, similarity))
            return h + gate[..., None].type_as(m) * m
        active = (gate[0] >= self.threshold).nonzero().squeeze(1)
        routed = z[0].index_select(0, active)
        # The active token count is data: a compiled MLP (--compile regional) gets it as a size symbol with no
        # value assumed (0 and 1 included), so one graph serves every count instead of one recompile per count.
        if not torch.compiler.is_compiling():
            torch._dynamo.decorators.mark_unbacked(routed, 0)
        out = block.mlp(routed) * gate[0].index_select(0, active)[:, None].type_as(z)
        self.val_active[layer] += active.numel()
        return h[0].index_add(0, active, out)[None]

    def finish_forward(self, records, input_seq, window_blocks, aux_losses):
        if not self.training:
            self.val_tokens += input_seq.numel()
            self.val_window.copy_(torch.as_tensor(window_blocks))
            self.val_seq_len.fill_(input_seq.numel())
            return
        logits = torch.cat([r[0] for r in records])
        labels = similarity_labels(torch.cat([r[1] for r in records]), self.skip_rate, self.labels_per_layer)
        with torch.no_grad():
            self.label_active_sum += labels.float().mean(dim=1)
            self.label_count += 1
        if aux_losses is not None and self.skip_loss_weight:
            aux_losses.append(self.skip_loss_weight * skip_loss(logits, labels))

    def mlp_router(self, model):
        return RoutedPass(self)

    @staticmethod
    def model_layer_pattern(cfg, track_layer_pattern):
        return dlo_layer_pattern(cfg, track_layer_pattern)

    @staticmethod
    def base_config(cfg):
        return dlo_base_config(cfg)

    def before_step(self, model, config, step):
        dlo_before_step(model, config, step)

    def after_step(self, model, opt, config, proc):
        dlo_after_step(model, opt, config, proc)

    def load_init_state(self, model, state, config):
        dlo_expand_from_checkpoint(model, state, config, max(config.train_seq_len, config.val_seq_len))
        return True

    def label_active_fractions(self):
        return self.label_active_sum / self.label_count.clamp_min(1)

    def named_scalars(self, model):
        """Skip rate, the last step's label active fractions, and (after a validation, then reset) each layer's
        measured active fraction and the effective FLOPs relative to the dense expanded model."""
        out = {"dlo.skip_rate": float(self.skip_rate)}
        if self.label_count > 0:
            for i, a in enumerate(self.label_active_fractions().tolist()):
                out[f"dlo.L{i}.label_active"] = a
        counts = torch.cat([self.val_active, self.val_tokens.view(1)])
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(counts)
        if counts[-1] > 0:
            active = (counts[:-1].double() / counts[-1].double()).tolist()
            for i, a in enumerate(active):
                out[f"dlo.L{i}.active"] = a
            window, seq_len = int(self.val_window), int(self.val_seq_len)
            out["dlo.flops_rel"] = (
                forward_flops_per_token(model.cfg, model.pattern, window, seq_len, active, routers=True)
                / forward_flops_per_token(model.cfg, model.pattern, window, seq_len))
        self.val_active.zero_()
        self.val_tokens.zero_()
        return out


class RoutedPass:
    """One forward pass's routed MLPs: each layer's (logits, similarity) record for the labels and the skip loss."""

    def __init__(self, routers):
        self.routers, self.records = routers, []

    def __call__(self, layer, block, h):
        return self.routers.routed_mlp(layer, block, h, self.records)

    def finish(self, input_seq, window_blocks, aux_losses):
        self.routers.finish_forward(self.records, input_seq, window_blocks, aux_losses)


def slerp(a, b, t, eps=1e-8):
    """Spherical interpolation between two weight tensors seen as flat vectors (t=0: a, t=1: b); plain linear
    interpolation when either is zero or they are parallel."""
    na, nb = a.norm(), b.norm()
    if na < eps or nb < eps:
        return torch.lerp(a, b, t)
    omega = torch.arccos(((a * b).sum() / (na * nb)).clamp(-1, 1))
    if torch.sin(omega) < 1e-6:
        return torch.lerp(a, b, t)
    return (torch.sin((1 - t) * omega) * a + torch.sin(t * omega) * b) / torch.sin(omega)


class StudyTrackExpansion:
    """How DLO reads a model of the tracks built on speedrun.model (StudyGPT: #14 and the small track). A track
    with other blocks or scalars declares its own as its model class's `depth_expansion` (#18's: R18GPT)."""

    @staticmethod
    def expansion_scalars(model):
        """The per-layer scalars as expand_model reads them: the block lambdas pass the residual at (1, 0, ...),
        the value lambdas are the layer's own."""
        L = model.cfg.num_layers
        block = model.scalar_slice("block").view(L, -1)
        pass_through = torch.zeros(block.shape[1])
        pass_through[0] = 1.0
        return ("scalars",), [("shared", model.scalar_slice("unet"), None), ("residual", block, pass_through),
                              ("source", model.scalar_slice("value").view(L, 2), None)]

    @staticmethod
    def unexpanded_model(model, max_seq_len):
        """The model a part that grows this one (ModelPart.base_config) grows from, on its device and dtype."""
        (cfg,) = [c for c in (part.base_config(model.cfg) for part in model.parts) if c is not None]
        base = type(model)(cfg, max_seq_len).to(model.lm_head_w.device)
        base.cast_low_precision(model.embedding_params()[0].dtype)
        return base

    @staticmethod
    def output_projections(block):
        """(attention's output matrix or None, the MLP's): zeroed, they make the block the identity."""
        return (None if block.attn is None else block.attn.qkvo_w[3]), block.mlp.proj_w

    @staticmethod
    def weight_matrices(block):
        """Every weight matrix on its own, q, k, v and o apart (the random init)."""
        return [m for p in block.parameters() for m in (p if p.ndim == 3 else [p])]


def depth_expansion(model):
    """The model's track's expansion rules (StudyTrackExpansion or the model class's own depth_expansion)."""
    return getattr(model, "depth_expansion", StudyTrackExpansion)


def init_expanded_block(block, source, members, policy, slerp_t, expansion):
    """Initialises a new layer from its source layer and its group's original layers `members`. The track's
    expansion rules say which are a block's matrices (weight_matrices) and output projections."""
    if policy == "random":  # Xavier uniform on every matrix (each of q, k, v, o on its own)
        for matrix in expansion.weight_matrices(block):
            nn.init.xavier_uniform_(matrix)
    elif policy in ("copy", "identity", "strict-identity") + EXPANSION_BASELINES:
        block.load_state_dict(source.state_dict())
        attention_out, mlp_out = expansion.output_projections(block)
        if policy in ("identity", "strict-identity") and attention_out is not None:
            attention_out.zero_()
        if policy == "strict-identity":
            mlp_out.zero_()
    elif policy == "merge":  # uniform mean over the group's original layers that have the parameter
        for name, p in block.named_parameters():
            parts = [dict(m.named_parameters())[name].float() for m in members
                     if name in dict(m.named_parameters())]
            p.copy_(torch.stack(parts).mean(0))
    elif policy == "slerp":  # between the group's last two original layers
        first, second = dict(members[-2].named_parameters()), dict(members[-1].named_parameters())
        for name, p in block.named_parameters():
            if name not in first:  # the earlier layer has no attention: take the source's
                p.copy_(second[name])
                continue
            a, b = first[name].float(), second[name].float()
            p.copy_(torch.stack([slerp(x, y, slerp_t) for x, y in zip(a, b)]) if p.ndim == 3
                    else slerp(a, b, slerp_t))


@torch.no_grad()
def expand_model(base, model, policy, slerp_t):
    """Writes the unexpanded model `base` into the expanded `model`: shared weights copied, original layers at
    their expanded positions with their scalars, new layers by `policy` with the residual scalars that pass the
    residual unchanged (#14's block lambdas (1, 0, ...)) and, except for random, the source's own scalars (#14's
    value lambdas); the expansion baselines (exact duplicates) take all the source's scalars. Routers keep their
    initialisation. Each track says where its per-layer scalars are (depth_expansion): expansion_scalars(model) ->
    (the state keys that hold them, [(rule, tensor, pass_through)]), rule "shared" (copied whole), "residual" (a
    [layers, k] view; new layers start at pass_through) or "source" (a [layers, k] view; new layers take their
    source's)."""
    pat = model.pattern
    own = model.state_dict()
    expansion = depth_expansion(model)
    scalar_keys, parts = expansion.expansion_scalars(model)
    _, base_parts = expansion.expansion_scalars(base)
    for key, value in base.state_dict().items():
        if not key.startswith("blocks.") and key not in scalar_keys:
            own[key].copy_(value)
    for (rule, mine, pass_through), (_, theirs, _) in zip(parts, base_parts):
        if rule == "shared":
            mine.copy_(theirs)
            continue
        for i, p in enumerate(pat["dlo_position"]):
            mine[p] = theirs[i]
        for q, src in pat["dlo_new_layers"].items():
            if policy in EXPANSION_BASELINES or (rule == "source" and policy != "random"):
                mine[q] = theirs[src]
            elif rule == "residual":
                mine[q] = pass_through
    for i, p in enumerate(pat["dlo_position"]):
        model.blocks[p].load_state_dict(base.blocks[i].state_dict())
    for q, src in pat["dlo_new_layers"].items():
        init_expanded_block(model.blocks[q], base.blocks[src], [base.blocks[j] for j in pat["dlo_group_members"][q]],
                            policy, slerp_t, expansion)


def dlo_base_config(cfg):
    return replace(cfg, num_layers=cfg.dlo_base_layers, dlo_groups=0, dlo_add=0, dlo_base_layers=0)


def dlo_expand_from_checkpoint(model, state, args, max_seq_len):
    """Builds the unexpanded model (the track's unexpanded_model), loads the checkpoint into it (strict shapes),
    then expands into `model`."""
    base = depth_expansion(model).unexpanded_model(model, max_seq_len)
    load_model_weights(base, state, args.init_from)
    expand_model(base, model, args.dlo_init, args.dlo_slerp_t)


def dlo_layer_lr_multipliers(model):
    """Layer-wise rates: layer l's hidden matrices get lr * a_l / mean(a), a_l = its label active fraction
    (1 - its sparsity factor); the mean rate is the base rate."""
    active = model.study["dlo"].label_active_fractions()
    mean = active.mean()
    # Device tensors, no .tolist() or `if mean > 0`: reading them on the host would wait for the step's kernels.
    mul = torch.where(mean > 0, active / mean.clamp_min(torch.finfo(active.dtype).tiny), torch.ones_like(active))
    out = {}
    for i, block in enumerate(model.blocks):
        for p, _ in model.block_matrix_params(block):
            out[p] = mul[i]
    return out


def dlo_before_step(model, args, step):
    if not args.dlo_groups:
        return
    routers = model.study["dlo"]
    routers.skip_rate.fill_(dlo_skip_rate(step, args.dlo_anneal_start, args.dlo_sparsity, args.dlo_anneal_steps))
    routers.label_active_sum.zero_()
    routers.label_count.zero_()


def dlo_after_step(model, opt, args, proc):
    if not args.dlo_groups:
        return
    routers = model.study["dlo"]
    if proc.world_size > 1:  # the labels' layer statistics over the whole batch
        stats = torch.cat([routers.label_active_sum, routers.label_count.view(1)])
        dist.all_reduce(stats)
        routers.label_active_sum.copy_(stats[:-1])
        routers.label_count.copy_(stats[-1])
    if args.dlo_layer_lr:
        opt.muon.lr_mul.update(dlo_layer_lr_multipliers(model))


# Choices of the flags that take a word (the first one is the default).
DLO_CHOICES = dict(dlo_init=("identity",) + tuple(p for p in DLO_POLICIES if p != "identity"),
                   dlo_train_gating=("soft", "hard"), dlo_router_init=("zero", "uniform"),
                   dlo_score=("rescaled", "sigmoid"), dlo_skip_allocation=("layer-wise", "uniform"))
# dlo_anneal_steps and dlo_threshold default to values that depend on other flags (check_dlo_args).
DLO_DEFAULTS = dict(dlo_add=1, dlo_slerp_t=0.5, dlo_sparsity=0.1, dlo_anneal_start=0.0, dlo_anneal_steps=None,
                    dlo_skip_loss_weight=0.1, dlo_threshold=None, dlo_score_scale=None,
                    **{key: choices[0] for key, choices in DLO_CHOICES.items()})


DLO_FLAGS = (
    Flag("--dlo-groups", "G: cut the checkpoint's layers into G groups", resume=True, kind=int,
         options=dict(type=int)),
    Flag("--dlo-add", "P: new layers appended to each group (default 1; 0: routers on the unexpanded model)",
         resume=True, kind=int, options=dict(type=int)),
    Flag("--dlo-init", f"new layers' initialisation, one of {', '.join(DLO_POLICIES)} (default identity; duplicate "
                       f"and dus are the expansion baselines, docs/dlo.md)", resume=True, kind=str),
    Flag("--dlo-slerp-t", "SLERP position between the group's last two layers (default 0.5)", resume=True,
         kind=float, options=dict(type=float)),
    Flag("--dlo-sparsity", "target overall skip rate in [0, 1) (default 0.1)", resume=True, kind=float,
         options=dict(type=float)),
    Flag("--dlo-anneal-start", "skip rate at step 0 (default 0)", resume=True, kind=float, options=dict(type=float)),
    Flag("--dlo-anneal-steps", "steps of the linear skip-rate ramp (default half of --num-iterations)", resume=True,
         kind=int, options=dict(type=int)),
    Flag("--dlo-skip-loss-weight", "weight of the router BCE skip loss added to the task loss (default 0.1)",
         resume=True, kind=float, options=dict(type=float)),
    Flag("--dlo-layer-lr", "layer-wise Muon learning rates scaled by each layer's label active fraction",
         resume=True, kind=bool, options=dict(action="store_true")),
    Flag("--dlo-threshold", "an MLP runs for a token iff its gate >= this at evaluation (default: the gate at a zero "
                            "logit, 1.0 rescaled, 0.5 sigmoid)", resume=True, kind=float, options=dict(type=float)),
    Flag("--dlo-score", "gate form: rescaled = 1 + scale*(sigmoid(logit) - 0.5), sigmoid = sigmoid(logit) without "
                        "rescaling (default rescaled)", resume=True, kind=str),
    Flag("--dlo-score-scale", "scale of the rescaled gate, in (0, 2] (default 1)", resume=True, kind=float,
         options=dict(type=float)),
    Flag("--dlo-router-init", "router weights at the start: zero, or uniform (PyTorch's default Linear init) "
                              "(default zero)", resume=True, kind=str),
    Flag("--dlo-skip-allocation", "labels ranked over all layers together (layer-wise skip rates) or within each "
                                  "layer (uniform: every layer skips the same fraction) (default layer-wise)",
         resume=True, kind=str),
    Flag("--dlo-train-gating", "training MLP output: soft = gate * MLP for every token, hard = only where gate >= "
                               "threshold (default soft)", resume=True, kind=str),
)
DLO_DESCRIPTION = ("Dynamic Layer Operation (docs/dlo.md): expand a trained checkpoint (--init-from) in depth and "
                   "learn per token which MLPs to skip. Off unless --dlo-groups is given.")


def dlo_flag(key):
    return "--" + key.replace("_", "-")


def resolve_dlo_args(config, pattern=None):
    """Validates the DLO flags; returns their resolved values (defaults filled in, those that depend on other flags
    derived) or {} without --dlo-groups. Raises UsageError (one line) on values that cannot work."""
    given = [k for k in list(DLO_DEFAULTS) + ["dlo_layer_lr"] if getattr(config, k) not in (None, False)]
    if config.dlo_groups is None:
        if given:
            raise UsageError(f"{dlo_flag(given[0])} needs --dlo-groups")
        return {}
    resolved = {key: value if getattr(config, key) is None else getattr(config, key)
                for key, value in DLO_DEFAULTS.items()}
    for key, choices in DLO_CHOICES.items():
        value = resolved[key]
        if value not in choices:
            raise UsageError(f"{dlo_flag(key)}: unknown value {value!r} (choose from {', '.join(choices)})")
    if resolved["dlo_anneal_steps"] is None:
        resolved["dlo_anneal_steps"] = config.num_iterations // 2
    rescaled = resolved["dlo_score"] == "rescaled"
    if resolved["dlo_score_scale"] is None:
        resolved["dlo_score_scale"] = 1.0 if rescaled else None
    low, at_zero = gate_range(resolved["dlo_score"], resolved["dlo_score_scale"])
    if resolved["dlo_threshold"] is None:
        resolved["dlo_threshold"] = at_zero
    args = replace(config, **resolved)
    G, L, P = args.dlo_groups, args.num_layers, args.dlo_add
    if G < 1 or L % G:
        raise UsageError(f"--dlo-groups {G} must be a positive divisor of --num-layers {L} (the checkpoint's depth)")
    checks = [
        (P >= 0, f"--dlo-add must not be negative (got {P})"),
        (P > 0 or "dlo_init" not in given and "dlo_slerp_t" not in given,
         "--dlo-init and --dlo-slerp-t need --dlo-add of at least 1 (--dlo-add 0 adds no layer)"),
        (0 <= args.dlo_sparsity < 1, f"--dlo-sparsity must be in [0, 1) (got {args.dlo_sparsity})"),
        (0 <= args.dlo_anneal_start <= args.dlo_sparsity,
         f"--dlo-anneal-start must be in [0, --dlo-sparsity] (got {args.dlo_anneal_start})"),
        (args.dlo_anneal_steps >= 0, f"--dlo-anneal-steps must not be negative (got {args.dlo_anneal_steps})"),
        (args.dlo_skip_loss_weight >= 0, f"--dlo-skip-loss-weight must not be negative "
                                         f"(got {args.dlo_skip_loss_weight})"),
        (0 <= args.dlo_slerp_t <= 1, f"--dlo-slerp-t must be in [0, 1] (got {args.dlo_slerp_t})"),
        (args.dlo_init != "slerp" or L // G >= 2, "--dlo-init slerp needs at least 2 layers per group"),
        (args.dlo_init != "duplicate" or P <= L // G,
         f"--dlo-init duplicate repeats layers of the group: --dlo-add must be at most {L // G}"),
        (args.dlo_init != "dus" or (L - G * P) % 2 == 0 and G * P <= L,
         f"--dlo-init dus repeats a middle block of --dlo-groups x --dlo-add layers: it must be at most "
         f"--num-layers {L} and differ from it by an even number (got {G * P})"),
        (rescaled or "dlo_score_scale" not in given, "--dlo-score-scale applies to --dlo-score rescaled only"),
        (not rescaled or 0 < args.dlo_score_scale <= 2,
         f"--dlo-score-scale must be in (0, 2] (got {args.dlo_score_scale})"),
        (low < args.dlo_threshold <= at_zero,
         f"--dlo-threshold must be in ({low:g}, {at_zero:g}] (above the lowest gate, at most the gate at a zero "
         f"logit) so tokens start active and can drop out (got {args.dlo_threshold})"),
        (bool(args.init_from or args.resume), "--dlo-groups needs --init-from CHECKPOINT (DLO expands a trained "
                                              "model) or --resume"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)
    return resolved


# The model config fields (off: no group, no added layer; the gate's and the routers' command-line defaults).
DLO_MODEL_FIELDS = (("dlo_groups", int, 0), ("dlo_add", int, 0), ("dlo_base_layers", int, 0),
                    ("dlo_score_scale", float, 1.0), ("dlo_threshold", float, 1.0),
                    ("dlo_skip_loss_weight", float, DLO_DEFAULTS["dlo_skip_loss_weight"]),
                    *((key, str, choices[0]) for key, choices in DLO_CHOICES.items()))


def dlo_model_config(model_cfg, args):
    """The model config fields of the DLO flags: num_layers becomes the expanded depth, dlo_base_layers the
    checkpoint's ({} without DLO)."""
    if not args.dlo_groups:
        return {}
    fields = {name: getattr(args, name) for name, _, _ in DLO_MODEL_FIELDS if name != "dlo_base_layers"}
    return dict(fields, num_layers=model_cfg.num_layers + args.dlo_groups * args.dlo_add,
                dlo_base_layers=model_cfg.num_layers)


DLO = Study(
    name="dlo", title="dlo", description=DLO_DESCRIPTION, flags=DLO_FLAGS, resolve=resolve_dlo_args,
    # by hand: num_layers and dlo_base_layers are computed from the preset's depth, and off means 0 groups, not None
    model_config=dlo_model_config, model_fields=DLO_MODEL_FIELDS,
    # expansion copies the baseline's per-layer parts only: every other study is refused with it
    rebuilds_model=True, excludes_why="DLO expands baseline checkpoints", model_part=DLORouters,
)
