"""What a study is, in one place: its command-line flags (each with its help and whether `--resume` must match it),
its validation and default filling, the flags of other studies it cannot be combined with, the model config fields
it sets, and its part of a run's default variant name. speedrun/studies.py lists the bundled studies; the command
line (cli.py), the run config (run_config.py), variant names (variants.py), the resume check (through the config's
field metadata) and the model's StudyConfig (model.py) are all built from that list."""

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

import torch.nn as nn

from speedrun.errors import UsageError


@dataclass(frozen=True, eq=False)  # compared (and hashed) by identity: each flag is declared once
class Flag:
    """One command-line flag and the run config field it fills (its dest).

    resume has no default on purpose: every flag says whether a resumed run must have the value of the run that
    wrote the checkpoint (a study flag that changes the model or its training: True)."""
    name: str  # "--backout-mode"
    help: str
    resume: bool
    kind: Any = Any  # the config field's type once resolved
    options: Mapping = field(default_factory=dict)  # argparse keywords: type, nargs, metavar, choices, action, default

    @property
    def dest(self):
        return self.name.removeprefix("--").replace("-", "_")

    @property
    def unset(self):
        """The parsed value when the flag is not on the command line."""
        return self.options.get("default", False if self.options.get("action") == "store_true" else None)

    def add_to(self, group):
        group.add_argument(self.name, help=self.help, **self.options)  # the help as written: a `{` is text


@dataclass(frozen=True)
class Study:
    """A study: flags, checks and model fields, declared once (see the module docstring).

    Every field but name and flags has a default: a study with a part whose model fields are its flags declares
    each switch once (the flag; its model field and the copy into the model config are derived).
    resolve(config, pattern) -> {field: value}: validates this study's flags of the run config (the track's layer
      pattern at --num-layers given) and returns their resolved values (defaults filled in); raises UsageError.
      Default: no check, nothing derived.
    model_config(model_cfg, config) -> {field: value}: the model config fields this run sets (empty when off).
      Default (model_values): each model field named as a run config field, copied where it is not its default.
    model_fields: (name, type, default) of the model config fields; the defaults mean off. Default: with a
      model_part, one per flag (its dest, kind and unset value); without, none.
    model_part: its ModelPart class (below), built into a model whose config has the study on.
    variant_name(config) -> the study's part of the default variant name, or None for the generic one made from the
      flags as given (e.g. dlo-groups2-init-slerp).
    on_r18(config) -> None, or the one-line reason this resolved config does not run on --base r18 (record #18's
      model, speedrun/r18): None (the default) runs the study there through the same hooks; a part whose hooks
      #18's model cannot honour (mlp_extra: its blocks have no MLP input to widen) is refused there in one line.
    r18_model_part: its ModelPart on --base r18 where that differs from model_part (backout's R18Backout replaces
      #18's own backout)."""
    name: str  # the word the generic variant name starts with
    flags: tuple[Flag, ...]  # the first one switches the study on
    title: str = ""  # the --help group's title (default: the name)
    description: str | None = None
    resolve: Callable = lambda config, pattern: {}
    model_config: Callable | None = None
    model_fields: tuple | None = None
    variant_name: Callable | None = None
    excludes: tuple[str, ...] = ()  # flags of other studies this one cannot be combined with
    excludes_why: str = ""
    # A study that rebuilds the model (DLO expands a checkpoint) refuses every other study but those it names here.
    rebuilds_model: bool = False
    compatible: tuple[str, ...] = ()
    model_part: type | None = None  # a ModelPart subclass: the study's parameters and model hooks
    on_r18: Callable | None = None
    r18_model_part: type | None = None

    def __post_init__(self):
        object.__setattr__(self, "title", self.title or self.name)
        if self.model_fields is None:  # the flags are the model fields
            object.__setattr__(self, "model_fields", tuple((flag.dest, flag.kind, flag.unset) for flag in self.flags)
                               if self.model_part is not None else ())

    def model_values(self, model_cfg, config):
        """The model config fields this run sets (Study.model_config, or each field copied where it is set)."""
        if self.model_config is not None:
            return self.model_config(model_cfg, config)
        return {name: getattr(config, name) for name, _, default in self.model_fields
                if getattr(config, name, default) != default}

    @property
    def r18_part(self):
        return self.r18_model_part or self.model_part

    def active(self, config):
        return is_set(getattr(config, self.flags[0].dest))

    def in_model(self, model_cfg):
        """Whether a model config has this study's part (its first model field is not the default)."""
        name, _, default = self.model_fields[0]
        return self.model_part is not None and getattr(model_cfg, name) != default

    def check_exclusions(self, config, studies):
        """Raises UsageError when this study is on together with a flag it excludes (a flag of a study that is not
        in `studies`, as in an exported file that holds only the studies switched on, is off)."""
        if not self.active(config):
            return
        flags = {flag.name: flag for study in studies for flag in study.flags}
        excluded = list(self.excludes)
        if self.rebuilds_model:
            excluded += [study.flags[0].name for study in studies
                         if study is not self and study.name not in self.compatible and study.active(config)]
        for name in excluded:
            if name in flags and is_set(getattr(config, flags[name].dest)):
                raise UsageError(f"{self.flags[0].name} cannot be combined with {name} ({self.excludes_why})")


