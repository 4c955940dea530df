"""LAuReL: learned augmented residuals (study flags --laurel*, docs/laurel.md)."""

import math
from collections import deque

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedrun.errors import UsageError, parse_int_flag

# A LAuReL'd residual replaces x + f(x) by  alpha*f(x) + g(x, history). Sites are the attention and MLP residuals
# of a block; x is the stream entering that residual (after the U-net skip and the block's own mix for the
# attention site, after the attention residual for the MLP site). The PA history holds the inputs of the last k
# LAuReL'd residuals, the current one included (history[j] = x_{i-j}).

LAUREL_VARIANTS = ("rw", "lr", "pa", "rw+lr", "rw+pa", "rw+lr+pa")
LAUREL_RW_FORMS = ("softmax", "sigmoid", "single", "vector")
LAUREL_PA_H = ("identity", "lowrank")
LAUREL_WHERE = ("attn", "mlp", "both")
LAUREL_DEFAULTS = dict(laurel_rank=32, laurel_k=3, laurel_rw_form="softmax", laurel_rw_scale=2.0,
                       laurel_where="mlp")


def laurel_sites(num_layers, no_attention_layer, where, layers=None):
    """The (layer, site) pairs that get LAuReL, in execution order; the no-attention layer has no attn site."""
    names = ("attn", "mlp") if where == "both" else (where,)
    chosen = range(num_layers) if layers is None else sorted(layers)
    return [(i, s) for i in chosen for s in names if not (s == "attn" and i == no_attention_layer)]


def laurel_parts(variant, pa_h):
    """(rw, lr, pa, pa_lowrank). In rw+lr+pa the low-rank products are PA's h (eq. 6): no separate LR term."""
    parts = set(variant.split("+"))
    pa = "pa" in parts
    return "rw" in parts, "lr" in parts and not pa, pa, pa and pa_h == "lowrank"


def laurel_down_init(count, rank, dim):
    """The paper's column-orthogonal A (D x r, A[i, j] = 1/sqrt(rD) iff i mod r == j) for `count` products, stored
    as F.linear weights [count, r, D]: A is the down-projection D -> r, read first."""
    a = torch.zeros(rank, dim)
    i = torch.arange(dim)
    a[i % rank, i] = 1 / math.sqrt(rank * dim)
    return a.repeat(count, 1, 1)


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


class LaurelResiduals(nn.Module):
    """Parameters of every LAuReL'd residual: low-rank products stacked in two tensors (one Muon batch each);
    the RW and PA scalars live in the model's scalar vector ("laurel.rw", "laurel.gamma")."""

    def __init__(self, cfg, no_attention_layer):
        super().__init__()
        self.rw, self.lr, self.pa, self.pa_lowrank = laurel_parts(cfg.laurel, cfg.laurel_pa_h)
        self.k, self.rw_form, self.rw_scale = cfg.laurel_k, cfg.laurel_rw_form, cfg.laurel_rw_scale
        self.sites = laurel_sites(cfg.num_layers, no_attention_layer, cfg.laurel_where, cfg.laurel_layers)
        self.index = {site: n for n, site in enumerate(self.sites)}
        self.layers = {layer for layer, _ in self.sites}
        self.products_per_site = 1 if self.lr else (self.k if self.pa_lowrank else 0)
        if self.products_per_site:
            count = len(self.sites) * self.products_per_site
            self.down = nn.Parameter(laurel_down_init(count, cfg.laurel_rank, cfg.model_dim))
            self.up = nn.Parameter(torch.zeros(count, cfg.model_dim, cfg.laurel_rank))  # B = 0: starts as x

    def scalar_inits(self, dim):
        n, out = len(self.sites), {}
        if self.rw:
            out["rw"] = torch.zeros({"single": (n, 1), "vector": (n, 2, dim)}.get(self.rw_form, (n, 2)))
        if self.pa:
            out["gamma"] = torch.zeros(n, self.k)
        return out

    def rw_shape(self, dim):
        return {"single": (-1, 1), "vector": (-1, 2, dim)}.get(self.rw_form, (-1, 2))

    def weights(self, model):
        """(alpha, beta, gamma) tensors from the model's scalar vector (None where the variant has none)."""
        alpha = beta = gamma = None
        if self.rw:
            raw = model.scalar_slice("laurel.rw").view(self.rw_shape(model.cfg.model_dim))
            alpha, beta = laurel_rw_weights(raw, self.rw_form, self.rw_scale)
        if self.pa:
            gamma = model.scalar_slice("laurel.gamma").view(-1, self.k)
        return alpha, beta, gamma

    def begin(self, model):
        return LaurelPass(self, *self.weights(model))

    def product(self, index, x):
        """B A x for the index-th low-rank product."""
        return F.linear(F.linear(x, self.down[index].type_as(x)), self.up[index].type_as(x))


