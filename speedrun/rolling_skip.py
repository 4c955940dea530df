"""Rolling skip (study flag --rolling-skip, docs/backout.md): from layer 3 on, layer i's input is
a*out[i-3] + b*out[i-1] with a and b learned (init a = 0, b = 1: the baseline's hand-over)."""

from speedrun.errors import UsageError
from speedrun.study import Flag

ROLLING_SKIP_FLAGS = (
    Flag("--rolling-skip", "from layer 3 on, layer i's input is a*out[i-3] + b*out[i-1] (learned, init a=0, b=1)",
         resume=True, kind=bool, options=dict(action="store_true")),
)
ROLLING_SKIP_MODEL_FIELDS = (("rolling_skip", bool, False),)


def resolve_rolling_skip_args(config, pattern):
    if config.rolling_skip and config.num_layers < 4:
        raise UsageError(f"--rolling-skip needs at least 4 layers (got --num-layers {config.num_layers})")
    return {}


def rolling_skip_config(model_cfg, config):
    return dict(rolling_skip=True) if config.rolling_skip else {}
