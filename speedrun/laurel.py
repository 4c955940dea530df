"""LAuReL: learned augmented residuals (study flags --laurel*, docs/laurel.md)."""

import math
from itertools import accumulate

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedrun.errors import UsageError, parse_int_flag
from speedrun.study import Flag, ModelPart, Study

# A LAuReL'd residual replaces x + f(x) by  alpha*f(x) + g(x, history). Sites are the attention and MLP residuals
# of a block, or the whole block (f = attention + MLP); x is the stream entering that residual (after the U-net
# skip and the block's own mix for the attention and block sites, after the attention residual for the MLP site).
# The PA history holds the inputs of the last k LAuReL'd residuals, the current one included (history[j] = x_{i-j}),
# so site n (in execution order) sees min(k, n + 1) of them and gets exactly that many gammas.

LAUREL_VARIANTS = ("rw", "lr", "pa", "rw+lr", "rw+pa", "rw+lr+pa")
LAUREL_RW_FORMS = ("softmax", "sigmoid", "single", "vector")
LAUREL_PA_H = ("identity", "lowrank", "lowrank-shared")
LAUREL_WHERE = ("attn", "mlp", "both", "block")
LAUREL_FACTOR_INITS = ("orthogonal", "xavier")
LAUREL_ZERO_FACTORS = ("up", "down")
LAUREL_DEFAULTS = dict(laurel_rank=32, laurel_k=3, laurel_rw_form="softmax", laurel_rw_scale=2.0,
                       laurel_where="mlp", laurel_factor_init="orthogonal", laurel_zero_factor="up")


def laurel_sites(num_layers, no_attention_layer, where, layers=None):
    """The (layer, site) pairs that get LAuReL, in execution order; the no-attention layer has no attn site."""
    chosen = range(num_layers) if layers is None else sorted(layers)
    if where == "both":
        return [(i, s) for i in chosen for s in ("attn", "mlp") if not (s == "attn" and i == no_attention_layer)]
    if where == "attn":
        return [(i, "attn") for i in chosen if i != no_attention_layer]
    return [(i, where) for i in chosen]


def laurel_parts(variant, pa_h):
    """(rw, lr, pa, pa_lowrank). In rw+lr+pa the low-rank products are PA's h (eq. 6): no separate LR term."""
    parts = set(variant.split("+"))
    pa = "pa" in parts
    return "rw" in parts, "lr" in parts and not pa, pa, pa and pa_h != "identity"


def laurel_column_orthogonal(count, rank, dim):
    """The paper's LLM init of a D x r factor (entry [i, j] = 1/sqrt(rD) iff i mod r == j: columns with disjoint
    supports, hence orthogonal), for `count` products, stored as F.linear weights of the down-projection [count, r, D]."""
    a = torch.zeros(rank, dim)
    i = torch.arange(dim)
    a[i % rank, i] = 1 / math.sqrt(rank * dim)
    return a.repeat(count, 1, 1)


def laurel_xavier(count, rank, dim):
    """Xavier (Glorot) uniform for a D x r factor, the paper's ResNet init: U(-b, b), b = sqrt(6 / (D + r))."""
    bound = math.sqrt(6 / (dim + rank))
    return torch.empty(count, rank, dim).uniform_(-bound, bound)


def laurel_factors(count, rank, dim, init, zero_factor):
    """(down [count, r, D], up [count, D, r]) of `count` low-rank products B A: one factor starts at zero so every
    product starts at exactly zero, the other gets `init`. zero_factor "up": B = 0 (LoRA's layout, the default);
    "down": A = 0 and B is the initialised one."""
    live = (laurel_column_orthogonal if init == "orthogonal" else laurel_xavier)(count, rank, dim)
    if zero_factor == "up":
        return live, torch.zeros(count, dim, rank)
    return torch.zeros(count, rank, dim), live.transpose(1, 2).contiguous()


def laurel_rw_weights(raw, form, scale):
    """(alpha, beta) per site from the raw RW scalars, each bounded in (0, scale); raw = 0 gives scale/2 each."""
    if form == "softmax":  # raw [n, 2]
        w = scale * torch.softmax(raw, dim=-1)
        return w[:, 0], w[:, 1]
    if form == "single":  # raw [n, 1]: one sigmoid sets both
        s = torch.sigmoid(raw[:, 0])
        return scale * s, scale * (1 - s)
    w = scale * torch.sigmoid(raw)  # sigmoid: raw [n, 2]; vector: raw [n, 2, D]
    return w[:, 0], w[:, 1]