class LaurelPass:
    """One forward pass: the bounded weights, computed once, and the PA history (a deque of at most k inputs)."""

    def __init__(self, module: LaurelResiduals, alpha, beta, gamma):
        self.m, self.alpha, self.beta, self.gamma = module, alpha, beta, gamma
        self.history = deque(maxlen=module.k) if module.pa else None

    def for_layer(self, layer):
        if layer not in self.m.layers:
            return None
        return lambda x, fx, site: self.residual(layer, site, x, fx)

    def residual(self, layer, site, x, fx):
        m = self.m
        n = m.index.get((layer, site))
        if n is None:  # the other site of a layer LAuReL'd at one site only
            return x + fx
        g = x
        if m.lr:  # eq. 3
            g = x + m.product(n, x)
        if m.pa:  # eq. 4: x_i + sum_j gamma_j h_j(x_{i-j}) over the inputs in the history
            self.history.appendleft(x)
            extra = None
            for j, earlier in enumerate(self.history):
                h = m.product(n * m.k + j, earlier) if m.pa_lowrank else earlier
                term = self.gamma[n, j] * h
                extra = term if extra is None else extra + term
            g = x + extra
        if m.rw:  # eqs. 5 and 6: alpha f(x) + beta g
            alpha, beta = self.alpha[n], self.beta[n]
            if alpha.ndim:  # vector form: per-dimension weights in the activation dtype
                alpha, beta = alpha.type_as(fx), beta.type_as(x)
            return alpha * fx + beta * g
        return g + fx


def attach_laurel(model, cfg):
    if cfg.laurel is None:
        return
    module = LaurelResiduals(cfg, model.pattern["no_attention_layer"])
    model.study["laurel"] = module
    for name, init in module.scalar_inits(cfg.model_dim).items():
        model.add_scalars(f"laurel.{name}", init)


@torch.no_grad()
def laurel_named_scalars(model):
    """alpha, beta (bounded values; the mean for the vector form) and gamma_j per LAuReL'd residual."""
    if "laurel" not in model.study:
        return {}
    m, out = model.study["laurel"], {}
    alpha, beta, gamma = m.weights(model)
    if alpha is not None and alpha.ndim > 1:
        alpha, beta = alpha.mean(dim=-1), beta.mean(dim=-1)
    suffix = ".mean" if m.rw_form == "vector" else ""
    alpha, beta = (None, None) if alpha is None else (alpha.tolist(), beta.tolist())
    gamma = None if gamma is None else gamma.tolist()
    for n, (layer, site) in enumerate(m.sites):
        key = f"laurel.L{layer}.{site}"
        if alpha is not None:
            out[f"{key}.alpha{suffix}"], out[f"{key}.beta{suffix}"] = alpha[n], beta[n]
        if gamma is not None:
            for j, value in enumerate(gamma[n]):
                out[f"{key}.gamma{j}"] = value
    return out


def add_laurel_args(parser):
    g = parser.add_argument_group("laurel", "LAuReL residuals (docs/laurel.md); every flag needs --laurel")
    g.add_argument("--laurel", default=None, metavar="VARIANT",
                   help=f"LAuReL variant: {', '.join(LAUREL_VARIANTS)} (default: off)")
    g.add_argument("--laurel-rank", default=None, metavar="R",
                   help="rank r of the low-rank products B A (LR, low-rank PA; 0 < r < model dim; default 32)")
    g.add_argument("--laurel-k", default=None, metavar="K",
                   help="PA: previous activations used, the current input included (default 3)")
    g.add_argument("--laurel-rw-form", default=None, metavar="FORM",
                   help=f"RW bound: {', '.join(LAUREL_RW_FORMS)} (default softmax)")
    g.add_argument("--laurel-rw-scale", default=None, metavar="S",
                   help="RW: alpha, beta lie in (0, S) and start at S/2 (default 2: the plain residual at init)")
    g.add_argument("--laurel-pa-h", default=None, metavar="H",
                   help="PA: h is identity or lowrank (default identity; rw+lr+pa is eq. 6: lowrank)")
    g.add_argument("--laurel-where", default=None, metavar="SITE",
                   help="residuals LAuReL'd: attn, mlp or both (default mlp: one per layer, as the paper)")
    g.add_argument("--laurel-layers", default=None, metavar="LIST",
                   help="comma-separated layer indices to LAuReL (default: every layer)")


