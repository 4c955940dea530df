"""A run's default variant name, built from its study flags, so that hand-started arms logged to one folder do not
pool under one name in analysis. `--variant` overrides it; only a run without study flags is "baseline"."""

from speedrun.backout import backout_variant_name
from speedrun.laurel import laurel_variant_name

SHARED_GROUPS = ("run", "checkpoints")  # make_parser's groups: everything else a track adds is a study flag


def given_study_flags(parser, args):
    """[(group word, flag, value)] of the study flags set on the command line (value not the parser default), in
    parser order. Call it right after parse_args, before the study checks fill in their defaults."""
    given = []
    for group in parser._action_groups:
        if group.title in SHARED_GROUPS or group in (parser._positionals, parser._optionals):
            continue
        for action in group._group_actions:
            value = getattr(args, action.dest)
            if value != action.default:
                given.append((group.title.split()[0], action.option_strings[0], value))
    return given


def flag_piece(prefix, flag, value):
    """One generic name piece: the flag without `--` and the group prefix, then its value (numbers joined on,
    words after a dash, lists joined with +; a switch is its name alone)."""
    name = flag.removeprefix("--").removeprefix(prefix + "-")
    if value is True:
        return name
    if isinstance(value, (list, tuple)):
        value = "+".join(map(str, value))
    if isinstance(value, float):
        return f"{name}{value:g}"
    return f"{name}{value}" if isinstance(value, int) else f"{name}-{value}"


# Groups with a name of their own (the rest, e.g. dlo, get the generic one from the flags as given).
STUDY_NAMERS = dict(backout=backout_variant_name, laurel=laurel_variant_name)


def default_variant(given, args, extra=(), namers=STUDY_NAMERS):
    """`extra` pieces (e.g. a changed layer count), then one part per study group with a given flag: the group's
    namer(args) (args resolved) where it has one, else the generic `group-piece-piece...`; parts joined by `_`."""
    parts = list(extra)
    for group in dict.fromkeys(g for g, _, _ in given):
        if group in namers:
            parts.append(namers[group](args))
        else:
            parts.append("-".join([group] + [flag_piece(group, f, v) for g, f, v in given if g == group]))
    return "_".join(p for p in parts if p) or "baseline"
