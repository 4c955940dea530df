"""The backout skip (docs/backout.md): earlier layers' outputs mixed into the final latents before the head.

Its tensors and hooks are the ModelPart `Backout` (model.study["backout"]), its learned lambdas in the model's scalar
vector."""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from speedrun.errors import UsageError
from speedrun.layers import MLP, norm, uniform_init_
from speedrun.study import Flag, ModelPart, Study

SIMILARITY_TOKENS = 8192  # tokens of each eval sequence the backout similarity is measured on
BACKOUT_ACTIVATIONS = {"relu": F.relu, "tanh": torch.tanh}


def backout_mlp_hidden(cfg):
    return max(1, round(cfg.backout_mlp_ratio * cfg.model_dim))


def source_label(source):
    """A source's name in the logged scalars: L<index> for a layer, else its name (embed, new-embed)."""
    return source if isinstance(source, str) else f"L{source}"


def mixed_head_input(mode, x, head_in, sources, x_lambda, skip_lambdas, norm_after_sum):
    """The head input of the sum and subtract backouts, x the final residual:
    subtract: norm(x - sum_L lambda_L*source_L);
    sum: x_lambda*head_in + sum_L lambda_L*source_L, head_in = norm(x) and the sources already normed by the
    caller (the #14 part norms them once for its similarity record too), normed again when norm_after_sum."""
    if mode == "subtract":
        for lam, source in zip(skip_lambdas, sources):
            x = x - lam * source
        return norm(x)
    out = x_lambda * head_in
    for lam, source in zip(skip_lambdas, sources):
        out = out + lam * source
    return norm(out) if norm_after_sum else out


class BackoutLambdas:
    """The sum and subtract backouts' lambdas, for the parts of both models (#14's Backout, r18's R18Backout):
    x_lambda (sum mode) and one lambda per source, learned in the model's scalar vector
    ("backout.x", "backout.skip", reserved with model.add_scalars) or buffers of the part when frozen (x_lambda
    also with a fixed x)."""

    def reserve_lambdas(self, model, mode, num_sources, x_init, skip_init, fixed_x, frozen):
        self.mode = mode
        if mode == "sum":
            x_lambda = torch.tensor(float(x_init))
            if frozen or fixed_x:
                self.register_buffer("x_lambda", x_lambda)
            else:
                model.add_scalars("backout.x", x_lambda)
        skip_lambdas = torch.full((num_sources,), float(skip_init))
        if frozen:
            self.register_buffer("skip_lambdas", skip_lambdas)
        else:
            model.add_scalars("backout.skip", skip_lambdas)

    def lambdas(self, model):
        """(x_lambda or None, [skip lambda per source]) as 0-dim tensors (0-dim: they keep the activation dtype)."""
        x_lambda = None
        if self.mode == "sum":
            x_lambda = self.x_lambda if hasattr(self, "x_lambda") else model.scalar_slice("backout.x")[0]
        skips = self.skip_lambdas if hasattr(self, "skip_lambdas") else model.scalar_slice("backout.skip")
        return x_lambda, list(skips.unbind(0))

    @torch.no_grad()
    def lambda_scalars(self, model, sources):
        """The lambdas as logged scalars: backout.x and backout.<source label>."""
        x_lambda, skip_lambdas = self.lambdas(model)
        out = {"backout.x": x_lambda.item()} if self.mode == "sum" else {}
        for source, lam in zip(sources, skip_lambdas):
            out[f"backout.{source_label(source)}"] = lam.item()
        return out


