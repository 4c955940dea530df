"""DLO: depth expansion of a trained checkpoint and per-token routed MLP skipping (study flags --dlo-*, docs/dlo.md)."""

from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from speedrun.checkpoint import load_model_weights
from speedrun.errors import UsageError
from speedrun.layers import norm

DLO_POLICIES = ("random", "copy", "identity", "merge", "slerp", "strict-identity")


def dlo_layer_pattern(cfg, layer_pattern):
    """Per-layer structure of the expanded model. The checkpoint's L layers are cut into G groups of n = L/G and P
    new layers are appended to each group. Every layer of the expanded model has a source layer of the checkpoint
    (itself, or for a new layer the last original layer of its group) and inherits the source's value embedding,
    window length and attention presence; U-net pairs connect the expanded positions of the original pairs.
    layer_pattern: the track's function num_layers -> pattern."""
    L, G, P = cfg.dlo_base_layers, cfg.dlo_groups, cfg.dlo_add
    base, n = layer_pattern(L), L // G
    position = [(i // n) * (n + P) + i % n for i in range(L)]
    new_layers = {g * (n + P) + n + k: g * n + n - 1 for g in range(G) for k in range(P)}
    source = {position[i]: i for i in range(L)} | new_layers
    total = L + G * P
    return dict(num_value_embeds=base["num_value_embeds"],
                ve_index=[base["ve_index"][source[j]] for j in range(total)],
                long_window_layers=[j for j in range(total) if source[j] in base["long_window_layers"]],
                no_attention_layer=position[base["no_attention_layer"]],
                no_attention_layers=[j for j in range(total) if source[j] == base["no_attention_layer"]],
                unet_pairs=[(position[s], position[d]) for s, d in base["unet_pairs"]],
                dlo_position=position, dlo_new_layers=new_layers,
                dlo_group_members={q: list(range(s - n + 1, s + 1)) for q, s in new_layers.items()})


def dlo_skip_rate(step, start, target, anneal_steps):
    """Overall skip rate at a step: linear from `start` to `target` over `anneal_steps`, then constant."""
    if anneal_steps <= 0:
        return target
    return start + (target - start) * min(1.0, step / anneal_steps)


def similarity_labels(similarity, skip_rate):
    """Router labels (True = active) for a [layers, tokens] similarity table: ranked over all layers and tokens
    together, the round((1 - skip_rate) * count) least similar entries are active. Static shapes (compile-friendly)."""
    flat = similarity.flatten()
    n = flat.numel()
    num_active = torch.round((1 - torch.as_tensor(skip_rate, dtype=torch.float64, device=flat.device)) * n)
    rank = torch.empty(n, dtype=torch.int64, device=flat.device).scatter_(
        0, flat.argsort(), torch.arange(n, device=flat.device))
    return (rank < num_active).view_as(similarity)


def skip_loss(router_logits, labels):
    """The router supervision: binary cross-entropy of sigmoid(logit) against the similarity-induced labels."""
    return F.binary_cross_entropy_with_logits(router_logits, labels.to(router_logits.dtype))


def forward_flops_per_token(cfg, pattern, window_blocks, seq_len, mlp_active=None, routers=False):
    """Forward FLOPs per token (2 per multiply-add) counted by hand: per layer with attention the q/k/v/o
    projections and the score and value products over the keys a query may see (its window, capped at the
    sequence; causal and document masking are ignored); each MLP times its active fraction (1 if not given);
    the routers' dot products when `routers`; the lm head over the padded vocabulary."""
    D, hdim = cfg.model_dim, cfg.num_heads * cfg.head_dim
    padded_vocab = ((cfg.vocab_size + 127) // 128) * 128
    keys = dict(long=min(window_blocks * cfg.block_size, seq_len),
                short=min(max(window_blocks // 2, 1) * cfg.block_size, seq_len))
    no_attention = pattern.get("no_attention_layers", [pattern["no_attention_layer"]])
    total = 2 * D * padded_vocab
    for i in range(cfg.num_layers):
        if i not in no_attention:
            k = keys["long"] if i in pattern["long_window_layers"] else keys["short"]
            total += 2 * 4 * hdim * D + 2 * 2 * hdim * k
        total += (1.0 if mlp_active is None else mlp_active[i]) * 2 * 2 * D * cfg.mlp_ratio * D
        if routers:
            total += 2 * D
    return total


class DLORouters(nn.Module):
    """One linear router (D -> 1, no bias, zero-initialised) per layer of the expanded model, gating its MLP.

    gate = 1 + scale * (sigmoid(w . norm(h) / sqrt(D)) - 0.5): exactly 1 at zero weights, in (1 - scale/2,
    1 + scale/2) otherwise. Training: h + gate * MLP(norm(h)) ("soft") or, with hard gating, only where
    gate >= threshold. Evaluation: only tokens with gate >= threshold go through the MLP (gathered, scattered back).
    """

    def __init__(self, cfg):
        super().__init__()
        L, D = cfg.num_layers, cfg.model_dim
        self.num_layers, self.dim = L, D
        self.scale, self.threshold = cfg.dlo_score_scale, cfg.dlo_threshold
        self.skip_loss_weight, self.hard_gating = cfg.dlo_skip_loss_weight, cfg.dlo_train_gating == "hard"
        # One flat 1-D vector, so the baseline's optimiser split sends it to Adam (not Muon).
        self.router_w = nn.Parameter(torch.zeros(L * D))
        for name, shape, dtype in [("skip_rate", (), torch.float64), ("label_active_sum", (L,), torch.float32),
                                   ("label_count", (), torch.float32), ("val_active", (L,), torch.int64),
                                   ("val_tokens", (), torch.int64), ("val_window", (), torch.int64),
                                   ("val_seq_len", (), torch.int64)]:
            self.register_buffer(name, torch.zeros(shape, dtype=dtype), persistent=False)

    def router_logits(self, layer, z):
        w = self.router_w[layer * self.dim:(layer + 1) * self.dim]
        return (z.float() @ w) * self.dim ** -0.5

    def gate(self, logits):
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
        out = block.mlp(z[0].index_select(0, active)) * gate[0].index_select(0, active)[:, None].type_as(z)
        self.val_active[layer] += active.numel()
        return h[0].index_add(0, active, out)[None]

    def finish_forward(self, records, input_seq, window_blocks, aux_losses):
        if not self.training:
            self.val_tokens += input_seq.numel()
            self.val_window.copy_(torch.as_tensor(window_blocks))
            self.val_seq_len.fill_(input_seq.numel())
            return
        logits = torch.cat([r[0] for r in records])
        labels = similarity_labels(torch.cat([r[1] for r in records]), self.skip_rate)
        with torch.no_grad():
            self.label_active_sum += labels.float().mean(dim=1)
            self.label_count += 1
        if aux_losses is not None and self.skip_loss_weight:
            aux_losses.append(self.skip_loss_weight * skip_loss(logits, labels))

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


def init_expanded_block(block, members, policy, slerp_t):
    """Initialises a new layer from its group's original layers `members` (the last one is its source)."""
    source = members[-1]
    if policy == "random":  # Xavier uniform on every matrix (each of q, k, v, o on its own)
        for p in block.parameters():
            for matrix in (p if p.ndim == 3 else [p]):
                nn.init.xavier_uniform_(matrix)
    elif policy in ("copy", "identity", "strict-identity"):
        block.load_state_dict(source.state_dict())
        if policy != "copy" and block.attn is not None:
            block.attn.qkvo_w[3].zero_()
        if policy == "strict-identity":
            block.mlp.proj_w.zero_()
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
    their expanded positions with their scalars, new layers by `policy` with block scalars (1, 0, ...) (the
    residual passes unchanged) and, except for random, the source's value scalars. Routers stay at zero."""
    pat = model.pattern
    own = model.state_dict()
    for key, value in base.state_dict().items():
        if not key.startswith("blocks.") and key != "scalars":
            own[key].copy_(value)
    model.scalar_slice("unet").copy_(base.scalar_slice("unet"))
    lam = model.scalar_slice("block").view(model.cfg.num_layers, -1)
    base_lam = base.scalar_slice("block").view(base.cfg.num_layers, -1)
    vlam, base_vlam = model.scalar_slice("value").view(-1, 2), base.scalar_slice("value").view(-1, 2)
    lam.zero_()
    lam[:, 0] = 1.0  # the block's own mix passes the residual unchanged
    for i, p in enumerate(pat["dlo_position"]):
        model.blocks[p].load_state_dict(base.blocks[i].state_dict())
        lam[p], vlam[p] = base_lam[i], base_vlam[i]
    for q, src in pat["dlo_new_layers"].items():
        init_expanded_block(model.blocks[q], [base.blocks[j] for j in pat["dlo_group_members"][q]], policy, slerp_t)
        if policy != "random":
            vlam[q] = base_vlam[src]


def dlo_base_config(cfg):
    return replace(cfg, num_layers=cfg.dlo_base_layers, dlo_groups=0, dlo_add=0, dlo_base_layers=0)


def dlo_expand_from_checkpoint(model, state, args, max_seq_len):
    """Builds the unexpanded model, loads the checkpoint into it (strict shapes), then expands into `model`."""
    base = type(model)(dlo_base_config(model.cfg), max_seq_len).to(model.lm_head_w.device)
    base.cast_low_precision(model.embedding_params()[0].dtype)
    load_model_weights(base, state, args.init_from)
    expand_model(base, model, args.dlo_init, args.dlo_slerp_t)


def dlo_layer_lr_multipliers(model):
    """Layer-wise rates: layer l's hidden matrices get lr * a_l / mean(a), a_l = its label active fraction
    (1 - its sparsity factor); the mean rate is the base rate."""
    active = model.study["dlo"].label_active_fractions()
    mean = active.mean()
    mul = (active / mean if mean > 0 else torch.ones_like(active)).tolist()
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


def dlo_after_step(model, opt, args, ddp):
    if not args.dlo_groups:
        return
    routers = model.study["dlo"]
    if ddp.world_size > 1:  # the labels' layer statistics over the whole batch
        stats = torch.cat([routers.label_active_sum, routers.label_count.view(1)])
        dist.all_reduce(stats)
        routers.label_active_sum.copy_(stats[:-1])
        routers.label_count.copy_(stats[-1])
    if args.dlo_layer_lr:
        opt.muon.lr_mul.update(dlo_layer_lr_multipliers(model))


DLO_DEFAULTS = dict(dlo_add=1, dlo_init="identity", dlo_slerp_t=0.5, dlo_sparsity=0.1, dlo_anneal_start=0.0,
                    dlo_anneal_steps=None, dlo_skip_loss_weight=0.1, dlo_threshold=1.0, dlo_score_scale=1.0,
                    dlo_train_gating="soft")


def add_dlo_args(parser):
    g = parser.add_argument_group(
        "dlo", "Dynamic Layer Operation (docs/dlo.md): expand a trained checkpoint (--init-from) in depth and learn "
               "per token which MLPs to skip. Off unless --dlo-groups is given.")
    g.add_argument("--dlo-groups", type=int, default=None, help="G: cut the checkpoint's layers into G groups")
    g.add_argument("--dlo-add", type=int, default=None, help="P: new layers appended to each group (default 1)")
    g.add_argument("--dlo-init", default=None,
                   help=f"new layers' initialisation, one of {', '.join(DLO_POLICIES)} (default identity)")
    g.add_argument("--dlo-slerp-t", type=float, default=None,
                   help="SLERP position between the group's last two layers (default 0.5)")
    g.add_argument("--dlo-sparsity", type=float, default=None, help="target overall skip rate in [0, 1) (default 0.1)")
    g.add_argument("--dlo-anneal-start", type=float, default=None, help="skip rate at step 0 (default 0)")
    g.add_argument("--dlo-anneal-steps", type=int, default=None,
                   help="steps of the linear skip-rate ramp (default half of --num-iterations)")
    g.add_argument("--dlo-skip-loss-weight", type=float, default=None,
                   help="weight of the router BCE skip loss added to the task loss (default 0.1)")
    g.add_argument("--dlo-layer-lr", action="store_true",
                   help="layer-wise Muon learning rates scaled by each layer's label active fraction")
    g.add_argument("--dlo-threshold", type=float, default=None,
                   help="an MLP runs for a token iff its gate >= this at evaluation (default 1.0)")
    g.add_argument("--dlo-score-scale", type=float, default=None,
                   help="gate = 1 + scale*(sigmoid(logit) - 0.5), scale in (0, 2] (default 1)")
    g.add_argument("--dlo-train-gating", default=None,
                   help="training MLP output: soft = gate * MLP for every token, hard = only where gate >= "
                        "threshold (default soft)")


def check_dlo_args(args):
    """Fills the DLO defaults and rejects values that cannot work (UsageError, one line)."""
    given = [k for k in list(DLO_DEFAULTS) + ["dlo_layer_lr"] if getattr(args, k) not in (None, False)]
    if args.dlo_groups is None:
        if given:
            raise UsageError(f"--{given[0].replace('_', '-')} needs --dlo-groups")
        return
    for key, value in DLO_DEFAULTS.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if args.dlo_anneal_steps is None:
        args.dlo_anneal_steps = args.num_iterations // 2
    combined = [flag for flag, on in (("--backout-layers", args.backout_layers), ("--rolling-skip", args.rolling_skip),
                                      ("--laurel", args.laurel)) if on]
    if combined:  # expansion copies the baseline's per-layer parts only
        raise UsageError(f"--dlo-groups cannot be combined with {combined[0]} (DLO expands baseline checkpoints)")
    G, L = args.dlo_groups, args.num_layers
    if G < 1 or L % G:
        raise UsageError(f"--dlo-groups {G} must be a positive divisor of --num-layers {L} (the checkpoint's depth)")
    checks = [
        (args.dlo_add >= 1, f"--dlo-add must be at least 1 (got {args.dlo_add})"),
        (args.dlo_init in DLO_POLICIES, f"--dlo-init: unknown policy {args.dlo_init!r} "
                                        f"(choose from {', '.join(DLO_POLICIES)})"),
        (0 <= args.dlo_sparsity < 1, f"--dlo-sparsity must be in [0, 1) (got {args.dlo_sparsity})"),
        (0 <= args.dlo_anneal_start <= args.dlo_sparsity,
         f"--dlo-anneal-start must be in [0, --dlo-sparsity] (got {args.dlo_anneal_start})"),
        (args.dlo_anneal_steps >= 0, f"--dlo-anneal-steps must not be negative (got {args.dlo_anneal_steps})"),
        (args.dlo_skip_loss_weight >= 0, f"--dlo-skip-loss-weight must not be negative "
                                         f"(got {args.dlo_skip_loss_weight})"),
        (0 <= args.dlo_slerp_t <= 1, f"--dlo-slerp-t must be in [0, 1] (got {args.dlo_slerp_t})"),
        (args.dlo_init != "slerp" or L // G >= 2, "--dlo-init slerp needs at least 2 layers per group"),
        (0 < args.dlo_score_scale <= 2, f"--dlo-score-scale must be in (0, 2] (got {args.dlo_score_scale})"),
        (1 - args.dlo_score_scale / 2 < args.dlo_threshold <= 1,
         f"--dlo-threshold must be in (1 - scale/2, 1] so tokens start active and can drop out "
         f"(got {args.dlo_threshold})"),
        (args.dlo_train_gating in ("soft", "hard"), f"--dlo-train-gating must be soft or hard "
                                                    f"(got {args.dlo_train_gating!r})"),
        (bool(args.init_from or args.resume), "--dlo-groups needs --init-from CHECKPOINT (DLO expands a trained "
                                              "model) or --resume"),
    ]
    for ok, message in checks:
        if not ok:
            raise UsageError(message)


def dlo_model_config(cfg, args):
    if not getattr(args, "dlo_groups", None):
        return cfg
    return replace(cfg, num_layers=cfg.num_layers + args.dlo_groups * args.dlo_add, dlo_groups=args.dlo_groups,
                   dlo_add=args.dlo_add, dlo_base_layers=cfg.num_layers, dlo_score_scale=args.dlo_score_scale,
                   dlo_threshold=args.dlo_threshold, dlo_skip_loss_weight=args.dlo_skip_loss_weight,
                   dlo_train_gating=args.dlo_train_gating)