def check_laurel_args(args, model_dim, no_attention_layer):
    """Validates the --laurel* flags and fills their defaults (only when --laurel is given); model_dim and the
    layer without attention are the track's at args.num_layers."""
    names = ["laurel_rank", "laurel_k", "laurel_rw_form", "laurel_rw_scale", "laurel_pa_h", "laurel_where",
             "laurel_layers"]
    flag = {n: "--" + n.replace("_", "-") for n in names}
    if args.laurel is None:
        for n in names:
            if getattr(args, n) is not None:
                raise UsageError(f"{flag[n]} needs --laurel")
        return
    if args.laurel not in LAUREL_VARIANTS:
        raise UsageError(f"--laurel: unknown variant {args.laurel!r} (choose from {', '.join(LAUREL_VARIANTS)})")
    for n, allowed in [("laurel_rw_form", LAUREL_RW_FORMS), ("laurel_pa_h", LAUREL_PA_H),
                       ("laurel_where", LAUREL_WHERE)]:
        if getattr(args, n) is not None and getattr(args, n) not in allowed:
            raise UsageError(f"{flag[n]}: unknown value {getattr(args, n)!r} (choose from {', '.join(allowed)})")
    pa_h = args.laurel_pa_h or ("lowrank" if args.laurel == "rw+lr+pa" else "identity")
    if args.laurel == "rw+lr+pa" and pa_h != "lowrank":
        raise UsageError("--laurel-pa-h identity: rw+lr+pa is eq. 6 (low-rank h); use --laurel rw+pa for identity h")
    rw, lr, pa, pa_lowrank = laurel_parts(args.laurel, pa_h)
    unused = {"laurel_rank": not (lr or pa_lowrank), "laurel_k": not pa, "laurel_pa_h": not pa,
              "laurel_rw_form": not rw, "laurel_rw_scale": not rw}
    for n, is_unused in unused.items():
        if is_unused and getattr(args, n) is not None:
            raise UsageError(f"{flag[n]} has no effect with --laurel {args.laurel}")
    for n, value in LAUREL_DEFAULTS.items():
        if getattr(args, n) is None:
            setattr(args, n, value)
    args.laurel_pa_h = pa_h
    args.laurel_rank = parse_int_flag(args.laurel_rank, "--laurel-rank")
    args.laurel_k = parse_int_flag(args.laurel_k, "--laurel-k")
    try:
        args.laurel_rw_scale = float(args.laurel_rw_scale)
    except ValueError:
        raise UsageError(f"--laurel-rw-scale: expected a number, got {args.laurel_rw_scale!r}")
    if not args.laurel_rw_scale > 0 or math.isinf(args.laurel_rw_scale):
        raise UsageError(f"--laurel-rw-scale must be a positive number, got {args.laurel_rw_scale}")
    dim, num_layers = model_dim, args.num_layers
    if not 0 < args.laurel_rank < dim:
        raise UsageError(f"--laurel-rank must be in 1..{dim - 1} (below the model dim {dim}), got {args.laurel_rank}")
    no_attention = no_attention_layer
    if args.laurel_layers is not None:
        items = [s.strip() for s in str(args.laurel_layers).split(",")]
        layers = [parse_int_flag(s, "--laurel-layers") for s in items]
        for i in layers:
            if not 0 <= i < num_layers:
                raise UsageError(f"--laurel-layers: layer {i} is outside the model (layers 0..{num_layers - 1})")
        if len(set(layers)) != len(layers):
            raise UsageError("--laurel-layers: a layer is listed twice")
        if args.laurel_where == "attn" and no_attention in layers:
            raise UsageError(f"--laurel-layers: layer {no_attention} has no attention residual "
                             f"(use --laurel-where mlp or both)")
        args.laurel_layers = sorted(layers)
    sites = laurel_sites(num_layers, no_attention, args.laurel_where, args.laurel_layers)
    if pa and not 0 < args.laurel_k <= len(sites):
        raise UsageError(f"--laurel-k must be in 1..{len(sites)} (the number of LAuReL'd residuals), "
                         f"got {args.laurel_k}")


def laurel_config(args):
    """ModelConfig fields of the LAuReL flags ({} when off: the dataclass defaults mean off)."""
    if args.laurel is None:
        return {}
    return dict(laurel=args.laurel, laurel_rank=args.laurel_rank, laurel_k=args.laurel_k,
                laurel_rw_form=args.laurel_rw_form, laurel_rw_scale=args.laurel_rw_scale,
                laurel_pa_h=args.laurel_pa_h, laurel_where=args.laurel_where,
                laurel_layers=None if args.laurel_layers is None else tuple(args.laurel_layers))
