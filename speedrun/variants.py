"""A run's default variant name, built from its study flags, so that hand-started arms logged to one folder do not
pool under one name in analysis. `--variant` overrides it; only a run without study flags is "baseline"."""

from speedrun.studies import OFFERED_STUDIES
from speedrun.study import FIXED_STUDIES


def given_study_flags(parsed):
    """[(study name, flag, value)] of the study flags set on the command line (value not the unset one), in
    --help order. `parsed`: the parsed flags (a dict) before resolution fills in any default."""
    return [(study.name, flag.name, parsed[flag.dest]) for study in OFFERED_STUDIES for flag in study.flags
            if parsed[flag.dest] != flag.unset]


def flag_piece(prefix, flag, value):
    """One generic name piece: the flag without `--` and the study's prefix, then its value (numbers joined on,
    words after a dash, lists joined with +; a switch is its name alone, or nothing when it is the study's name)."""
    name = flag.removeprefix("--").removeprefix(prefix + "-")
    if value is True:
        return "" if name == prefix else name
    if isinstance(value, (list, tuple)):
        value = "+".join(map(str, value))
    if isinstance(value, float):
        return f"{name}{value:g}"
    return f"{name}{value}" if isinstance(value, int) else f"{name}-{value}"


def default_variant(given, config, extra=()):
    """`extra` pieces (e.g. a changed layer count), then one part per study with a given flag: the study's
    variant_name(config) (config resolved) where it has one, else the generic `name-piece-piece...`; parts joined
    by `_`."""
    parts = list(extra)
    for study in OFFERED_STUDIES:  # a loop over the registry: an export with no study on folds it away
        pieces = [flag_piece(study.name, f, v) for name, f, v in given if name == study.name]
        if not pieces:
            continue
        generic = "-".join([study.name] + [piece for piece in pieces if piece])
        parts.append(study.variant_name(config) if study.variant_name else generic)
    parts += [piece for piece, _ in FIXED_STUDIES]  # an exported file's studies, named at its export
    return "_".join(p for p in parts if p) or "baseline"