# The studies an exported file runs fixed when every study of its run is (speedrun/export.py writes them there:
# docs/export.md, rule 16): one (variant name piece, {preset: ((first, last), ...)}) each, in registry order. Its
# command line then offers no study (OFFERED_STUDIES is empty there); none in the modular script.
FIXED_STUDIES = ()


def check_fixed_depth(config, depths):
    """Refuses in one line a preset and layer count of an exported file's run other than those where the modular
    script resolved the file's arm as the file holds it ({preset: ((first, last), ...)}): there the modular script
    refuses the arm, or resolves another."""
    runs = depths.get(config.preset, ())
    if not any(first <= config.num_layers <= last for first, last in runs):
        at = ", ".join(f"{first}..{last}" if last > first else f"{first}" for first, last in runs) or "none"
        raise UsageError(f"this file's arm does not run with --num-layers {config.num_layers} at --preset "
                         f"{config.preset} (it runs at {at}); export the modular script for that run")


def fixed_resolution(values, depths):
    """The resolve of a study in a file exported for one of its arms (speedrun/export.py writes the call into the
    study's declaration there): the values the modular script's resolution gave the arm's flags, at the presets and
    layer counts where it gives them (check_fixed_depth)."""
    def resolve(config, pattern):
        check_fixed_depth(config, depths)
        return values
    return resolve


def reserve_scalars(inits, layout, name, init):
    """Reserves the slice `name` of a scalar vector built from `inits` (a list of flat tensors, concatenated once
    the model is built); layout maps names to (start, end)."""
    start = sum(t.numel() for t in inits)
    inits.append(init.float().flatten())
    layout[name] = (start, start + init.numel())


def added_params_by_study(parts, scalar_layout, track_scalars=()):
    """Parameters each study adds, named once by its study: the modules of its part (parts: {study name: part}) plus
    its slices of the model's scalar vector, a slice counted under its name up to the first `.`, with `_` read as
    `-` (the gated skip's `gated_skip` under `gated-skip`); the track's own slices (track_scalars) are not counted."""
    counts = {name: sum(p.numel() for p in part.parameters()) for name, part in parts.items()}
    study_names = {name.replace("-", "_"): name for name in parts}
    for key, (start, end) in scalar_layout.items():
        prefix = key.split(".")[0]
        if prefix not in track_scalars:
            name = study_names.get(prefix.replace("-", "_"), prefix)
            counts[name] = counts.get(name, 0) + (end - start)
    return counts


def one_part_hook(parts, hook, *args, what):
    """The one part's non-None answer to a hook only one part may answer (`what` it does, for the error), or None."""
    found = [answer for answer in (getattr(part, hook)(*args) for part in parts) if answer is not None]
    assert len(found) <= 1, f"two study parts {what}"
    return found[0] if found else None