class LaurelResiduals(ModelPart):
    """Parameters of every LAuReL'd residual: low-rank products stacked in two tensors (one Muon batch each);
    the RW and PA scalars live in the model's scalar vector ("laurel.rw", "laurel.gamma"). Its residuals hook
    hands the blocks one LaurelPass per forward."""
    built_last = True  # LAuReL was built after the other parts before it was one

    def __init__(self, model, cfg):
        super().__init__()
        # uses_*: no string is their name, so an export reads them as the variant's literals (docs/export.md, rule 19)
        self.uses_rw, self.uses_lr, self.uses_pa, self.pa_lowrank = laurel_parts(cfg.laurel, cfg.laurel_pa_h)
        self.k, self.rw_form, self.rw_scale = cfg.laurel_k, cfg.laurel_rw_form, cfg.laurel_rw_scale
        self.whole_block = cfg.laurel_where == "block"
        self.sites = laurel_sites(cfg.num_layers, model.pattern["no_attention_layer"], cfg.laurel_where,
                                  cfg.laurel_layers)
        self.index = {site: n for n, site in enumerate(self.sites)}
        self.layers = {layer for layer, _ in self.sites}
        # PA: site n reads the min(k, n + 1) inputs the history holds there; a gamma (or product) for an input that
        # is never there could never receive a gradient, so none is made.
        if self.uses_pa:
            self.history_lengths = [min(self.k, n + 1) for n in range(len(self.sites))]
            self.gamma_start = [0, *accumulate(self.history_lengths)]
        # One product per site (LR, or PA's h shared by the k inputs, section 2.3: site n's is product n) or per
        # history entry (eq. 6: numbered as the gammas are, site n's from gamma_start[n]).
        self.product_per_input = self.pa_lowrank and cfg.laurel_pa_h == "lowrank"
        if self.uses_lr or self.pa_lowrank:
            down, up = laurel_factors(self.gamma_start[-1] if self.product_per_input else len(self.sites),
                                      cfg.laurel_rank, cfg.model_dim, cfg.laurel_factor_init, cfg.laurel_zero_factor)
            self.down, self.up = nn.Parameter(down), nn.Parameter(up)
        for name, init in self.scalar_inits(cfg.model_dim).items():
            model.add_scalars(f"laurel.{name}", init)

    def scalar_inits(self, dim):
        n, out = len(self.sites), {}
        if self.uses_rw:
            out["rw"] = torch.zeros({"single": (n, 1), "vector": (n, 2, dim)}.get(self.rw_form, (n, 2)))
        if self.uses_pa:
            # identity h: gamma = 0 (the term is zero and gamma's gradient h(x) is not). Low-rank h: the product is
            # already zero through its zero factor; gamma = 1 lets that factor's gradient through at the first
            # step (gamma = 0 with a zero factor would leave gamma, A and B at zero gradient forever).
            fill = 1.0 if self.pa_lowrank else 0.0
            out["gamma"] = torch.full((self.gamma_start[-1],), fill)
        return out

    def rw_shape(self, dim):
        return {"single": (-1, 1), "vector": (-1, 2, dim)}.get(self.rw_form, (-1, 2))

    def weights(self, model):
        """(alpha, beta, gamma) tensors from the model's scalar vector (None where the variant has none); gamma is
        flat, site n's entries start at gamma_start[n]."""
        alpha, beta = laurel_rw_weights(model.scalar_slice("laurel.rw").view(self.rw_shape(model.cfg.model_dim)),
                                        self.rw_form, self.rw_scale) if self.uses_rw else (None, None)
        return alpha, beta, model.scalar_slice("laurel.gamma") if self.uses_pa else None

    def residuals(self, model):
        return self.new_pass(*self.weights(model)).for_layer

    def new_pass(self, alpha, beta, gamma):
        """A forward's LaurelPass with these weights and an empty PA history (None without PA)."""
        return LaurelPass(self, alpha, beta, gamma, [] if self.uses_pa else None)

    def product(self, site, j, x):
        """B A x for the product of site `site` that reads its j-th history entry (LR and shared h: the one)."""
        index = self.gamma_start[site] + j if self.product_per_input else site
        return F.linear(F.linear(x, self.down[index].type_as(x)), self.up[index].type_as(x))

    def residual(self, laurel_pass, layer, site, x, parts):
        """The LAuReL'd residual of f = the sum of `parts` (a tuple, added in order after g, so that at init the
        sum is the baseline's, bit for bit), in the forward `laurel_pass` (its weights and PA history)."""
        n = self.index.get((layer, site))
        if n is None:  # the other site of a layer LAuReL'd at one site only
            return sum_in_order(x, parts)
        g = x
        if self.uses_lr:  # eq. 3
            g = x + self.product(n, 0, x)
        if self.uses_pa:  # eq. 4: x_i + sum_j gamma_j h_j(x_{i-j}) over the inputs in the history
            # A new list each time, never mutated in place: --compile regional hands the pass to compiled blocks,
            # and a bounded deque mutated inside a trace outgrows its maxlen there.
            laurel_pass.history = [x, *laurel_pass.history[:self.k - 1]]
            extra = None
            for j, earlier in enumerate(laurel_pass.history):
                h = self.product(n, j, earlier) if self.pa_lowrank else earlier
                term = laurel_pass.gamma[self.gamma_start[n] + j] * h
                extra = term if extra is None else extra + term
            g = x + extra
        if self.uses_rw:  # eqs. 5 and 6: alpha f(x) + beta g
            alpha, beta = laurel_pass.alpha[n], laurel_pass.beta[n]
            if self.rw_form == "vector":  # per-dimension weights, in the activation dtype
                alpha, beta = alpha.type_as(x), beta.type_as(x)
            return sum_in_order(beta * g, [alpha * p for p in parts])
        return sum_in_order(g, parts)

    def site_residual(self, layer_residual, x, fx, site):
        """A block's residual at `site` of layer_residual's layer (LayerResidual; here, so that whole_block is read
        through self). With the whole-block site the attention residual stays plain and is remembered; the MLP's
        then LAuReLs x_block + (attn + mlp)."""
        laurel_pass, layer = layer_residual.laurel_pass, layer_residual.layer
        if not self.whole_block:
            return laurel_pass.residual(layer, site, x, (fx,))
        if site == "attn":
            layer_residual.attention = (x, fx)
            return x + fx
        if layer_residual.attention is None:
            return laurel_pass.residual(layer, "block", x, (fx,))
        x_block, attn = layer_residual.attention
        return laurel_pass.residual(layer, "block", x_block, (attn, fx))

    @torch.no_grad()
    def named_scalars(self, model):
        """alpha, beta (bounded values; the mean for the vector form) and gamma_j per LAuReL'd residual. Tested by the
        switches, not by the values: an export folds them with the variant (docs/export.md, rule 19)."""
        out = {}
        alpha, beta, gamma = self.weights(model)
        if self.uses_rw:
            if self.rw_form == "vector":  # per-dimension alpha and beta: their mean
                alpha, beta = alpha.mean(dim=-1), beta.mean(dim=-1)
            alpha, beta = alpha.tolist(), beta.tolist()
        if self.uses_pa:
            gamma = gamma.tolist()
        suffix = ".mean" if self.rw_form == "vector" else ""
        for n, (layer, site) in enumerate(self.sites):
            key = f"laurel.L{layer}.{site}"
            if self.uses_rw:
                out[f"{key}.alpha{suffix}"], out[f"{key}.beta{suffix}"] = alpha[n], beta[n]
            if self.uses_pa:
                for j, value in enumerate(gamma[self.gamma_start[n]:self.gamma_start[n + 1]]):
                    out[f"{key}.gamma{j}"] = value
        return out


