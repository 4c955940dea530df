"""The model of the medium record #18 (2025-12-31, "BulkSmallTrackTransfer": the small-track script of that date
scaled to 16 layers of width 1024). Written from the record's description and log; same maths, own code.

What differs from the #14 model (speedrun.model / train_gpt_medium.py):
- packed documents with a token-level look-back window (speedrun.r18.attention), one sequence per rank;
- embedding tied to the lm head until the split step, then a separate `embed` (copied from the head);
- smear: token t adds a gated share of token t-1's embedding; a second embedding `embed2` re-injected per layer;
- per-layer residual decay `resid_lambdas` (init 1.05) and re-injection `x0_lambdas` (x0, embed2);
- attention: q/k norm, YaRN-adjusted half-truncated rotary (tables in bf16), partial key offset on long-window
  layers, value embeddings through a sigmoid gate, an output gate per head, the two `sa_lambdas` scaling the
  QKV and O weights; no value norm;
- 3 gated U-net skips (2->11, 4->10, 6->9), backout `x -= lambda * out[11]` (lambda init 0.5);
- logits `23*sigmoid((z+5)/7.5)`; training loss summed (not averaged), multi-token in the first part of training.

The structure is the record's 16-layer one (layer_pattern); the tiny preset shrinks widths, not depth. A study
part may change it (ModelPart.model_layer_pattern: DLO's expansion): the model then follows the part's (R18GPT.pattern).
"""

import math
from dataclasses import dataclass, replace
from functools import partial

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedrun.layers import norm, padded_vocab
from speedrun.r18.attention import varlen_attend
from speedrun.r18.studies import MATRIX_MULTIPLIERS, SCALAR_MULTIPLIERS, r18_parts
from speedrun.study import StudyHost, added_params_by_study

NUM_LAYERS = 16
VALUE_EMBED_LAYERS = (0, 1, 2, 3, 4, 11, 12, 13, 14, 15)  # ve[0..4] twice: layers 0-4 and 11-15
LONG_WINDOW_LAYERS = (0, 4, 11, 15)  # the others use the short window; long ones also get the key offset
SKIP_PAIRS = ((6, 9), (4, 10), (2, 11))  # (from, to): the last stored is the first added
BACKOUT_LAYER = 11
GATE_INPUT_DIMS = 16  # every gate reads the first 16 channels of its input
NUM_VALUE_EMBEDS = 5
SCALAR_PAD_MULTIPLE = 8  # the scalar vector is padded as for 8 ranks at every world size (same checkpoint)


@dataclass
class R18Config:
    model_dim: int = 1024
    num_heads: int = 8
    head_dim: int = 128
    vocab_size: int = 50257
    block_size: int = 128  # window sizes are counted in blocks of this many tokens
    max_seq_len: int = 4 * 64 * 1024  # rotary table length: the longest sequence a rank sees (validation)
    num_layers: int = NUM_LAYERS  # set by the model from its layer pattern (DLO's expansion: more)
    mlp_ratio: int = 4


def layer_pattern(num_layers):
    """The record's per-layer structure, as speedrun.dlo and the studies read a track's pattern."""
    if num_layers != NUM_LAYERS:
        raise ValueError(f"#18's layer pattern has {NUM_LAYERS} layers, not {num_layers}")
    ve_index = [None] * num_layers
    for j, layer in enumerate(VALUE_EMBED_LAYERS):
        ve_index[layer] = j % NUM_VALUE_EMBEDS
    return dict(num_value_embeds=NUM_VALUE_EMBEDS, ve_index=ve_index, long_window_layers=list(LONG_WINDOW_LAYERS),
                no_attention_layer=None, unet_pairs=list(SKIP_PAIRS), backout_layer=BACKOUT_LAYER)