class Backout(BackoutLambdas, ModelPart):
    """The backout's own tensors (transform matrices, down-projections, a fresh embedding, frozen lambdas and the
    similarity record) and its hooks: the head's input (sum, subtract, concat-head) or the last MLP's extra input
    (concat-mlp). Its learned lambdas live in the model's scalar vector ("backout.x", "backout.skip")."""

    def __init__(self, model, cfg):
        super().__init__()
        D, k = cfg.model_dim, len(cfg.backout_layers)
        self.cfg = cfg
        if cfg.backout_transform.endswith("-linear"):
            self.transform_w = nn.Parameter(uniform_init_(torch.empty(k, D, D)))
        if cfg.backout_mode == "concat-mlp":
            self.down_w = nn.Parameter(uniform_init_(torch.empty(k, cfg.backout_concat_dim, D)))
        if "new-embed" in cfg.backout_layers:
            self.new_embed = nn.Embedding(cfg.vocab_size, D)
        if cfg.backout_transform != "none":
            # (cos, relative L2) per source, overwritten by each eval forward: the last validation batch's values.
            self.register_buffer("similarity", torch.zeros(k, 2))
        if cfg.backout_mode in ("sum", "subtract"):
            self.reserve_lambdas(model, cfg.backout_mode, k, cfg.backout_x_init, cfg.backout_skip_init,
                                 cfg.backout_fixed_x, cfg.backout_freeze)
        elif cfg.backout_mode == "concat-head":
            # The head reads [norm(x), source 1, ...]: widen the (all-zero) lm head, so the new columns start at
            # zero and train exactly like the old ones (same Adam group, fp32).
            rows = model.lm_head_w.size(0)
            model.lm_head_w = nn.Parameter(torch.zeros(rows, D * (1 + k)))
            model.extra_param_counts["backout"] = rows * D * k
        elif cfg.backout_mode == "concat-mlp":
            old = model.blocks[-1].mlp
            new = MLP(D, backout_mlp_hidden(cfg), in_dim=D + k * cfg.backout_concat_dim)
            model.blocks[-1].mlp = new
            model.extra_param_counts["backout"] = (sum(p.numel() for p in new.parameters())
                                                   - sum(p.numel() for p in old.parameters()))

    def mixed(self, outputs, x_embed, input_seq, normed=True):
        """The vectors the backout mixes in, one per source: norm(T(source)) (normed) or T(source).

        In eval mode also records, per source, cos and relative L2 between norm(source) and norm(T(source)) on the
        first SIMILARITY_TOKENS tokens."""
        cfg = self.cfg
        vectors = []
        for j, name in enumerate(cfg.backout_layers):
            source = x_embed if name == "embed" else self.new_embed(input_seq)[None] if name == "new-embed" \
                else outputs[name]
            t = cfg.backout_transform
            activation, _, linear = t.partition("-")
            moved = source.detach() if t == "detach" else source if activation == "none" \
                else BACKOUT_ACTIVATIONS[activation](source)
            if linear:  # relu-linear, tanh-linear: the activation, then a learned D x D matrix per source
                moved = F.linear(moved, self.transform_w[j].type_as(source))
            moved_normed = norm(moved)
            if t != "none" and not self.training:
                # The first tokens suffice and keep the fp32 copies small (a val sequence is 262144 tokens).
                a = norm(source[:, :SIMILARITY_TOKENS].float())
                b = moved_normed[:, :SIMILARITY_TOKENS].float()
                cos = F.cosine_similarity(a, b, dim=-1).mean()
                rel_l2 = torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(a).clamp_min(1e-12)
                self.similarity[j].copy_(torch.stack([cos, rel_l2]).detach())
            vectors.append(moved_normed if normed else moved)
        return vectors

    def head_input(self, model, head_in, outputs, x_embed, input_seq):
        """head_in is norm(x), x = outputs[-1] the final residual."""
        cfg = self.cfg
        if cfg.backout_mode == "concat-mlp":
            return head_in
        if cfg.backout_mode == "concat-head":
            return torch.cat([head_in] + self.mixed(outputs, x_embed, input_seq), dim=-1)
        x_lambda, skip_lambdas = self.lambdas(model)
        sources = self.mixed(outputs, x_embed, input_seq, normed=cfg.backout_mode == "sum")
        return mixed_head_input(cfg.backout_mode, outputs[-1], head_in, sources, x_lambda, skip_lambdas,
                                cfg.backout_norm_after_sum)

    def mlp_extra(self, model, i, outputs, x_embed, input_seq):
        """concat-mlp, last layer: each source's norm(T(source)) projected down to backout_concat_dim,
        concatenated."""
        if self.cfg.backout_mode != "concat-mlp" or i != model.cfg.num_layers - 1:
            return None
        mixed = self.mixed(outputs, x_embed, input_seq)
        return torch.cat([F.linear(v, self.down_w[j].type_as(v)) for j, v in enumerate(mixed)], dim=-1)

    def named_scalars(self, model):
        cfg = self.cfg
        out = self.lambda_scalars(model, cfg.backout_layers) if cfg.backout_mode in ("sum", "subtract") else {}
        if cfg.backout_transform != "none":
            labels = [source_label(source) for source in cfg.backout_layers]
            for label, (cos, rel_l2) in zip(labels, self.similarity.tolist()):
                out[f"backout.{label}.cos"], out[f"backout.{label}.rel_l2"] = cos, rel_l2
        return out