class LaurelPass:
    """One forward pass: the bounded weights, computed once, and the PA history (a list of at most k inputs, the
    newest first)."""

    def __init__(self, module: LaurelResiduals, alpha, beta, gamma, history):
        self.m, self.alpha, self.beta, self.gamma, self.history = module, alpha, beta, gamma, history

    def for_layer(self, layer):
        """The residual function a block calls as laurel(x, f(x), "attn" / "mlp"), or None (layer not LAuReL'd)."""
        if layer not in self.m.layers:
            return None
        return LayerResidual(self, layer)

    def residual(self, layer, site, x, parts):
        return self.m.residual(self, layer, site, x, parts)


def sum_in_order(first, rest):
    for t in rest:
        first = first + t
    return first


class LayerResidual:
    """What a block calls at its residuals: laurel(x, fx, site) with site "attn" or "mlp"
    (LaurelResiduals.site_residual); with the whole-block site it holds the layer's attention input and output
    until the MLP's call, x_block being the attention's input (the MLP's own input in the layer without
    attention)."""

    def __init__(self, laurel_pass, layer):
        self.laurel_pass, self.layer, self.attention = laurel_pass, layer, None

    def __call__(self, x, fx, site):
        return self.laurel_pass.m.site_residual(self, x, fx, site)