class Yarn(nn.Module):
    """Half-truncated rotary tables (bf16, as the record stores them) and the attention scale, both adjusted by
    YaRN when the long window grows: low frequencies that turned less than `alpha` times across the old window
    are interpolated by old/new, those that turned more than `beta` times are kept."""

    def __init__(self, head_dim, max_seq_len, block_size):
        super().__init__()
        self.head_dim, self.max_seq_len, self.block_size = head_dim, max_seq_len, block_size
        self.reset()

    def reset(self):
        device = self.cos.device if hasattr(self, "cos") else None
        freq = (1 / 1024) ** torch.linspace(0, 1, steps=self.head_dim // 4, dtype=torch.float32, device=device)
        self.angular_freq = torch.cat([freq, freq.new_zeros(self.head_dim // 4)])
        theta = torch.outer(torch.arange(self.max_seq_len, dtype=torch.float32, device=device), self.angular_freq)
        self.cos = nn.Buffer(theta.cos().to(torch.bfloat16), persistent=False)
        self.sin = nn.Buffer(theta.sin().to(torch.bfloat16), persistent=False)
        self.attn_scale = 0.1

    def apply(self, old_window, new_window, alpha=1, beta=32):
        rotations = self.block_size * old_window * self.angular_freq / (2 * torch.pi)
        scaling = old_window / new_window
        keep = torch.clamp((rotations - alpha) / (beta - alpha), 0, 1)
        self.angular_freq *= scaling + keep * (1 - scaling)
        theta = torch.outer(torch.arange(self.max_seq_len, dtype=torch.float32, device=self.angular_freq.device),
                            self.angular_freq)
        self.cos.copy_(theta.cos())
        self.sin.copy_(theta.sin())
        self.attn_scale *= 0.2 * math.log(new_window / old_window) + 1


def rotate(x, cos, sin):
    """Rotary on [B, T, H, D] in x's dtype (the record does not upcast)."""
    cos, sin = cos[None, :x.size(-3), None, :], sin[None, :x.size(-3), None, :]
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos + x2 * sin, x1 * (-sin) + x2 * cos), 3)


def gate(linear, x):
    return linear(x[..., :linear.weight.size(-1)])


class ZeroLinear(nn.Linear):
    """Bias-free, zero at init (drawing no random numbers, so the record's init order gives its weights)."""

    def reset_parameters(self):
        with torch.no_grad():
            self.weight.zero_()

    def forward(self, x):
        return F.linear(x, self.weight.type_as(x))


class Gate(ZeroLinear):
    """Reads the first GATE_INPUT_DIMS channels of its input (see `gate`)."""

    def __init__(self, out_features):
        super().__init__(GATE_INPUT_DIMS, out_features, bias=False)


class Attention(nn.Module):
    def __init__(self, cfg: R18Config, has_value_embed):
        super().__init__()
        self.num_heads, self.head_dim, self.dim = cfg.num_heads, cfg.head_dim, cfg.model_dim
        if cfg.num_heads * cfg.head_dim != cfg.model_dim:
            raise ValueError("r18 needs num_heads * head_dim == model_dim")
        # q, k, v, o stacked as rows of one [4*dim, dim] matrix (o stored transposed): one NorMuon shape.
        self.qkvo_w = nn.Parameter(torch.empty(4 * self.dim, self.dim))
        bound = math.sqrt(3) * self.dim ** -0.5
        with torch.no_grad():
            self.qkvo_w[:3 * self.dim].uniform_(-bound, bound)
            self.qkvo_w[3 * self.dim:].zero_()
        self.attn_gate = Gate(cfg.num_heads)
        self.value_embed_gate = Gate(cfg.num_heads) if has_value_embed else None

    def forward(self, x, ve, sa_lambdas, cu_seqlens, max_len, window, rotary: Yarn, implementation, key_offset):
        B, T = x.shape[:2]
        qkv = F.linear(x, sa_lambdas[0] * self.qkvo_w[:3 * self.dim].type_as(x))
        q, k, v = qkv.view(B, T, 3 * self.num_heads, self.head_dim).chunk(3, dim=-2)
        q, k = norm(q), norm(k)
        q, k = rotate(q, rotary.cos, rotary.sin), rotate(k, rotary.cos, rotary.sin)
        if key_offset:
            # The non-rotating dims of each half take the previous token's key: one layer can then match
            # "the token after X" (induction).
            shifted = torch.cat([k[:, :1], k[:, :-1]], dim=1)
            d = self.head_dim
            stationary = torch.zeros(d, dtype=torch.bool, device=k.device)
            stationary[d // 4:d // 2] = True
            stationary[3 * d // 4:] = True
            k = torch.where(stationary, shifted, k)
        if ve is not None:
            v = v + 2 * torch.sigmoid(gate(self.value_embed_gate, x)).view(B, T, self.num_heads, 1) * ve.view_as(v)
        y = varlen_attend(implementation, q[0], k[0], v[0], cu_seqlens, max_len, window, rotary.attn_scale)
        y = y.view(B, T, self.num_heads, self.head_dim)
        y = y * torch.sigmoid(gate(self.attn_gate, x)).view(B, T, self.num_heads, 1)
        y = y.contiguous().view(B, T, self.dim)
        return F.linear(y, sa_lambdas[1] * self.qkvo_w[3 * self.dim:].type_as(y))


class TransposedMLP(nn.Module):
    """relu^2 MLP; both weights stored [4*dim, dim] (the projection transposed), so NorMuon's shape rule gives
    both the same learning-rate factor."""

    def __init__(self, dim):
        super().__init__()
        self.c_fc = nn.Parameter(torch.empty(4 * dim, dim))
        self.c_proj = nn.Parameter(torch.empty(4 * dim, dim))
        bound = math.sqrt(3) * 0.5 * dim ** -0.5
        with torch.no_grad():
            self.c_fc.uniform_(-bound, bound)
            self.c_proj.zero_()

    def forward(self, x):
        x = F.linear(x, self.c_fc.type_as(x))
        return F.linear(F.relu(x).square(), self.c_proj.T.type_as(x))


class Block(nn.Module):
    def __init__(self, cfg, has_value_embed):
        super().__init__()
        self.attn = Attention(cfg, has_value_embed)
        self.mlp = TransposedMLP(cfg.model_dim)

    def forward(self, x, *attn_args, augment=None, routed_mlp=None):
        """augment: None (plain residuals) or a function (x, f(x), site) -> the residual at site "attn" or "mlp"
        (ModelPart.residuals). routed_mlp: h -> the MLP residual a part's router computes (ModelPart.mlp_router),
        or None."""
        if augment is None:
            x = x + self.attn(norm(x), *attn_args)
            return x + self.mlp(norm(x)) if routed_mlp is None else routed_mlp(x)
        x = augment(x, self.attn(norm(x), *attn_args), "attn")
        return augment(x, self.mlp(norm(x)), "mlp")


def scalar_layout(num_layers):
    """Offsets of the named parts of `scalars` (one vector, Adam's scalar group)."""
    L = num_layers
    return dict(resid=slice(0, L), sa=slice(L, 3 * L), smear=3 * L, backout=3 * L + 1,
                skip=slice(3 * L + 2, 3 * L + 5), used=3 * L + 5)


def logit_map(logits):
    return 23 * torch.sigmoid((logits + 5) / 7.5)


class R18DepthExpansion:
    """How a depth-growing study part (DLO, speedrun.dlo.depth_expansion) reads #18's model: its per-layer scalars,
    the record's model it grows from, and each block's output projections and weight matrices."""

    @staticmethod
    def expansion_scalars(model):
        """The residual decay passes the residual at 1 and the re-injection at 0, the sa_lambdas are the layer's
        own; the smear, backout and skip weights are shared (the padding keeps its init)."""
        L, layout = model.cfg.num_layers, scalar_layout(model.cfg.num_layers)
        return ("scalars", "x0_lambdas"), [
            ("residual", model.scalars[layout["resid"]].view(L, 1), torch.ones(1)),
            ("residual", model.x0_lambdas.view(L, 2), torch.zeros(2)),
            ("source", model.scalars[layout["sa"]].view(L, 2), None),
            ("shared", model.scalars[layout["sa"].stop:layout["used"]], None)]

    @staticmethod
    def unexpanded_model(model, max_seq_len=None):
        """The record's model, on the model's device and dtype (max_seq_len: the config's)."""
        device, dtype = model.lm_head.weight.device, model.embed.weight.dtype
        return type(model)(model.cfg).to(device).cast_low_precision(dtype)

    @staticmethod
    def output_projections(block):
        """(attention's output matrix, the MLP's): zeroed, they make the block the identity."""
        return block.attn.qkvo_w[3 * block.attn.dim:], block.mlp.c_proj

    @staticmethod
    def weight_matrices(block):
        """Every weight matrix on its own, q, k, v and o apart."""
        qkvo_w, dim = block.attn.qkvo_w, block.attn.dim
        return list(qkvo_w.view(4, dim, dim)) + [p for p in block.parameters() if p is not qkvo_w]


class R18GPT(StudyHost, nn.Module):
    """Parameters are created in the record's order with the same initialisers, so one seed gives the record's
    initial weights. Each parameter carries `label` (its optimiser group), and where not 1, `lr_mul`/`wd_mul`.
    `studies`: a resolved run config whose studies (those of `registry`, by default the bundled ones) add their
    parts (speedrun.r18.studies states the rule) after the record's parameters (so the record's initial weights stay those of the seed); the model calls their hooks
    (ModelPart, speedrun/study.py) as the #14 model does, its x0 being the embedding the residual starts from. The
    layers follow `pattern`: the record's, or a part's (ModelPart.model_layer_pattern, e.g. DLO's expansion)."""

    depth_expansion = R18DepthExpansion
    scalar_vector = "study_scalars"  # the record's own scalars keep their vector, `scalars`

    def __init__(self, cfg: R18Config, studies=None, registry=None):
        super().__init__()
        # The config the parts are built from, and the parts this model builds ((study name, part class)).
        self.study_cfg, parts = r18_parts(studies, registry)
        # What a study part reads of the layer pattern, and the layers' value embeddings, windows, skips, backout.
        own = [pattern for pattern in (part.model_layer_pattern(self.study_cfg, layer_pattern)
                                       for _, part in parts) if pattern is not None]
        self.pattern = own[0] if own else layer_pattern(NUM_LAYERS)
        self.cfg = cfg = replace(cfg, num_layers=len(self.pattern["ve_index"]))
        L, dim, vocab = cfg.num_layers, cfg.model_dim, padded_vocab(cfg.vocab_size)
        self.smear_gate = Gate(1)
        self.skip_gates = nn.ModuleList([Gate(1) for _ in self.pattern["unet_pairs"]])
        self.value_embeds = nn.ModuleList([nn.Embedding(vocab, dim) for _ in range(self.pattern["num_value_embeds"])])
        for embed in self.value_embeds:
            nn.init.zeros_(embed.weight)
        self.blocks = nn.ModuleList([Block(cfg, k is not None) for k in self.pattern["ve_index"]])
        self.yarn = Yarn(cfg.head_dim, cfg.max_seq_len, cfg.block_size)
        self.lm_head = ZeroLinear(dim, vocab, bias=False)
        nn.init.normal_(self.lm_head.weight, mean=0, std=0.005)
        self.embed = nn.Embedding(vocab, dim)  # used from the split step on (copied from the head then)
        self.embed2 = nn.Embedding(vocab, dim)
        self.x0_lambdas = nn.Parameter(torch.zeros(2 * L))
        layout = scalar_layout(L)
        pad = -layout["used"] % SCALAR_PAD_MULTIPLE
        self.scalars = nn.Parameter(torch.cat([
            1.05 * torch.ones(L),  # residual decay: layer i's output weighs 1.05^(L-i) at the end
            torch.tensor([0.5, 1.0]).repeat(L),  # sa_lambdas (QKV, O)
            torch.zeros(1),  # smear
            0.5 * torch.ones(1),  # backout
            -1.5 * torch.ones(len(self.pattern["unet_pairs"])),  # skip weights, sigmoid(-1.5) ~ 0.18
            torch.ones(pad)]))
        self.split_embed = False
        self._label_parameters()
        if parts:  # with none, no study container (StudyHost.parts is empty)
            self.begin_scalars()
            self.build_parts(parts, self.study_cfg)
            for part in self.parts:  # what a study adds trains by its shape (speedrun.r18.studies)
                for p in part.parameters():
                    p.label, p.lr_mul, p.wd_mul = MATRIX_MULTIPLIERS if p.ndim >= 2 else SCALAR_MULTIPLIERS
            if self._scalar_inits:
                self.study_scalars = nn.Parameter(torch.cat(self._scalar_inits))
                self.study_scalars.label, self.study_scalars.lr_mul, self.study_scalars.wd_mul = SCALAR_MULTIPLIERS
            del self._scalar_inits

    def block_matrix_params(self, block):
        """A block's hidden matrices with their weight-decay multipliers (DLO's layer-wise rates scale them)."""
        return [(p, p.wd_mul) for p in (block.attn.qkvo_w, block.mlp.c_fc, block.mlp.c_proj)]

    def added_params(self):
        """Parameters each study adds, named as on the #14 model (speedrun.study.added_params_by_study); a part that
        grows the model (ModelPart.base_config) counts everything beyond the record's model, its new layers
        included."""
        if not self.parts:
            return {}
        counts = added_params_by_study(self.study, self.scalar_layout)
        for name, part in self.study.items():
            if part.base_config(self.study_cfg) is not None:
                with torch.device("meta"):
                    record = sum(p.numel() for p in R18GPT(self.cfg).parameters())
                counts[name] = sum(p.numel() for p in self.parameters()) - record
        return counts

    def named_scalars(self):
        """The record's smear, skip and (unless a part replaced the head input it belongs to) backout scalars, then
        every part's."""
        layout = scalar_layout(len(self.blocks))
        s = self.scalars.detach().float().cpu()
        out = {} if self.replaces_base_head_input() else dict(backout=float(s[layout["backout"]].reshape(-1)[0]))
        out.update(smear=float(s[layout["smear"]].reshape(-1)[0]),
                   skip=[float(v) for v in s[layout["skip"]].reshape(-1)])
        out.update(self.parts_named_scalars())
        return out

    def _label_parameters(self):
        def mark(p, label, lr_mul=1.0, wd_mul=1.0):
            p.label, p.lr_mul, p.wd_mul = label, lr_mul, wd_mul

        mark(self.smear_gate.weight, "smear_gate", lr_mul=0.01, wd_mul=0.0)
        for g in self.skip_gates:
            mark(g.weight, "skip_gate", lr_mul=0.01, wd_mul=0.0)
        for e in self.value_embeds:
            mark(e.weight, "value_embed", lr_mul=75.0, wd_mul=5.0)
        for block in self.blocks:
            mark(block.attn.qkvo_w, "attn")
            mark(block.attn.attn_gate.weight, "attn_gate", lr_mul=0.1)
            if block.attn.value_embed_gate is not None:
                mark(block.attn.value_embed_gate.weight, "value_embed_gate", lr_mul=0.1)
            mark(block.mlp.c_fc, "mlp")
            mark(block.mlp.c_proj, "mlp", lr_mul=2.0)
        mark(self.lm_head.weight, "lm_head", wd_mul=150.0)
        mark(self.embed.weight, "embed", wd_mul=150.0)
        mark(self.embed2.weight, "embed2", lr_mul=75.0, wd_mul=5.0)
        mark(self.x0_lambdas, "x0_lambdas", lr_mul=5.0, wd_mul=0.0)
        mark(self.scalars, "scalars", lr_mul=5.0, wd_mul=0.0)

    def cast_low_precision(self, dtype):
        """Embeddings, gates and the head in `dtype` (bf16 in the record); attention/MLP matrices and the scalar
        vectors stay fp32."""
        for m in self.modules():
            if isinstance(m, (nn.Embedding, nn.Linear)):
                m.weight.data = m.weight.data.to(dtype)
        return self

    def window_tokens(self, ws_short, ws_long):
        short, long = ws_short * self.cfg.block_size, ws_long * self.cfg.block_size
        return [long if i in self.pattern["long_window_layers"] else short for i in range(self.cfg.num_layers)]

    def forward(self, input_seq, target_seq, cu_seqlens, mtp_weights, ws_short, ws_long, max_len,
                attention="sdpa"):
        """Summed training loss (multi-token when mtp_weights has more than one weight), or the mean validation
        loss in eval mode. input_seq/target_seq: [T]; cu_seqlens: the documents' boundaries."""
        pattern = self.pattern
        layout = scalar_layout(self.cfg.num_layers)
        resid_lambdas, sa_lambdas = self.scalars[layout["resid"]], self.scalars[layout["sa"]].view(-1, 2)
        smear_lambda, backout_lambda = self.scalars[layout["smear"]], self.scalars[layout["backout"]]
        skip_lambdas, x0_lambdas = self.scalars[layout["skip"]], self.x0_lambdas.view(-1, 2)
        windows = self.window_tokens(ws_short, ws_long)

        x = self.embed(input_seq) if self.split_embed else F.embedding(input_seq, self.lm_head.weight)
        ve = [e(input_seq) for e in self.value_embeds]
        ve_at = {layer: ve[k] for layer, k in enumerate(pattern["ve_index"]) if k is not None}
        smear = smear_lambda * torch.sigmoid(gate(self.smear_gate, x[1:]))
        x = torch.cat([x[:1], x[1:] + smear * x[:-1]])
        x = x0 = norm(x[None])
        x02 = norm(self.embed2(input_seq)[None])

        skip_into = {dst: (k, src) for k, (src, dst) in enumerate(pattern["unet_pairs"])}
        residuals, router = self.parts_residuals(), self.parts_mlp_router()
        # The study parts' hooks may read any layer's output; without parts only the skips' sources and the backout
        # layer are kept, so an eager validation holds no more activations than the record's (None in the others).
        kept = (range(len(self.blocks)) if self.parts
                else {src for _, src in skip_into.values()} | {pattern["backout_layer"]})
        outputs = []
        for i, block in enumerate(self.blocks):
            x = self.parts_block_input(i, x, outputs, x0)
            if i in skip_into:
                k, src = skip_into[i]
                weight = torch.sigmoid(skip_lambdas[k]) * 2 * torch.sigmoid(gate(self.skip_gates[k], x0))
                x = x + weight * outputs[src]
            if i == 0:
                x = (resid_lambdas[0] + x0_lambdas[0, 0]) * x + x0_lambdas[0, 1] * x02
            else:
                x = resid_lambdas[i] * x + x0_lambdas[i, 0] * x0 + x0_lambdas[i, 1] * x02
            x = block(x, ve_at.get(i), sa_lambdas[i], cu_seqlens, max_len, windows[i], self.yarn, attention,
                      i in pattern["long_window_layers"], augment=None if residuals is None else residuals(i),
                      routed_mlp=None if router is None else partial(router, i, block))
            x = self.parts_block_output(i, x, outputs)
            outputs.append(x if i in kept else None)
        head_in = (norm(x) if self.replaces_base_head_input()
                   else norm(x - backout_lambda * outputs[pattern["backout_layer"]]))
        loss = self.head_loss(self.parts_head_input(head_in, outputs, x0, input_seq), target_seq, mtp_weights)
        aux_losses = []
        if router is not None:
            router.finish(input_seq, ws_long, aux_losses)  # none in eval mode
        # The training loss is summed over tokens, an auxiliary loss a mean: per token it weighs as on #14.
        return loss + input_seq.numel() * sum(aux_losses) if aux_losses else loss

    def head_loss(self, x, target_seq, mtp_weights):
        if not self.training:  # mean over 4 chunks (memory), logits in fp32
            loss = 0
            for xc, tc in zip(x.flatten(end_dim=1).chunk(4), target_seq.chunk(4)):
                logits = logit_map(F.linear(xc, self.lm_head.weight.type_as(xc)).float())
                loss = loss + F.cross_entropy(logits, tc, reduction="mean") / 4
            return loss
        logits = logit_map(F.linear(x, self.lm_head.weight.type_as(x))).view(-1, self.lm_head.weight.size(0))
        n_predict = mtp_weights.size(0) if mtp_weights is not None else 1
        if n_predict == 1:
            return F.cross_entropy(logits, target_seq, reduction="sum")
        # Token t is scored on targets t..t+n-1 (weighted); scores past the sequence's end are dropped.
        targets = F.pad(target_seq, (0, n_predict - 1)).unfold(0, n_predict, 1)
        cross_entropy = torch.logsumexp(logits, dim=-1, keepdim=True) - logits.gather(1, targets)
        beyond_end = torch.zeros_like(cross_entropy, dtype=torch.bool)
        for k in range(1, n_predict):
            beyond_end[-k:, k] = True
        return (cross_entropy.masked_fill(beyond_end, 0) * mtp_weights).sum()
