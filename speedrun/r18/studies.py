"""The studies on --base r18, by the rule every study follows there (no study is named here):

- a study runs on r18 unless it refuses itself: its Study.on_r18(config) gives the one-line reason (backout refuses
  its modes other than sum and subtract, its transforms and `new-embed`); a study whose part needs a hook #18's
  model cannot honour (mlp_extra: #18's blocks have no MLP input to widen) is refused in one line too;
- its part is Study.r18_model_part where it has one (backout's R18Backout, which replaces #18's own backout), else
  its model_part, built as on #14 from the run config with the studies' model fields (e.g. DLO's expanded depth)
  and reached only through the ModelPart hooks (speedrun/study.py), the embedding the residual starts from being
  #18's x0 (the smeared and normed embedding);
- what a study adds trains by its shape: scalars and vectors join the Adam scalar group with the record's scalar
  multipliers (the `study_scalars` vector too, label "scalars": lr x5, no decay); matrices join NorMuon with the
  hidden matrices' multipliers (lr x1 times the shape factor, decay x1), one group per shape after the record's
  groups (label STUDY_MATRIX_LABEL).
"""

from dataclasses import make_dataclass, replace

from speedrun.errors import UsageError
from speedrun.studies import OFFERED_STUDIES, STUDIES
from speedrun.study import ModelPart

STUDY_MATRIX_LABEL = "study_matrix"
SCALAR_MULTIPLIERS = ("scalars", 5.0, 0.0)  # label, lr and decay multipliers of the record's scalars
MATRIX_MULTIPLIERS = (STUDY_MATRIX_LABEL, 1.0, 1.0)
# Hooks #18's model has no place for: (hook, why).
UNHONOURED_HOOKS = (("mlp_extra", "widens an MLP's input, and #18's blocks have no input for it"),)


def check_r18_studies(config, studies=OFFERED_STUDIES):
    """Raises UsageError (one line) on a study switched on in the resolved config that does not run on r18."""
    for study in studies:
        if not study.active(config):
            continue
        reason = study.on_r18(config) if study.on_r18 is not None else None
        for hook, why in UNHONOURED_HOOKS:
            if reason is None and getattr(study.r18_part, hook) is not getattr(ModelPart, hook):
                reason = f"{study.flags[0].name}: not on --base r18 (its part's {hook} {why})"
        if reason is not None:
            raise UsageError(reason)


def r18_parts(config, registry=None):
    """(the config r18's study parts are built from, [(study name, its r18 part class)] of each study on in it, in
    build order: registry order, built_last parts after the others): (None, []) for the record's model (no run
    config: what DLO counts against) and for a registry of no study."""
    if config is None or not (STUDIES if registry is None else registry):
        return None, []
    cfg = part_config(config, registry)
    return cfg, r18_study_parts(cfg)


def r18_study_parts(cfg):
    """The (study name, r18 part class) pairs a part config's model builds (speedrun.model.study_parts, with each
    study's Study.r18_part): an export writes them as the run's value (docs/export.md, rule 31)."""
    on = [study for study in cfg.studies if study.in_model(cfg)]
    return [(study.name, study.r18_part) for study in sorted(on, key=lambda study: study.r18_part.built_last)]


def part_config(config, studies=None):
    """The config r18's study parts are built from: the run config with the model fields of every study of the
    run's registry (`studies`, by default the bundled ones; kept as its `studies`), off unless its flags set them
    (Study.model_config, as the #14 model's config gets them: DLO's num_layers becomes the expanded depth)."""
    studies = STUDIES if studies is None else tuple(studies)
    values = {**vars(config), **{name: default for study in studies for name, _, default in study.model_fields},
              "studies": studies}
    cfg = make_dataclass("R18StudyConfig", list(values))(**values)  # a dataclass: parts replace() its fields
    for study in studies:
        cfg = replace(cfg, **study.model_values(cfg, config))
    return cfg