LAUREL_FLAGS = (
    Flag("--laurel", f"LAuReL variant: {', '.join(LAUREL_VARIANTS)} (default: off)", resume=True, kind=str,
         options=dict(metavar="VARIANT")),
    Flag("--laurel-rank", "rank r of the low-rank products B A (LR, low-rank PA; 0 < r < model dim; default 32)",
         resume=True, kind=int, options=dict(metavar="R")),
    Flag("--laurel-k", "PA: previous activations used, the current input included (default 3)", resume=True,
         kind=int, options=dict(metavar="K")),
    Flag("--laurel-rw-form", f"RW bound: {', '.join(LAUREL_RW_FORMS)} (default softmax)", resume=True, kind=str,
         options=dict(metavar="FORM")),
    Flag("--laurel-rw-scale", "RW: alpha, beta lie in (0, S) and start at S/2 (default 2: the plain residual at "
                              "init)", resume=True, kind=float, options=dict(metavar="S")),
    Flag("--laurel-pa-h", "PA: h is identity, lowrank (one product per previous activation, eq. 6) or "
                          "lowrank-shared (one product per site for all k, section 2.3) (default identity; rw+lr+pa: "
                          "lowrank)", resume=True, kind=str, options=dict(metavar="H")),
    Flag("--laurel-where", "residuals LAuReL'd: attn, mlp, both, or block (f = attention + MLP) (default mlp: one "
                           "per layer, as the paper)", resume=True, kind=str, options=dict(metavar="SITE")),
    Flag("--laurel-layers", "comma-separated layer indices to LAuReL (default: every layer)", resume=True,
         kind=tuple, options=dict(metavar="LIST")),
    Flag("--laurel-factor-init", "init of the low-rank factor that does not start at zero: orthogonal (the paper's "
                                 "LLM column-orthogonal) or xavier (its ResNet init) (default orthogonal)",
         resume=True, kind=str, options=dict(metavar="INIT")),
    Flag("--laurel-zero-factor", "the factor of each low-rank product that starts at zero: up (B, the default) or "
                                 "down (A)", resume=True, kind=str, options=dict(metavar="FACTOR")),
)


LAUREL_CHOICES = dict(laurel_rw_form=LAUREL_RW_FORMS, laurel_pa_h=LAUREL_PA_H, laurel_where=LAUREL_WHERE,
                      laurel_factor_init=LAUREL_FACTOR_INITS, laurel_zero_factor=LAUREL_ZERO_FACTORS)


def laurel_flag(name):
    return "--" + name.replace("_", "-")


