"""The bundled studies (speedrun/study.py says what a study declares), in the order their flags appear in --help
and their parts in a default variant name."""

from speedrun.backout import (BACKOUT_FLAGS, BACKOUT_MODEL_FIELDS, Backout, R18Backout, backout_added_params,
                              backout_config, backout_on_r18, backout_variant_name, resolve_backout_args)
from speedrun.dlo import (DLO_DESCRIPTION, DLO_FLAGS, DLO_MODEL_FIELDS, DLORouters, dlo_added_params,
                         dlo_model_config, resolve_dlo_args)
from speedrun.gated_skip import GATED_SKIP
from speedrun.laurel import (LAUREL_FLAGS, LAUREL_MODEL_FIELDS, LaurelResiduals, laurel_added_params, laurel_config,
                             laurel_variant_name, resolve_laurel_args)
from speedrun.rolling_skip import (ROLLING_SKIP_FLAGS, ROLLING_SKIP_MODEL_FIELDS, RollingSkip,
                                   resolve_rolling_skip_args, rolling_skip_added_params, rolling_skip_config)
from speedrun.study import Study

STUDIES = (
    Study(name="backout", title="backout (docs/backout.md; every flag needs --backout-layers)", description=None,
          flags=BACKOUT_FLAGS, resolve=resolve_backout_args, model_config=backout_config,
          added_params=backout_added_params, model_fields=BACKOUT_MODEL_FIELDS, variant_name=backout_variant_name,
          model_part=Backout, on_r18=backout_on_r18, r18_model_part=R18Backout),
    Study(name="rolling", title="rolling skip (docs/backout.md)", description=None, flags=ROLLING_SKIP_FLAGS,
          resolve=resolve_rolling_skip_args, model_config=rolling_skip_config,
          added_params=rolling_skip_added_params, model_fields=ROLLING_SKIP_MODEL_FIELDS,
          variant_name=lambda config: "rolling-skip", model_part=RollingSkip),
    Study(name="laurel", title="laurel", description="LAuReL residuals (docs/laurel.md); every flag needs --laurel",
          flags=LAUREL_FLAGS, resolve=resolve_laurel_args, model_config=laurel_config,
          added_params=laurel_added_params, model_fields=LAUREL_MODEL_FIELDS, variant_name=laurel_variant_name,
          model_part=LaurelResiduals),
    Study(name="dlo", title="dlo", description=DLO_DESCRIPTION, flags=DLO_FLAGS, resolve=resolve_dlo_args,
          model_config=dlo_model_config, added_params=dlo_added_params, model_fields=DLO_MODEL_FIELDS,
          # expansion copies the baseline's per-layer parts only: every other study is refused with it
          rebuilds_model=True, excludes_why="DLO expands baseline checkpoints", model_part=DLORouters),
    GATED_SKIP,
)