class R18Backout(BackoutLambdas, ModelPart):
    """The backout on --base r18 (Study.r18_model_part): any sources replace #18's own backout (x -= lambda*out[11],
    its lambda then unused), `--backout-layers none` removes it; the sum and subtract mixes over untransformed
    sources, `embed` being #18's x0 (the smeared and normed embedding), its lambdas as on #14."""

    replaces_base_head_input = True  # #18's own backout

    def __init__(self, model, cfg):
        super().__init__()
        self.sources = () if cfg.backout_layers == ("none",) else tuple(cfg.backout_layers)
        self.norm_after_sum = cfg.backout_norm_after_sum
        if self.sources:
            self.reserve_lambdas(model, cfg.backout_mode, len(self.sources), cfg.backout_x_init,
                                 cfg.backout_skip_init, cfg.backout_fixed_x, cfg.backout_freeze)

    def head_input(self, model, head_in, outputs, x_embed, input_seq):
        """head_in is norm(x), x = outputs[-1] the final residual (#18's own backout off)."""
        if not self.sources:
            return head_in
        sources = [x_embed if s == "embed" else outputs[s] for s in self.sources]
        if self.mode == "sum":  # the sum mixes normed vectors
            sources = [norm(s) for s in sources]
        x_lambda, skips = self.lambdas(model)
        return mixed_head_input(self.mode, outputs[-1], head_in, sources, x_lambda, skips, self.norm_after_sum)

    def named_scalars(self, model):
        return self.lambda_scalars(model, self.sources) if self.sources else {}


BACKOUT_MODES_ON_R18 = ("sum", "subtract")


def backout_on_r18(config):
    """Why a resolved backout does not run on --base r18 (Study.on_r18), or None: R18Backout runs it."""
    if config.backout_layers == ("none",):
        return None
    if config.backout_mode not in BACKOUT_MODES_ON_R18:
        return f"--backout-mode {config.backout_mode}: on --base r18 only {' and '.join(BACKOUT_MODES_ON_R18)} run"
    if config.backout_transform != "none":
        return (f"--backout-transform {config.backout_transform}: on --base r18 the sources are mixed in "
                f"untransformed")
    if "new-embed" in config.backout_layers:
        return "--backout-layers new-embed: not on --base r18 (its sources: layers and `embed`)"
    return None


BACKOUT_MODES = ["sum", "subtract", "concat-head", "concat-mlp"]
BACKOUT_TRANSFORMS = ["none", "detach", "relu", "tanh", "relu-linear", "tanh-linear"]