def resolve_laurel_args(args, pattern):
    """Validates the --laurel* flags; returns their resolved values (defaults filled in only when --laurel is
    given). The model dim is the preset's, the layer without attention the track's pattern's at --num-layers."""
    names = [*LAUREL_DEFAULTS, "laurel_pa_h", "laurel_layers"]
    if args.laurel is None:
        for n in names:
            if getattr(args, n) is not None:
                raise UsageError(f"{laurel_flag(n)} needs --laurel")
        return {}
    if args.laurel not in LAUREL_VARIANTS:
        raise UsageError(f"--laurel: unknown variant {args.laurel!r} (choose from {', '.join(LAUREL_VARIANTS)})")
    for n, allowed in LAUREL_CHOICES.items():
        if getattr(args, n) is not None and getattr(args, n) not in allowed:
            raise UsageError(f"{laurel_flag(n)}: unknown value {getattr(args, n)!r} "
                             f"(choose from {', '.join(allowed)})")
    pa_h = args.laurel_pa_h or ("lowrank" if args.laurel == "rw+lr+pa" else "identity")
    if args.laurel == "rw+lr+pa" and pa_h == "identity":
        raise UsageError("--laurel-pa-h identity: rw+lr+pa is eq. 6 (low-rank h); use --laurel rw+pa for identity h")
    rw, lr, pa, pa_lowrank = laurel_parts(args.laurel, pa_h)
    low_rank = lr or pa_lowrank
    unused = {"laurel_rank": not low_rank, "laurel_k": not pa, "laurel_pa_h": not pa, "laurel_rw_form": not rw,
              "laurel_rw_scale": not rw, "laurel_factor_init": not low_rank, "laurel_zero_factor": not low_rank}
    for n, is_unused in unused.items():
        if is_unused and getattr(args, n) is not None:
            raise UsageError(f"{laurel_flag(n)} has no effect with --laurel {args.laurel}"
                             + (f" --laurel-pa-h {pa_h}" if pa else ""))
    resolved = {n: value if getattr(args, n) is None else getattr(args, n) for n, value in LAUREL_DEFAULTS.items()}
    resolved["laurel_pa_h"] = pa_h
    resolved["laurel_rank"] = parse_int_flag(resolved["laurel_rank"], "--laurel-rank")
    resolved["laurel_k"] = parse_int_flag(resolved["laurel_k"], "--laurel-k")
    try:
        resolved["laurel_rw_scale"] = rw_scale = float(resolved["laurel_rw_scale"])
    except ValueError:
        raise UsageError(f"--laurel-rw-scale: expected a number, got {resolved['laurel_rw_scale']!r}")
    if not rw_scale > 0 or math.isinf(rw_scale):
        raise UsageError(f"--laurel-rw-scale must be a positive number, got {rw_scale}")
    rank, k, where = resolved["laurel_rank"], resolved["laurel_k"], resolved["laurel_where"]
    dim, num_layers = args.model_dim, args.num_layers
    if not 0 < rank < dim:
        raise UsageError(f"--laurel-rank must be in 1..{dim - 1} (below the model dim {dim}), got {rank}")
    no_attention = pattern["no_attention_layer"]
    if args.laurel_layers is not None:
        items = [s.strip() for s in str(args.laurel_layers).split(",")]
        layers = [parse_int_flag(s, "--laurel-layers") for s in items]
        for i in layers:
            if not 0 <= i < num_layers:
                raise UsageError(f"--laurel-layers: layer {i} is outside the model (layers 0..{num_layers - 1})")
        if len(set(layers)) != len(layers):
            raise UsageError("--laurel-layers: a layer is listed twice")
        if where == "attn" and no_attention in layers:
            raise UsageError(f"--laurel-layers: layer {no_attention} has no attention residual "
                             f"(use --laurel-where mlp, both or block)")
        resolved["laurel_layers"] = tuple(sorted(layers))
    sites = laurel_sites(num_layers, no_attention, where, resolved.get("laurel_layers"))
    if pa and not 0 < k <= len(sites):
        raise UsageError(f"--laurel-k must be in 1..{len(sites)} (the number of LAuReL'd residuals), "
                         f"got {k}")
    return resolved


def laurel_variant_name(args):
    """LAuReL's part of the default variant name, e.g. laurel-rw+lr+pa-r32-k3: the variant, its rank and k when
    it has them, then every other LAuReL setting that is not its default."""
    rw, lr, pa, pa_lowrank = laurel_parts(args.laurel, args.laurel_pa_h)
    pieces = [f"laurel-{args.laurel}"]
    if lr or pa_lowrank:
        pieces.append(f"r{args.laurel_rank}")
    if pa:
        pieces.append(f"k{args.laurel_k}")
    default_pa_h = "lowrank" if args.laurel == "rw+lr+pa" else "identity"
    if pa and args.laurel_pa_h != default_pa_h:
        pieces.append(f"h-{args.laurel_pa_h}")
    for n in ("laurel_rw_form", "laurel_rw_scale", "laurel_where", "laurel_factor_init", "laurel_zero_factor"):
        value = getattr(args, n)
        if value != LAUREL_DEFAULTS[n]:
            text = f"{value:g}" if isinstance(value, float) else f"-{value}"
            pieces.append(n.removeprefix("laurel_").replace("_", "-") + text)
    if args.laurel_layers is not None:
        pieces.append("+".join(f"L{i}" for i in args.laurel_layers))
    return "-".join(pieces)


LAUREL = Study(
    name="laurel", title="laurel", description="LAuReL residuals (docs/laurel.md); every flag needs --laurel",
    # each flag is also a model field (default: the flag's unset value, off), copied as resolved when it is set
    flags=LAUREL_FLAGS, resolve=resolve_laurel_args, variant_name=laurel_variant_name, model_part=LaurelResiduals,
)