class StudyHost:
    """The model side of the study contract, one for every base (the #14 and small tracks' StudyGPT, --base r18's
    R18GPT): the parts built into model.study and model.parts, the named study scalars, and the calls of the parts'
    hooks. A base keeps its study scalars in the vector named by `scalar_vector` (built from the slices the parts
    reserve during __init__, after begin_scalars()) and calls the hooks below where its forward reaches them.
    parts_residuals, parts_mlp_router and parts_mlp_extra test `self.parts` first: with no study on, an export folds
    their calls to None."""
    scalar_vector = "scalars"
    parts = ()  # the parts built (build_parts); a model that builds none holds no `study` container

    def begin_scalars(self):
        self._scalar_inits, self.scalar_layout = [], {}

    def add_scalars(self, name, init):
        """Reserves a named slice of the study scalar vector (only during __init__)."""
        reserve_scalars(self._scalar_inits, self.scalar_layout, name, init)

    def scalar_slice(self, name):
        a, b = self.scalar_layout[name]
        return getattr(self, self.scalar_vector)[a:b]

    def scalar_grad(self, name):
        """The gradient of a named slice (after a backward)."""
        a, b = self.scalar_layout[name]
        return getattr(self, self.scalar_vector).grad[a:b]

    def build_parts(self, parts, cfg):
        """Builds each part of `parts` ((study name, its ModelPart class), in build order: registry order, built_last
        parts after the others) into self.study and self.parts; extra_param_counts: what a part adds outside
        self.study (e.g. widened lm-head columns), or removes (negative). A model that builds no part (none on)
        calls it not: it holds none of these but the class's `parts = ()`."""
        self.study, self.parts, self.extra_param_counts = nn.ModuleDict(), [], {}
        for name, part_class in parts:
            self.study[name] = part_class(self, cfg)
            self.parts.append(self.study[name])

    def named_parts(self):
        """(study name, part) of each part built, in build order."""
        return self.study.items() if self.parts else ()

    def parts_block_input(self, i, x, outputs, x_embed):
        for part in self.parts:
            x = part.block_input(self, i, x, outputs, x_embed)
        return x

    def parts_block_output(self, i, x, outputs):
        for part in self.parts:
            x = part.block_output(self, i, x, outputs)
        return x

    def parts_head_input(self, head_in, outputs, x_embed, input_seq):
        for part in self.parts:
            head_in = part.head_input(self, head_in, outputs, x_embed, input_seq)
        return head_in

    def parts_residuals(self):
        """This forward pass's residual functions (layer -> None or (x, f(x), site) -> residual), from the one part
        that augments the residuals, or None: every residual plain."""
        return one_part_hook(self.parts, "residuals", self, what="augment the residuals") if self.parts else None

    def parts_mlp_router(self):
        """This forward pass's MLP router (ModelPart.mlp_router), or None: every block runs its own MLP."""
        return one_part_hook(self.parts, "mlp_router", self, what="route the MLPs") if self.parts else None

    def parts_mlp_extra(self, i, outputs, x_embed, input_seq):
        """Features a study part concatenates to layer i's MLP input, or None (every baseline layer)."""
        return one_part_hook(self.parts, "mlp_extra", self, i, outputs, x_embed, input_seq,
                             what=f"widen layer {i}'s MLP input") if self.parts else None

    def routes_mlp(self):
        return any(part.routes_mlp for part in self.parts)

    def replaces_base_head_input(self):
        """Whether a part computes the head's input from norm(x) in place of the base's own (#18's backout)."""
        return any(part.replaces_base_head_input for part in self.parts)

    def parts_named_scalars(self):
        out = {}
        for part in self.parts:
            out.update(part.named_scalars(self))
        return out

    def parts_before_step(self, config, step):
        for part in self.parts:
            part.before_step(self, config, step)

    def parts_after_step(self, opt, config, proc):
        for part in self.parts:
            part.after_step(self, opt, config, proc)

    def parts_init_from(self, state, config):
        """Whether a part loaded an --init-from checkpoint itself (ModelPart.load_init_state: e.g. expanding it)."""
        return any(part.load_init_state(self, state, config) for part in self.parts)


def is_set(value):
    """Whether a flag's value turns something on: not None, False or an empty tuple (0 is a value: layer 0)."""
    return value is not None and value is not False and value != ()