BACKOUT_FLAGS = (
    Flag("--backout-layers", "sources mixed into the final latents: 0-based layer indices, `embed` (the token "
                             "embedding the residual starts from) or `new-embed` (a fresh embedding table); comma- "
                             "or space-separated. The records: 11 (medium track), 8 (small track)",
         resume=True, kind=tuple, options=dict(nargs="+", metavar="SOURCE", default=())),  # (): off, as resolved
    Flag("--backout-mode", "sum: x_lambda*norm(x) + sum_L lambda_L*norm(out[L]) (default); subtract: "
                           "norm(x - sum_L lambda_L*out[L]); concat-head: the head reads [norm(x), norm(out[L]), ...]; "
                           "concat-mlp: a down-projection of norm(out[L]) joins the last MLP's input",
         resume=True, kind=str, options=dict(choices=BACKOUT_MODES)),
    Flag("--backout-transform", "applied to each source before its norm (default none); relu-linear / tanh-linear = "
                                "ReLU / tanh then a learned DxD matrix (Muon)",
         resume=True, kind=str, options=dict(choices=BACKOUT_TRANSFORMS)),
    Flag("--backout-x-init", "initial x_lambda (sum mode; default 1.0)", resume=True, kind=float,
         options=dict(type=float)),
    Flag("--backout-skip-init", "initial lambda of every source (default 0.0 in sum mode, 0.5 in subtract mode)",
         resume=True, kind=float, options=dict(type=float)),
    Flag("--backout-fixed-x", "x_lambda is a constant (its init), not learned", resume=True, kind=bool,
         options=dict(action="store_true")),
    Flag("--backout-freeze", "every backout lambda stays at its init", resume=True, kind=bool,
         options=dict(action="store_true")),
    Flag("--backout-norm-after-sum", "sum mode: norm(x_lambda*norm(x) + sum_L lambda_L*norm(out[L]))", resume=True,
         kind=bool, options=dict(action="store_true")),
    Flag("--backout-concat-dim", "concat-mlp: width each source is projected down to (default 128)", resume=True,
         kind=int, options=dict(type=int)),
    Flag("--backout-mlp-ratio", "concat-mlp: hidden width of the last MLP as a multiple of the model dim "
                                "(default 1.0)", resume=True, kind=float, options=dict(type=float)),
)


def backout_defaults(mode):
    """Defaults of the backout's numeric flags (the skip lambda's depends on the mode)."""
    return dict(backout_x_init=1.0, backout_skip_init=0.5 if mode == "subtract" else 0.0, backout_concat_dim=128,
                backout_mlp_ratio=1.0)


