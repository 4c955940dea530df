"""Rolling skip (study flag --rolling-skip, docs/backout.md): from layer 3 on, layer i's input is
a*out[i-3] + b*out[i-1] with a and b learned (init a = 0, b = 1: the baseline's hand-over)."""

import torch

from speedrun.errors import UsageError
from speedrun.study import Flag, ModelPart, Study

ROLLING_SKIP_FLAGS = (
    Flag("--rolling-skip", "from layer 3 on, layer i's input is a*out[i-3] + b*out[i-1] (learned, init a=0, b=1)",
         resume=True, kind=bool, options=dict(action="store_true")),
)


def resolve_rolling_skip_args(config, pattern):
    if config.rolling_skip and config.num_layers < 4:
        raise UsageError(f"--rolling-skip needs at least 4 layers (got --num-layers {config.num_layers})")
    return {}


class RollingSkip(ModelPart):
    """Per layer i >= 3 the scalars (a, b) of `a*out[i-3] + b*out[i-1]`, (0, 1) at init: the baseline's input."""

    def __init__(self, model, cfg):
        super().__init__()
        model.add_scalars("rolling", torch.tensor([0.0, 1.0]).repeat(cfg.num_layers - 3))

    def block_input(self, model, i, x, outputs, x_embed):
        # Replaces the plain hand-over of out[i-1]; the U-net skip and the block's own mix follow as usual.
        if i < 3:
            return x
        a, b = model.scalar_slice("rolling").view(-1, 2)[i - 3]
        return a * outputs[i - 3] + b * x

    def named_scalars(self, model):
        out = {}
        for i, (a, b) in enumerate(model.scalar_slice("rolling").view(-1, 2).tolist(), start=3):
            out[f"rolling.L{i}.a"], out[f"rolling.L{i}.b"] = a, b
        return out


ROLLING_SKIP = Study(
    name="rolling", title="rolling skip (docs/backout.md)", flags=ROLLING_SKIP_FLAGS,
    resolve=resolve_rolling_skip_args,  # the flag is also the model field rolling_skip (default False: off)
    variant_name=lambda config: "rolling-skip", model_part=RollingSkip,
)
