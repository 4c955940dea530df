"""The study flags on --base r18. The rule, stated once:

- backout: any `--backout-layers` replaces #18's own backout (x -= lambda*out[11], its lambda in `scalars`, then
  unused); `--backout-layers none` removes it. The sum and subtract modes over layer outputs and `embed` (#18's
  x0, the smeared and normed embedding) run here; the other modes and transforms and `new-embed` are refused.
- LAuReL adds to #18's blocks at their attention and MLP residuals (every #18 layer has attention).
- DLO (speedrun.dlo, docs/dlo.md "On --base r18") expands an r18 checkpoint as on #14 and routes the MLPs of the
  expanded model; it runs alone (as on #14). The routers' weights (one vector) join the Adam scalar group as
  below; the new layers' matrices join their record groups by label (attention, MLP, gates); --dlo-layer-lr scales
  NorMuon's lr and decay per layer as on #14 (NorMuon.lr_mul).
- the other studies (rolling skip, gated skip) are refused in one line.
- what a study adds trains by its shape: scalars and vectors join the Adam scalar group with the record's scalar
  multipliers (one vector `study_scalars`, label "scalars": lr x5, no decay); matrices join NorMuon with the
  hidden matrices' multipliers (lr x1 times the shape factor, decay x1), one group per shape after the record's
  groups (label STUDY_MATRIX_LABEL).
"""

from types import SimpleNamespace

import torch.nn as nn

from speedrun.backout import BackoutLambdas, mixed_head_input
from speedrun.dlo import DLORouters, dlo_model_config
from speedrun.errors import UsageError
from speedrun.laurel import LaurelResiduals
from speedrun.layers import norm

STUDY_MATRIX_LABEL = "study_matrix"
RUNS_ON_R18 = ("backout", "laurel", "dlo")
BACKOUT_MODES_ON_R18 = ("sum", "subtract")


def check_r18_studies(given):
    """Raises UsageError on a study flag that does not run on r18 (given: [(study, flag, value)] as given)."""
    for study, flag, _ in given:
        if study not in RUNS_ON_R18:
            raise UsageError(f"{flag}: this study does not run on --base r18 yet (there: backout, LAuReL and DLO)")


def check_r18_backout_args(config):
    """Raises UsageError on a resolved backout that does not run on r18."""
    if not config.backout_layers or config.backout_layers == ("none",):
        return
    if config.backout_mode not in BACKOUT_MODES_ON_R18:
        raise UsageError(f"--backout-mode {config.backout_mode}: on --base r18 only "
                         f"{' and '.join(BACKOUT_MODES_ON_R18)} run")
    if config.backout_transform != "none":
        raise UsageError(f"--backout-transform {config.backout_transform}: on --base r18 the sources are mixed in "
                         f"untransformed")
    if "new-embed" in config.backout_layers:
        raise UsageError("--backout-layers new-embed: not on --base r18 (its sources: layers and `embed`)")


class R18Backout(BackoutLambdas, nn.Module):
    """A backout that replaces #18's own: the sum and subtract mixes of speedrun.backout over untransformed
    sources, its lambdas in the study scalars (or buffers when frozen)."""

    def __init__(self, model, config):
        super().__init__()
        self.sources = () if config.backout_layers == ("none",) else tuple(config.backout_layers)
        self.norm_after_sum = config.backout_norm_after_sum
        if self.sources:
            self.reserve_lambdas(model, config.backout_mode, len(self.sources), config.backout_x_init,
                                 config.backout_skip_init, config.backout_fixed_x, config.backout_freeze)

    def head_input(self, model, x, outputs, x0):
        if not self.sources:
            return norm(x)
        sources = [x0 if s == "embed" else outputs[s] for s in self.sources]
        x_lambda, skips = self.lambdas(model)
        if self.mode == "sum":  # the sum mixes normed vectors
            x_normed, sources = norm(x), [norm(s) for s in sources]
        else:
            x_normed = None
        return mixed_head_input(self.mode, x, x_normed, sources, x_lambda, skips, self.norm_after_sum)

    def named_scalars(self, model):
        return self.lambda_scalars(model, self.sources) if self.sources else {}


def r18_dlo_config(config):
    """DLO's model config on r18: the run config with the expanded depth and the checkpoint's (dlo_model_config)."""
    return SimpleNamespace(**{**vars(config), **dlo_model_config(config, config)})


def attach_r18_studies(model, config):
    """The study parts of a resolved run config (speedrun.cli) on an R18GPT, by the rule of this module."""
    if config.backout_layers:
        model.study["backout"] = R18Backout(model, config)
    if config.laurel is not None:
        laurel = LaurelResiduals(model, config)  # its scalars go into study_scalars through model.add_scalars
        model.study["laurel"] = laurel
        for p in laurel.parameters():
            p.label, p.lr_mul, p.wd_mul = STUDY_MATRIX_LABEL, 1.0, 1.0
    if config.dlo_groups:
        routers = model.study["dlo"] = DLORouters(model, r18_dlo_config(config))
        routers.router_w.label, routers.router_w.lr_mul, routers.router_w.wd_mul = "scalars", 5.0, 0.0


def study_named_scalars(model):
    out = model.study["backout"].named_scalars(model) if "backout" in model.study else {}
    out = out | (model.study["laurel"].named_scalars(model) if "laurel" in model.study else {})
    return out | (model.study["dlo"].named_scalars(model) if "dlo" in model.study else {})