def resolve_backout_args(args, pattern=None):
    """Validates the backout flags; returns their resolved values (defaults filled in, backout_layers a tuple of
    layer indices and names)."""
    last = args.num_layers - 1
    dependent = dict(mode=args.backout_mode, transform=args.backout_transform, x_init=args.backout_x_init,
                     skip_init=args.backout_skip_init, fixed_x=args.backout_fixed_x or None,
                     freeze=args.backout_freeze or None, norm_after_sum=args.backout_norm_after_sum or None,
                     concat_dim=args.backout_concat_dim, mlp_ratio=args.backout_mlp_ratio)
    given = [f"--backout-{k.replace('_', '-')}" for k, v in dependent.items() if v is not None]
    if not args.backout_layers:
        if given:
            raise UsageError(f"{given[0]} needs --backout-layers (no backout source given)")
        return dict(backout_layers=())
    items = [item.strip() for item in ",".join(args.backout_layers).split(",")]
    if items == ["none"]:
        # A base model with a backout of its own (--base r18) runs without it; elsewhere "none" is the default.
        if getattr(args, "base", None) != "r18":
            raise UsageError("--backout-layers none: only --base r18 has a backout of its own to turn off")
        if given:
            raise UsageError(f"{given[0]} has no backout to set with --backout-layers none")
        return dict(backout_layers=("none",), backout_mode="sum", backout_transform="none", **backout_defaults("sum"))
    sources = []
    for item in items:
        if item in ("embed", "new-embed"):
            source = item
        else:
            try:
                source = int(item)
            except ValueError:
                raise UsageError(f"--backout-layers: {item!r} is not a layer index, `embed` or `new-embed`")
            if not 0 <= source <= last:
                raise UsageError(f"--backout-layers: layer {source} is outside the model (layers 0..{last})")
        if source in sources:
            raise UsageError(f"--backout-layers: {item} is listed twice")
        sources.append(source)
    mode = args.backout_mode or "sum"
    transform = args.backout_transform or "none"
    if last in sources and mode in ("sum", "subtract"):
        raise UsageError(f"--backout-layers: layer {last} is the last layer; mixing out[{last}] into x = out[{last}] "
                         f"only rescales it (use --backout-mode concat-head for that control)")
    if last in sources and mode == "concat-mlp":
        raise UsageError(f"--backout-layers: layer {last} is not computed yet when the last MLP runs (concat-mlp)")
    if transform == "detach" and "new-embed" in sources:
        raise UsageError("--backout-transform detach: the new-embed table would never receive a gradient")
    for flag, value, modes in [("--backout-x-init", args.backout_x_init, ["sum"]),
                               ("--backout-fixed-x", dependent["fixed_x"], ["sum"]),
                               ("--backout-norm-after-sum", dependent["norm_after_sum"], ["sum"]),
                               ("--backout-skip-init", args.backout_skip_init, ["sum", "subtract"]),
                               ("--backout-freeze", dependent["freeze"], ["sum", "subtract"]),
                               ("--backout-concat-dim", args.backout_concat_dim, ["concat-mlp"]),
                               ("--backout-mlp-ratio", args.backout_mlp_ratio, ["concat-mlp"])]:
        if value is not None and mode not in modes:
            raise UsageError(f"{flag} does not apply to --backout-mode {mode} (only {'/'.join(modes)})")
    for flag, value in [("--backout-x-init", args.backout_x_init), ("--backout-skip-init", args.backout_skip_init),
                        ("--backout-mlp-ratio", args.backout_mlp_ratio)]:
        if value is not None and not math.isfinite(value):
            raise UsageError(f"{flag} must be finite")
    if args.backout_concat_dim is not None and args.backout_concat_dim <= 0:
        raise UsageError("--backout-concat-dim must be positive")
    if args.backout_mlp_ratio is not None and args.backout_mlp_ratio <= 0:
        raise UsageError("--backout-mlp-ratio must be positive")
    resolved = dict(backout_layers=tuple(sources), backout_mode=mode, backout_transform=transform)
    for name, value in backout_defaults(mode).items():
        if getattr(args, name) is None:
            resolved[name] = value
    return resolved


# Name pieces of the settings that differ from their defaults, in the order they are checked.
BACKOUT_NAME_PIECES = [("backout_mode", "sum", "{}"), ("backout_transform", "none", "{}"),
                       ("backout_x_init", None, "x{:g}"), ("backout_skip_init", None, "skip{:g}"),
                       ("backout_fixed_x", False, "fixed-x"), ("backout_freeze", False, "frozen"),
                       ("backout_norm_after_sum", False, "norm-after-sum"), ("backout_concat_dim", None, "dim{}"),
                       ("backout_mlp_ratio", None, "ratio{:g}")]


def backout_variant_name(args):
    """The backout's part of the default variant name, e.g. backout-L11, backout-L11+L10+embed-tanh-linear: the
    sources, then every backout setting that is not its default."""
    defaults = backout_defaults(args.backout_mode)
    pieces = ["backout-" + "+".join(f"L{s}" if isinstance(s, int) else s for s in args.backout_layers)]
    for name, default, form in BACKOUT_NAME_PIECES:
        value = getattr(args, name)
        if value != (defaults[name] if default is None else default):
            pieces.append(form.format(value))
    return "-".join(pieces)


BACKOUT = Study(
    name="backout", title="backout (docs/backout.md; every flag needs --backout-layers)",
    # each flag is also a model field (default: the flag's unset value, off), copied as resolved when it is set
    flags=BACKOUT_FLAGS, resolve=resolve_backout_args, variant_name=backout_variant_name,
    model_part=Backout, on_r18=backout_on_r18, r18_model_part=R18Backout,
)