class ModelPart(nn.Module):
    """What a study adds to the model (Study.model_part), built as model_part(model, model_cfg) in the model's
    __init__ when the study's first model field is not its default (in registry order, built_last parts after the
    others), and kept in model.study[study name]; the model and the training loop reach it only through the hooks
    below, on every track's model alike (speedrun.model.StudyGPT, and --base r18's R18GPT, where x_embed is #18's
    x0 and a study runs unless Study.on_r18 refuses it). Backout, rolling skip, LAuReL, DLO and the gated skip are
    all written this way. Its
    parameters are then counted in added_params and trained (matrices by Muon, the rest by Adam). A scalar goes
    into the model's scalar vector instead, with model.add_scalars(name, init) during __init__ (Adam's scalar group,
    counted under its name's first part). Every hook is optional; the defaults change nothing.
      block_input(model, i, x, outputs, x_embed): layer i's input, given the one it would get, the outputs so far
        and the embedding the residual started from
      block_output(model, i, x, outputs): layer i's output, given the one it computed
      head_input(model, head_in, outputs, x_embed, input_seq): the head's input, given the one it would read
        (norm of the final residual outputs[-1]), every layer's output, the embedding the residual started from and
        the tokens
      mlp_extra(model, i, outputs, x_embed, input_seq): None, or features concatenated to layer i's MLP input (the
        part widens that MLP in __init__; one part per layer at most)
      residuals(model): at the start of each forward pass, None (plain residuals) or a function i -> None or
        augment(x, fx, site): layer i's residuals x + f(x) at site "attn" or "mlp", inside the block (one part
        per model at most)
      mlp_router(model): at the start of each forward pass, None, or a router that computes every layer's MLP
        itself: router(i, block, h) -> layer i's output from h (its stream after attention), and
        router.finish(input_seq, window_blocks, aux_losses) at the pass's end (it may append a loss). Such a part
        sets routes_mlp: the model then compiles each block's attention and MLP as regions of their own and lets
        data-dependent sizes into the whole-model graph.
      named_scalars(model): {name: float} for the validation lines' scalars
      before_step(model, config, step), after_step(model, opt, config, proc): around each training step
      load_init_state(model, state, config): loads an --init-from checkpoint's state into the model and returns True, or
        returns False (the default: the run loads it as it is)
    A part that changes the model's depth says so before any is built, as staticmethod model_layer_pattern(cfg,
    track_layer_pattern) -> the model's per-layer structure (None: the track's at cfg.num_layers), and reports
    what it adds against base_config(cfg) (the model it grows from; None: counted from its own parameters)."""

    def block_input(self, model, i, x, outputs, x_embed):
        return x

    def block_output(self, model, i, x, outputs):
        return x

    built_last = False  # built after the parts without it: the parameter and scalar order of older checkpoints
    routes_mlp = False  # its mlp_router computes the MLPs (see above)
    replaces_base_head_input = False  # its head_input gets norm(x), not the base's own head input (#18's backout)

    @staticmethod
    def model_layer_pattern(cfg, track_layer_pattern):
        return None

    @staticmethod
    def base_config(cfg):
        return None

    def head_input(self, model, head_in, outputs, x_embed, input_seq):
        return head_in

    def mlp_extra(self, model, i, outputs, x_embed, input_seq):
        return None

    def residuals(self, model):
        return None

    def named_scalars(self, model):
        return {}

    def before_step(self, model, config, step):
        pass

    def after_step(self, model, opt, config, proc):
        pass

    def mlp_router(self, model):
        return None

    def load_init_state(self, model, state, config):
        return False


# The members of ModelPart whose default leaves the model as it would be without the part: a hook that returns the
# input it is given (block_input's x) or {}, False or None, or does nothing, and a flag that is False. StudyHost asks
# each hook in a loop over its parts that such a default leaves as it is; the models ask built_last,
# model_layer_pattern and base_config of each switched-on study's part class. An export (speedrun/export.py,
# passive_members) reads a loop over the parts as over none where it asks only such members that no switched-on
# part overrides, reads such a member by any receiver as its default where only a part can have its name
# (part_owned_members), and refuses a member named here whose default is not of that form.
NEUTRAL_DEFAULTS = ("block_input", "block_output", "head_input", "named_scalars", "before_step", "after_step",
                    "load_init_state", "routes_mlp", "replaces_base_head_input", "built_last", "model_layer_pattern",
                    "base_config")
