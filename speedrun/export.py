"""`--export-script OUT.py`: a run's training script as one standalone file, built from the project's own source.

The file is the training script with every project module it needs inlined above it, in import order, each under
one comment line naming where it came from; the project imports are gone and the plain ones (stdlib, numpy,
torch) are merged at the top. It holds only what the run executes:
- tests the export can decide are folded (folded_tests): `if` statements, conditional expressions and `for` loops
  over an empty registry keep the branch that runs, and the statements a kept `return` leaves unreachable go. They
  decide on the calls of the functions FOLDED_CALLS declares, found by what their name resolves to (the base:
  speedrun.cli.runs_r18; the export flag itself), the fields of the studies that are off (so --base r18's hand
  wiring reaches none of their modules), those of the studies that are on (study_field_folds: their flags are
  fixed in the file, so the code of their other settings goes) and the run flags the file's command line leaves
  out (OMITTED_RUN_FLAGS: their add_argument becomes a set_defaults, their code is folded away);
- the study registry keeps only the studies the run switches on, so the other study modules are never inlined;
  emptied, it is read as `()` (empty_registries_read), and so is a parameter every kept call passes `()` or leaves
  at a default of `()`: it goes from its function and the calls, and a function whose body is then `pass` goes with
  its call statements (decided_calls); so does a parameter of a function or of a method called as `self.name(...)`
  that every call passes one scalar the folds decide (`mode`, passed `cfg.backout_mode`), read as its literal;
- a method whose body computes a constant from folded values (StudyHost.parts_mlp_router: None with no study on) is
  folded where `self.name(...)` calls it, and a local assigned such a value once is read as it, so the tests on it
  fold too (fold_constants); so is `self.NAME` of an upper-case class constant every kept class sets alike
  (class_constants: the small track's USE_SNOO = False);
- every top-level definition nothing kept refers to is dropped (tree-shaking from the script's `__main__` block),
  and every method and class attribute of a kept class that no kept code names and no library base class has
  (Program);
- docstrings are dropped and blank lines made single (the comments stay), as upstream's script reads.
The run's study and track flags become the file's FIXED_FLAGS (speedrun/cli.py), read before its own command
line, which keeps the run flags (seed, log dir, stop-after, preset...). The file writes its own source as the
log's code section, with no module sections. `--from-log LOG` rebuilds the flags from a log's config line. A run
it cannot export is refused in one line, as is modular code that breaks a rule the export relies on (docs/export.md,
"Rules for the modular code", lists each with its check).
Before the file is kept it is checked (verify_export): it and the modular script train the run's arm a few steps of
the tiny preset on CPU, with the same flags and seed; every logged loss and scalar and every final parameter must
be equal, or the export is refused naming the first difference (or the program that failed).
"""

import ast
import collections
import builtins
import functools
import importlib
import io
import itertools
import json
import keyword
import math
import operator
import re
import sys
import tokenize
from dataclasses import dataclass, field, replace
from pathlib import Path

from speedrun.errors import UsageError
from speedrun.flag_scopes import BASE_ONLY_CHOICES, BASE_ONLY_FLAGS, EXPORT_ONLY_FLAGS, choices_help
from speedrun.model import study_parts
from speedrun.r18.studies import r18_study_parts
from speedrun.run_config import MAX_LAYERS
from speedrun.studies import STUDIES
from speedrun.study import NEUTRAL_DEFAULTS, ModelPart, Study, StudyHost, is_set

ROOT = Path(__file__).resolve().parent.parent
PROJECT_PACKAGES = ("speedrun", "data")
# The export's own flags (speedrun/flag_scopes.py), in the parser for --help alone: never in the file.
EXPORT_FLAG, FROM_LOG_FLAG, FORCE_FLAG, CHECK_DIR_FLAG = EXPORT_ONLY_FLAGS
STUDIES_MODULE = "speedrun.studies"  # the module of the STUDIES registry the export prunes
# The script's tuple of its own flags (speedrun.study.Flag), pruned to those the file's command line can vary.
TRACK_FLAGS_NAME = "TRACK_FLAGS"
BASE_FLAG = "--base"  # the medium track's base: one file is one base's
# The comment a pruned registry gets in the file.
REGISTRY_NOTES = {"STUDIES": "the studies its run uses", TRACK_FLAGS_NAME: "the flags its command line can vary"}
# Flags that define the arm rather than the run: fixed in the file (with the study and track flags).
ARM_FLAGS = ("--variant", "--num-layers")
RULE = "# " + "-" * 114


# Each rule reads the text it folds afresh: one export parsed 3,557 texts (521 distinct) and walked ~26 million
# nodes. No rule changes a tree in place (each edits text and parses the result; test_export checks it), so a text is
# parsed once and a node's walk listed once, and every reader shares them: an export in half the time, for ~0.5 GB.
@functools.lru_cache(maxsize=256)  # the distinct texts of most of an export (whole programs among them)
def parse(source, mode="exec"):
    """ast.parse(source, mode=mode), the same tree for the same text: a reader must not change it."""
    return ast.parse(source, mode=mode)


def walk(node):
    """The nodes ast.walk(node) yields, in its order, listed at the first walk of the node and kept on it."""
    try:
        return itertools.chain((node,), node._walked_descendants)
    except AttributeError:
        pass
    nodes = [node]
    for each in nodes:  # breadth first, as ast.walk: the list grows while it is read
        for name in each._fields:
            value = getattr(each, name, None)
            if isinstance(value, ast.AST):
                nodes.append(value)
            elif isinstance(value, list):
                nodes.extend(item for item in value if isinstance(item, ast.AST))
    # Not the node itself: a tree then holds no reference cycle, and one the parse cache lets go is freed at once (in
    # a cycle, each waited for a full collection; the test suite makes one where a module ends: 24-85 CPU-s).
    node._walked_descendants = nodes[1:]
    return iter(nodes)


def is_project(module_name):
    return module_name.split(".")[0] in PROJECT_PACKAGES


def module_path(module_name):
    """The file of a project module (a package's __init__.py)."""
    base = ROOT.joinpath(*module_name.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


# Run flags the file's command line leaves out when the exported run does not give them: the file runs with the
# parser's default (the config's value), and the code only the flag reaches is folded away. Upstream's scripts have none of
# them. --save-final-checkpoint stays: the final weights are how two runs are compared bit for bit
# (tests/scripts/test_export_runs.py) and how a record's model is kept.
OMITTED_RUN_FLAGS = ("--resume", "--init-from", "--checkpoint-every", "--profile-steps")
NEEDS_FLAG = {"--init-schedule": "--init-from"}  # left out with the flag it needs
# kept with the flag that needs it: a run that writes checkpoints every K steps can resume from them
KEPT_WITH = {"--resume": "--checkpoint-every"}
CONFIG_NAMES = ("config", "args", "studies")  # the names the run config has where the code tests its fields
# The fold of a field of a study that is on, read as `X.FIELD` by any receiver that only reads names (the run config,
# the model config `cfg`, `self.cfg`): STUDY_FIELD + FIELD (study_field_folds).
STUDY_FIELD = "."
# The fold holding the (module, function) of each switched-on study's resolve: it reads the study's flags as parsed,
# before their defaults are filled in, so the fields are not folded there.
PARSED_READERS = "(parsed flags)"


def other_bases_only(config, declared):
    """Of a declaration {name: the base that alone runs it}, the names a base other than the run's alone runs, in
    order; none on a track with one base (its config has no base)."""
    base = getattr(config, "base", None)
    return tuple(name for name, only in declared.items() if base is not None and only != base)


def flags_not_offered(config):
    """The flags a file of this run does not offer: --base (the file is one base's, so it is declared no base's
    here) and those BASE_ONLY_FLAGS gives another base (r14's file has no --attention, r18's no --num-layers). A
    track flag goes from the file's TRACK_FLAGS, its field folded to the run's value and logged from
    LEFT_OUT_FIELDS; a shared one's add_argument becomes a set_defaults (omit_arguments)."""
    return other_bases_only(config, {BASE_FLAG: None, **BASE_ONLY_FLAGS})


def choices_not_run(config):
    """(flag, its choices) of BASE_ONLY_CHOICES that a base other than the run's alone runs: the file's parser does not
    offer them (cut_choices)."""
    cuts = ((flag, other_bases_only(config, choices)) for flag, choices in BASE_ONLY_CHOICES.items())
    return tuple((flag, cut) for flag, cut in cuts if cut)


def check_refused_off_base(config, run_argv, resolve_args, track_flags):
    """Raises UsageError where the modular script runs, on this run's base, a flag or choice that a declaration says
    another base alone runs (BASE_ONLY_FLAGS, BASE_ONLY_CHOICES): the file would then lack something the run can do."""
    probes = [(flag, choice) for flag, cut in choices_not_run(config) for choice in cut]
    probes += [(f.name, choice) for f in track_flags if f.name in flags_not_offered(config) and f.name != BASE_FLAG
               for choice in f.options.get("choices", ()) if choice != f.unset]
    for flag, choice in probes:
        try:
            resolve_args([*run_argv, flag, choice])
        except UsageError:
            continue
        raise UsageError(f"{EXPORT_FLAG}: {flag} {choice} is declared another base's (speedrun/flag_scopes.py's "
                         f"BASE_ONLY_FLAGS, BASE_ONLY_CHOICES), but --base {config.base} runs it: fix the declaration")


def omitted_run_flags(run_argv):
    """The run flags of OMITTED_RUN_FLAGS and NEEDS_FLAG that run_argv does not give, sorted."""
    given = {name for name, _ in flag_groups(run_argv)}
    omitted = {flag for flag in OMITTED_RUN_FLAGS if flag not in given and KEPT_WITH.get(flag) not in given}
    omitted |= {flag for flag, needed in NEEDS_FLAG.items() if needed in omitted and flag not in given}
    return tuple(sorted(omitted))


def hashable(value):
    return tuple(value) if isinstance(value, list) else value


# Functions whose every call the export decides, whatever the argument (a read of the run config) and wherever it is
# called from (found by what the name resolves to, not by how the call is spelt): (module, function) -> its value in
# the run of `config`. The file imports no project module, so its log embeds none (runlog.package_sources finds none).
FOLDED_CALLS = {("speedrun.cli", "runs_r18"): lambda config: getattr(config, "base", None) == "r18",
                ("speedrun.cli", "asks_for_export"): lambda config: False,
                ("speedrun.runlog", "package_sources"): lambda config: ()}
R18_BASE = "speedrun.cli.runs_r18(*)"  # its fold: whether the export's base is r18


def folded_call_key(module, function):
    """The fold of every call of a FOLDED_CALLS function (parsed_module gives it each module's name for it)."""
    return f"{module}.{function}(*)"


def left_out_flags(active, not_varied):
    """The flags whose fields the file leaves out of its config (their tests folded, their values logged from
    LEFT_OUT_FIELDS): those of the studies that are off (not in `active`) and the track flags it does not offer."""
    return [*(flag for study in STUDIES if study not in active for flag in study.flags), *not_varied]


def folded_tests(config, omitted=(), active=(), not_varied=()):
    """ast.unparse(expression) -> its value in this export: `if` statements and conditional expressions whose test
    these decide keep only the branch taken. The fields of the studies that are off (not in `active`) fold to their
    value in this run: --base r18's hand wiring (speedrun/r18/studies.py) tests them, and folded, the modules of those
    studies are never reached (and the file's config has no such fields: its registry holds the active studies); so
    do those of the track flags the file does not offer (`not_varied`: flags_not_offered)."""
    folds = {folded_call_key(*function): value(config) for function, value in FOLDED_CALLS.items()}
    for flag in omitted:
        if flag in OMITTED_RUN_FLAGS:  # left out, the flag holds the parser's default: the config's value
            dest = flag[2:].replace("-", "_")
            folds.update({f"{name}.{dest}": hashable(getattr(config, dest)) for name in CONFIG_NAMES})
    if not active:  # the registry is empty, and so is every model's list of study parts
        folds.update({"STUDIES": (), **{parts: () for parts in PARTS_LISTS}})
        # the study contract's hooks (speedrun/study.py's StudyHost, every base's) are then constants in each module
        folds.update(constant_methods(parse(module_path("speedrun.study").read_text()), folds)[0])
    folds.update({f"{name}.{flag.dest}": hashable(getattr(config, flag.dest))
                  for flag in left_out_flags(active, not_varied) for name in CONFIG_NAMES})
    return folds


def is_literal(value):
    """Whether a value is a scalar (is_scalar) or a tuple of scalars: one the tests on a field can be decided with."""
    return is_scalar(value) or isinstance(value, tuple) and all(is_scalar(item) for item in value)


def study_field_folds(active, probes, script_module, fixed=()):
    """The folds of the fields of the studies that are on (their flags are fixed in the file): a field read as
    `X.FIELD` (STUDY_FIELD) is its value wherever a test reads it, as an off study's is. Only a study whose model
    fields are its flags (Study.model_config None: the model config then holds the run's value under the field's
    name), and of it each field that holds one value in every probe config (the run's, and the arm resolved at the
    check's tiny preset and at other depths: a default derived from the model's size or depth stays a read). Its
    resolve function reads the flags as parsed, before their defaults are filled in: it is not folded with them
    (PARSED_READERS, checked by check_study_fields), unless the file fixes its resolution (`fixed`,
    fixed_resolutions): then the file has none."""
    folds, readers = {}, set()
    for study in active:
        if study.model_config is not None:
            continue
        for flag in study.flags:
            values = [hashable(getattr(probe, flag.dest)) for probe in probes]
            if is_literal(values[0]) and all(type(v) is type(values[0]) and v == values[0] for v in values):
                folds[STUDY_FIELD + flag.dest] = values[0]
        resolve = study.resolve
        if resolve.__name__ != "<lambda>" and study not in fixed:  # the default resolves nothing
            readers.add((script_module if resolve.__module__ == "__main__" else resolve.__module__,
                         resolve.__name__))
    return dict(folds, **{PARSED_READERS: tuple(sorted(readers))}) if folds else {}


# The fold key of the switched-on studies' declarations the file rewrites (fixed_resolutions): ((module, name,
# keyword, its new source), ...).
FIXED_DECLARATIONS = "(fixed declarations)"


def fixed_resolutions(config, active, fixed, resolve_args, offers_depth):
    """{study: (resolved values, {preset: ((first, last), ...)}, variant name piece or None)} of the studies that are
    on whose resolution the file holds as the run's values (speedrun/study.py's fixed_resolution): the arm (`fixed`
    flags alone; rule 14: a study's resolution reads its own flags, the preset and the depth) resolved at every
    preset and, where the file offers --num-layers, every depth up to MAX_LAYERS, gives each field of the study
    one value wherever it resolves (and its variant_name one piece); the presets and depths where it resolves are
    the file's, and it refuses the others. A study whose resolution is the default (nothing derived), whose value
    follows the preset or the depth, or whose run (`config`) resolved otherwise keeps its resolve."""
    candidates = [study for study in active if study.resolve.__name__ != "<lambda>"]
    if not candidates:
        return {}
    presets = getattr(sys.modules.get(resolve_args.__module__), "PRESETS", None)  # the track script's
    if not presets:
        return {}
    probes = {}
    for preset in presets:
        for depth in (range(1, MAX_LAYERS + 1) if offers_depth else [None]):
            argv = [*fixed, "--preset", preset] + ([] if depth is None else ["--num-layers", str(depth)])
            try:
                probes[preset, depth] = resolve_args(argv)
            except UsageError:
                continue
    depths = {}  # {preset: [[first, last], ...]}: where the arm resolves
    for (preset, _), probe in probes.items():
        runs = depths.setdefault(preset, [])
        if runs and runs[-1][1] == probe.num_layers - 1:
            runs[-1][1] = probe.num_layers
        else:
            runs.append([probe.num_layers, probe.num_layers])
    depths = {preset: tuple(map(tuple, runs)) for preset, runs in depths.items()}
    found = {}
    for study in candidates:
        values = {(tuple(hashable(getattr(c, flag.dest)) for flag in study.flags),
                   study.variant_name(c) if study.variant_name else None) for c in probes.values()}
        ran = (tuple(hashable(getattr(config, flag.dest)) for flag in study.flags),
               study.variant_name(config) if study.variant_name else None)
        if values != {ran} or not all(is_literal_source(value) for value in
                                      [*(getattr(config, flag.dest) for flag in study.flags), ran[1]]):
            continue
        found[study] = ({flag.dest: getattr(config, flag.dest) for flag in study.flags}, depths, ran[1])
    return found


def is_literal_source(value):
    """Whether repr(value) is a literal that reads back as the value (what the file can spell)."""
    try:
        return ast.literal_eval(repr(value)) == value
    except (ValueError, SyntaxError):
        return False


def every_study_fixed(active, resolutions):
    """Rule 16: whether the file's run has studies on and fixed_resolutions holds every one's resolution, each
    naming its variant piece and taking its model fields from its flags (no model_config=): the file's command line
    then offers no study, and the studies' declarations give the model their values."""
    return bool(active) and all(study in resolutions and resolutions[study][2] is not None
                                and study.model_config is None for study in active)


# Study's tests of what a declaration gives (its methods'), decided where every declaration of the file is
# rewritten by rule 16: each then gives its model fields (none derived from flags) and its model_config.
FIELDS_DERIVED = "self.model_fields is None"
OWN_MODEL_CONFIG = "self.model_config is not None"


def declaration_rewrites(resolutions, fixed_arm):
    """The FIXED_DECLARATIONS fold of fixed_resolutions: in the module that declares each study (declared_where), its
    Study(...) call's resolve= becomes fixed_resolution(values, depths) and its variant_name= a lambda of the piece
    (rule 14); with every study fixed (rule 16, `fixed_arm`), resolve= becomes a model_config= of the values and
    variant_name= goes (the file's command line offers no study: FIXED_STUDIES checks the depth, names the run)."""
    rewrites, every_gives_fields = [], fixed_arm
    for study, (values, depths, piece) in resolutions.items():
        module, name = declared_where(study)
        indent = " " * 8  # the call's arguments under the declaration's keywords (at 4)
        if fixed_arm:  # keywords of their own lines (rewritten_declarations), at 4
            given = "\n".join(packed_dict("    model_config=lambda model_cfg, config: ", values, indent, WIDTH - 2))[4:]
            rewrites += [(module, name, "resolve", given), (module, name, "variant_name", None)]
            # its flags are none of the file's: the model fields they give, as literals
            fields = [f"({field!r}, {kind.__name__}, {default!r})" for field, kind, default in study.model_fields]
            if all(kind.__module__ == "builtins" and is_literal_source(default)
                   for _, kind, default in study.model_fields):
                closing = ",)" if len(fields) == 1 else ")"  # a tuple of one
                rewrites.append((module, name, "flags", "\n".join(packed_items("    flags=(), model_fields=(", fields,
                                                                               closing, indent, WIDTH - 2))[4:]))
            else:
                every_gives_fields = False
            continue
        resolution = packed_dict(indent, values, indent + " ") + [f"{indent}{depths!r})"]
        rewrites.append((module, name, "resolve", "\n".join(["resolve=fixed_resolution(", *resolution[:-2],
                                                               resolution[-2] + ","] + resolution[-1:])))
        if piece is not None:
            rewrites.append((module, name, "variant_name", f"variant_name=lambda config: {piece!r}"))
    if not rewrites:
        return {}
    given = {OWN_MODEL_CONFIG: True} if fixed_arm else {}
    return {FIXED_DECLARATIONS: tuple(rewrites), **given, **({FIELDS_DERIVED: False} if every_gives_fields else {})}


# The fold key of the functions a file holds as the run's value (rule 31): ((module, function, the source of its
# value, ((class, its module), ...) the value names), ...).
WRITTEN_FUNCTIONS = "(functions written as the run's value)"


def built_parts_written(active, fixed_arm, on_r18=False):
    """Rule 31: the WRITTEN_FUNCTIONS fold of speedrun.model.study_parts, the parts a model builds, as the run's where
    every model the file builds holds them: its command line turns no study on or off (none on, or every one fixed:
    rule 16), and no part builds a model of another config (ModelPart.base_config: DLO counts and expands from its
    base, which holds no DLO part). The model then builds them by name, and the registry is not read for it. With
    them, BUILT_PARTS: the parts' classes on the run's base (on_r18: Study.r18_part; R18GPT builds them itself)."""
    parts = sorted([study for study in active if study.model_part is not None],
                   key=lambda study: study.model_part.built_last)
    classes = [study.r18_part if on_r18 else study.model_part for study in parts]
    every_class = [*classes, *(study.model_part for study in parts)]
    if (active and not fixed_arm) or any(cls is None or cls.base_config is not ModelPart.base_config
                                         or not is_project(cls.__module__) for cls in every_class):
        return {}
    functions = [(study_parts, [study.model_part for study in parts])]
    if on_r18:  # R18GPT builds the studies' r18 parts, by speedrun.r18.studies.r18_study_parts
        functions.append((r18_study_parts, classes))
    written = tuple((function.__module__, function.__name__,
                     "[" + ", ".join(f"({study.name!r}, {cls.__name__})" for study, cls in zip(parts, built)) + "]",
                     tuple((cls.__name__, cls.__module__) for cls in built)) for function, built in functions)
    built = tuple((study.name, cls.__module__, cls.__name__) for study, cls in zip(parts, classes))
    return {WRITTEN_FUNCTIONS: written, BUILT_PARTS: built}


# The fold holding (study name, module, class) of each part the file's model builds, in build order, where rule 31
# wrote them (none: the registry decides).
BUILT_PARTS = "(the parts the file's model builds)"


def fixed_field_values(folds):
    """{field: value} of the study fields the folds hold (STUDY_FIELD: study_field_folds)."""
    return {key[len(STUDY_FIELD):]: value for key, value in folds.items() if key.startswith(STUDY_FIELD)}


# The fold key of rule 32: every read of a field of a study that is on is its literal (the model config has none).
FIELDS_EVERYWHERE = "(study fields read as literals everywhere)"


def registry_unread(active, folds):
    """Rule 32: whether the file's model config can hold no study field, so that its registry goes (the model config
    is the baseline's): rule 31 wrote the parts the model builds, on the #14 or small track's model (r18's builds its
    parts from the registry), and every model field of each study that is on holds one value in every probe config
    (STUDY_FIELD), which every read of it then is."""
    return bool(active) and WRITTEN_FUNCTIONS in folds and not folds.get(R18_BASE, False) and all(
        STUDY_FIELD + name in folds for study in active for name, _, _ in study.model_fields)


def study_fields_read_as_literals(text, folds):
    """Rule 32 on the whole file, once the modules' rules have decided what they do with a study field's reads (rule
    22 decides a parameter by the field a call passes): each read `X.FIELD` left of a field the folds hold
    (STUDY_FIELD) is its literal, the model config holding no such field."""
    if not folds.get(FIELDS_EVERYWHERE, False):
        return text
    fields = fixed_field_values(folds)
    tree = parse(text)
    called = {id(n.func) for n in walk(tree) if isinstance(n, ast.Call)}  # a method of that name is no field
    edits = [(n, repr(fields[n.attr])) for n in walk(tree) if isinstance(n, ast.Attribute)
             and isinstance(n.ctx, ast.Load) and n.attr in fields and reads_config(n.value) and id(n) not in called]
    return replace_spans(text, edits) if edits else text


def written_functions(source, written, where):
    """The source with each function of WRITTEN_FUNCTIONS (a top-level def; a missing one is refused) returning its
    value: its body a lazy import of each class the value names and `return VALUE`."""
    tree, edits = parse(source), []
    for name, value, classes in written:
        found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name]
        if not found:
            raise UsageError(f"{EXPORT_FLAG}: {where}: no top-level function {name}, which the export writes as the "
                             f"run's value (docs/export.md, rule 31)")
        body = found[0].body
        indent = "\n" + " " * body[0].col_offset
        lines = [f"from {module} import {cls}" for cls, module in classes] + [f"return {value}"]
        edits.append((span((body[0].lineno, body[0].col_offset), (body[-1].end_lineno, body[-1].end_col_offset)),
                      indent.join(lines)))
    return replace_spans(source, edits)


def rewritten_declarations(source, rewrites, where):
    """The source with the keyword arguments of FIXED_DECLARATIONS rewritten (each `NAME = Study(...)` at module
    level; a missing one is refused): each replaced by its new source, or cut where that is None; and the import of
    fixed_resolution where a new one calls it."""
    tree, lines = parse(source), source.split("\n")
    edits = []
    for name, keyword, new in rewrites:
        call = study_declaration(tree, name)
        found = [k for k in (call.keywords if call is not None else []) if k.arg == keyword]
        if not found:
            raise UsageError(f"{EXPORT_FLAG}: {where}: {name} is no `{name} = Study(..., {keyword}=...)` at module "
                             f"level, which the export rewrites to the run's resolved values (docs/export.md, rule 14)")
        items = sorted(call.args + call.keywords, key=lambda n: (n.lineno, n.col_offset))
        at = items.index(found[0])
        if new is not None and "\n" in new and at and items[at - 1].end_lineno == found[0].lineno:
            # lines of their own, at the column of the call's keywords that start theirs (else 4)
            column = min((k.col_offset for i, k in enumerate(items)
                          if (items[i - 1].end_lineno if i else call.lineno) < k.lineno), default=4)
            edits.append((span((items[at - 1].end_lineno, items[at - 1].end_col_offset),
                               (found[0].end_lineno, found[0].end_col_offset)), f",\n{' ' * column}{new}"))
            continue
        if new is not None:  # the comment lines right above a keyword that starts its line were about it: they go
            first = first_line_with_comments(lines, found[0]) if not at or \
                items[at - 1].end_lineno < found[0].lineno else found[0].lineno
            edits.append((span((first, found[0].col_offset), (found[0].end_lineno, found[0].end_col_offset)), new))
            continue
        edits += cut_items(items, {at})
    text = replace_spans(source, edits)
    if not any(new and "fixed_resolution(" in new for _, _, new in rewrites):
        return text
    lines = text.split("\n")
    lines.insert(declaration_statement(parse(text), rewrites[0][0]).lineno - 1,
                 "from speedrun.study import fixed_resolution")
    return "\n".join(lines)


# The fold key of the switched-on studies' declarations whose texts for --help the file never shows: ((module, name
# of its `NAME = Study(...)`), ...). Its command line refuses every flag of theirs, so argparse drops their help and
# their groups, and the group's description is read only where nothing is fixed (cli.make_parser).
QUIET_DECLARATIONS = "(help texts the file never shows)"
WIDTH = 118  # the project's line length


def declared_where(study):
    """(module, name) of a registered study's `NAME = Study(...)`: where speedrun/studies.py imports it from."""
    registry = parse(module_path(STUDIES_MODULE).read_text())
    return next((node.module, alias.name) for node in registry.body if isinstance(node, ast.ImportFrom)
                for alias in node.names if getattr(importlib.import_module(node.module), alias.name) is study)


def declaration_statement(tree, name):
    """The statement `name = Study(...)` (any call) at module level, or None."""
    return next((node for node in tree.body if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                 and [ast.unparse(t) for t in node.targets] == [name]), None)


def study_declaration(tree, name):
    """The Study(...) call of `name = Study(...)` at module level, or None."""
    statement = declaration_statement(tree, name)
    return None if statement is None else statement.value


def declared_flags(tree, call):
    """The Flag(...) calls of a Study(...) call's flags: its `flags=` tuple, or the module-level one it names."""
    flags = next((k.value for k in call.keywords if k.arg == "flags"), None)
    if isinstance(flags, ast.Name):
        flags = next((node.value for node in tree.body if isinstance(node, ast.Assign)
                      and [ast.unparse(t) for t in node.targets] == [flags.id]), None)
    return [] if flags is None else [n for n in walk(flags) if isinstance(n, ast.Call)
                                     and ast.unparse(n.func) == "Flag"]


def quiet_declarations(source, names):
    """The source with the help texts of the studies `names` emptied: each of their Flag(...)s' help becomes ""
    (the call then on one line where it fits and holds no comment), and each Study's `description=` goes."""
    tree = parse(source)
    edits = []
    for call in (study_declaration(tree, name) for name in names):
        if call is None:
            continue
        items = sorted(call.args + call.keywords, key=lambda n: (n.lineno, n.col_offset))
        edits += cut_items(items, {i for i, item in enumerate(items) if getattr(item, "arg", None) == "description"})
        for flag in declared_flags(tree, call):
            help_node = next((k.value for k in flag.keywords if k.arg == "help"),
                             flag.args[1] if len(flag.args) > 1 else None)
            if isinstance(help_node, ast.Constant) and help_node.value != "":
                edits.append((help_node, '""'))
    text = replace_spans(source, edits) if edits else source
    tree, lines, edits = parse(text), text.split("\n"), []
    for call in (study_declaration(tree, name) for name in names):
        for flag in declared_flags(tree, call) if call is not None else ():
            written = ast.get_source_segment(text, flag)
            joined = " ".join(part.strip() for part in written.split("\n")).replace("( ", "(")
            rest = len(lines[flag.end_lineno - 1].encode()) - flag.end_col_offset
            if "\n" in written and "#" not in written and flag.col_offset + len(joined.encode()) + rest <= WIDTH \
                    and ast.dump(parse(joined)) == ast.dump(parse(written)):
                edits.append((flag, joined))
    return replace_spans(text, edits) if edits else text


def own_setter(statement):
    """The field a statement `object.__setattr__(self, "FIELD", ...)` sets (a frozen dataclass's __post_init__), or
    None."""
    call = statement.value if isinstance(statement, ast.Expr) else None
    if isinstance(call, ast.Call) and ast.unparse(call.func) == "object.__setattr__" and len(call.args) == 3 \
            and ast.unparse(call.args[0]) == "self" and isinstance(call.args[1], ast.Constant):
        return call.args[1].value
    return None


def library_classes(tree):
    """The names the file's top-level `from MODULE import NAME` statements bind to a class of a library (every import
    of an exported file is a library's: the project's modules are inlined)."""
    found = set()
    for statement in tree.body:
        if isinstance(statement, ast.ImportFrom) and statement.module and not statement.level:
            for alias in statement.names:
                try:
                    value = getattr(importlib.import_module(statement.module), alias.name)
                except (ImportError, AttributeError):
                    continue
                if isinstance(value, type) and value.__module__.split(".")[0] != "speedrun":
                    found.add(alias.asname or alias.name)
    return found


def is_study_call(node):
    """Whether an ast node is a `Study(...)` call: a declaration, or its rewrite by rule 16."""
    return isinstance(node, ast.Call) and ast.unparse(node.func) == Study.__name__


def names_read(tree, skipped, keywords=False):
    """The names a syntax tree reads as attributes or strings (with keywords: as a call's keywords too), leaving
    out the nodes whose id() is in skipped (what declares or passes the names asked about reads none of them)."""
    read = set()
    for node in walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Attribute):
            read.add(node.attr)
        elif keywords and isinstance(node, ast.keyword):
            read.add(node.arg)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            read.add(node.value)
    return read


def without_unread_study_fields(text):
    """The file's text without the fields of Study (speedrun/study.py's class, the declarations' one form) that
    nothing in it reads (rule 17): each one's declaration with the comment lines above it, its keyword in every
    Study(...) call and the __post_init__ statement that sets it (`object.__setattr__(self, "title", ...)`). A
    field counts as read where its name is an attribute (but of a library class's instance made in place:
    `Path(p).resolve()`), a string or a keyword of a `replace(...)` anywhere else in the file (a name cannot read a
    field); one a positional argument of a call passes stays, as do all where a call
    passes `**` keywords or the file calls asdict, astuple or fields of anything but another class's `self`. A
    __post_init__ left setting nothing goes."""
    tree = parse(text)
    study = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == Study.__name__), None)
    if study is None:
        return text
    order = [item.target.id for item in study.body if isinstance(item, ast.AnnAssign)
             and isinstance(item.target, ast.Name)]
    declarations = {item.target.id: item for item in study.body if isinstance(item, ast.AnnAssign)}
    post_init = next((m for m in study.body if isinstance(m, ast.FunctionDef) and m.name == "__post_init__"), None)
    setters = {field: s for s in (post_init.body if post_init else ()) for field in [own_setter(s)]
               if field in declarations}
    calls = [n for n in walk(tree) if is_study_call(n)]
    positional = max((len(call.args) for call in calls), default=0)
    keywords = collections.defaultdict(list)  # field -> its keywords in the Study(...) calls (passing is no read)
    for call in calls:
        for keyword in call.keywords:
            keywords[keyword.arg].append(keyword)
    if None in keywords:  # Study(**given): which fields a call passes is not in its text
        return text
    # asdict, astuple and fields read every field of what they are given: allowed only of another class's self
    whole = [n for n in walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).split(".")[-1]
             in ("asdict", "astuple", "fields")]
    if any(ast.unparse(n.args[0]) != "self" if n.args else True for n in whole) or \
            any(n in whole for n in walk(study)):
        return text
    # dataclasses.replace(study, title=...) builds a Study with the fields it names
    replaced = {k.arg for n in walk(tree) if isinstance(n, ast.Call) and ast.unparse(n.func).endswith("replace")
                for k in n.keywords}
    unread = set(order[positional:]) - replaced
    # `Path(p).resolve()` reads a Path's attribute: an instance of a library class is no Study
    foreign = {id(n) for n in walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Call)
               and isinstance(n.value.func, ast.Name) and n.value.func.id in library_classes(tree)}
    while True:  # a field read only where another unread one is set or declared is unread too
        skipped = {id(n) for name in unread for owner in (declarations[name], setters.get(name),
                                                          *keywords.get(name, ())) if owner is not None
                   for n in walk(owner)}
        read = names_read(tree, skipped | foreign)
        still = {name for name in unread if name not in read}
        if still == unread:
            break
        unread = still
    if not unread and not (post_init and [type(s) for s in post_init.body] == [ast.Pass]):
        return text
    edits = []
    for call in calls:
        items = sorted(call.args + call.keywords, key=lambda n: (n.lineno, n.col_offset))
        edits += cut_items(items, {i for i, item in enumerate(items) if getattr(item, "arg", None) in unread})
    text = replace_spans(text, edits) if edits else text
    tree = parse(text)
    study = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == Study.__name__)
    post_init = next((m for m in study.body if isinstance(m, ast.FunctionDef) and m.name == "__post_init__"), None)
    gone = [item for item in study.body if isinstance(item, ast.AnnAssign) and item.target.id in unread]
    gone += [s for s in (post_init.body if post_init else ()) if own_setter(s) in unread]
    if post_init and all(s in gone or isinstance(s, ast.Pass) for s in post_init.body):
        gone = [s for s in gone if s not in post_init.body] + [post_init]  # sets nothing: the dataclass calls none
    return without_statements(text, tree, gone)


def class_members(cls):
    """{name: its statement} of the methods and the plain class attributes (`flag = False`) a class body defines."""
    members = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
    members.update({m.targets[0].id: m for m in cls.body if isinstance(m, ast.Assign) and len(m.targets) == 1
                    and isinstance(m.targets[0], ast.Name)})
    return members


def without_shadowed_methods(text):
    """The file's text without the members no instance can read (rule 18): of a class the file names only as a base
    of its other classes (never called, instantiated or otherwise read), each method or class attribute that every
    class deriving from it directly defines too, unless some code reads it through `super()` (ModelPart's
    `head_input` where backout, the one part, answers it). A class defines its subclasses' fallbacks; with every
    subclass answering, none is asked. So too one that no code asks of them: each read of it is `self.NAME` in a
    method of a class outside its family (none of them derives from that class; the model's own `head_input`
    where no part answers it), no string is the name, and no library object has it (nn.Module calls `forward`)."""
    tree = parse(text)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    only_bases = named_only_as_bases(tree, classes)
    through_super = {n.attr for n in walk(tree) if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Call)
                     and ast.unparse(n.value.func) == "super"}
    strings = strings_in([tree])
    own_reads = own_attribute_reads(classes)
    attribute_reads = collections.defaultdict(list)
    for node in walk(tree):
        if isinstance(node, ast.Attribute):
            attribute_reads[node.attr].append(node)
    gone = []
    for name, cls in classes.items():
        if name not in only_bases:
            continue
        subclasses = [c for c in classes.values() if any(ast.unparse(b) == name for b in c.bases)]
        defined = [set(class_members(c)) for c in subclasses]
        family = derived_classes(classes, name)
        for member, m in class_members(cls).items():
            if member in through_super:
                continue
            reads = attribute_reads[member]
            # every subclass answers it; or nothing asks it of one: each read is `self.member` in a class none of
            # them derives from, nor derives from it (the model's own head_input beside ModelPart's)
            if all(member in names for names in defined) or reads and member not in strings | foreign_attributes() \
                    and all(id(read) in own_reads and not derived_classes(classes, own_reads[id(read)]) & family
                            for read in reads):
                gone.append(m)
    return without_empty_bases(without_statements(text, tree, gone))


def named_only_as_bases(tree, classes):
    """The names of `classes` ({name: ClassDef}) the tree names, and names only in the bases of its classes (never
    called, instantiated or otherwise read)."""
    as_bases = {id(base) for cls in classes.values() for base in cls.bases}
    named = collections.defaultdict(list)
    for node in walk(tree):
        if isinstance(node, ast.Name) and node.id in classes:
            named[node.id].append(node)
    return {name for name, nodes in named.items() if all(id(n) in as_bases for n in nodes)}


def derived_classes(classes, name):
    """The names of the class `name` and of every class of `classes` ({name: ClassDef}) deriving from it."""
    family, grown = {name}, True
    while grown:
        more = {c.name for c in classes.values() if any(ast.unparse(b) in family for b in c.bases)} - family
        family |= more
        grown = bool(more)
    return family


def own_attribute_reads(classes):
    """{id of a `self.NAME` node: the name of the class} for the reads of `self` in the methods of `classes`
    ({name: ClassDef}) that hold no class of their own (whose `self` would be another)."""
    found = {}
    for name, cls in classes.items():
        for method in (m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))):
            if any(isinstance(n, ast.ClassDef) for n in walk(method)):
                continue
            found.update({id(n): name for n in walk(method) if isinstance(n, ast.Attribute)
                          and isinstance(n.value, ast.Name) and n.value.id == "self"})
    return found


def without_empty_bases(text):
    """The file's text without each class it names only as a base whose body is left `pass` (ModelPart once rule 18
    and the passive members have emptied it) and that has one base at most: each class deriving from it derives from
    that base in its place (none where it lists that base already); the order of the others is kept, so is the MRO
    less the empty class."""
    tree = parse(text)
    classes = {n.name: n for n in tree.body if isinstance(n, ast.ClassDef)}
    only_bases = named_only_as_bases(tree, classes)
    edits = []
    for name, cls in classes.items():
        if name not in only_bases or len(cls.bases) > 1 or cls.keywords \
                or cls.decorator_list or [type(s) for s in cls.body] != [ast.Pass]:
            continue
        base = ast.unparse(cls.bases[0]) if cls.bases else None
        for sub in (c for c in classes.values() if any(ast.unparse(b) == name for b in c.bases)):
            listed = [ast.unparse(b) for b in sub.bases]
            (position,) = [i for i, b in enumerate(listed) if b == name]
            edits += cut_items(sub.bases, {position}) if base is None or base in listed else \
                [(sub.bases[position], base)]
    if not edits:
        return text
    text = re.sub(r"^(class \w+)\(\):", r"\1:", replace_spans(text, edits), flags=re.M)  # no base left: no `()`
    tree = parse(text)
    read = {n.id for n in walk(tree) if isinstance(n, ast.Name)}
    return without_statements(text, tree, [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name not in read
                                           and n.name in classes and [type(s) for s in n.body] == [ast.Pass]])


# Calls that set or delete an attribute named by their argument, and attributes that reach an object's attributes
# wholesale (so does `vars(self)`): a file with one of them naming no literal keeps every attribute test and read
# (rule 19).
NAMED_SETTERS = ("setattr", "delattr", "register_buffer", "register_parameter", "add_module", "register_module")
WHOLESALE_ATTRIBUTES = ("__dict__", "__setattr__", "__delattr__")


def without_overwritten_locals(text):
    """The source without each assignment of a local that only reads (`x = None`) which the next statement of its
    block assigns again without reading it (what rule 19 leaves of `x = None` then `if self.mode == "sum": x = ...`);
    not a global or nonlocal, nor one a function or lambda inside reads (the second value may call it)."""
    tree = parse(text)
    gone = []
    for function in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        shared = set(global_names(function))
        shared |= {n.id for n in nodes_in_nested_scopes(function) if isinstance(n, ast.Name)}
        for block in own_blocks(function):
            for first, then in zip(block, block[1:]):
                if isinstance(first, ast.Assign) and isinstance(then, ast.Assign) and len(first.targets) == 1 \
                        and isinstance(first.targets[0], ast.Name) and only_reads(first.value) \
                        and [ast.unparse(target) for target in then.targets] == [first.targets[0].id] \
                        and first.targets[0].id not in names_in([then.value]) | shared:
                    gone.append(first)
    return without_statements(text, tree, gone) if gone else text


# An expression whose source parses as one operand wherever it is written: brackets of its own, or none needed (a
# generator expression's span holds its parentheses, even as a call's one argument).
ONE_OPERAND = (ast.Name, ast.Attribute, ast.Call, ast.Subscript, ast.Constant, ast.List, ast.Dict, ast.Set,
               ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def nodes_in_nested_scopes(node):
    """The nodes inside a function, lambda or class that `node` defines within itself (node itself not counted):
    their names are their own scope's, and they run when called, not where written."""
    return [inner for scope in walk(node) if scope is not node
            and isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
            for inner in walk(scope)]


def evaluated_once_in(statement, node):
    """Whether `node`, inside `statement`, is evaluated once when the statement runs: not in a loop's body, a
    lambda, a nested function or a comprehension past its first sequence."""
    parents = {id(child): parent for parent in walk(statement) for child in ast.iter_child_nodes(parent)}
    child, parent = node, parents.get(id(node))
    while parent is not None:
        if isinstance(parent, (ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                or isinstance(parent, (ast.For, ast.While)) and child is not getattr(parent, "iter", None) \
                or isinstance(parent, (ast.ListComp, ast.SetComp, ast.GeneratorExp, ast.DictComp)) \
                and not (isinstance(child, ast.comprehension) and child is parent.generators[0]) \
                or isinstance(parent, ast.comprehension) and child is not parent.iter:
            return False
        child, parent = parent, parents.get(id(parent))
    return True


def without_single_use_aliases(text):
    """The file's text with each local read once written in its one read (rule 20), again until none is left:
    - a name or an attribute chain (`cfg = self.cfg`, `moved = source`) read once, in a later statement of its
      block that runs it once, where the statements between only assign names it does not read, from values that
      evaluate nothing;
    - any value assigned and then returned by the next statement (`out = f(x)` then `return out`);
    - a value that needs no brackets of its own (a call, an item, a display), read once in the next statement,
      which evaluates it there first and once (moves_into), both on one line that stays within WIDTH, no comment
      of the assignment's own lost (`source = outputs[11]` then `moved = norm(source)`);
    - a list display of a local extended by the next statement's `.append(x)`, x reading neither the local nor
      anything that could (`vectors = []` then `vectors.append(v)` is `vectors = [v]`)."""
    while True:
        tree = parse(text)
        lines = text.split("\n")
        found = None
        for function in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            names = [n.id for n in walk(function) if isinstance(n, ast.Name)] + declared_names(function)
            for block in own_blocks(function):
                for i, statement in enumerate(block):
                    then = block[i + 1] if i + 1 < len(block) else None
                    appended = appended_item(function, statement, then, text, lines)
                    if appended is not None:
                        text = replace_spans(text, [(statement.value, appended)])
                        text = without_statements(text, parse(text), [
                            n for n in walk(parse(text)) if isinstance(n, ast.Expr)
                            and n.lineno == then.lineno and n.col_offset == then.col_offset])
                        found = True
                        break
                    single = isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                        and isinstance(statement.targets[0], ast.Name)
                    if not (single and names.count(statement.targets[0].id) == 2):
                        continue  # a local stored once and read once
                    local, value = statement.targets[0].id, statement.value
                    if isinstance(then, ast.Return) and isinstance(then.value, ast.Name) and then.value.id == local:
                        found = (statement, then.value, value)
                        break
                    use = [n for n in walk(then) if isinstance(n, ast.Name) and n.id == local] if then else []
                    if use and moves_into(then, use[0]) and fits_one_line(text, lines, statement, then, local):
                        found = (statement, use[0], value)
                        break
                    if not (isinstance(value, (ast.Name, ast.Attribute)) and only_reads(value)):
                        continue
                    for later in block[i + 1:]:
                        use = [n for n in walk(later) if isinstance(n, ast.Name) and n.id == local]
                        if use:
                            found = (statement, use[0], value) if evaluated_once_in(later, use[0]) else None
                            break
                        if not (isinstance(later, ast.Assign) and evaluates_nothing(later.value) and all(
                                isinstance(t, ast.Name) and t.id not in names_in([value]) for t in later.targets)):
                            break
                    if found:
                        break
                if found:
                    break
            if found:
                break
        if found is None:
            return text
        if found is True:  # a list display extended in place
            continue
        statement, use, value = found
        text = replace_spans(text, [(use, ast.get_source_segment(text, value))])
        text = without_statements(text, parse(text), [n for n in walk(parse(text))
                                                          if isinstance(n, ast.Assign) and n.lineno == statement.lineno
                                                          and n.col_offset == statement.col_offset])


# What may be evaluated before a moved value without seeing what it does: reads of names, attributes and constants.
PURE_READS = (ast.Name, ast.Attribute, ast.Constant, ast.keyword, ast.expr_context, ast.operator, ast.unaryop,
              ast.cmpop)
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)


def evaluated_before(parent, child):
    """The parts of `parent` evaluated before its part `child` when `parent` is, or None where `child` is not
    evaluated then once and unconditionally (a conditional expression, `and`/`or`, a chained comparison, a lambda,
    a comprehension past its first sequence, an assignment's target)."""
    if isinstance(parent, ast.Call):
        order = [parent.func, *parent.args, *parent.keywords]  # positional arguments before keywords, each in order
    elif isinstance(parent, ast.BinOp):
        order = [parent.left, parent.right]
    elif isinstance(parent, ast.Subscript):
        order = [parent.value, parent.slice]
    elif isinstance(parent, (ast.Tuple, ast.List)):
        order = parent.elts
    elif isinstance(parent, ast.Compare) and len(parent.ops) == 1:
        order = [parent.left, *parent.comparators]
    elif isinstance(parent, (ast.Attribute, ast.Starred, ast.keyword, ast.Expr, ast.Return, ast.Assign)):
        order = [parent.value]
    elif isinstance(parent, ast.UnaryOp):
        order = [parent.operand]
    elif isinstance(parent, COMPREHENSIONS):  # its first sequence is evaluated before the comprehension runs
        order = parent.generators[:1]
    elif isinstance(parent, ast.comprehension):
        order = [parent.iter]
    else:
        return None
    index = next((i for i, part in enumerate(order) if part is child), None)
    return None if index is None else order[:index]


def moves_into(statement, use):
    """Whether the value of a local assigned right before `statement` and read once, at `use` in it, may be written
    there: the statement is an assignment, expression or return that evaluates `use` once and unconditionally
    (evaluated_before), and what it evaluates before it only reads names, attributes and constants (so cannot see
    what the value does; what it evaluates after saw the value done before, as it will); not as what a call calls."""
    if not isinstance(statement, (ast.Assign, ast.Expr, ast.Return)):
        return False
    parents = {id(child): parent for parent in walk(statement) for child in ast.iter_child_nodes(parent)}
    node = use
    if isinstance(parents[id(use)], ast.Call) and parents[id(use)].func is use:
        return False  # `make(x)(y)` reads worse than the name it was given
    while node is not statement:
        parent = parents[id(node)]
        before = evaluated_before(parent, node)
        if before is None or not all(isinstance(n, PURE_READS) for part in before for n in walk(part)):
            return False
        node = parent
    return True


def fits_one_line(text, lines, statement, then, local):
    """Whether writing the value of `statement` (a local's one-line assignment, no comment of its own: none on its
    line or right above it) in place of `local` in `then` (one line) keeps `then` one line within WIDTH."""
    value = statement.value
    if not isinstance(value, ONE_OPERAND) or statement.lineno != statement.end_lineno \
            or then.lineno != then.end_lineno or any(isinstance(n, (ast.NamedExpr, ast.Yield, ast.YieldFrom,
                                                                    ast.Await)) for n in walk(value)):
        return False
    after = lines[statement.lineno - 1].encode()[statement.end_col_offset:].decode()  # ast counts UTF-8 bytes
    if after.strip() or first_line_with_comments(lines, statement) != statement.lineno:
        return False
    source = ast.get_source_segment(text, value)
    return len(lines[then.lineno - 1]) - len(local) + len(source) <= WIDTH


def appended_item(function, statement, then, text, lines):
    """The new source of a list display `statement` assigns a local (`vectors = [...]`) where `then`, the next
    statement, appends one item to it (`vectors.append(v)`): the display with that item last; else None. The item
    reads no name of the local, and nothing it calls can (the local is the function's own: no global, nonlocal or
    parameter of that name, no nested function or lambda naming it); both one line each, the result within WIDTH."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.List)
            and isinstance(then, ast.Expr) and isinstance(then.value, ast.Call)):
        return None
    local, call = statement.targets[0].id, then.value
    if not (isinstance(call.func, ast.Attribute) and call.func.attr == "append"
            and isinstance(call.func.value, ast.Name) and call.func.value.id == local
            and len(call.args) == 1 and not call.keywords and not isinstance(call.args[0], (ast.Starred, ast.Tuple))):
        return None
    item = call.args[0]
    if any(isinstance(n, ast.Name) and n.id == local for n in [*walk(item), *nodes_in_nested_scopes(function)]) \
            or local in declared_names(function) or statement.lineno != statement.end_lineno \
            or then.lineno != then.end_lineno:
        return None
    items = [ast.get_source_segment(text, e) for e in statement.value.elts] + [ast.get_source_segment(text, item)]
    display = "[" + ", ".join(items) + "]"
    line = lines[statement.lineno - 1]
    return display if len(line) - len(ast.get_source_segment(text, statement.value)) + len(display) <= WIDTH else None


def without_string_locals(text):
    """Rule 20: a local assigned one string literal in its function's own block, stored nowhere else and read only
    as a whole replacement field of one-line f-strings after it (`{suffix}`: no conversion, no format spec) is
    written into them, its assignment gone (LAuReL's `suffix = ""` of its other RW form: `f"{key}.alpha"`); not in
    a function that reads its own namespace."""
    tree = parse(text)
    edits, gone = [], []
    for function in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        if reads_own_namespace(function):
            continue
        names = [n for n in walk(function) if isinstance(n, ast.Name)]
        declared = declared_names(function)
        fields = {id(n.value): n for n in walk(function) if isinstance(n, ast.FormattedValue)
                  and n.conversion == -1 and n.format_spec is None and isinstance(n.value, ast.Name)}
        strings = {id(f): s for s in walk(function) if isinstance(s, ast.JoinedStr) and s.lineno == s.end_lineno
                   for f in s.values}
        for statement in function.body:
            if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                    and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Constant)
                    and isinstance(statement.value.value, str)):
                continue
            local, value = statement.targets[0].id, statement.value.value
            reads = [n for n in names if n.id == local and n is not statement.targets[0]]
            if local in declared or not reads or any(
                    not isinstance(n.ctx, ast.Load) or id(n) not in fields or id(fields[id(n)]) not in strings
                    or n.lineno <= statement.lineno for n in reads):
                continue
            gone.append(statement)
            for joined in {id(strings[id(fields[id(n)])]): strings[id(fields[id(n)])] for n in reads}.values():
                edits.append((joined, string_with_fields(joined, local, value)))
    if not gone:
        return text
    positions = {(s.lineno, s.col_offset) for s in gone}
    text = replace_spans(text, edits)  # each f-string on its own line: the statements keep their lines
    tree = parse(text)
    return without_statements(text, tree, [n for n in walk(tree) if isinstance(n, ast.Assign)
                                           and (n.lineno, n.col_offset) in positions])


def string_with_fields(joined, local, value):
    """The source of an f-string with each `{local}` field its text `value` (a plain string where no field is left),
    in double quotes where it holds none."""
    parts = []
    for part in joined.values:
        if isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.Name) and part.value.id == local:
            part = ast.Constant(value)
        if isinstance(part, ast.Constant) and parts and isinstance(parts[-1], ast.Constant):
            parts[-1] = ast.Constant(parts[-1].value + part.value)
        else:
            parts.append(part)
    if all(isinstance(part, ast.Constant) for part in parts):
        source = ast.unparse(ast.Constant("".join(part.value for part in parts)))
    else:
        source = ast.unparse(ast.JoinedStr(parts))
    prefix = "f" if source.startswith("f") else ""
    inner = source[len(prefix) + 1:-1]
    return f'{prefix}"{inner}"' if source[len(prefix)] == "'" and '"' not in inner and "\\" not in inner else source


def without_literal_parameters(text):
    """The file's text with each parameter of a top-level function that every call of it passes as one literal
    (by position, no `*` or `**` in any call, the function named nowhere but as called) and that the function reads
    only in the tests of its `if`s and conditional expressions read as that literal, gone from the signature and the
    calls, and those tests folded (rule 22: what rule 19 leaves of R18Backout's `mixed_head_input(self.mode, ...)`;
    a literal the function computes with stays a named parameter); so too each parameter it never reads that every
    call passes by position a value that evaluates nothing but reads (`outputs[-1]`, what the folded subtract mode
    leaves of `mixed_head_input(x, ...)`), and each to which every call passes one module constant's name is that
    name (decided_parameters). Again until none is left: a folded test can leave a parameter unread."""
    return to_fixed_point(literal_parameters_folded, text)


# The method torch's Module.__call__ hands a call's own arguments to: a call of a module instance is a call of it,
# unless a hook registered so may change them.
MODULE_CALL_TARGET = "forward"
FORWARD_PRE_HOOKS = ("register_forward_pre_hook", "register_module_forward_pre_hook")
MAIN_GUARDS = ("__name__ == '__main__'", "'__main__' == __name__")


def parameters_and_defaults(arguments):
    """(parameter, its default or None) of a signature's named parameters in order: the positional ones (the
    defaults are the last ones'), then the keyword-only ones."""
    positional = arguments.posonlyargs + arguments.args
    defaults = [None] * (len(positional) - len(arguments.defaults)) + arguments.defaults
    return list(zip(positional, defaults)) + list(zip(arguments.kwonlyargs, arguments.kw_defaults))


def signature_items(arguments):
    """Nodes spanning a signature's items (`name`, `name=default`, `*name`, `**name`), in order, each with the
    parameter's name (None for a bare `*`, which has no node and is not listed)."""
    items = parameters_and_defaults(arguments)
    items += [(a, None) for a in (arguments.vararg, arguments.kwarg) if a is not None]
    return sorted(((span((a.lineno, a.col_offset), ((d or a).end_lineno, (d or a).end_col_offset)), a.arg)
                   for a, d in items), key=lambda item: (item[0].lineno, item[0].col_offset))


def unset_parameters(tree):
    """The parameters the file's calls always leave at one sentinel (None, True, False; rule 29), as
    ({id(function): {parameter: that literal}}, {id(call): the positions and keyword names of its arguments that pass
    them}):
    - of a function or method whose calls are the file's own and all known (its name read only as called, one
      definition of the name, no library attribute; a static method by any receiver, another method by an instance):
      a parameter every call passes the same sentinel, by position or by name, or leaves at a sentinel default (no
      `*` or `**` argument in any call);
    - of a module's `forward` (its calls are its instances', unknown here): a keyword-only parameter with a sentinel
      default where every keyword of the name to a callable not known so passes that default (to no library's or
      builtin's callable), every function such a call may reach that has the parameter has that default, and
      nothing else could pass it (no string, attribute, stored name or lambda parameter of the name; no forward
      pre-hook)."""
    functions = [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    calls = [n for n in walk(tree) if isinstance(n, ast.Call)]
    methods = {id(m) for c in walk(tree) if isinstance(c, ast.ClassDef) for m in c.body}
    classes = {n.name for n in walk(tree) if isinstance(n, ast.ClassDef)}
    # a class's __init__ is known where its one definition's name is read only as called (no base of another class,
    # no isinstance, no alias, no `module.Class(...)`) and nothing builds an object of a class it reads off one
    # (`type(self)(...)`, `self.__class__(...)`, a classmethod's `cls(...)`)
    owners = {id(m): c.name for c in walk(tree) if isinstance(c, ast.ClassDef) for m in c.body}
    class_names = collections.Counter(n.name for n in walk(tree) if isinstance(n, ast.ClassDef))
    rebuilt = any(isinstance(c.func, ast.Call) and ast.unparse(c.func.func) == "type"
                  or isinstance(c.func, ast.Attribute) and c.func.attr == "__class__"
                  or isinstance(c.func, ast.Name) and c.func.id == "cls" for c in calls)
    definitions = collections.Counter(f.name for f in functions)
    named = collections.Counter(n.id for n in walk(tree) if isinstance(n, ast.Name))
    named.update(n.attr for n in walk(tree) if isinstance(n, ast.Attribute))
    call_names = collections.Counter(call_name(c) for c in calls)
    library = {name for s in tree.body for name in import_bound_names(s) or ()} | set(dir(builtins))
    library -= {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    strings = strings_in([tree])  # a name getattr may reach
    # what the `if __name__ == "__main__":` block calls is the file's entry point: an importer calls it too
    entry_points = {c.func.id for s in tree.body if isinstance(s, ast.If) and ast.unparse(s.test) in MAIN_GUARDS
                    for c in walk(s) if isinstance(c, ast.Call) and isinstance(c.func, ast.Name)}

    def defaults_of(arguments):
        return {a.arg: sentinel(d) for a, d in parameters_and_defaults(arguments) if sentinel(d) is not None}

    def stores(function, name):
        return any(isinstance(n, ast.Name) and n.id == name and not isinstance(n.ctx, ast.Load)
                   for stmt in function.body for n in walk(stmt))

    def known_calls(function):
        """Its calls, and how many leading parameters they skip; None where something else may call it."""
        if function.name == "__init__" and id(function) in owners:  # `Class(...)` calls it, where nothing else can
            owner = owners[id(function)]
            reach = [c for c in calls if isinstance(c.func, ast.Name) and c.func.id == owner]
            if owner not in strings and class_names[owner] == 1 and named[owner] == call_names[owner] == len(reach) \
                    and not function.decorator_list and not rebuilt:
                return reach, 1
            return None
        static = [ast.unparse(d) for d in function.decorator_list] == ["staticmethod"]
        if function.name in foreign_attributes() or function.name in strings | entry_points \
                or named[function.name] != call_names[function.name] \
                or function.decorator_list and not static or definitions[function.name] != 1:
            return None
        if id(function) in methods:
            reach = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == function.name]
            if not static and any(isinstance(c.func.value, ast.Name) and c.func.value.id in classes for c in reach):
                return None  # `Class.method(obj, ...)` passes self by position
            return reach, 0 if static else 1
        return [c for c in calls if isinstance(c.func, ast.Name) and c.func.id == function.name], 0

    folded, cut = {}, collections.defaultdict(set)
    known = {}
    for function in functions:
        found = known_calls(function)
        if found is None:
            continue
        known[function.name] = function
        reach, skipped = found
        arguments = function.args
        if not reach or arguments.vararg or arguments.kwarg or any(k.arg is None for c in reach for k in c.keywords):
            continue
        starred = any(isinstance(a, ast.Starred) for c in reach for a in c.args)  # may reach any positional one
        defaults = defaults_of(arguments)
        positional = arguments.posonlyargs + arguments.args
        decided = {}  # name -> (its literal, [(call, its position or name there, the literal)])
        for index, parameter in enumerate(positional + arguments.kwonlyargs):
            name = parameter.arg
            if index < skipped or stores(function, name) or starred and index < len(positional):
                continue
            passed = []  # (the call, its argument's position or name, the literal it passes)
            for c in reach:
                by_name = next((k for k in c.keywords if k.arg == name), None)
                if index < len(positional) and len(c.args) > index - skipped:
                    passed.append((c, index - skipped, sentinel(c.args[index - skipped])))
                elif by_name is not None and index >= len(arguments.posonlyargs):
                    passed.append((c, name, sentinel(by_name.value)))
                else:
                    passed.append((c, None, defaults.get(name)))
            literals = {literal for _, _, literal in passed}
            if len(literals) == 1 and None not in literals:
                decided[name] = (literals.pop(), passed)
        keyword_only = {a.arg for a in arguments.kwonlyargs}
        if cuts_bare_star(arguments, decided):
            # a bare `*` goes with its last parameter (unset_parameters_folded): no positional one this pass
            decided = {name: d for name, d in decided.items() if name in keyword_only and positional}
        for name, (literal, passed) in decided.items():
            folded.setdefault(id(function), {})[name] = literal
            for c, where, _ in passed:
                if where is not None:
                    cut[id(c)].add(where)
    # a module's forward: the keywords of calls of callables not known here
    # a forward pre-hook may rewrite the keywords a module's call hands its forward
    hooked = any(isinstance(n, ast.Attribute) and n.attr in FORWARD_PRE_HOOKS for n in walk(tree))
    forwards = [f for f in functions if f.name == MODULE_CALL_TARGET and id(f) in methods and not hooked]
    unknown_calls = [c for c in calls if call_name(c) not in known]
    reachable = collections.defaultdict(set)  # name -> the defaults of it where an unknown call may land
    for function in functions:
        if function.name not in known:
            given = defaults_of(function.args)
            for a in function.args.posonlyargs + function.args.args + function.args.kwonlyargs:
                reachable[a.arg].add(given.get(a.arg))
            for a in (function.args.vararg, function.args.kwarg):
                if a is not None:
                    reachable[a.arg].add(None)
    for n in walk(tree):
        if isinstance(n, ast.Lambda):
            for a in n.args.posonlyargs + n.args.args + n.args.kwonlyargs:
                reachable[a.arg].add(None)
    # a forward passing its own parameter on (`augment=augment`) passes the default it is read as
    passed_on = {id(k) for f in forwards for a in f.args.kwonlyargs for stmt in f.body for c in walk(stmt)
                 if isinstance(c, ast.Call) for k in c.keywords
                 if isinstance(k.value, ast.Name) and k.value.id == a.arg == k.arg}
    attributes = {n.attr for n in walk(tree) if isinstance(n, ast.Attribute)}
    stored = {n.id for n in walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    for function in forwards:
        given = defaults_of(function.args)
        if not function.args.vararg and not function.args.posonlyargs + function.args.args:
            continue  # `forward(*, a=None)`: a bare `*` with nothing before it to cut from
        for a in function.args.kwonlyargs:
            literal = given.get(a.arg)
            keywords = [(c, k) for c in unknown_calls for k in c.keywords if k.arg == a.arg]
            if literal is None or reachable[a.arg] != {literal} or a.arg in strings | attributes | stored \
                    or any(id(k) not in passed_on and sentinel(k.value) != literal or root_name(c.func) in library
                           for c, k in keywords):
                continue
            folded.setdefault(id(function), {})[a.arg] = literal
            for c, k in keywords:
                cut[id(c)].add(a.arg)
    return folded, cut


def cuts_bare_star(arguments, names):
    """Whether cutting the parameters `names` from a signature cuts every keyword-only one after a bare `*`, which
    then goes with them."""
    return bool(arguments.kwonlyargs) and not arguments.vararg and {a.arg for a in arguments.kwonlyargs} <= set(names)


def sentinel(node):
    """`None`, `True` or `False` where the node is that constant, else None."""
    return repr(node.value) if isinstance(node, ast.Constant) and type(node.value) in (bool, type(None)) else None


def call_name(call):
    """The name a call calls by (`f` of `f(x)` and of `obj.f(x)`), or None."""
    return call.func.id if isinstance(call.func, ast.Name) else \
        call.func.attr if isinstance(call.func, ast.Attribute) else None


def root_name(node):
    """The name an expression's chain of attributes, items and calls starts from (`torch` of `torch.nn.f(x).g`), or
    None."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def unset_parameters_folded(text):
    """without_unset_parameters, one pass."""
    tree = parse(text)
    folded, cut = unset_parameters(tree)
    if not folded:
        return text
    edits = []
    for call in walk(tree):
        if isinstance(call, ast.Call) and cut.get(id(call)):
            gone = [call.args[i] for i in cut[id(call)] if isinstance(i, int)]
            gone += [k for k in call.keywords if k.arg in cut[id(call)]]
            items = sorted(call.args + call.keywords, key=lambda n: (n.lineno, n.col_offset))
            edits += cut_items(items, {i for i, item in enumerate(items) if any(item is g for g in gone)})
    for function in walk(tree):
        unset = folded.get(id(function)) if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) else None
        if not unset:
            continue
        arguments = function.args
        positional = arguments.posonlyargs + arguments.args
        if cuts_bare_star(arguments, unset):
            # a bare `*` goes with its last parameter: from the end of the last positional one (unset_parameters
            # cuts none of those in the same pass)
            last = signature_items(arguments)[-1][0]
            edits.append((span((positional[-1].end_lineno, positional[-1].end_col_offset) if not arguments.defaults
                               else (arguments.defaults[-1].end_lineno, arguments.defaults[-1].end_col_offset),
                               (last.end_lineno, last.end_col_offset)), ""))
        else:
            items = signature_items(arguments)
            edits += cut_items([node for node, _ in items], {i for i, (_, name) in enumerate(items) if name in unset})
        receivers = {id(n.value) for n in walk(function) if isinstance(n, ast.Attribute)}
        edits += [(n, f"({unset[n.id]})" if id(n) in receivers else unset[n.id]) for stmt in function.body
                  for n in walk(stmt) if isinstance(n, ast.Name) and n.id in unset]
    return drop_unreachable(fold_ifs(replace_spans(text, edits), {}))


def without_unset_parameters(text):
    """Rule 29: each parameter no call of the file sets (unset_parameters) read as its default in its function, and
    gone from the signatures and from the calls that pass its default by name; then the tests on it folded (the
    baseline's `augment=None` through the blocks: `if augment is None` is the plain residual). Again until none is
    left: a folded parameter passed on (`run_block`'s `mlp_extra=mlp_extra`) becomes the literal its callee's
    parameter is then set to."""
    return to_fixed_point(unset_parameters_folded, text)


def without_inert_code(text):
    """The file's text with what folding leaves inert gone (rule 24), again until none is left:
    - a call of a top-level function whose body is one `return` of a literal (the registry's `given_study_flags()`:
      `[]`) or of a parameter (`resolve_study_args(config, pattern)` with no study: `config`) is that literal or
      that argument, where its other arguments evaluate nothing (the function named nowhere but in such calls);
    - a local nothing reads (no global or nonlocal, in a function that does not read its namespace): its assignment
      goes where the value evaluates nothing, and is the value's call alone where it is a call (`pattern =
      layer_pattern(n)`, kept for the check the call makes); `x = x` of a local goes;
    - a `for` loop left with a body of `pass` whose targets nothing else reads, over a value that evaluates nothing
      or its `.items()`, `.keys()` or `.values()`;
    - a method of one of the file's classes that nothing else can answer (inert_methods): where its body is `pass` or
      returns a literal, each call of it is that literal and a call made as a statement goes, then the method; where
      it only passes its parameters to an attribute's method, each call of it calls that one."""
    return to_fixed_point(inert_code_folded, text)


def inert_code_folded(text):
    """without_inert_code, one pass."""
    tree = parse(text)
    named = collections.Counter(n.id for n in walk(tree) if isinstance(n, ast.Name))
    calls = collections.defaultdict(list)
    for call in walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name):
            calls[call.func.id].append(call)
    edits, bindings = [], file_bindings(tree)
    classes = frozenset(n.name for n in tree.body if isinstance(n, ast.ClassDef) and bindings[n.name] == 1)
    for function in tree.body:
        returned = inert_return(function, frozenset(bindings), classes)
        if returned is None or named[function.name] != len(calls[function.name]) or bindings[function.name] != 1:
            continue
        position = next((i for i, a in enumerate(function.args.args) if a.arg == returned), None)
        found = []
        for call in calls[function.name]:
            if call.keywords or any(isinstance(a, ast.Starred) for a in call.args) \
                    or len(call.args) != len(function.args.args) \
                    or not all(evaluates_nothing(a) for i, a in enumerate(call.args) if i != position):
                break
            found.append((call, returned if position is None else parenthesised(text, call.args[position])))
        else:
            edits += found
    statements = {id(n.value): n for n in walk(tree) if isinstance(n, ast.Expr)}
    methods = inert_methods(tree)
    gone = []
    for call in walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in methods \
                and evaluates_nothing(call.func.value) and not call.keywords \
                and all(evaluates_nothing(a) and not isinstance(a, ast.Starred) for a in call.args):
            kind, value = methods[call.func.attr]
            if kind == "forwards":  # `X.model_values(a, b)` is `X.model_config(a, b)`
                edits.append((call.func, f"{parenthesised(text, call.func.value)}.{value}"))
            elif id(call) in statements:
                gone.append(statements[id(call)])
            else:
                edits.append((call, value))
    if edits:  # a call inside another's argument waits for the next pass
        inside = {id(inner) for call, _ in edits for inner in walk(call) if inner is not call}
        return replace_spans(text, [(call, new) for call, new in edits if id(call) not in inside])
    if not gone:  # an inert method or function nothing calls any more
        read = names_and_attributes_read(tree)
        gone = [member for cls in walk(tree) if isinstance(cls, ast.ClassDef) for member in cls.body
                if isinstance(member, ast.FunctionDef) and member.name in methods and member.name not in read]
        gone += [function for function in tree.body if isinstance(function, ast.FunctionDef)
                 and function.name not in read and inert_return(function, frozenset(bindings), classes) is not None]
    calls_kept = []
    for function in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        if reads_own_namespace(function):
            continue
        read = function_reads(function)
        parameters = set(declared_names(function))
        for block in own_blocks(function):
            for statement in block:
                if isinstance(statement, ast.For) and [type(s) for s in statement.body] == [ast.Pass] \
                        and not statement.orelse and not names_in([statement.target]) & read \
                        and (evaluates_nothing(statement.iter) or dict_view_call(statement.iter)):
                    gone.append(statement)
                if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                        and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Call) \
                        and statement.targets[0].id not in read | parameters \
                        and statement.value.lineno == statement.lineno:
                    calls_kept.append(statement)
    if calls_kept:
        lines = text.split("\n")
        for statement in sorted(calls_kept, key=lambda n: n.lineno, reverse=True):
            target, line = statement.targets[0], lines[statement.lineno - 1].encode()  # columns count UTF-8 bytes
            lines[statement.lineno - 1] = (line[:target.col_offset] + line[statement.value.col_offset:]).decode()
        return "\n".join(lines)
    gone += self_assignments(tree)
    # an unread local of a value that evaluates nothing: the dead constants the modules' folding drops
    return without_statements(text, tree, gone) if gone else dead_constants_dropped(text)


def self_assignments(tree):
    """Each `x = x` of a local in the tree's functions (a parameter, or a name the function stores elsewhere too;
    not global or nonlocal): what a call folded to its argument leaves."""
    found = []
    for function in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        local = set(declared_names(function)) - set(global_names(function))
        local |= {name for name, count in collections.Counter(
            n.id for n in walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)).items()
            if count > 1 and name not in global_names(function)}
        found += [statement for block in own_blocks(function) for statement in block
                  if isinstance(statement, ast.Assign) and len(statement.targets) == 1
                  and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Name)
                  and statement.value.id == statement.targets[0].id and statement.value.id in local]
    return found


def function_reads(function):
    """The names a function (or a function inside it) may read: loaded, deleted or updated in place (`x += 1`),
    and those declared global or nonlocal (another scope reads them)."""
    read = {n.id for n in walk(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    read |= {n.target.id for n in walk(function) if isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Name)}
    return read | set(global_names(function))


def reads_own_namespace(scope):
    """Whether a scope calls `locals()` or `vars()` with no argument: its locals are read by name there, unseen."""
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in ("locals", "vars")
               and not n.args and not n.keywords for n in walk(scope))


def sole_answerers(tree):
    """The undecorated methods of the file's classes that alone can answer `X.name(...)` of their name: no other
    member of a class of the file has the name, no object of a library the file handles has an attribute of it
    (foreign_attributes), nothing stores the attribute or holds the name in a string (getattr), and every read of
    it is the function of a call."""
    members = collections.Counter(name for cls in walk(tree) if isinstance(cls, ast.ClassDef)
                                  for name in class_members(cls))
    members.update(m.target.id for cls in walk(tree) if isinstance(cls, ast.ClassDef) for m in cls.body
                   if isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name))  # a dataclass's fields
    strings = strings_in([tree])
    called = {id(n.func) for n in walk(tree) if isinstance(n, ast.Call)}
    not_called = {n.attr for n in walk(tree) if isinstance(n, ast.Attribute)
                  and (not isinstance(n.ctx, ast.Load) or id(n) not in called)}
    return [method for cls in walk(tree) if isinstance(cls, ast.ClassDef) for method in cls.body
            if isinstance(method, ast.FunctionDef) and not method.decorator_list and members[method.name] == 1
            and method.name not in foreign_attributes() | strings | not_called]


def inert_methods(tree):
    """{name: ("literal", the literal it returns) or ("forwards", an attribute)} of each method of a class of the
    file whose body is `pass` or one `return` of a literal with no name or of nothing (BaseRun's no-op hooks the
    track's run does not override: `check_inputs`), or one `return self.ATTR(...)` of its parameters in their order
    (Study's `model_values` where the file's declarations each give a model_config), where nothing but it can answer
    `X.name(...)` (sole_answerers)."""
    found = {}
    for method in sole_answerers(tree):
        if len(method.body) == 1:
            body, parameters = method.body[0], [a.arg for a in method.args.args]
            value = body.value if isinstance(body, ast.Return) else None
            if isinstance(body, ast.Pass) or isinstance(body, ast.Return) and value is None:
                found[method.name] = ("literal", "None")
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Attribute) and parameters \
                    and ast.unparse(value.func.value) == parameters[0] and value.func.attr != method.name \
                    and not value.keywords and [ast.unparse(a) for a in value.args] == parameters[1:] \
                    and not (method.args.vararg or method.args.kwarg or method.args.kwonlyargs
                             or method.args.posonlyargs or method.args.defaults):
                found[method.name] = ("forwards", value.func.attr)
            elif value is not None and not names_in([value]):
                try:
                    ast.literal_eval(value)
                except ValueError:
                    continue
                found[method.name] = ("literal", ast.unparse(value))
    return found


@functools.cache
def foreign_attributes():
    """The attribute names of the library objects a file handles: torch's Module and Optimizer
    (library_attributes), its Tensor, the builtin types, paths and text files."""
    import io
    import torch
    kinds = (torch.Tensor, object, dict, list, tuple, set, str, bytes, int, float, Path, io.TextIOWrapper)
    return library_attributes() | {name for kind in kinds for name in dir(kind)}


def names_and_attributes_read(tree):
    """Every name and attribute the tree reads, and every string in it: what may reach a definition."""
    read = {n.id for n in walk(tree) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Store)}
    read |= {n.attr for n in walk(tree) if isinstance(n, ast.Attribute)}
    return read | strings_in([tree])


def inert_return(function, shadowed=frozenset(), classes=frozenset()):
    """What a top-level function returns whatever its arguments are, or None: the source of its literal (one with
    no name: `[]`, `None`, `(1, 'a')`; or a list or tuple display of literals and of `classes`, the file's classes
    no other binding of their name shadows: rule 31's `[('backout', Backout)]`) or the name of the parameter it
    returns, where its body is that one `return`
    and its parameters are plain positional ones without defaults; or, of one without parameters whose body computes
    from literals alone (evaluated_body; no PURE_BUILTINS in `shadowed`, the names the file binds), the literal of
    its value (LAuReL's `laurel_parts()` over its folded `'rw+lr'`: `(True, True, False, False)`)."""
    if not isinstance(function, ast.FunctionDef) or function.decorator_list or not function.body:
        return None
    arguments = function.args
    if arguments.vararg or arguments.kwarg or arguments.kwonlyargs or arguments.posonlyargs or arguments.defaults:
        return None
    if not arguments.args and not set(PURE_BUILTINS) & shadowed:
        value = evaluated_body(function.body)
        if value is not UNKNOWN:
            return repr(value)
    if len(function.body) != 1 or not isinstance(function.body[0], ast.Return) or function.body[0].value is None:
        return None
    value = function.body[0].value
    if isinstance(value, ast.Name):
        return value.id if value.id in [a.arg for a in arguments.args] else None
    if isinstance(value, (ast.List, ast.Tuple)) and all(
            isinstance(n, (ast.List, ast.Tuple, ast.Constant, ast.Load))
            or (isinstance(n, ast.Name) and n.id in classes) for n in walk(value)):
        return ast.unparse(value)
    try:
        ast.literal_eval(value)
    except ValueError:
        return None
    return None if names_in([value]) else ast.unparse(value)


def evaluated_body(body):
    """The value a function body of `NAME = value` statements and one final `return` returns, each value decided by
    folded_value from literals and the names bound before it, where that value is a literal or a tuple of them
    (what `repr` writes back as source); else UNKNOWN."""
    env = {}
    for statement in body[:-1]:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name)):
            return UNKNOWN
        env[statement.targets[0].id] = folded_value(statement.value, env, test=False)
        if env[statement.targets[0].id] is UNKNOWN:
            return UNKNOWN
    last = body[-1]
    if not isinstance(last, ast.Return) or last.value is None:
        return UNKNOWN
    value = folded_value(last.value, env, test=False)
    literal = isinstance(value, LITERAL_TYPES) or isinstance(value, tuple) and all(
        isinstance(item, LITERAL_TYPES) for item in value)
    return value if literal else UNKNOWN


LITERAL_TYPES = (bool, int, float, str, type(None))


def dict_view_call(node):
    """Whether an expression is `X.items()`, `X.keys()` or `X.values()` of an X that evaluates nothing."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args \
        and not node.keywords and node.func.attr in ("items", "keys", "values") and evaluates_nothing(node.func.value)


def parenthesised(text, node):
    """The source of an expression, in parentheses unless it is one operand as it is (ONE_OPERAND)."""
    source = ast.get_source_segment(text, node)
    return source if isinstance(node, ONE_OPERAND) else f"({source})"


# Statements after which nothing more of their block runs.
BLOCK_ENDS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def operand_source(text, node, op):
    """The source of an operand of an `and`/`or` (op) standing alone or in a new one: in parentheses where its own
    were outside its span (a conditional, lambda or `:=`, an `or` inside an `and`)."""
    source = ast.get_source_segment(text, node)
    wrapped = isinstance(node, (ast.IfExp, ast.Lambda, ast.NamedExpr)) or (
        isinstance(node, ast.BoolOp) and isinstance(op, ast.And) and isinstance(node.op, ast.Or))
    return f"({source})" if wrapped else source


def without_empty_locals(text):
    """What the final rules leave of a local assigned an empty literal (rule 19's `parts = []` of R18GPT's unpacked
    `self.study_cfg, parts = (None, [])`): its tests and loops fold as at the modules' (propagate_locals)."""
    return fold_ifs(propagate_locals(text, {}), {})


def without_decided_residue(text):
    """Rule 26: what folding leaves decided goes (with rules 19, 22 and 24, until none changes the file):
    - a block's statements after its `return`, `raise`, `continue` or `break` (LAuReL's `return sum_in_order(g,
      parts)` after the return its `if self.uses_rw:` left unconditional), not a `yield` nor a binding of a name read
      elsewhere that no assignment before the block's end binds too;
    - an `and`/`or` whose first operand is a literal: `False and X` is `False` and `True or X` is `True` (X was never
      evaluated), `True and X` is X and `False or X` is X (LAuReL's `self.product_per_input = False and ...`)."""
    tree = parse(text)
    ended = {}  # a block's statements after its first end -> the names its statements before that end assign
    for block in statement_blocks(tree):
        end = next((i for i, s in enumerate(block) if isinstance(s, BLOCK_ENDS)), len(block))
        if end + 1 < len(block):
            bound = {t.id for kept in block[:end] if isinstance(kept, (ast.Assign, ast.AnnAssign))
                     for target in (kept.targets if isinstance(kept, ast.Assign) else [kept.target])
                     for t in walk(target) if isinstance(t, ast.Name) and isinstance(t.ctx, ast.Store)}
            ended.update({id(s): (s, bound) for s in block[end + 1:]})
    # kept where they still decide something: a `yield` makes a generator; a name they bind is local to its
    # function (or bound by a declaration), so a read of it elsewhere would read another variable without them,
    # unless a plain assignment before the block's end binds it there too (`w = ...; return w[:, 0], ...; w = ...`)
    inside = {id(n) for s, _ in ended.values() for n in walk(s)}
    read = {n.id for n in walk(tree) if isinstance(n, ast.Name) and id(n) not in inside}
    gone = [s for s, bound in ended.values() if not (set(file_bindings(s)) & read) - bound
            and not any(isinstance(n, (ast.Yield, ast.YieldFrom, ast.Await)) for n in walk(s))]
    if gone:
        return without_statements(text, tree, gone)
    for node in walk(tree):  # one at a time: an operand may hold another
        if isinstance(node, ast.BoolOp) and isinstance(node.values[0], ast.Constant):
            first, rest = node.values[0], node.values[1:]
            if bool(first.value) == isinstance(node.op, ast.Or):  # it decides: the rest is never evaluated
                return replace_spans(text, [(node, ast.get_source_segment(text, first))])
            joined = " and " if isinstance(node.op, ast.And) else " or "
            return replace_spans(text, [(node, joined.join(operand_source(text, v, node.op) for v in rest))])
    return text


def to_fixed_point(one_pass, text):
    """The text after `one_pass` is applied to it again and again until it changes it no more."""
    while True:
        passed = one_pass(text)
        if passed == text:
            return text
        text = passed


def literal_parameters_folded(text):
    """without_literal_parameters, one pass."""
    tree = parse(text)
    functions = {n.name: n for n in tree.body if isinstance(n, ast.FunctionDef) and not n.decorator_list}
    calls = {name: [] for name in functions}
    named = collections.Counter(n.id for n in walk(tree) if isinstance(n, ast.Name))
    for call in walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in calls:
            calls[call.func.id].append(call)
    constants = module_constants(tree)
    fixed = []
    for name, function in functions.items():
        arguments = function.args
        if not calls[name] or named[name] != len(calls[name]) or arguments.vararg or arguments.kwarg \
                or arguments.posonlyargs or arguments.kwonlyargs or arguments.defaults \
                or any(c.keywords or any(isinstance(a, ast.Starred) for a in c.args) for c in calls[name]):
            continue
        decided = decided_parameters(function, calls[name], 0, lambda call: {}, constants)
        fixed += [(name, *found) for found in decided]
        decided_names = {parameter for parameter, _, _ in decided}
        tested = {id(n) for node in walk(function) if isinstance(node, (ast.If, ast.IfExp))
                  for n in walk(node.test)}
        for position, parameter in enumerate(arguments.args):
            reads = [n for n in walk(function) if isinstance(n, ast.Name) and n.id == parameter.arg]
            if parameter.arg in decided_names or not reads or not all(id(n) in tested for n in reads):
                continue
            given = {ast.unparse(c.args[position]) if len(c.args) > position and isinstance(c.args[position],
                                                                                          ast.Constant) else None
                     for c in calls[name]}
            if len(given) == 1 and None not in given \
                    and not any(isinstance(n, ast.Name) and n.id == parameter.arg and not isinstance(n.ctx, ast.Load)
                                for n in walk(function)):
                fixed.append((name, parameter.arg, position, given.pop()))
    # a method alone in answering its calls (sole_answerers): each parameter it never reads that every call passes an
    # expression that only reads (BaseRun.settle's `init_state` in a file that resumes nothing). Bound calls only:
    # `Class.method(obj, ...)` passes self by position.
    classes = {n.name for n in walk(tree) if isinstance(n, ast.ClassDef)}
    attribute_calls = collections.defaultdict(list)  # one walk for every method, not one each
    for call in walk(tree):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            attribute_calls[call.func.attr].append(call)
    for method in sole_answerers(tree):
        arguments = method.args
        called = attribute_calls[method.name]
        if not called or arguments.vararg or arguments.kwarg or arguments.posonlyargs or arguments.kwonlyargs \
                or arguments.defaults or any(c.keywords or any(isinstance(a, ast.Starred) for a in c.args)
                                             or isinstance(c.func.value, ast.Name) and c.func.value.id in classes
                                             for c in called):
            continue
        fixed += [(f".{method.name}", parameter, position, literal) for parameter, position, literal
                  in decided_parameters(method, called, 1, lambda call: {}) if literal == "None"]
    return fold_ifs(without_calls_decided(text, fixed, ()), {}) if fixed else text


def module_constants(tree):
    """The names a module assigns once, by a top-level `NAME = value`, and binds nowhere else (file_bindings: no
    other store, parameter, global or nonlocal, definition or import of that name): each names one object wherever
    it is read."""
    bindings = file_bindings(tree)
    return frozenset(s.targets[0].id for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
                     and isinstance(s.targets[0], ast.Name) and bindings[s.targets[0].id] == 1)


# Builtins that make one number literal of another: a call of one on a literal is that literal (rule 23).
NUMBER_CONVERSIONS = {"float": float, "int": int}


def without_literal_residue(text):
    """The file's text with what folding leaves of a conversion or a loop written plainly (rule 23): a
    NUMBER_CONVERSIONS call of one number literal is its value (`float(1)` is `1.0`), `len` of a tuple or list
    display of constants its number (r18's `len((11,))` is `1`), and `for j, x in
    enumerate(xs)` whose `j` nothing in its function reads is `for x in xs`; not where the file binds the builtin's
    name, for a global or nonlocal index, nor in a function that reads its own namespace (`locals()`, `vars()`)."""
    tree = parse(text)
    bound = set(file_bindings(tree))

    def builtin_call(node, names):
        return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names \
            and node.func.id not in bound and len(node.args) == 1 and not node.keywords \
            and not isinstance(node.args[0], ast.Starred)

    literals = [(n, repr(NUMBER_CONVERSIONS[n.func.id](n.args[0].value))) for n in walk(tree)
                if builtin_call(n, NUMBER_CONVERSIONS) and isinstance(n.args[0], ast.Constant)
                and type(n.args[0].value) in (int, float) and math.isfinite(n.args[0].value)]  # `1e999` reads inf
    literals += [(n, repr(len(n.args[0].elts))) for n in walk(tree) if builtin_call(n, ("len",))
                 and isinstance(n.args[0], (ast.Tuple, ast.List))
                 and all(isinstance(item, ast.Constant) for item in n.args[0].elts)]
    tables = constant_tables(tree)
    literals += [(n, value) for n in walk(tree) for value in [display_lookup(text, n, tables)]
                 if value is not None]
    # `dict({}, k=v)`, what rule 29 leaves of `dict(extra or {}, k=v)`: the keywords alone
    literals += [(n, ast.get_source_segment(text, n)[:n.args[0].col_offset - n.col_offset]
                  + ast.get_source_segment(text, n)[n.keywords[0].value.col_offset - n.col_offset
                                                    - len(n.keywords[0].arg) - 1:])
                 for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
                 and n.func.id == "dict" and "dict" not in bound and len(n.args) == 1 and n.keywords
                 and all(k.arg for k in n.keywords) and isinstance(n.args[0], ast.Dict) and not n.args[0].keys
                 and n.args[0].lineno == n.lineno == n.keywords[0].value.lineno]
    if literals:  # before the loops: a loop's sequence may hold one, and its edit spans the sequence's source
        text = replace_spans(text, literals)
        tree = parse(text)
    edits = []
    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    innermost = {id(node): scope for scope in scopes for node in walk(scope)}  # the walk visits outer ones first
    for scope in scopes:
        read = function_reads(scope) | set(declared_names(scope))  # a global or nonlocal index is read elsewhere
        if reads_own_namespace(scope):
            continue
        for loop in (n for n in walk(scope) if isinstance(n, ast.For) and innermost[id(n)] is scope):
            target = loop.target
            if builtin_call(loop.iter, ("enumerate",)) and isinstance(target, ast.Tuple) and len(target.elts) == 2 \
                    and isinstance(target.elts[0], ast.Name) and target.elts[0].id not in read:
                edits += [(target, ast.get_source_segment(text, target.elts[1])),
                          (loop.iter, ast.get_source_segment(text, loop.iter.args[0]))]
    return loop_target_comparisons_decided(replace_spans(text, edits) if edits else text)


def loop_target_comparisons_decided(text):
    """Rule 23: in a `for` loop over a tuple or list display of constants (or `enumerate` of one), a comparison of a
    target (stored nowhere in the body) with a constant that every item decides alike is that truth, and the tests
    it decides fold (multi-layer backout's `name == "embed"` over `(9, 11)`); not inside a function or lambda the
    body defines, nor where the file binds `enumerate`."""
    tree = parse(text)
    bound = set(file_bindings(tree))
    edits = []
    for loop in (n for n in walk(tree) if isinstance(n, ast.For)):
        sequence, target = loop.iter, loop.target
        numbered = isinstance(sequence, ast.Call) and isinstance(sequence.func, ast.Name) \
            and sequence.func.id == "enumerate" and "enumerate" not in bound and len(sequence.args) == 1 \
            and not sequence.keywords
        items = sequence.args[0] if numbered else sequence
        if not (isinstance(items, (ast.Tuple, ast.List)) and items.elts
                and all(isinstance(item, ast.Constant) for item in items.elts)):
            continue
        values = [item.value for item in items.elts]
        if numbered and isinstance(target, ast.Tuple) and len(target.elts) == 2:
            possible = {getattr(target.elts[0], "id", None): list(range(len(values))),
                        getattr(target.elts[1], "id", None): values}
        elif not numbered and isinstance(target, ast.Name):
            possible = {target.id: values}
        else:
            continue
        possible.pop(None, None)
        body = [n for statement in loop.body for n in walk(statement)]
        if any(isinstance(n, ast.Name) and n.id in possible and not isinstance(n.ctx, ast.Load) for n in body):
            continue
        nested = {id(n) for n in nodes_in_nested_scopes(loop)}  # the loop's iter and target define no scope
        for node in body:
            if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in VALUE_COMPARISONS
                    and id(node) not in nested):
                continue
            left, right = node.left, node.comparators[0]
            name, constant, flipped = (left, right, False) if isinstance(right, ast.Constant) else (right, left, True)
            if not (isinstance(name, ast.Name) and name.id in possible and isinstance(constant, ast.Constant)):
                continue
            compare = VALUE_COMPARISONS[type(node.ops[0])]
            try:
                truths = {bool(compare(constant.value, v) if flipped else compare(v, constant.value))
                          for v in possible[name.id]}
            except TypeError:
                continue
            if len(truths) == 1:
                edits.append((node, repr(truths.pop())))
    return drop_unreachable(fold_ifs(replace_spans(text, edits), {})) if edits else text


def only_reads_displays(node):
    """Whether an expression only reads (only_reads) or is a tuple or list display of such: building it has no
    effect."""
    return only_reads(node) or isinstance(node, (ast.Tuple, ast.List)) and all(map(only_reads_displays, node.elts))


def lookup_parts(node):
    """(table, key, [default] or [] of `.get`, or None of `[key]`) of a lookup `table[key]` (a load) or
    `table.get(key[, default])`, or None."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get" \
            and not node.keywords and len(node.args) in (1, 2) and not isinstance(node.args[-1], ast.Starred):
        return node.func.value, node.args[0], node.args[1:]
    if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
        return node.value, node.slice, None
    return None


def constant_tables(tree):
    """{name: its dict display} of the module's constants (module_constants) bound to a dict display whose every read
    is a lookup (lookup_parts: nothing can change it) and whose values only read names the module binds once, at
    its top level, or builtins it never binds (each means there what it means where the value was written)."""
    constants = module_constants(tree)
    bindings = file_bindings(tree)
    top_level = {name for s in tree.body for name in [*(import_bound_names(s) or ()), *(
        [s.name] if isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) else []), *(
        names_in(s.targets) if isinstance(s, ast.Assign) else [])]}
    tables = {s.targets[0].id: s.value for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
              and isinstance(s.targets[0], ast.Name) and s.targets[0].id in constants and isinstance(s.value, ast.Dict)}
    looked_up = {id(parts[0]) for n in walk(tree) for parts in [lookup_parts(n)] if parts is not None}
    for node in walk(tree):
        if isinstance(node, ast.Name) and node.id in tables and isinstance(node.ctx, ast.Load) \
                and id(node) not in looked_up:
            del tables[node.id]
    return {name: table for name, table in tables.items()
            if all(bindings[n.id] == 1 and n.id in top_level or not bindings[n.id] and hasattr(builtins, n.id)
                   for value in table.values for n in walk(value) if isinstance(n, ast.Name))}


def display_lookup(text, node, tables=None):
    """The source of what a lookup by a constant key in a dict display of constant keys reads (`{"single": (n, 1),
    "vector": (n, 2, dim)}.get('softmax', (n, 2))` reads `(n, 2)`: LAuReL's shapes once its form folded), also of
    one of `tables` ({name: dict display}: constant_tables) read by its name (multi-layer backout's
    `BACKOUT_ACTIVATIONS['relu']` is `F.relu`), or None where the node is no such lookup or a value it drops would
    do something when built."""
    parts = lookup_parts(node)
    if parts is None:
        return None
    table, key, default = parts
    if isinstance(table, ast.Name) and isinstance(table.ctx, ast.Load):
        table = (tables or {}).get(table.id, table)
    if not (isinstance(table, ast.Dict) and isinstance(key, ast.Constant)
            and all(isinstance(k, ast.Constant) for k in table.keys) and all(map(only_reads_displays, table.values))):
        return None
    found = [v for k, v in zip(table.keys, table.values) if k.value == key.value]
    if found:
        return parenthesised(text, found[-1])  # a display's later entry of a key replaces an earlier one
    if default is None:  # `{...}[missing]` raises: it stays
        return None
    return parenthesised(text, default[0]) if default else "None"


def without_unread_model_fields(text):
    """Rule 28: of a declaration that gives its model fields as literals (rule 16's `model_fields=(...)` and
    `model_config=lambda ...: {...}`), the fields after the first (Study.in_model reads that one by position) that
    the file reads nowhere else - no attribute, string or keyword of the name but the keys of LEFT_OUT_FIELDS, which
    log them - go from both (the record's backout_mode, ..., folded into its code). The model config then holds one
    field less; nothing logs or saves it whole (the run's config line takes those values from LEFT_OUT_FIELDS)."""
    tree = parse(text)
    declared = []  # (its model_fields tuple, its model_config dict, the names in the tuple's order)
    for call in walk(tree):
        if not is_study_call(call):
            continue
        given = {k.arg: k.value for k in call.keywords}
        fields, values = given.get("model_fields"), given.get("model_config")
        if not (isinstance(fields, ast.Tuple) and isinstance(values, ast.Lambda) and isinstance(values.body, ast.Dict)
                and all(isinstance(e, ast.Tuple) and e.elts and isinstance(e.elts[0], ast.Constant)
                        for e in fields.elts)
                and all(isinstance(k, ast.Constant) for k in values.body.keys)):
            continue
        declared.append((fields, values.body, [e.elts[0].value for e in fields.elts]))
    if not declared:
        return text
    logged = next((s.value for s in tree.body if isinstance(s, ast.Assign) and len(s.targets) == 1
                   and isinstance(s.targets[0], ast.Name) and s.targets[0].id == "LEFT_OUT_FIELDS"
                   and isinstance(s.value, ast.Dict)), None)
    skipped = {id(n) for fields, values, _ in declared for node in (fields, values) for n in walk(node)}
    skipped |= {id(k) for k in (logged.keys if logged is not None else ())}
    read = names_read(tree, skipped, keywords=True)
    edits, lines = [], text.split("\n")
    for fields, values, names in declared:
        unread = {name for name in names[1:] if name not in read}
        if not unread:
            continue
        line = lines[fields.lineno - 1]
        indent = " " * (len(line) - len(line.lstrip()) + 4)  # the declaration's continued lines
        kept = [ast.get_source_segment(text, e) for e, name in zip(fields.elts, names) if name not in unread]
        opening = " " * fields.col_offset + "("
        edits.append((fields, "\n".join(packed_items(opening, kept, ",)" if len(kept) == 1 else ")", indent))
                      [len(opening) - 1:]))
        kept = [f"{ast.get_source_segment(text, k)}: {ast.get_source_segment(text, v)}"
                for k, v in zip(values.keys, values.values) if k.value not in unread]
        opening = " " * values.col_offset + "{"
        edits.append((values, "\n".join(packed_items(opening, kept, "}", indent))[len(opening) - 1:]))
    return replace_spans(text, edits) if edits else text


def without_redundant_parentheses(text):
    """Rule 27: the parentheses folding leaves around one expression where they change nothing (`(laurel_column_
    orthogonal)(count, 16, dim)` of a folded `(a if c else b)(...)`, `+ (0)`, `torch.zeros(((n, 2)))`, `counts = ([1]
    * n)`): a pair on one line around an atom (a name, constant, attribute, call, item or display) or around an
    assigned or returned value, opening after an operator, bracket or keyword (not a call's), and the pair around a
    tuple an assignment unpacks (`start_step, train_ms = (0, 0.0)`); the file's syntax tree the same without it."""
    while True:
        tree = parse(text)
        span_of = source_spans(text)
        whole = {id(n.value) for n in walk(tree) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign,
                                                                          ast.Return)) and n.value is not None}
        in_strings = {id(n) for f in walk(tree) if isinstance(f, ast.JoinedStr) for n in walk(f)}
        unpacked = {id(n.value) for n in walk(tree) if isinstance(n, ast.Assign) and len(n.targets) == 1
                    and isinstance(n.targets[0], ast.Tuple) and isinstance(n.value, ast.Tuple) and len(n.value.elts) > 1}
        pairs = set()
        for node in walk(tree):
            if not isinstance(node, ast.expr) or id(node) in in_strings or node.lineno != node.end_lineno \
                    or not (isinstance(node, PAREN_FREE_ATOMS) or id(node) in whole):
                continue
            start, end = span_of(node)
            if id(node) in unpacked and text[start] == "(" and text[end - 1] == ")":
                pairs.add((start, end - 1))  # `a, b = (0, 0.0)` of a folded `... if resume else (0, 0.0)`
                continue
            if not (start and text[start - 1] == "(" and text[end:end + 1] == ")"):
                continue
            before = text[max(0, start - 1 - LOOK_BACK):start - 1].rstrip()  # not the whole text for each node
            word = re.search(r"\w*$", before).group()
            if not (before and (before[-1] in ")]}'\"" or word and not keyword.iskeyword(word))):  # `f(x)`, `d[k](x)`
                pairs.add((start - 1, end))
        if not pairs:
            return text
        expected = ast.dump(tree)
        if not parses_as(without_pairs(text, pairs), expected):  # one that mattered: each alone, then those together
            pairs = [pair for pair in sorted(pairs) if parses_as(without_pairs(text, [pair]), expected)]
            if len(pairs) > 1 and not parses_as(without_pairs(text, pairs), expected):
                pairs = pairs[:1]
        if not pairs:
            return text
        text = without_pairs(text, pairs)


# How far back rule 27 looks for what precedes an opening parenthesis (past blanks: a call's name, an operator).
LOOK_BACK = 1000

# Expressions that read the same with or without parentheses around them (rule 27).
PAREN_FREE_ATOMS = (ast.Name, ast.Constant, ast.Attribute, ast.Call, ast.Subscript, ast.List, ast.Dict, ast.Set,
                    ast.ListComp, ast.DictComp, ast.SetComp, ast.Tuple)


def without_pairs(text, pairs):
    """The text without the characters at the positions of each (open, close) pair."""
    cut = {i for pair in pairs for i in pair}
    return "".join(c for i, c in enumerate(text) if i not in cut)


def parses_as(text, expected):
    """Whether the text parses to the syntax tree dumped as `expected`."""
    try:
        return ast.dump(parse(text)) == expected
    except SyntaxError:
        return False


def import_bound_names(statement):
    """The names a top-level import statement binds (`import a.b` binds a), or None for one that must stay whatever
    is read (`from __future__ import ...`, a `*` import) and for any other statement."""
    if isinstance(statement, ast.Import):
        return [alias.asname or alias.name.split(".")[0] for alias in statement.names]
    if isinstance(statement, ast.ImportFrom) and statement.module != "__future__" \
            and all(alias.name != "*" for alias in statement.names):
        return [alias.asname or alias.name for alias in statement.names]
    return None


def without_unread_definitions(text):
    """The file's text without each top-level function, class, constant or import whose name nothing in the file
    reads (no name, attribute or string of it) once the final rules have cut what read it (`backout_on_r18`, read
    only by the declaration's `on_r18=` that rule 17 cut; LAuReL's `accumulate`, read only by PA's code), again
    until none is left; with them the members no code names (unnamed_members)."""
    while True:
        tree = parse(text)
        read = names_and_attributes_read(tree)
        gone = [s for s in tree.body if (bound := import_bound_names(s)) is not None and not set(bound) & read
                or isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and s.name not in read
                or isinstance(s, ast.Assign) and all(
                    isinstance(target, ast.Name) and target.id not in read and target.id not in FILE_CONSTANTS
                    and not target.id.startswith("__") for target in s.targets)]
        gone += unnamed_members(tree)
        if not gone:
            break
        text = without_statements(text, tree, gone)
    # `from x import a, b` with b unread: `from x import a`
    tree = parse(text)
    lines = text.split("\n")
    for statement in reversed(tree.body):
        bound = import_bound_names(statement)
        if isinstance(statement, ast.ImportFrom) and bound and not set(bound) <= read \
                and statement.lineno == statement.end_lineno:
            kept = [alias for alias, name in zip(statement.names, bound) if name in read]
            lines[statement.lineno - 1] = ast.unparse(ast.ImportFrom(statement.module, kept, statement.level))
    # a section left with no statement loses its header (each narrowing kept its one line: `lines` still holds)
    code = [i for i, line in enumerate(lines) if line.strip() and not line.startswith("#")]
    return "\n".join(line for i, line in enumerate(lines) if not (
        SECTION_HEADER.match(line) and not any(i < j < next((k for k in range(i + 1, len(lines))
                                                              if SECTION_HEADER.match(lines[k])), len(lines))
                                               for j in code)))


# The library bases whose instances a library asks no member by name but those of torch's Module (`forward`)
MEMBER_SAFE_BASES = ("nn.Module", "torch.nn.Module", "object")


def unnamed_members(tree):
    """Rule 8 once the final rules have cut their readers: each method (undecorated, a staticmethod or classmethod)
    and plain class attribute of a class of the file that nothing in the file reads (no attribute or string of its
    name, nor the name in a class body), not a dunder nor a name torch's Module or Optimizer has (library_attributes:
    torch asks those), of a class whose every base is such a class of the file or MEMBER_SAFE_BASES and whose
    decorators are dataclass's (nothing outside the file asks it members by name): the baselines'
    StudyHost.build_parts, whose one call went with the test on the run's empty list of parts. None where the file
    lists a class's members (`__dict__`, `dir`, `vars` of a class of the file) or asks a member by a name it builds
    (getattr/hasattr/setattr/delattr of an f-string, a sum, a call or an item): a name it reads
    (`getattr(self, self.scalar_vector)`) is a string the file holds."""
    nodes = list(walk(tree))
    classes = {cls.name: cls for cls in nodes if isinstance(cls, ast.ClassDef)}
    calls = [n for n in nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)]
    if any(isinstance(n, ast.Attribute) and n.attr in WHOLESALE_ATTRIBUTES for n in nodes) or any(
            call.func.id == "dir" or call.func.id == "vars" and any(ast.unparse(a) in classes for a in call.args)
            or call.func.id in ("getattr", "hasattr", "setattr", "delattr") and len(call.args) > 1
            and not isinstance(call.args[1], (ast.Constant, ast.Name, ast.Attribute)) for call in calls):
        return []
    safe = set()
    while True:  # the classes whose every base is safe, grown until none joins
        joined = {name for name, cls in classes.items() if name not in safe and all(
            ast.unparse(base) in MEMBER_SAFE_BASES or ast.unparse(base) in safe for base in cls.bases)
                  and not cls.keywords and all(ast.unparse(d).startswith("dataclass") for d in cls.decorator_list)}
        if not joined:
            break
        safe |= joined
    # a member is reached by an attribute, a string, or its name in a class body (not a method's: another scope)
    read = {n.attr for n in nodes if isinstance(n, ast.Attribute)} | strings_in([tree]) | {
        n.id for cls in classes.values() for statement in cls.body if not isinstance(statement, ast.FunctionDef)
        for n in walk(statement) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    plain = ("staticmethod", "classmethod")
    return [member for name in sorted(safe) for member_name, member in class_members(classes[name]).items()
            if member_name not in read and not member_name.startswith("__") and member_name not in library_attributes()
            and all(ast.unparse(d) in plain for d in getattr(member, "decorator_list", ()))]


@functools.cache
def library_attributes():
    """The attribute names torch's Module and Optimizer have, as classes and as instances: a library base of a file's
    class may set or read them where the file shows no statement of it (Module.train() sets `training`)."""
    import torch
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))])
    return frozenset({*dir(torch.nn.Module), *vars(torch.nn.Module()), *dir(torch.optim.Optimizer), *vars(optimizer)})


def sets_a_computed_name(call):
    """Whether a call of NAMED_SETTERS names its attribute other than by a literal (`setattr(x, name, v)`)."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
    if name not in NAMED_SETTERS:
        return False
    position = 1 if name in ("setattr", "delattr") else 0  # setattr(obj, NAME, value); module.register_buffer(NAME, t)
    return not (len(call.args) > position and isinstance(call.args[position], ast.Constant))


def is_constant_display(node):
    """Whether an expression is a constant or a tuple display of constants (`(11,)`): a value no code can change."""
    return isinstance(node, ast.Constant) or isinstance(node, ast.Tuple) and all(
        isinstance(item, ast.Constant) for item in node.elts)


def unpacked_items(statement):
    """[(target, value)] of an assignment `A, B = a, b` of as many values as targets (none starred), else []."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
            and isinstance(statement.targets[0], ast.Tuple) and isinstance(statement.value, ast.Tuple)
            and len(statement.targets[0].elts) == len(statement.value.elts)):
        return []
    pairs = list(zip(statement.targets[0].elts, statement.value.elts))
    return [] if any(isinstance(n, ast.Starred) for pair in pairs for n in pair) else pairs


def without_constant_attributes(text):
    """The file's text with what its attributes decide folded (rule 19), where nothing can set an attribute but by a
    statement the file shows (no NAMED_SETTERS call with a computed name, no WHOLESALE_ATTRIBUTES), the attribute's
    name is no member of a class of the file nor an attribute of torch's Module or Optimizer (library_attributes),
    and no other string is that name:
    - `A if hasattr(self, "N") else B` is B where nothing stores N (the frozen lambdas' buffers of another backout);
    - an attribute every store of which is `self.N = LITERAL` (one literal: is_constant_display), or its item of an
      unpacking `self.A, self.N = a, LITERAL` (unpacked_items), and every read `self.N` is read as that literal, its
      stores gone (`self.mode = 'sum'`; an unpacking keeps its other items), and the tests on it fold (fold_ifs),
      with the loops over a tuple of one item it leaves (constant_tuples_unrolled)."""
    tree = parse(text)
    calls = [n for n in walk(tree) if isinstance(n, ast.Call)]
    if any(map(sets_a_computed_name, calls)) or any(ast.unparse(n) == "vars(self)" for n in calls) \
            or any(isinstance(n, ast.Attribute) and n.attr in WHOLESALE_ATTRIBUTES for n in walk(tree)):
        return text
    strings = collections.Counter(n.value for n in walk(tree) if isinstance(n, ast.Constant)
                                  and isinstance(n.value, str))
    taken = {name for cls in walk(tree) if isinstance(cls, ast.ClassDef) for name in class_members(cls)}
    taken |= {m.target.id for cls in walk(tree) if isinstance(cls, ast.ClassDef) for m in cls.body
              if isinstance(m, ast.AnnAssign) and isinstance(m.target, ast.Name)}
    taken |= library_attributes()
    stored = collections.defaultdict(list)
    read = collections.defaultdict(list)
    for n in walk(tree):
        if isinstance(n, ast.Attribute):
            (read if isinstance(n.ctx, ast.Load) else stored)[n.attr].append(n)
    tested = collections.Counter(n.args[1].value for n in calls if ast.unparse(n.func) == "hasattr"
                                 and len(n.args) == 2 and isinstance(n.args[1], ast.Constant))
    edits = [(n, ast.get_source_segment(text, n.orelse)) for n in walk(tree) if isinstance(n, ast.IfExp)
             and isinstance(n.test, ast.Call) and ast.unparse(n.test.func) == "hasattr" and len(n.test.args) == 2
             and ast.unparse(n.test.args[0]) == "self" and isinstance(n.test.args[1], ast.Constant)
             and n.test.args[1].value not in stored and n.test.args[1].value not in taken
             and strings[n.test.args[1].value] == tested[n.test.args[1].value]]
    # the value each store is given: `self.N = value`, or its own item of `self.A, self.N = a, value`
    assigned = {id(s.targets[0]): s.value for s in walk(tree) if isinstance(s, ast.Assign) and len(s.targets) == 1}
    assigned.update({id(target): value for s in walk(tree) for target, value in unpacked_items(s)})
    constants = {}
    for name, stores in stored.items():
        values = [assigned.get(id(n)) for n in stores]
        if name not in taken and not strings[name] and None not in values \
                and len({ast.unparse(value) for value in values}) == 1 and all(map(is_constant_display, values)) \
                and all(ast.unparse(n.value) == "self" for n in stores + read[name]) and read[name]:
            constants[name] = ast.unparse(values[0])
            edits += [(n, constants[name]) for n in read[name]]
    if not edits:
        return text
    text = replace_spans(text, edits)

    def folded(target):
        return isinstance(target, ast.Attribute) and target.attr in constants

    tree = parse(text)  # an unpacking that also stores others keeps their items alone
    unpackings = [(s, unpacked_items(s)) for s in walk(tree)]
    partly = [(s, [(t, v) for t, v in pairs if not folded(t)]) for s, pairs in unpackings
              if any(folded(t) for t, _ in pairs) and not all(folded(t) for t, _ in pairs)]
    text = replace_spans(text, [(s, ", ".join(ast.get_source_segment(text, t) for t, _ in kept) + " = "
                                 + ", ".join(ast.get_source_segment(text, v) for _, v in kept)) for s, kept in partly])
    tree = parse(text)
    gone = [s for s in walk(tree) if isinstance(s, ast.Assign) and len(s.targets) == 1
            and folded(s.targets[0]) or unpacked_items(s) and all(folded(t) for t, _ in unpacked_items(s))]
    # rule 25 on a tuple so read (R18Backout's `for s in self.sources`), and the tests that leaves
    unrolled = to_fixed_point(lambda t: fold_ifs(constant_tuples_unrolled(t, {}), {}),
                              without_statements(text, tree, gone))
    return without_overwritten_locals(unrolled)


# A function that asks the study parts a hook by its name -> the position of the argument that names it; it answers
# None when every part does (speedrun/study.py's one_part_hook).
PART_HOOK_CALLS = {("speedrun.study", "one_part_hook"): 1}


def part_hook_folds(active, folds, script_module):
    """With studies on: the folds of the calls of PART_HOOK_CALLS whose hook every switched-on study's part (its class
    on the run's base) answers with None, its method folded (study_field_folds) to `return None`, as ModelPart's
    defaults do; then of StudyHost's methods that compute a constant from them (`self.parts_mlp_router()`: None),
    as with no study on. Backout defines no mlp_router or residuals, and its mlp_extra is None but in concat-mlp."""
    on_r18 = folds.get(R18_BASE, False)
    classes = [study.r18_part if on_r18 else study.model_part for study in active]
    if not classes or None in classes:
        return {}
    hooks = {name for name, value in vars(ModelPart).items() if callable(value) and not name.startswith("_")}
    none_hooks = {hook for hook in hooks if all(answers_none(cls, hook, folds, script_module) for cls in classes)}
    found = {}
    for (module, function), position in PART_HOOK_CALLS.items():
        source = module_path(module).read_text()
        tree = parse(source)
        found.update({ast.unparse(call): None for call in walk(tree) if isinstance(call, ast.Call)
                      and isinstance(call.func, ast.Name) and call.func.id == function and len(call.args) > position
                      and isinstance(call.args[position], ast.Constant) and call.args[position].value in none_hooks})
        # folded as in the file: a loop that asks only passive members is over no part (`self.routes_mlp()`: False)
        hooks_folded = dict(folds, **found)
        found.update(constant_methods(parse(fold_constants(source, hooks_folded)[0]), hooks_folded)[0])
    return found


# The names the model (a StudyHost) is read by: in its own methods and in the training loop.
HOST_RECEIVERS = ("self", "model")
PARTS_LISTS = tuple(f"{receiver}.parts" for receiver in HOST_RECEIVERS)  # the model's list of study parts
# The fold holding (method, k) of each StudyHost method whose body, folded as in the file, returns its k-th parameter
# after self (k None: its body is `pass`; "{}": it returns an empty dict): host_method_folds.
PASSED_THROUGH = "(StudyHost methods that pass an argument through or do nothing)"
# The fold holding (member, its default's form) of each ModelPart member of NEUTRAL_DEFAULTS that no switched-on
# part overrides (passive_members).
PASSIVE_MEMBERS = "(part members no switched-on part overrides)"
# Those of them only a part can have, by any receiver (part_owned_members).
PART_OWNED_MEMBERS = "(passive part members no other class has)"


def neutral_form(node):
    """How a method or a class attribute changes nothing, or None: ("argument", k) for a method that returns its k-th
    parameter after self, ("returns", literal) for one that returns {}, False or None, as is or through one local
    (`out = {}` then `return out`), or does nothing ("None"), ("flag", "False") for a class attribute set to False.
    ModelPart's defaults (neutral_defaults) and StudyHost's methods folded as in the file (host_method_folds)."""
    if isinstance(node, ast.Assign):
        return ("flag", "False") if isinstance(node.value, ast.Constant) and node.value.value is False else None
    static = isinstance(node, ast.FunctionDef) and [ast.unparse(d) for d in node.decorator_list] == ["staticmethod"]
    if not isinstance(node, ast.FunctionDef) or node.decorator_list and not static or not node.args.args \
            or node.args.vararg or node.args.kwarg or node.args.kwonlyargs or node.args.posonlyargs:
        return None
    body = node.body[1:] if ast.get_docstring(node, clean=False) is not None else node.body
    parameters = [a.arg for a in node.args.args[0 if static else 1:]]
    if [type(statement) for statement in body] == [ast.Pass]:
        return ("returns", "None")
    if not body or len(body) > 2 or not isinstance(body[-1], ast.Return):
        return None
    value = body[-1].value
    if len(body) == 2:  # a local assigned, then returned
        local = assigned_locals(body[0])
        if not (len(local) == 1 and isinstance(value, ast.Name) and local[0][0] == value.id):
            return None
        value = local[0][1]
    elif isinstance(value, ast.Name) and value.id in parameters:
        return ("argument", parameters.index(value.id))
    if value is None or ast.unparse(value) in ("None", "False", "{}"):
        return ("returns", "None" if value is None else ast.unparse(value))
    return None


def neutral_defaults():
    """{member: its default's form (neutral_form)} of each member of ModelPart that speedrun/study.py's
    NEUTRAL_DEFAULTS names, read from ModelPart's source; raises UsageError for one of another form."""
    path = module_path(ModelPart.__module__)
    tree = parse(path.read_text())
    (part,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == ModelPart.__name__]
    members = {item.name: item for item in part.body if isinstance(item, ast.FunctionDef)}
    members.update({item.targets[0].id: item for item in part.body if isinstance(item, ast.Assign)
                    and len(item.targets) == 1 and isinstance(item.targets[0], ast.Name)})
    forms = {name: neutral_form(members.get(name)) for name in NEUTRAL_DEFAULTS}
    for name, form in forms.items():
        if form is None:
            raise UsageError(f"{EXPORT_FLAG}: {path.relative_to(ROOT).as_posix()}: NEUTRAL_DEFAULTS names {name}, but "
                             f"{ModelPart.__name__}.{name} is neither a method that returns a parameter, {{}}, False "
                             f"or None (or does nothing) nor a class attribute set to False")
    return forms


def passive_members(active, on_r18):
    """(member, its default's form) of each member NEUTRAL_DEFAULTS names that no switched-on study's part class (on
    the run's base; its own or an inherited member) overrides: every part answers it as ModelPart does, so a loop
    that asks the parts only such members runs as over no part (passive_loops_read). All of them with no study on."""
    classes = [study.r18_part if on_r18 else study.model_part for study in active]
    return tuple((name, form) for name, form in neutral_defaults().items()
                 if all(getattr(cls, name) is getattr(ModelPart, name) for cls in classes if cls is not None))


def project_sources():
    """The project's Python sources an export may inline from: speedrun/ and the track scripts."""
    return sorted((ROOT / "speedrun").rglob("*.py")) + sorted(ROOT.glob("train_gpt*.py"))


def part_owned_members(passive):
    """(member, its form) of each passive member (passive_members) that only a part can have: in the project's
    sources every class defining that name is ModelPart or a subclass, nothing stores the attribute, and no string
    given to getattr/setattr/hasattr/delattr is the name. Any read `X.member` then reads a part's (or fails), and
    every part in the file answers ModelPart's default: part_members_read writes the reads as that default,
    whatever X is."""
    part_classes, seen = {ModelPart.__name__}, [ModelPart]
    while seen:
        for cls in seen.pop().__subclasses__():
            part_classes.add(cls.__name__)
            seen.append(cls)
    owned = {name: form for name, form in passive
             if form[0] in ("flag", "returns") and name not in library_attributes()}
    for path in project_sources():
        for node in walk(parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.name not in part_classes:
                defined = {n.name for n in node.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
                defined |= {target.id for n in node.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                            for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
                            if isinstance(target, ast.Name)}
                for name in defined & owned.keys():
                    del owned[name]
            elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
                owned.pop(node.attr, None)
            elif isinstance(node, ast.Call) and ast.unparse(node.func) in ("getattr", "setattr", "hasattr", "delattr") \
                    and len(node.args) > 1 and isinstance(node.args[1], ast.Constant):
                owned.pop(node.args[1].value, None)
    return tuple(owned.items())


def part_members_read(text, folds):
    """The source with each read of a member PART_OWNED_MEMBERS holds written as its default (`X.built_last`:
    False; `X.model_layer_pattern(...)`: None), where X and the call's arguments only read names and attributes
    (nothing that is evaluated is lost) and the call is not a statement of its own (the loops over the parts fold
    those: passive_loops_read): the sort by it, the comprehensions filtering on it, fold (constant_keys_read,
    empty_registries_read)."""
    owned = dict(folds.get(PART_OWNED_MEMBERS, ()))
    if not owned:
        return text
    tree = parse(text)
    called = {id(node.func): node for node in walk(tree) if isinstance(node, ast.Call)}
    statements = {id(node.value) for node in walk(tree) if isinstance(node, ast.Expr)}  # a call for its effect
    edits = []
    for node in walk(tree):
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in owned
                and only_reads(node.value)):
            continue
        kind, value = owned[node.attr]
        call = called.get(id(node))
        if kind == "flag" and call is None:
            edits.append((node, value))
        elif kind == "returns" and call is not None and id(call) not in statements and not call.keywords \
                and all(map(only_reads, call.args)):
            edits.append((call, value))
    return replace_spans(text, edits) if edits else text


def passive_member_asked(node, part, passive):
    """(the member's name, its default's form) when `node` reads `part.MEMBER` or calls `part.MEMBER(...)` with
    arguments that only read names, MEMBER passive; else None."""
    call = node if isinstance(node, ast.Call) else None
    if call is not None:
        if call.keywords or not all(only_reads(a) for a in call.args):
            return None
        node = call.func
    if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == part
            and node.attr in passive):
        return None
    form = passive[node.attr]
    return (node.attr, form) if (form[0] == "flag") == (call is None) else None


def leaves_as_is(statement, part, passive):
    """Whether a loop's one statement leaves everything as it is when each part answers as ModelPart's default:
    `x = part.hook(..., x, ...)` (x at the parameter the default returns), `part.hook(...)` (it returns None) or
    `out.update(part.hook(...))` (it returns {})."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
            and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Call):
        asked = passive_member_asked(statement.value, part, passive)
        args = statement.value.args
        return asked is not None and asked[1][0] == "argument" and len(args) > asked[1][1] \
            and isinstance(args[asked[1][1]], ast.Name) and args[asked[1][1]].id == statement.targets[0].id
    if not (isinstance(statement, ast.Expr) and isinstance(statement.value, ast.Call)):
        return False
    call = statement.value
    asked = passive_member_asked(call, part, passive)
    if asked is not None:
        return asked[1] == ("returns", "None")
    if isinstance(call.func, ast.Attribute) and call.func.attr == "update" and only_reads(call.func.value) \
            and len(call.args) == 1 and not call.keywords:  # a dict updated with {}
        asked = passive_member_asked(call.args[0], part, passive)
        return asked is not None and asked[1] == ("returns", "{}")
    return False


def passive_loops_read(text, folds):
    """The source with the parts list (PARTS_LISTS) written `()` in each loop over it that asks the parts only
    members every part answers as ModelPart's default does (PASSIVE_MEMBERS), in a form that default leaves as it
    is: a `for` whose one statement leaves_as_is, or `any(part.MEMBER... for part in parts)` of a default False or
    None. The loop then folds as with no part (fold_ifs, empty_registries_read), as in a file with no study on."""
    passive = dict(folds.get(PASSIVE_MEMBERS, ()))
    if not passive:
        return text
    edits = []
    for node in walk(parse(text)):
        if isinstance(node, ast.For) and ast.unparse(node.iter) in PARTS_LISTS and isinstance(node.target, ast.Name) \
                and len(node.body) == 1 and not node.orelse and leaves_as_is(node.body[0], node.target.id, passive):
            edits.append((node.iter, "()"))
        elif isinstance(node, ast.Call) and ast.unparse(node.func) == "any" and len(node.args) == 1 \
                and not node.keywords and isinstance(node.args[0], ast.GeneratorExp):
            loop = node.args[0].generators
            if len(loop) == 1 and not loop[0].ifs and ast.unparse(loop[0].iter) in PARTS_LISTS \
                    and isinstance(loop[0].target, ast.Name):
                asked = passive_member_asked(node.args[0].elt, loop[0].target.id, passive)
                if asked is not None and asked[1][1] in ("False", "None"):
                    edits.append((loop[0].iter, "()"))
    return replace_spans(text, edits) if edits else text


def host_method_folds(folds):
    """{PASSED_THROUGH: (method, k)...} of StudyHost's methods that, folded as in the file (no part: every loop over
    the parts gone; or one that asks only passive members), return their k-th parameter after self (parts_block_input
    -> x), do nothing (k None: parts_before_step) or return an empty dict (k "{}": parts_named_scalars with no
    part); host_calls_read folds their calls."""
    text, _ = fold_constants(module_path(StudyHost.__module__).read_text(), folds)
    (host,) = [n for n in parse(text).body if isinstance(n, ast.ClassDef) and n.name == StudyHost.__name__]
    found = []
    for method in host.body:
        form = neutral_form(method) if isinstance(method, ast.FunctionDef) else None
        if form is not None and form[0] == "argument":
            found.append((method.name, form[1]))
        elif form in (("returns", "None"), ("returns", "{}")):  # does nothing, or returns an empty dict
            found.append((method.name, None if form[1] == "None" else "{}"))
    return {PASSED_THROUGH: tuple(found)}


# The fold holding (method, hook, study name, form, parameters) of each StudyHost method that asks every part's `hook`
# in turn where one part of the file's model alone overrides it (rule 33: forwarded_host_methods).
FORWARDED = "(StudyHost methods whose hook one part answers)"


def dispatch_form(method):
    """(hook, form) of a StudyHost method that asks each of self.parts in turn with its own parameters: "chain",
    `for part in self.parts: v = part.HOOK(self, *parameters)` then `return v` (v a parameter: parts_head_input);
    "merge", `out = {}`, `for part in self.parts: out.update(part.HOOK(self, *parameters))`, `return out`
    (parts_named_scalars); else None."""
    if not isinstance(method, ast.FunctionDef):
        return None
    arguments = method.args
    if method.decorator_list or arguments.vararg or arguments.kwarg \
            or arguments.kwonlyargs or arguments.posonlyargs or arguments.defaults or not arguments.args:
        return None
    parameters = [a.arg for a in arguments.args[1:]]
    body = method.body

    def parts_loop(node):
        return isinstance(node, ast.For) and ast.unparse(node.iter) == "self.parts" and not node.orelse \
            and isinstance(node.target, ast.Name) and len(node.body) == 1

    def hook_of(call, part):
        if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and not call.keywords \
                and ast.unparse(call.func.value) == part \
                and [ast.unparse(a) for a in call.args] == ["self", *parameters]:
            return call.func.attr
        return None

    if len(body) == 2 and parts_loop(body[0]) and isinstance(body[1], ast.Return) \
            and isinstance(body[1].value, ast.Name) and body[1].value.id in parameters:
        step = body[0].body[0]
        if isinstance(step, ast.Assign) and [ast.unparse(t) for t in step.targets] == [body[1].value.id]:
            hook = hook_of(step.value, body[0].target.id)
            return None if hook is None else (hook, "chain")
    if len(body) == 3 and isinstance(body[0], ast.Assign) and len(body[0].targets) == 1 \
            and isinstance(body[0].targets[0], ast.Name) and ast.unparse(body[0].value) == "{}" \
            and parts_loop(body[1]) and isinstance(body[2], ast.Return) \
            and ast.unparse(body[2].value) == body[0].targets[0].id:
        step = body[1].body[0]
        if isinstance(step, ast.Expr) and isinstance(step.value, ast.Call) and len(step.value.args) == 1 \
                and ast.unparse(step.value.func) == f"{body[0].targets[0].id}.update" and not step.value.keywords:
            hook = hook_of(step.value.args[0], body[1].target.id)
            return None if hook is None else (hook, "merge")
    return None


def forwarded_host_methods(folds):
    """Rule 33: {FORWARDED: ...} of the StudyHost methods (folded as in the file) of a dispatch_form whose hook one
    part of the file's model (BUILT_PARTS, rule 31) alone overrides, the others leaving it at ModelPart's default
    (NEUTRAL_DEFAULTS: the input as it is, or {}); forwarded_calls_read writes their calls as that part's."""
    built = folds.get(BUILT_PARTS, ())
    if not built:
        return {}
    classes = {name: getattr(importlib.import_module(module), cls) for name, module, cls in built}
    text, _ = fold_constants(module_path(StudyHost.__module__).read_text(), folds)
    (host,) = [n for n in parse(text).body if isinstance(n, ast.ClassDef) and n.name == StudyHost.__name__]
    found = []
    for method in host.body:
        form = dispatch_form(method)
        if form is None or form[0] not in NEUTRAL_DEFAULTS:
            continue
        hook, kind = form
        owners = [name for name, cls in classes.items() if getattr(cls, hook) is not getattr(ModelPart, hook)]
        if len(owners) == 1:
            found.append((method.name, hook, owners[0], kind, len(method.args.args) - 1))
    return {FORWARDED: tuple(found)} if found else {}


def forwarded_calls_read(text, folds):
    """Rule 33 at the calls: `self.M(args)` or `model.M(args)` (HOST_RECEIVERS) of a FORWARDED method is
    `self.study['NAME'].HOOK(self, args)`, the one part's answer (the parts list is fixed once built); a "merge"
    method only as the argument of `X.update(...)`, which then merges the part's dict itself."""
    forwarded = {method: rest for method, *rest in folds.get(FORWARDED, ())}
    if not forwarded:
        return text
    tree = parse(text)
    updated = {id(n.args[0]) for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr == "update" and len(n.args) == 1 and not n.keywords}
    edits = []
    for call in walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in forwarded
                and isinstance(call.func.value, ast.Name) and call.func.value.id in HOST_RECEIVERS
                and not call.keywords and not any(isinstance(a, ast.Starred) for a in call.args)):
            continue
        hook, name, kind, count = forwarded[call.func.attr]
        if len(call.args) != count or (kind == "merge" and id(call) not in updated):
            continue
        receiver = call.func.value.id
        arguments = ", ".join([receiver, *(ast.get_source_segment(text, a, padded=False) or ast.unparse(a)
                                           for a in call.args)])
        edits.append((call, f"{receiver}.study[{name!r}].{hook}({arguments})"))
    return replace_spans(text, edits) if edits else text


def host_calls_read(text, folds):
    """The source with each call `self.method(...)` or `model.method(...)` (HOST_RECEIVERS) of a method of
    PASSED_THROUGH, its other arguments only reading names, read as the argument it returns, and each such call of
    one that does nothing made as a statement gone, as is `out.update(call)` of one that returns an empty dict; then
    `x = x` left by the first goes too."""
    passed = dict(folds.get(PASSED_THROUGH, ()))
    if not passed:
        return text
    tree = parse(text)
    statements = {id(n.value): n for n in walk(tree) if isinstance(n, ast.Expr)}
    # a dict updated with the call's value: `out.update(self.parts_named_scalars())`
    statements.update({id(n.value.args[0]): n for n in walk(tree) if isinstance(n, ast.Expr)
                       and isinstance(n.value, ast.Call) and isinstance(n.value.func, ast.Attribute)
                       and n.value.func.attr == "update" and only_reads(n.value.func.value)
                       and len(n.value.args) == 1 and not n.value.keywords})
    edits, gone = [], []
    for call in walk(tree):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in passed
                and isinstance(call.func.value, ast.Name) and call.func.value.id in HOST_RECEIVERS
                and not call.keywords and not any(isinstance(a, ast.Starred) for a in call.args)):
            continue
        position = passed[call.func.attr]
        statement = statements.get(id(call))
        updated = statement is not None and statement.value is not call  # the call is update()'s argument
        if position in (None, "{}") and statement is not None and updated == (position == "{}") \
                and all(only_reads(a) for a in call.args):
            gone.append(statement)
        elif isinstance(position, int) and len(call.args) > position \
                and all(only_reads(a) for i, a in enumerate(call.args) if i != position):
            edits.append((call, parenthesised(text, call.args[position])))
    if edits:
        return replace_spans(text, edits)
    return without_statements(text, tree, gone + self_assignments(tree))


def answers_none(part_class, hook, folds, script_module):
    """Whether a part class's method `hook` (its own or the first base class's that defines it) returns None
    whatever it is passed, its module folded as the file's is."""
    owner = next((c for c in part_class.__mro__ if hook in vars(c)), None)
    if owner is None or owner.__module__ in ("__main__", script_module) or not is_project(owner.__module__):
        return False
    values, owners = folded_constant_methods(owner.__module__, tuple(sorted(folds.items())))
    return owners.get(hook) == owner.__name__ and f"self.{hook}()" in values and values[f"self.{hook}()"] is None


def folded_constant_methods(module, folds):
    """constant_methods of a project module folded with `folds` (its items, sorted) as the file's modules are."""
    return source_constant_methods(module, module_path(module).read_text(), folds)


@functools.lru_cache(maxsize=64)
def source_constant_methods(module, source, folds):
    """folded_constant_methods of the module's source text (cached by the text too: every hook of a part asks its
    module, and a module of that name in another checkout is another source)."""
    folds = dict(folds)
    readers = tuple(function for name, function in folds.get(PARSED_READERS, ()) if name == module)
    module_folds = dict(folds, **module_call_folds(module, parse(source), folds))
    text, _ = fold_constants(source, module_folds, readers)
    return constant_methods(parse(text), module_folds)


def offers_depth(fixed, config):
    """Whether the file's command line offers --num-layers (not fixed, and its base runs it)."""
    return "--num-layers" not in {name for name, _ in flag_groups(fixed)} | set(flags_not_offered(config))


def probe_configs(config, run_argv, modular_argv, fixed, resolve_args):
    """The configs study_field_folds compares a field's value across: the run's, the check's (the tiny preset) and,
    where the file's command line offers --num-layers, the run at one layer more and one less (those that resolve)."""
    probes = [config, resolve_args(modular_argv)]
    if offers_depth(fixed, config):
        for depth in (config.num_layers + 1, config.num_layers - 1):
            try:
                probes.append(resolve_args([*run_argv, "--num-layers", str(depth)]))
            except UsageError:
                continue
    return probes


UNKNOWN = object()
COMPARISONS = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Is: operator.is_, ast.IsNot: operator.is_not,
               ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge,
               ast.In: lambda a, b: a in b, ast.NotIn: lambda a, b: a not in b}


def only_reads(node):
    """Whether an expression only reads names, attributes and constants (no call, no subscript)."""
    return all(isinstance(n, (ast.Name, ast.Attribute, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp,
                              ast.Load, ast.cmpop, ast.boolop, ast.unaryop)) for n in walk(node))


def only_read_or_item(node):
    """Whether an expression only reads (evaluates_nothing), or is an item of one read at one (`outputs[-1]`)."""
    if isinstance(node, ast.Subscript):
        return evaluates_nothing(node.value) and evaluates_nothing(node.slice)
    return evaluates_nothing(node)


def reads_config(node):
    """Whether an expression only reads names, attributes, constants and items at a constant (`parsed["base"]`)."""
    return all(isinstance(n, (ast.Name, ast.Attribute, ast.Constant, ast.Subscript, ast.Load)) for n in walk(node))


# Builtins folded_value evaluates on a decided argument (no module may rebind a builtin's name: check_names).
PURE_BUILTINS = {"len": len, "any": any, "all": all, "bool": bool, "set": set}
# Methods of a decided string folded_value evaluates with constant arguments (`mode.endswith("-linear")`,
# `mode.partition("-")`, `form.split("+")`).
PURE_STR_METHODS = ("startswith", "endswith", "partition", "split")


def folded_value(node, folds, test=True):
    """The value of an expression made of folds (a field of a study that is on by any receiver: STUDY_FIELD),
    constants, `not`, `and`/`or`, one comparison, a conditional expression, a comprehension over an empty sequence,
    len/any/all/bool of a decided value, PURE_STR_METHODS of a decided string, and calls of methods that compute
    a constant (`self.name()` in folds, constant_methods) with arguments that only read names; UNKNOWN when any
    part that decides it is not. `and`/`or` are decided left to right, past a part left unknown only where that
    part just reads names; test: only the truth of the value counts (an `if`'s test), so such an
    `and`/`or` is decided as a bool (`x or "sum"` is true, its value unknown)."""
    text = ast.unparse(node)
    if text in folds:
        return folds[text]
    if test and text in PARTS_LISTS and folds.get(BUILT_PARTS):
        return True  # rule 31: every model of the file holds the run's parts, one at least
    if test and isinstance(node, (ast.Tuple, ast.List)) and node.elts and all(
            isinstance(n, (ast.Tuple, ast.List, ast.Name, ast.Attribute, ast.Constant, ast.Load)) for n in walk(node)):
        return True  # a display of items that evaluate nothing: `if [('backout', Backout)]:`
    if isinstance(node, ast.Attribute) and STUDY_FIELD + node.attr in folds and reads_config(node.value):
        return folds[STUDY_FIELD + node.attr]  # a field of a study that is on, in the run or the model config
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.IfExp):
        taken = folded_value(node.test, folds)
        if taken is UNKNOWN and only_reads(node.test):  # either branch gives one value: `x if self.parts else x`
            values = [folded_value(branch, folds, test=False) for branch in (node.body, node.orelse)]
            same = UNKNOWN not in values and type(values[0]) is type(values[1]) and values[0] == values[1]
            return values[0] if same else UNKNOWN
        return UNKNOWN if taken is UNKNOWN else folded_value(node.body if taken else node.orelse, folds, test)
    if isinstance(node, (ast.ListComp, ast.GeneratorExp, ast.SetComp)):
        iterated = folded_value(node.generators[0].iter, folds)  # the one part evaluated before any item
        if isinstance(iterated, (tuple, list)) and not iterated:
            return [] if isinstance(node, ast.ListComp) else ()
        return UNKNOWN
    if isinstance(node, ast.Call):
        called = ast.unparse(node.func)
        if f"{called}(*)" in folds and all(reads_config(a) for a in node.args + [k.value for k in node.keywords]):
            return folds[f"{called}(*)"]
        if f"{called}()" in folds and all(only_reads(a) for a in node.args + [k.value for k in node.keywords]):
            return folds[f"{called}()"]
        if isinstance(node.func, ast.Attribute) and node.func.attr in PURE_STR_METHODS and not node.keywords \
                and all(isinstance(a, ast.Constant) for a in node.args):
            receiver = folded_value(node.func.value, folds, test=False)
            try:
                return getattr(receiver, node.func.attr)(*(a.value for a in node.args)) \
                    if isinstance(receiver, str) else UNKNOWN
            except TypeError:  # the program would raise here; left as it is
                return UNKNOWN
        if called in PURE_BUILTINS and len(node.args) == 1 and not node.keywords:
            argument = folded_value(node.args[0], folds, test=called == "bool")  # decided: no effect
            return UNKNOWN if argument is UNKNOWN else PURE_BUILTINS[called](argument)
        return UNKNOWN
    if isinstance(node, ast.Dict) and not node.keys:
        return {}
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [folded_value(item, folds, test=False) for item in node.elts]
        return UNKNOWN if UNKNOWN in items else tuple(items)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        value = folded_value(node.operand, folds)
        return UNKNOWN if value is UNKNOWN else not value
    if isinstance(node, ast.BoolOp):
        skipped = False  # a part left unknown that only reads names (it could run first and change nothing)
        for part in node.values:
            value = folded_value(part, folds, test)
            if value is UNKNOWN:
                if not only_reads(part):
                    return UNKNOWN
                skipped = True
            elif bool(value) == isinstance(node.op, ast.Or):
                return UNKNOWN if skipped and not test else bool(value) if skipped else value
        return UNKNOWN if skipped else value
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in COMPARISONS:
        left, right = (folded_value(side, folds, test=False) for side in (node.left, node.comparators[0]))
        if UNKNOWN not in (left, right):
            try:
                return COMPARISONS[type(node.ops[0])](left, right)
            except TypeError:  # `x in None`: the program would raise here; left as it is
                return UNKNOWN
    return UNKNOWN


# ----- text edits on a module's source ------------------------------------------------------------------------------

def replace_lines(lines, first, last, new_lines):
    """lines with 1-based lines first..last replaced."""
    return lines[:first - 1] + new_lines + lines[last:]


def dedent_lines(lines, columns):
    return [line[columns:] if line[:columns].strip() == "" else line.lstrip() for line in lines]


def decided(node, folds):
    """Whether folds decide which branch of an `if`, a conditional expression or a `for` runs (a `for` over an
    empty sequence runs its `else` alone)."""
    if isinstance(node, (ast.If, ast.IfExp)):
        return folded_value(node.test, folds) is not UNKNOWN
    if isinstance(node, ast.For):
        iterated = folded_value(node.iter, folds)
        return isinstance(iterated, tuple) and not iterated
    return False


def without_study_fields(folds):
    """The folds less those of the fields of the studies that are on: what the functions that read those flags as
    parsed (PARSED_READERS) are folded with."""
    return {key: value for key, value in folds.items() if not key.startswith(STUDY_FIELD)}


def parsed_readers_nodes(tree, readers):
    """The ids of the nodes inside the module's top-level functions named in `readers`."""
    return {id(n) for f in tree.body if isinstance(f, ast.FunctionDef) and f.name in readers for n in walk(f)}


def fold_ifs(text, folds, readers=()):
    """The source with each `if` statement, conditional expression and `for` loop whose test (or sequence) the
    folds decide replaced by the branch that runs (outermost first); inside the functions `readers` without the
    folds of the fields of the studies that are on (they read the flags as parsed)."""
    parsed_folds = without_study_fields(folds)
    while True:
        tree = parse(text)
        inside = parsed_readers_nodes(tree, readers)
        node = next((n for n in walk(tree) if decided(n, parsed_folds if id(n) in inside else folds)), None)
        if node is None:
            return text
        folds_here = parsed_folds if id(node) in inside else folds
        taken = not isinstance(node, ast.For) and bool(folded_value(node.test, folds_here))
        if isinstance(node, ast.IfExp):
            text = replace_span(text, node, node.body if taken else node.orelse)
            continue
        lines = text.split("\n")
        branch = node.body if taken else node.orelse
        chained = branch and lines[branch[0].lineno - 1][node.col_offset:].startswith("elif")
        if lines[node.lineno - 1][node.col_offset:].startswith("elif"):  # a link of a chain whose `if` stays
            # the chain goes on with the rest of it, the branch taken as its `else`, or without this link
            kept = lines[branch[0].lineno - 1:node.end_lineno] if chained else \
                [" " * node.col_offset + "else:", *lines[branch[0].lineno - 1:branch[-1].end_lineno]] if branch else []
            text = "\n".join(replace_lines(lines, node.lineno, node.end_lineno, kept))
            continue
        kept = []
        if chained:  # the rest of an elif chain, at the column of the `if` it replaces: its `elif` becomes that `if`
            kept = lines[branch[0].lineno - 1:node.end_lineno]
            kept[0] = kept[0][:node.col_offset] + kept[0][node.col_offset + 2:]
        elif branch:
            kept = dedent_lines(lines[branch[0].lineno - 1:branch[-1].end_lineno],
                                branch[0].col_offset - node.col_offset)
        elif only_statement(tree, node):
            kept = [" " * node.col_offset + "pass"]
        first = node.lineno if kept else first_line_with_comments(lines, node)  # gone: its comments too
        text = "\n".join(replace_lines(lines, first, node.end_lineno, kept))


def evaluates_nothing(node):
    """Whether an expression only reads names and attributes, and builds constants and empty literals (`not {}`)."""
    return all(isinstance(n, (ast.Name, ast.Attribute, ast.Constant, ast.Compare, ast.BoolOp, ast.UnaryOp, ast.Load,
                              ast.cmpop, ast.boolop, ast.unaryop)) or is_empty_literal(n) for n in walk(node))


def neutral_operands_dropped(text, folds, readers=()):
    """The source with each operand of an `and` (`or`) that is the test of an `if`, a conditional expression or a
    `while` left out where the folds decide it true (false) and it evaluates nothing, while another operand is left
    undecided: the test is true exactly when it was (`if a and not {}` reads `if a`). In the functions `readers`,
    without the folds of the fields of the studies that are on (fold_ifs)."""
    tree = parse(text)
    inside = parsed_readers_nodes(tree, readers)
    parsed_folds = without_study_fields(folds)
    edits = []
    for node in walk(tree):
        test = node.test if isinstance(node, (ast.If, ast.IfExp, ast.While)) else None
        if not isinstance(test, ast.BoolOp):
            continue
        neutral = isinstance(test.op, ast.And)
        values = [folded_value(operand, parsed_folds if id(node) in inside else folds) for operand in test.values]
        kept = [operand for operand, value in zip(test.values, values)
                if value is UNKNOWN or bool(value) != neutral or not evaluates_nothing(operand)]
        if kept and len(kept) < len(test.values) and UNKNOWN in values:
            joined = f" {'and' if neutral else 'or'} ".join(
                f"({ast.get_source_segment(text, k)})" if isinstance(k, (ast.BoolOp, ast.IfExp, ast.NamedExpr))
                else ast.get_source_segment(text, k) for k in kept)
            edits.append((test, joined))
    return replace_spans(text, edits) if edits else text


def without_statements(text, tree, gone):
    """The source without the statements `gone` (nodes of `tree`, its parse), each with the comment lines right above
    it; a block left with none of its statements keeps `pass` in place of its first."""
    going = {id(statement) for statement in gone}
    emptied = {id(block[0]) for block in statement_blocks(tree)
               if block and all(id(statement) in going for statement in block)}
    lines = text.split("\n")
    for statement in sorted(gone, key=lambda n: n.lineno, reverse=True):
        kept = [" " * statement.col_offset + "pass"] if id(statement) in emptied else []
        lines = replace_lines(lines, statement.lineno if kept else first_line_with_comments(lines, statement),
                              statement.end_lineno, kept)
    return "\n".join(lines)


def only_statement(tree, node):
    """Whether `node` is the only statement of its block."""
    return any(block == [node] for block in statement_blocks(tree))


def replace_spans(text, edits):
    """The source with each expression node of `edits` [(node, its new source)] replaced (the nodes apart)."""
    span_of = source_spans(text)
    for (first, last), new in sorted(((span_of(n), new) for n, new in edits), key=lambda edit: edit[0], reverse=True):
        text = text[:first] + new + text[last:]
    return text


def source_spans(text):
    """The function giving an ast node's (start, end) character offsets in `text` (ast's columns count UTF-8 bytes)."""
    lines = text.split("\n")
    starts = list(itertools.accumulate((len(line) + 1 for line in lines), initial=0))

    def offset(line, column):
        return starts[line - 1] + len(lines[line - 1].encode()[:column].decode())
    return lambda node: (offset(node.lineno, node.col_offset), offset(node.end_lineno, node.end_col_offset))


def study_parts_of_base(text, on_r18):
    """The source with each `Study(...)` call's part keywords kept for the export's base only: on r18, a
    `r18_model_part=X` becomes its `model_part=X`; elsewhere `on_r18=` and `r18_model_part=` go (speedrun/study.py:
    only --base r18 reads them). So an r14 file with backout on holds no R18Backout, an r18 file no #14 Backout."""
    tree = parse(text)
    edits = []
    for call in walk(tree):
        if not is_study_call(call):
            continue
        keywords = {k.arg: k for k in call.keywords}
        r18_part = keywords.get("r18_model_part")
        if on_r18 and r18_part is not None and "model_part" in keywords:
            edits.append((keywords["model_part"].value, ast.get_source_segment(text, r18_part.value)))
        dropped = {"r18_model_part"} if on_r18 else {"on_r18", "r18_model_part"}
        arguments = sorted(call.args + call.keywords, key=lambda n: (n.lineno, n.col_offset))
        for before, argument in zip([None] + arguments, arguments):
            if isinstance(argument, ast.keyword) and argument.arg in dropped:
                if before is None:
                    raise UsageError(f"{EXPORT_FLAG}: Study({argument.arg}=...) must follow its other arguments")
                # from the end of the argument before it: the comma goes with the keyword
                span = ast.Constant(None, lineno=before.end_lineno, col_offset=before.end_col_offset,
                                    end_lineno=argument.end_lineno, end_col_offset=argument.end_col_offset)
                edits.append((span, ""))
    return replace_spans(text, edits) if edits else text


def replace_span(text, node, by):
    """The source with the expression `node` replaced by the source of the expression `by`."""
    return replace_spans(text, [(node, ast.get_source_segment(text, by))])


def is_scalar(value):
    """Whether a value is one whose repr is its literal (None, a bool, a number, a string)."""
    return value is None or isinstance(value, (bool, int, str)) or isinstance(value, float) and math.isfinite(value)


def constant_methods(tree, folds):
    """{`self.name()`: value}, {name: its class} of each method whose body (a docstring aside) is assignments of
    decided values to names, asserts decided true and a `return` of a decided scalar: calling it computes nothing
    else (StudyHost.parts_mlp_router is None with no study on). The value holds whatever arguments the call passes. A
    name two classes of the module define is left out (Program.check_constant_methods: nor may a class of another)."""
    found, owners = {}, {}
    classes = [c for c in walk(tree) if isinstance(c, ast.ClassDef)]
    defined = [m.name for c in classes for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))]
    for owner, method in ((c, m) for c in classes for m in c.body
                          if isinstance(m, ast.FunctionDef) and not m.decorator_list and m.args.args
                          and m.args.args[0].arg == "self" and defined.count(m.name) == 1):
        local = dict(folds)
        body = method.body[1:] if ast.get_docstring(method, clean=False) is not None else method.body
        for statement in body:
            if isinstance(statement, ast.Assign) and len(statement.targets) == 1 \
                    and isinstance(statement.targets[0], ast.Name):
                local[statement.targets[0].id] = folded_value(statement.value, local, test=False)
            elif isinstance(statement, ast.Assert) and folded_value(statement.test, local) is True:
                continue
            elif isinstance(statement, ast.Return) and statement.value is not None:
                value = folded_value(statement.value, local, test=False)
                if value is not UNKNOWN and is_scalar(value):
                    found[f"self.{method.name}()"], owners[method.name] = value, owner.name
                break
            else:
                break
    return found, owners


# The fields of an ast node that hold a block of statements (an except clause's is its `body`).
BLOCK_FIELDS = ("body", "orelse", "finalbody")


def statement_blocks(tree):
    """Every statement list in `tree`, those of its nested functions and classes included."""
    return [block for node in walk(tree) for block in (getattr(node, name, None) for name in BLOCK_FIELDS)
            if isinstance(block, list)]


def own_blocks(function):
    """The statement lists of a function outside its nested functions and classes (a pass over every function
    then sees each block once, with the names of the function it belongs to)."""
    blocks, todo = [], [function]
    while todo:
        node = todo.pop()
        for name in BLOCK_FIELDS:
            block = getattr(node, name, None)
            if isinstance(block, list):
                blocks.append(block)
                todo += [s for s in block if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                ast.ClassDef))]
        todo += getattr(node, "handlers", [])  # an except clause's body is a block of the function's too
    return blocks


def declared_names(function):
    """Each name a function (or a function or lambda in it) binds by a parameter or declares global or nonlocal,
    once for each: a count of a local's stores or reads that adds these sees a name that is not a plain local."""
    return [a.arg for n in walk(function) if isinstance(n, ast.arguments)
            for a in n.posonlyargs + n.args + n.kwonlyargs + [n.vararg, n.kwarg] if a is not None] \
        + global_names(function)


def global_names(function):
    """The names a function (or a function in it) declares global or nonlocal: another scope reads and sets them."""
    return [name for n in walk(function) if isinstance(n, (ast.Global, ast.Nonlocal)) for name in n.names]


def file_bindings(tree):
    """How many times the file (or a statement) binds each name: stores, parameters, global and nonlocal declarations,
    functions and classes it defines, names it imports and `except ... as` names."""
    bindings = collections.Counter(n.id for n in walk(tree) if isinstance(n, ast.Name)
                                   and not isinstance(n.ctx, ast.Load))
    bindings.update(declared_names(tree))
    bindings.update(n.name for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                                     ast.ClassDef)))
    bindings.update(a.asname or a.name.split(".")[0] for n in walk(tree)
                    if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names)
    bindings.update(n.name for n in walk(tree) if isinstance(n, ast.ExceptHandler) and n.name)
    return bindings


def assigned_locals(statement):
    """[(name, value node)] of `x = value` or `a, b = value_a, value_b` (names only); [] for any other statement."""
    if isinstance(statement, ast.Assign) and len(statement.targets) == 1 and isinstance(statement.targets[0], ast.Name):
        return [(statement.targets[0].id, statement.value)]
    pairs = unpacked_items(statement)
    return [(t.id, v) for t, v in pairs] if all(isinstance(t, ast.Name) for t, _ in pairs) else []


def unpacked_locals(statement):
    """The names of `a, b, c = value` (names only) where value is not a tuple display (assigned_locals pairs those);
    [] for any other statement."""
    if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1):
        return []
    target = statement.targets[0]
    if isinstance(target, ast.Tuple) and not isinstance(statement.value, ast.Tuple) \
            and all(isinstance(t, ast.Name) for t in target.elts):
        return [t.id for t in target.elts]
    return []


def is_str_method_receiver(node, call_funcs):
    """Whether `node` is the receiver of a PURE_STR_METHODS call (`t` of `t.partition("-")`)."""
    return any(f.attr in PURE_STR_METHODS and f.value is node for f in call_funcs if isinstance(f, ast.Attribute))


def propagate_locals(text, folds, readers=()):
    """The source with each local that is assigned once, by an expression the folds decide as a scalar (`router =
    self.parts_mlp_router()`, or one item of `residuals, router = self.parts_residuals(), self.parts_mlp_router()`,
    or each name of `a, b, c = mode.partition("-")` decided as a tuple of as many scalars), assigned that value as a
    literal and read as it in the statements after it in its block (where it is not called nor its attribute or
    item read, but for a decided string as the receiver of a PURE_STR_METHODS call): the tests on it then fold, and
    the assignment is left unread (drop_dead_constants). A local assigned a literal in the source is left as it
    is. In the functions `readers`, the fields of the studies that are on are not folded (fold_ifs)."""
    tree = parse(text)
    edits = []
    inside = parsed_readers_nodes(tree, readers)
    parsed_folds = without_study_fields(folds)
    for function in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        function_folds = parsed_folds if id(function) in inside else folds
        stores = [n.id for n in walk(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)]
        stores += declared_names(function)
        for block in own_blocks(function):
            for i, statement in enumerate(block):
                decided_names = []  # (name, its value)
                for name, value_node in assigned_locals(statement):
                    if stores.count(name) != 1 or isinstance(value_node, ast.Constant):
                        continue
                    if is_empty_literal(value_node):  # what a folded comprehension leaves (`own = []`)
                        edits += empty_tests(name, ast.unparse(value_node), block[i + 1:])
                        continue
                    value = folded_value(value_node, function_folds, test=False)
                    if value is not UNKNOWN and is_scalar(value):
                        edits.append((value_node, repr(value)))
                        decided_names.append((name, value))
                names = unpacked_locals(statement)
                if names and all(stores.count(name) == 1 for name in names):
                    values = folded_value(statement.value, function_folds, test=False)
                    if isinstance(values, tuple) and len(values) == len(names) and all(map(is_scalar, values)):
                        edits.append((statement.value, repr(values)))
                        decided_names += list(zip(names, values))
                if not decided_names:
                    continue
                later = [n for s in block[i + 1:] for n in walk(s)]
                call_funcs = [n.func for n in later if isinstance(n, ast.Call)]
                for name, value in decided_names:
                    held = {id(n.value) for n in later if isinstance(n, (ast.Attribute, ast.Subscript))
                            and not (isinstance(value, str) and is_str_method_receiver(n.value, call_funcs))}
                    held |= {id(f) for f in call_funcs}
                    edits += [(n, repr(value)) for n in later if isinstance(n, ast.Name) and n.id == name
                              and isinstance(n.ctx, ast.Load) and id(n) not in held]
    return replace_spans(text, edits)


def empty_tests(name, literal, later):
    """(read, its replacement) for each read of a local assigned an empty literal that only its truth counts in
    (the test of an `if`, a conditional expression or `while`, the operand of `not`: the literal) or that a `for`
    iterates (as is or its items(), keys() or values(): `()`), where every read of it in the statements `later` is
    one of those or an item read, or inside the body of an `if NAME:` (which then never runs: R18GPT's `if parts:`
    that builds them): nothing can fill it, and those tests and loops fold (fold_ifs)."""
    edits, reads, item_reads = {}, [], set()
    skipped = {id(n) for statement in later for test in walk(statement) if isinstance(test, ast.If)
               and isinstance(test.test, ast.Name) and test.test.id == name
               for inner in test.body for n in walk(inner)}
    for node in (n for statement in later for n in walk(statement) if id(n) not in skipped):
        if isinstance(node, (ast.If, ast.IfExp, ast.While)) or \
                isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            test = node.operand if isinstance(node, ast.UnaryOp) else node.test
            edits[id(test)] = (test, literal)
        elif isinstance(node, ast.For):
            loop = node.iter
            viewed = isinstance(loop, ast.Call) and isinstance(loop.func, ast.Attribute) and not loop.args \
                and not loop.keywords and loop.func.attr in ("items", "keys", "values")
            edits[id(loop.func.value if viewed else loop)] = (loop, "()")
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            item_reads.add(id(node.value))  # an item read: no change, nothing to fold
        if isinstance(node, ast.Name) and node.id == name:
            reads.append(node)
    if not all(id(n) in edits or id(n) in item_reads for n in reads):
        return []
    return [edits[id(n)] for n in reads if id(n) in edits]


EMPTY_OF = {ast.ListComp: "[]", ast.SetComp: "set()", ast.GeneratorExp: "()", ast.DictComp: "{}"}
# `tuple(x for x in ())` is (), `sorted((), key=...)` is []
EMPTY_CONSTRUCTORS = {"tuple": "()", "list": "[]", "set": "set()", "dict": "{}", "sorted": "[]"}
EMPTY_LITERALS = ("()", "[]", "set()", "{}")


def constant_keys_read(text):
    """The source with each `sorted(X, key=lambda ...: CONSTANT)` (what part_members_read leaves of a sort by a
    passive member) written as X, a list display or comprehension (the sort is stable), else `list(X)`; X's
    continuation lines move left with it."""
    tree = parse(text)
    edits = []
    for node in walk(tree):
        if isinstance(node, ast.Call) and ast.unparse(node.func) == "sorted" and len(node.args) == 1 \
                and [k.arg for k in node.keywords] == ["key"] and isinstance(node.keywords[0].value, ast.Lambda) \
                and isinstance(node.keywords[0].value.body, ast.Constant):
            listed = isinstance(node.args[0], (ast.List, ast.ListComp))
            first, *rest = ast.get_source_segment(text, node.args[0]).split("\n")
            shift = 0 if not listed else node.args[0].col_offset - node.col_offset
            moved = "\n".join([first, *dedent_lines(rest, shift)]) if node.lineno == node.args[0].lineno else None
            edits += [(node, moved if listed else f"list({moved})")] if moved is not None else []
    return replace_spans(text, edits) if edits else text


def keeps_nothing(node, folds):
    """Whether a comprehension of one `for` has a filter the folds decide false for every item: its test reads
    only constants (`None is not None`), or the item, where the sequence is a comprehension of a constant
    (`pattern for pattern in (None for study in studies) if pattern is not None`). The filter then runs for no
    item and the sequence, evaluated for nothing, goes with it (an export's rule: no filter or sequence of such a
    comprehension is run for its side effects)."""
    if type(node) not in EMPTY_OF or len(node.generators) != 1 or not node.generators[0].ifs:
        return False
    loop = node.generators[0]
    item = {}
    if isinstance(loop.target, ast.Name) and isinstance(loop.iter, (ast.GeneratorExp, ast.ListComp)) \
            and isinstance(loop.iter.elt, ast.Constant) and not isinstance(loop.iter.elt.value, str):
        item = {loop.target.id: loop.iter.elt.value}
    return any(folded_value(test, dict(folds, **item)) is False for test in loop.ifs)


def is_empty_literal(node):
    return ast.unparse(node) in EMPTY_LITERALS


def empty_registries_read(text, folds):
    """The source with each read of a name the folds hold as an empty tuple (the registry pruned to no study:
    `STUDIES`) written `()`, and each comprehension over an empty tuple written as its empty value: the loops and
    defaults over the registry then fold, and its definition is left unread (the file has no `STUDIES = ()`)."""
    tree = parse(text)
    edits = [(n, "()") for n in walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
             and folds.get(n.id, UNKNOWN) == () and isinstance(folds[n.id], tuple)]
    if edits:
        return replace_spans(text, edits)
    for node in walk(tree):
        # `tuple(())`, `sorted((), key=...)`: what a registry passed on leaves; `tuple(x) + ()`
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in EMPTY_CONSTRUCTORS \
                and len(node.args) == 1 and is_empty_literal(node.args[0]) \
                and all(only_reads(k.value) or isinstance(k.value, ast.Lambda) for k in node.keywords):
            return replace_spans(text, [(node, EMPTY_CONSTRUCTORS[node.func.id])])
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add) and ast.unparse(node.right) == "()" \
                and (isinstance(node.left, ast.Tuple) or isinstance(node.left, ast.Call)
                     and ast.unparse(node.left.func) == "tuple"):
            return replace_span(text, node, node.left)
    # `x |= set()`, `x += ()`: adds nothing
    for node in walk(tree):
        if isinstance(node, ast.AugAssign) and isinstance(node.op, (ast.BitOr, ast.Add)) \
                and is_empty_literal(node.value) and isinstance(node.target, ast.Name):
            return without_statements(text, tree, [node])
    parents = {id(child): node for node in walk(tree) for child in ast.iter_child_nodes(node)}
    for node in walk(tree):
        if type(node) in EMPTY_OF and (isinstance(node.generators[0].iter, ast.Tuple)
                                       and not node.generators[0].iter.elts or keeps_nothing(node, folds)):
            call = parents.get(id(node))
            if isinstance(call, ast.Call) and call.args == [node] and not call.keywords \
                    and isinstance(call.func, ast.Name) and call.func.id in EMPTY_CONSTRUCTORS:
                return replace_spans(text, [(call, EMPTY_CONSTRUCTORS[call.func.id])])
            if isinstance(call, ast.Call) and call.args == [node] and isinstance(node, ast.GeneratorExp):
                # a call's one generator argument spans the call's parentheses: `any(())`, not `any()`
                return replace_spans(text, [(node, f"({EMPTY_OF[type(node)]})")])
            return replace_spans(text, [(node, EMPTY_OF[type(node)])])
    return text


# The folds' key of the file's constant tuples that its loops are unrolled over (rule 25): ((name, the source of
# its tuple literal), ...): the FIXED_STUDIES an export writes.
UNROLLED = "(constant tuples unrolled)"


def item_sources(target, item):
    """{name: the source of its value} of a loop target bound to one item ((its source, the sources of its fields
    where it is a tuple display), as loop_items gives it), or None where the target is not names the item unpacks
    to."""
    source, fields = item
    if isinstance(target, ast.Name):
        return {target.id: source}
    if isinstance(target, ast.Tuple) and all(isinstance(t, ast.Name) for t in target.elts) \
            and fields is not None and len(fields) == len(target.elts):
        return {t.id: field for t, field in zip(target.elts, fields)}
    return None


def unrollable(loop, scope):
    """Whether a `for` statement's body can be written out once per item with its targets' values in place: no
    `break`, `continue` or `else`, no store of a target in it, no function or lambda in it (which would read a
    target late), and no read of a target anywhere else in its function (or module)."""
    targets = names_in([loop.target])
    body = [n for statement in loop.body for n in walk(statement)]
    if loop.orelse or any(isinstance(n, (ast.Break, ast.Continue, ast.Lambda, ast.FunctionDef, ast.AsyncFunctionDef,
                                         ast.ClassDef, ast.Global, ast.Nonlocal)) for n in body):
        return False
    if any(isinstance(n, ast.Name) and n.id in targets and not isinstance(n.ctx, ast.Load) for n in body):
        return False
    inside = {id(n) for n in body} | {id(n) for n in walk(loop.target)}
    return not any(isinstance(n, ast.Name) and n.id in targets and id(n) not in inside for n in walk(scope))


# The builtins whose argument a fixed field's read is made a literal in (no module rebinds them: check_names).
FIELD_CONVERSIONS = ("tuple", "len", "bool", "enumerate")


# The comparisons rule 13 decides of a fixed field and literals: COMPARISONS but identity (no value's: `is` stays).
VALUE_COMPARISONS = {op: compare for op, compare in COMPARISONS.items() if op not in (ast.Is, ast.IsNot)}


def fixed_fields_read(text, folds, readers=()):
    """Rule 13 beyond tests: each read `X.FIELD` (X only reads names) of a field of a study that is on whose value the
    folds hold (STUDY_FIELD) and that is a whole value - a loop's sequence or an assignment's value (or its item of an
    unpacking, unpacked_items), also as the one argument of a FIELD_CONVERSIONS call there - is that value's
    literal (`for j, name in enumerate(self.cfg.backout_layers)` reads `enumerate((11,))`; `tuple(cfg.backout_layers)`
    of a tuple is the tuple), outside the functions `readers` (which read the flags as parsed); so is a comparison of
    such reads and literals that is a whole value its truth (LAuReL's `self.whole_block = cfg.laurel_where ==
    "block"` is False). Another read inside an expression or passed to a call stays (rule 22 decides a parameter by
    the field a call passes: `normed=cfg.backout_mode == "sum"`).
    check_study_fields refuses a kept binding of such a name, so every such read is of a config."""
    fields = fixed_field_values(folds)
    if not fields:
        return text
    tree = parse(text)
    inside = parsed_readers_nodes(tree, readers)
    whole = {id(n.iter) for n in walk(tree) if isinstance(n, (ast.For, ast.comprehension))}
    whole |= {id(n.value) for n in walk(tree) if isinstance(n, ast.Assign)}
    whole |= {id(value) for n in walk(tree) for _, value in unpacked_items(n)}  # `self.k, self.x = cfg.k, ...`
    converted = {id(n.args[0]): n for n in walk(tree) if id(n) in whole and isinstance(n, ast.Call)
                 and isinstance(n.func, ast.Name) and n.func.id in FIELD_CONVERSIONS and len(n.args) == 1
                 and not n.keywords}

    def field_value(node):
        """[the value] of a literal or of a read of a fixed field, else []."""
        if isinstance(node, ast.Constant):
            return [node.value]
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and node.attr in fields \
                and reads_config(node.value) and id(node) not in inside:
            return [fields[node.attr]]
        return []

    # a comparison of a fixed field with literals that is a whole value is its truth (LAuReL's `self.whole_block =
    # cfg.laurel_where == "block"`); passed to a call it stays, for rule 22 (`normed=cfg.backout_mode == "sum"`)
    compared = [n for n in walk(tree) if id(n) in whole and isinstance(n, ast.Compare) and all(
        type(op) in VALUE_COMPARISONS for op in n.ops) and all(field_value(v) for v in [n.left, *n.comparators])
        and not all(isinstance(v, ast.Constant) for v in [n.left, *n.comparators])]

    def truth(n):
        """The comparison's value, or None where it raises (`None < 3`: the code that reads it never runs)."""
        values = [field_value(v)[0] for v in [n.left, *n.comparators]]
        try:
            return all(VALUE_COMPARISONS[type(op)](a, b) for op, a, b in zip(n.ops, values, values[1:]))
        except TypeError:
            return None

    edits = [(n, repr(value)) for n, value in ((n, truth(n)) for n in compared) if value is not None]
    for n in walk(tree):
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n.attr in fields \
                and reads_config(n.value) and id(n) not in inside and (id(n) in whole or id(n) in converted):
            call = converted.get(id(n))
            if call is not None and call.func.id == "tuple" and isinstance(fields[n.attr], tuple):
                edits.append((call, repr(fields[n.attr])))
            else:
                edits.append((n, repr(fields[n.attr])))
    return replace_spans(text, edits) if edits else text


def constant_tuples_unrolled(text, folds):
    """Rule 25: the source with each loop over a one-item tuple of a constant (what fixed_fields_read leaves: `for
    name in (11,)`) or over a constant tuple the folds hold (UNROLLED: the file's FIXED_STUDIES) written out: a list
    comprehension of one `for` and no filter is the list display of its element at each item (`[piece for piece, _
    in FIXED_STUDIES]` is `['backout-L11']`), a `for` statement (unrollable) its body once per item with the
    targets' values in place (`check_fixed_depth(config, {...})`); the constant is then read nowhere and the file
    does not hold it."""
    constants = {name: (parse(source, mode="eval").body, source) for name, source in folds.get(UNROLLED, ())}
    tree = parse(text)

    def loop_items(node):
        """[(an item's source, its fields' sources or None)] of a sequence this rule writes loops over, or None."""
        if isinstance(node, ast.Tuple) and len(node.elts) == 1 and is_constant_display(node):
            return [(ast.get_source_segment(text, node.elts[0]), None)]  # `for name in (11,)`
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "enumerate" \
                and len(node.args) == 1 and not node.keywords:  # `enumerate((11,))`: (0, 11)
            inner = loop_items(node.args[0])
            return None if inner is None or len(inner) != 1 else [(f"(0, {inner[0][0]})", ["0", inner[0][0]])]
        if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in constants):
            return None
        value, source = constants[node.id]
        return [(ast.get_source_segment(source, item), [ast.get_source_segment(source, field) for field in item.elts]
                 if isinstance(item, ast.Tuple) else None) for item in value.elts]

    def written_at(node, names, values, source_text):
        edits = [(n, values[n.id]) for n in walk(node)
                 if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in names]
        return replace_spans(source_text, edits)

    scopes = [tree] + [n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    innermost = {id(node): scope for scope in scopes for node in walk(scope)}  # the walk visits outer ones first
    for node in walk(tree):
        items = loop_items(node.generators[0].iter if isinstance(node, ast.ListComp) and len(node.generators) == 1
                           else node.iter if isinstance(node, ast.For) else None)
        if items is None:
            continue
        if isinstance(node, ast.ListComp) and not node.generators[0].ifs and not node.generators[0].is_async:
            bound = [item_sources(node.generators[0].target, item) for item in items]
            rebound = names_in([node.generators[0].target]) & {
                n.id for n in walk(node.elt) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
            if None in bound or rebound:  # an inner comprehension's own target is no item
                continue
            element = ast.get_source_segment(text, node.elt)
            if "\n" in element:  # parsed alone, an element on lines of its own needs its brackets
                continue
            tree_of = parse(element, mode="eval")
            written = [written_at(tree_of, set(values), values, element) for values in bound]
            return replace_spans(text, [(node, "[" + ", ".join(written) + "]")])
        if isinstance(node, ast.For) and unrollable(node, innermost[id(node)]):
            bound = [item_sources(node.target, item) for item in items]
            if None in bound:
                continue
            lines = text.split("\n")
            first, last = node.body[0].lineno, node.body[-1].end_lineno
            written = []
            for values in bound:
                edited = written_at(ast.Module(body=node.body, type_ignores=[]), set(values), values, text)
                written += dedent_lines(edited.split("\n")[first - 1:last], node.body[0].col_offset - node.col_offset)
            return "\n".join(replace_lines(lines, node.lineno, node.end_lineno, written))
    return text


def fold_constants(text, folds, readers=()):
    """(the source, {method name: class}): empty_registries_read, fold_ifs and propagate_locals, with the module's
    constant methods, until nothing changes (readers: the module's functions that read the flags of the studies
    that are on as parsed)."""
    folded_methods = {}
    while True:
        tree = parse(text)
        methods, owners = constant_methods(tree, folds)
        called = {ast.unparse(n.func) for n in walk(tree) if isinstance(n, ast.Call)}
        folded_methods.update({name: owner for name, owner in owners.items() if f"self.{name}" in called})
        module_folds = dict(folds, **methods)
        folded_methods.update({name: StudyHost.__name__ for name, _ in folds.get(PASSED_THROUGH, ())
                               if name in methods_of(tree, StudyHost.__name__)})  # the class its calls fold for
        folded_methods.update({name: StudyHost.__name__ for name, *_ in folds.get(FORWARDED, ())
                               if name in methods_of(tree, StudyHost.__name__)})
        read = part_members_read(passive_loops_read(forwarded_calls_read(host_calls_read(text, folds), folds),
                                                    folds), folds)
        read = neutral_operands_dropped(empty_registries_read(constant_keys_read(constant_tuples_unrolled(
            read, folds)), folds), module_folds, readers)
        folded = propagate_locals(fold_ifs(read, module_folds, readers), module_folds, readers)
        if folded == text:  # what the folds left of the fixed fields: their other reads (rule 13), then again
            folded = fixed_fields_read(text, folds, readers)
            if folded == text:
                return text, folded_methods
        text = folded


def methods_of(tree, class_name):
    """The names of the methods of the module's classes named class_name."""
    return {m.name for c in walk(tree) if isinstance(c, ast.ClassDef) and c.name == class_name
            for m in c.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}


def add_argument_calls(tree, names):
    """The `X.add_argument("--flag", ...)` calls of the tree whose flag (a literal) is in names."""
    return [n for n in walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            and n.func.attr == "add_argument" and n.args and isinstance(n.args[0], ast.Constant)
            and n.args[0].value in names]


def cut_choices(text, cuts):
    """The source with the choices of `cuts` ((flag, choices) pairs) cut from the literal `choices=[...]` of the
    flag's add_argument, and their notes from a `help=choices_help(...)`: the file's parser does not offer them,
    nor does its --help explain them (a declaration of another form keeps them)."""
    cuts = dict(cuts)
    edits = []
    for call in add_argument_calls(parse(text), cuts):
        cut = cuts[call.args[0].value]
        for keyword in call.keywords:
            if keyword.arg == "choices" and isinstance(keyword.value, (ast.List, ast.Tuple)):
                items = keyword.value.elts
                edits += cut_items(items, {i for i, item in enumerate(items) if isinstance(item, ast.Constant)
                                           and item.value in cut})
            if keyword.arg == "help" and isinstance(keyword.value, ast.Call) \
                    and isinstance(keyword.value.func, ast.Name) and keyword.value.func.id == choices_help.__name__:
                notes = keyword.value.args + keyword.value.keywords
                edits += cut_items(notes, {i for i, note in enumerate(notes)
                                           if isinstance(note, ast.keyword) and note.arg in cut})
    return replace_spans(text, edits) if edits else text


def choices_helps_written(text):
    """The source with each `choices_help(...)` of literals (a help cut_choices has cut or not) written as the string
    it makes, in lines of at most WIDTH: the file says its help without the helper."""
    edits = []
    for call in walk(parse(text)):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name)
                and call.func.id == choices_help.__name__):
            continue
        try:
            value = choices_help(*map(ast.literal_eval, call.args),
                                 **{k.arg: ast.literal_eval(k.value) for k in call.keywords if k.arg})
        except ValueError:  # not a literal: the call stays, the helper with it
            continue
        if not any(k.arg is None for k in call.keywords):
            edits.append((call, string_lines(value, call.col_offset)))
    return replace_spans(text, edits) if edits else text


def string_lines(value, column):
    """A string literal of `value` in implicitly joined pieces, split after spaces, each line at `column` of at most
    WIDTH characters (a piece of one word may be longer)."""
    pieces = [""]
    for word in value.split(" "):
        if pieces[-1] and column + len(pieces[-1]) + len(word) + 3 > WIDTH:
            pieces.append("")
        pieces[-1] += word + " "
    pieces[-1] = pieces[-1][:-1]
    return ("\n" + " " * column).join(json.dumps(piece, ensure_ascii=False) for piece in pieces)


def omit_arguments(text, omitted):
    """The source with each `parser.add_argument(FLAG, ...)` statement of an omitted flag replaced by
    `parser.set_defaults(dest=default)`: the file's command line lacks the flag, its config keeps the value. One
    whose default is SUPPRESS (no config field: the export's own flags) goes whole. A (flag, choices) pair of
    `omitted` cuts those choices from the flag's (cut_choices)."""
    text = choices_helps_written(cut_choices(text, [item for item in omitted if isinstance(item, tuple)]))
    omitted = {item for item in omitted if isinstance(item, str)}
    lines = text.split("\n")
    tree = parse(text)
    statements = {id(n.value): n for n in walk(tree) if isinstance(n, ast.Expr)}
    calls = [statements[id(call)] for call in add_argument_calls(tree, omitted) if id(call) in statements]
    for node in sorted(calls, key=lambda n: n.lineno, reverse=True):
        keywords = {k.arg: k.value for k in node.value.keywords}
        dest = keywords["dest"].value if "dest" in keywords else node.value.args[0].value[2:].replace("-", "_")
        store_true = "action" in keywords and ast.literal_eval(keywords["action"]) == "store_true"
        default = ast.unparse(keywords["default"]) if "default" in keywords else "False" if store_true else "None"
        receiver = ast.unparse(node.value.func.value)
        new_lines = [] if default.endswith("SUPPRESS") else [f"{' ' * node.col_offset}{receiver}.set_defaults("
                                                             f"{dest}={default})"]
        first = first_line_with_comments(lines, node) if not new_lines else node.lineno
        lines = replace_lines(lines, first, node.end_lineno, new_lines)
    return "\n".join(lines)


def drop_unreachable(text):
    """The source without the statements that follow a `return` or `raise` in the same block (a folded `if` can
    leave them: `if base == "r18": return ...` kept whole)."""
    tree = parse(text)
    cuts = []
    for body in statement_blocks(tree):
        ends = [i for i, s in enumerate(body) if isinstance(s, (ast.Return, ast.Raise))]
        if ends and ends[0] + 1 < len(body):
            cuts.append((body[ends[0] + 1].lineno, body[-1].end_lineno))
    lines = text.split("\n")
    for first, last in sorted(cuts, reverse=True):
        lines = replace_lines(lines, first, last, [])
    return "\n".join(lines)


# The comment line that opens a file's section of one source file (section_header).
SECTION_HEADER = re.compile(r"# \S+\.py(: | -+$)")


def first_line_with_comments(lines, node):
    """The 1-based first line of a statement counting its decorators and the comment lines right above it (its own
    comments; a file's section header is its section's)."""
    first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
    while first > 1 and lines[first - 2].strip().startswith("#") and not SECTION_HEADER.match(lines[first - 2]) \
            and len(lines[first - 2]) - len(lines[first - 2].lstrip()) == node.col_offset:
        first -= 1
    return first


def drop_dead_constants(text):
    """The source without the assignments to local names their function never reads of values that only read
    names, attributes and constants (what folding leaves of `state = load(...) if config.flag else None`, or of
    `D, k = cfg.model_dim, 1`), with the comments right above them; again until none is left (a dropped one can
    leave the one it read unread)."""
    return to_fixed_point(dead_constants_dropped, text)


def dead_constants_dropped(text):
    """drop_dead_constants, one pass (an empty literal is such a value too: `own = []`)."""
    tree = parse(text)
    lines = text.split("\n")
    cuts = {}  # (first line, last line) -> the lines in their place
    for function in (n for n in walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        if reads_own_namespace(function):
            continue
        read = function_reads(function)
        for block in own_blocks(function):
            dead = [s for s in block if assigned_locals(s)
                    and all(name not in read and (only_reads(value) or is_empty_literal(value))
                            for name, value in assigned_locals(s))]
            for i, statement in enumerate(dead):
                empties = i == 0 and len(dead) == len(block)  # the block keeps a `pass`
                cuts[(first_line_with_comments(lines, statement), statement.end_lineno)] = \
                    [" " * statement.col_offset + "pass"] if empties else []
    for (first, last), new_lines in sorted(cuts.items(), reverse=True):
        lines = replace_lines(lines, first, last, new_lines)
    return "\n".join(lines)


def drop_docstrings(text):
    """The source without its docstrings (the module's, each class's and function's): the file keeps the comments
    only, as upstream's script; a body that was a docstring alone becomes `pass`."""
    tree = parse(text)
    lines = text.split("\n")
    cuts = []
    for node in walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) \
                and ast.get_docstring(node, clean=False) is not None:
            doc = node.body[0]
            own_lines = (lines[doc.lineno - 1][:doc.col_offset].strip() == ""
                         and lines[doc.end_lineno - 1][doc.end_col_offset:].strip() == "")
            if own_lines:
                alone = len(node.body) == 1 and not isinstance(node, ast.Module)  # the body becomes `pass`
                last = doc.end_lineno
                # and the blank lines after it, but for a `pass`: they part it from the next statement
                while last < len(lines) and not lines[last].strip() and not alone:
                    last += 1
                cuts.append((doc.lineno, last, [" " * doc.col_offset + "pass"] if alone else []))
    for first, last, new_lines in sorted(cuts, reverse=True):
        lines = replace_lines(lines, first, last, new_lines)
    return "\n".join(lines)


def single_blank_lines(text):
    """The text with every run of blank lines made one (upstream's spacing, not PEP 8's two between definitions),
    and none right under a one-line `class` or `def` header (what a cut docstring and members leave)."""
    text = re.sub(r"\n(?:[ \t]*\n)+", "\n\n", text)
    return re.sub(r"(\n[ \t]*(?:class|def) [^\n]*:\n)[ \t]*\n", r"\1", text)


def without_nested_imports(text, first_line, node):
    """A top-level statement's text (its first line is the module's line first_line) with the project imports
    inside it removed; a renamed one (`import x as y`) becomes `y = x` where it stood."""
    lines = text.split("\n")
    nested = [n for n in walk(node) if n is not node and isinstance(n, ast.ImportFrom) and n.module
              and is_project(n.module)]
    for imp in sorted(nested, key=lambda n: n.lineno, reverse=True):
        indent = " " * imp.col_offset
        kept = [f"{indent}{a.asname} = {a.name}" for a in imp.names if a.asname and a.asname != a.name]
        lines = replace_lines(lines, imp.lineno - first_line + 1, imp.end_lineno - first_line + 1, kept)
    return "\n".join(lines)


def prune_registry(text, name, keep, where):
    """The source with the elements of the top-level tuple `name = (...)` kept where keep[i] (each element on
    whole lines of its own), under a note in place of the comments above it; on one line where the names it keeps
    fit (`STUDIES = (BACKOUT,)`)."""
    tree = parse(text)
    for node in tree.body:
        if isinstance(node, ast.Assign) and [ast.unparse(t) for t in node.targets] == [name]:
            elements = node.value.elts
            if len(elements) != len(keep):
                raise UsageError(f"{EXPORT_FLAG}: {where}: {name} has {len(elements)} entries, the run {len(keep)}")
            lines = text.split("\n")
            for element in elements:
                before = lines[element.lineno - 1][:element.col_offset]
                after = lines[element.end_lineno - 1][element.end_col_offset:].split("#")[0]
                if before.strip() or after.strip() not in ("", ","):
                    raise UsageError(f"{EXPORT_FLAG}: {where}:{element.lineno}: each entry of {name} must stand on "
                                     f"lines of its own (docs/export.md, rules 6 and 12)")
            # the comments above the registry tell how the modular one is laid out: the file's says what it holds
            note = f"# In this file: {REGISTRY_NOTES[name]}; the others of {where} are left out."
            comments_from = first_line_with_comments(lines, node)
            names = [element.id for element, kept in zip(elements, keep) if kept and isinstance(element, ast.Name)]
            one_line = f"{name} = ({', '.join(names)}{',' if len(names) == 1 else ''})"
            if len(names) == sum(keep) and len(one_line) <= WIDTH \
                    and not any("#" in line for line in lines[node.lineno - 1:node.end_lineno]):
                return "\n".join(replace_lines(lines, comments_from, node.end_lineno, [note, one_line]))
            for element, kept in reversed(list(zip(elements, keep))):
                if not kept:  # with the comment lines right above it (its own)
                    lines = replace_lines(lines, first_line_with_comments(lines, element), element.end_lineno, [])
            return "\n".join(replace_lines(lines, comments_from, node.lineno - 1, [note]))
    raise UsageError(f"{EXPORT_FLAG}: {where}: no {name} = (...) to prune")


def span(first, last):
    """A node spanning the source from `first` to `last`, each (line, column)."""
    return ast.Constant(None, lineno=first[0], col_offset=first[1], end_lineno=last[0], end_col_offset=last[1])


def cut_items(items, removed):
    """[(span node, "")] removing items[i] for each i in `removed` from a signature's or a call's items (nodes with
    positions), each with the comma that joins it to the others."""
    edits, i = [], 0
    while i < len(items):
        if i not in removed:
            i += 1
            continue
        j = i
        while j + 1 < len(items) and j + 1 in removed:
            j += 1
        if i > 0:  # from the end of the item before
            edits.append((span((items[i - 1].end_lineno, items[i - 1].end_col_offset),
                               (items[j].end_lineno, items[j].end_col_offset)), ""))
        else:  # to the start of the item after, or the run's end
            end = (items[j + 1].lineno, items[j + 1].col_offset) if j + 1 < len(items) else \
                (items[j].end_lineno, items[j].end_col_offset)
            edits.append((span((items[0].lineno, items[0].col_offset), end), ""))
        i = j + 1
    return edits


def parameter_items(function):
    """Nodes spanning a function's parameters (`name` or `name=default`), in order."""
    return [span((a.lineno, a.col_offset), ((d or a).end_lineno, (d or a).end_col_offset))
            for a, d in parameters_and_defaults(function.args) if a in function.args.args]


def without_calls_decided(text, fixed_parameters, no_ops):
    """The source with each parameter of `fixed_parameters` ((function, parameter, its position, the literal every
    call of the program passes it: `()`, or one scalar the folds decide; decided_calls) read as that literal in its
    function and gone from its signature and its calls, and each call statement of a function of `no_ops` (its
    body does nothing) gone. A function named `self.name` is a method, called as `self.name(...)`; one named `.name`
    a method called by any receiver (`run.settle(...)`: sole_answerers)."""
    if not fixed_parameters and not no_ops:
        return text
    tree = parse(text)
    fixed = {}
    literals = {}
    for function, parameter, position, literal in fixed_parameters:
        fixed.setdefault(function, {})[parameter] = position
        literals[function, parameter] = literal
    edits = []  # the calls first: an argument cut may be a read of another fixed parameter
    for call in walk(tree):
        called = ast.unparse(call.func) if isinstance(call, ast.Call) else None
        if called not in fixed and isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute):
            called = f".{call.func.attr}"  # a method alone in answering its calls, by any receiver
        if called in fixed and isinstance(call.func, (ast.Name, ast.Attribute)):
            names = fixed[called]
            skipped = 1 if isinstance(call.func, ast.Attribute) else 0  # a method's call does not pass self
            items = sorted(call.args + call.keywords, key=lambda n: (n.lineno, n.col_offset))
            removed = {items.index(call.args[position - skipped]) for position in names.values()
                       if position - skipped < len(call.args)}
            removed |= {items.index(k) for k in call.keywords if k.arg in names}
            edits += cut_items(items, removed)
    text = replace_spans(text, edits) if edits else text
    edits = []
    tree = parse(text)
    definitions = [(n.name, n) for n in tree.body if isinstance(n, ast.FunctionDef)]
    definitions += [(f"{receiver}.{m.name}", m) for c in walk(tree) if isinstance(c, ast.ClassDef)
                    for m in c.body if isinstance(m, ast.FunctionDef) for receiver in ("self", "")]
    for key, node in definitions:
        if key in fixed:
            names = fixed[key]
            edits += cut_items(parameter_items(node), set(names.values()))
            receivers = {id(n.value) for n in walk(node) if isinstance(n, ast.Attribute)}
            # `(1).bit_length()`: a number read as a receiver keeps its parentheses (a name needs none). A store
            # stays: decided_calls reads folded functions, so one here is in a branch the folding takes away.
            edits += [(n, f"({literals[key, n.id]})" if id(n) in receivers and not literals[key, n.id].isidentifier()
                       else literals[key, n.id])
                      for n in walk(node) if isinstance(n, ast.Name) and n.id in names
                      and isinstance(n.ctx, ast.Load)]
    text = replace_spans(text, edits) if edits else text
    tree = parse(text)
    calls = [s for s in walk(tree) if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
             and isinstance(s.value.func, ast.Name) and s.value.func.id in no_ops]
    return without_statements(text, tree, calls)


def decided_parameters(function, called, skipped, folds_of, constants=frozenset()):
    """[(parameter, its position, its literal)] of the parameters of `function` that every call of `called`
    passes `()` or leaves at a default of `()`, or passes one scalar that folded_value decides (with the folds
    `folds_of(call)`) where not every call spells it as a literal, or that the function never reads where every
    call passes it an expression that only reads, or an item of one (literal: None), or to which every call passes
    the name of one of `constants` (module_constants) that the function does not bind (literal: that name);
    `skipped`: the leading parameters the calls do not pass (a method's self)."""
    args = function.args.args
    defaults = [d for a, d in parameters_and_defaults(function.args) if a in args]
    stored = {n.id for n in walk(function) if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    read = {n.id for n in walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    inner = {a.arg for n in walk(function) if isinstance(n, ast.arguments) and n is not function.args
             for a in n.posonlyargs + n.args + n.kwonlyargs}
    found = []
    for position, (arg, default) in enumerate(zip(args, defaults)):
        if arg.arg in stored | inner or position < skipped:
            continue
        passed = []  # (the argument, the folds it is read with)
        for call in called:
            keyword = next((k.value for k in call.keywords if k.arg == arg.arg), None)
            passed.append((call.args[position - skipped] if position - skipped < len(call.args)
                           else keyword or default, folds_of(call)))
        if not passed or any(v is None for v, _ in passed):
            continue
        if all(isinstance(v, ast.Tuple) and not v.elts for v, _ in passed):
            found.append((arg.arg, position, "()"))
            continue
        if arg.arg not in read and all(only_read_or_item(v) for v, _ in passed):  # unread; passing does nothing
            found.append((arg.arg, position, "None"))
            continue
        names = {v.id if isinstance(v, ast.Name) else None for v, _ in passed}
        if len(names) == 1 and names <= constants - stored - inner - {a.arg for a in args}:
            found.append((arg.arg, position, names.pop()))  # the one object every call passes
            continue
        # passed by every call, and folded in one at least: a literal the source passes is left as it is
        if any(v is default for v, _ in passed) or all(isinstance(v, ast.Constant) for v, _ in passed):
            continue
        values = [folded_value(v, folds, test=False) for v, folds in passed]
        if all(v is not UNKNOWN and is_scalar(v) and type(v) is type(values[0]) and v == values[0] for v in values):
            found.append((arg.arg, position, repr(values[0])))
    return found


def decided_calls(program):
    """(fixed_parameters, no_ops) of the kept program for without_calls_decided: of each top-level function its
    name reaches only by calls (never as a value, a local or a parameter, nor assigned; no `*`/`**` argument), and
    of each method that one class of the program's modules defines and that is reached only by `self.name(...)`
    calls (no other attribute or string names it; no library base class has it), the decided_parameters (in the
    functions that read the flags as parsed, PARSED_READERS, read without the folds of the studies' fields); and
    the functions whose body is `pass` alone, called as statements with arguments that only read names
    (check_r18_studies with no study on)."""
    nodes = [s.node for m in program.modules.values() for s in program.kept_statements(m)]
    functions = {n.name: n for n in nodes if isinstance(n, ast.FunctionDef) and not n.decorator_list}
    every = [n for node in nodes for n in walk(node)]
    loads = [n.id for n in every if isinstance(n, ast.Name)]
    bound = {a.arg for n in every if isinstance(n, ast.arguments) for a in n.posonlyargs + n.args + n.kwonlyargs}
    bound |= {n.name for n in every if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n not in nodes}
    bound |= {n.id for n in every if isinstance(n, ast.Name) and not isinstance(n.ctx, ast.Load)}
    calls = {}
    for n in every:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in functions:
            calls.setdefault(n.func.id, []).append(n)
    statements = {id(n.value) for n in every if isinstance(n, ast.Expr)}
    readers = {(module, function) for module, function in program.folds.get(PARSED_READERS, ())}
    inside_readers = {id(n) for m in program.modules.values() for s in program.kept_statements(m)
                      if isinstance(s.node, ast.FunctionDef) and (m.name, s.node.name) in readers
                      for n in walk(s.node)}
    parsed_folds = without_study_fields(program.folds)

    def folds_of(call):
        return parsed_folds if id(call) in inside_readers else program.folds

    fixed, no_ops = [], []
    for name, function in functions.items():
        called = calls.get(name, [])
        if loads.count(name) != len(called) or name in bound or function.args.vararg or function.args.kwarg \
                or function.args.posonlyargs \
                or any(isinstance(a, ast.Starred) for c in called for a in c.args) \
                or any(k.arg is None for c in called for k in c.keywords):
            continue
        if [type(s) for s in function.body] == [ast.Pass] and all(id(c) in statements for c in called) \
                and all(only_reads(a) for c in called for a in c.args + [k.value for k in c.keywords]):
            no_ops.append(name)
            continue
        fixed += [(name, *found) for found in decided_parameters(function, called, 0, folds_of)]
    # methods: over every statement of the modules, kept or not (a class left out keeps its calls, cut alike)
    classes = [(m, s) for m in program.modules.values() for s in m.statements if isinstance(s.node, ast.ClassDef)]
    anywhere = [n for _, s in classes for n in walk(s.node)]
    anywhere += [n for m in program.modules.values() for s in m.statements if not isinstance(s.node, ast.ClassDef)
                 for n in walk(s.node)]
    methods = {}
    for module, statement in classes:
        library = program.library_methods(module, statement)
        for method in statement.node.body:
            if isinstance(method, (ast.FunctionDef, ast.AsyncFunctionDef)):
                methods.setdefault(method.name, []).append(None if library is None or method.name in library
                                                           else method)
    named = collections.Counter(n.attr for n in anywhere if isinstance(n, ast.Attribute))
    named.update(n.value for n in anywhere if isinstance(n, ast.Constant) and isinstance(n.value, str))
    named.update(n.id for n in anywhere if isinstance(n, ast.Name))
    self_calls = {}
    for n in anywhere:
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and isinstance(n.func.value, ast.Name) \
                and n.func.value.id == "self":
            self_calls.setdefault(n.func.attr, []).append(n)
    for name, (method, *others) in methods.items():
        called = self_calls.get(name, [])
        if others or method is None or method.name.startswith("__") or method.decorator_list \
                or not isinstance(method, ast.FunctionDef) or not method.args.args \
                or method.args.args[0].arg != "self" or method.args.vararg or method.args.kwarg \
                or method.args.posonlyargs or named[name] != len(called) \
                or any(isinstance(a, ast.Starred) for c in called for a in c.args) \
                or any(k.arg is None for c in called for k in c.keywords):
            continue
        fixed += [(f"self.{name}", *found) for found in decided_parameters(method, called, 1, folds_of)]
    # positions in the modules' own source: a pass reads signatures an earlier one cut (the first parameter found
    # there may be the second of the source)
    cut = collections.defaultdict(set)
    for function, _, position, _ in program.decided[0]:
        cut[function].add(position)

    def source_position(function, position):
        kept = [i for i in range(position + len(cut[function]) + 1) if i not in cut[function]]
        return kept[position]

    fixed = [(function, parameter, source_position(function, position), literal)
             for function, parameter, position, literal in fixed]
    return tuple(sorted(fixed)), tuple(sorted(no_ops))


# ----- a module as statements ------------------------------------------------------------------------------------

@dataclass
class Statement:
    node: ast.stmt
    text: str  # its lines, with the comments and blank lines before it
    defines: set = field(default_factory=set)
    refs: set = field(default_factory=set)
    # A class's methods and attributes (dunders aside) by name: each is kept only when the kept code names it
    # (Program.shake).
    methods: dict = field(default_factory=dict)

    @property
    def is_definition(self):
        return bool(self.defines)

    @property
    def own_nodes(self):
        """The parts of the statement that are kept with it: all of it, or a class less its members."""
        if not self.methods:
            return [self.node]
        node = self.node
        return node.decorator_list + node.bases + node.keywords + [s for s in node.body if not is_method(s)]


def member_name(node):
    """The name of a statement of a class body the export may leave out, a method or a class attribute (`name =
    value`; `depth_expansion = R18DepthExpansion`, read by a study that is off), or None (a dunder is always kept,
    as is an annotated field: a dataclass's)."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        name = node.name
    elif isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
        name = node.targets[0].id
    else:
        return None
    return None if name.startswith("__") and name.endswith("__") else name


def is_method(node):
    """Whether a statement of a class body is a member the export may leave out (member_name)."""
    return member_name(node) is not None


def names_in(nodes):
    return {n.id for node in nodes for n in walk(node) if isinstance(n, ast.Name)}


def attributes_in(nodes):
    """Every attribute name and string constant in these nodes: whatever can reach a method by its name
    (`x.step()`, `getattr(x, "step")`; a class body's own statements reach its methods by plain names too)."""
    return {n.attr for node in nodes for n in walk(node) if isinstance(n, ast.Attribute)} | strings_in(nodes)


def strings_in(nodes):
    """Every string constant in these nodes: a name that getattr, a registry or a format may reach."""
    return {n.value for node in nodes for n in walk(node)
            if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def library_class(module, dotted):
    """The class a dotted name of a module's plain imports or the builtins denotes, or None."""
    head, *rest = dotted.split(".")
    line = module.plain_imports.get(head)
    try:
        if line is None:
            found = getattr(builtins, head, None)
        elif isinstance(line, str):  # `import a.b as c` binds a.b; `import a.b` binds a
            imported = line.split()[1]
            found = importlib.import_module(imported if " as " in line else imported.split(".")[0])
        else:
            source, name, _ = line
            found = getattr(importlib.import_module(source), name, None)
    except ImportError:
        return None
    for part in rest:
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def without_methods(statement, dropped):
    """A class statement with the methods named in `dropped` cut, with their decorators and comments."""
    lines = statement.text.split("\n")
    node = parse(statement.text).body[0]
    cut = [item for item in node.body if is_method(item) and member_name(item) in dropped]
    for item in reversed(cut):
        empties = len(cut) == len(node.body) and item is cut[0]  # the body keeps a `pass`
        lines = replace_lines(lines, first_line_with_comments(lines, item), item.end_lineno,
                              [" " * item.col_offset + "pass"] if empties else [])
    text = "\n".join(lines)
    node = parse(text).body[0]
    return Statement(node, text, statement.defines, names_in([node]))


@dataclass
class Module:
    name: str
    path: Path
    docstring: str | None
    statements: list  # Statement, imports excluded
    plain_imports: dict  # bound name -> import line (stdlib, numpy, torch)
    project_imports: dict  # bound name -> (module, name), at any depth (lazy imports included)
    constant_methods: dict = field(default_factory=dict)  # method name -> its class, its calls folded (fold_constants)

    def definers(self, name):
        return [s for s in self.statements if name in s.defines]


def assigned_names(node):
    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
    return {n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)}


def import_line(node, alias):
    bound = alias.asname or alias.name.split(".")[0]
    if isinstance(node, ast.Import):
        line = f"import {alias.name}" + (f" as {alias.asname}" if alias.asname else "")
        return bound, line
    return bound, (node.module, alias.name, alias.asname)


def load_module(name, folds, registries, omitted=(), decided=((), ())):
    """The module `name` as statements, its `if`s folded and its registries pruned (cached: a process exporting
    several runs parses each source once per folding)."""
    path = module_path(name)
    return parsed_module(name, path.read_text(), tuple(sorted(folds.items())),
                         tuple((r, tuple(k)) for r, k in registries.get(name, {}).items()), tuple(omitted), decided)


def module_call_folds(name, tree, folds):
    """The folds of FOLDED_CALLS under the names this module calls them by: its own function's, or what a project
    import binds (at any depth, renamed or not)."""
    found = {}
    for module, function in FOLDED_CALLS:
        if folded_call_key(module, function) not in folds:
            continue
        value = folds[folded_call_key(module, function)]
        if module == name:
            found[f"{function}(*)"] = value
        for node in walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == module:
                found.update({f"{a.asname or a.name}(*)": value for a in node.names if a.name == function})
    return found


@functools.lru_cache(maxsize=256)
def parsed_module(name, source, folds, registries, omitted, decided=((), ())):
    path = module_path(name)
    where = path.relative_to(ROOT).as_posix()
    rewrites = [rewrite[1:] for rewrite in dict(folds).get(FIXED_DECLARATIONS, ()) if rewrite[0] == name]
    if rewrites:
        source = rewritten_declarations(source, rewrites, where)
    written = [function[1:] for function in dict(folds).get(WRITTEN_FUNCTIONS, ()) if function[0] == name]
    if written:
        source = written_functions(source, written, where)
    quiet = [declared for module, declared in dict(folds).get(QUIET_DECLARATIONS, ()) if module == name]
    if quiet:
        source = quiet_declarations(source, quiet)
    folds = dict(folds, **module_call_folds(name, parse(source), dict(folds)))
    readers = tuple(function for module, function in folds.get(PARSED_READERS, ()) if module == name)
    text, folded_methods = fold_constants(without_calls_decided(omit_arguments(source, omitted), *decided), folds,
                                          readers)
    text = study_parts_of_base(drop_dead_constants(drop_unreachable(text)), folds.get(R18_BASE, False))
    for registry, keep in registries:
        text = prune_registry(text, registry, list(keep), where)
    docstring = ast.get_docstring(parse(text), clean=True)
    text = drop_docstrings(text)
    tree = parse(text)
    lines = text.split("\n")
    body = list(tree.body)
    previous_end = 0
    module = Module(name, path, docstring, [], {}, {}, folded_methods)
    for node in walk(tree):  # project imports at any depth: lazy ones resolve names too
        if isinstance(node, ast.ImportFrom) and node.module and is_project(node.module):
            for alias in node.names:
                module.project_imports[alias.asname or alias.name] = (node.module, alias.name)
                if alias.asname and alias.asname != alias.name and node in tree.body:
                    raise UsageError(f"{EXPORT_FLAG}: {where}:{node.lineno}: `import {alias.name} as "
                                     f"{alias.asname}` at module level cannot be inlined (import it unrenamed)")
        elif isinstance(node, ast.Import) and any(is_project(a.name) for a in node.names):
            if any(a.name != "speedrun" for a in node.names):
                raise UsageError(f"{EXPORT_FLAG}: {where}:{node.lineno}: `import` of a project module: only "
                                 f"`from ... import` can be inlined")
    for node in body:
        segment = without_nested_imports("\n".join(lines[previous_end:node.end_lineno]), previous_end + 1, node)
        previous_end = node.end_lineno
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if isinstance(node, ast.ImportFrom) and (node.module == "__future__" or is_project(node.module or "")):
                continue
            if isinstance(node, ast.Import) and all(is_project(a.name) for a in node.names):
                continue
            for alias in node.names:
                bound, line = import_line(node, alias)
                module.plain_imports[bound] = line
            continue
        statement = Statement(node, segment)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            statement.defines = {node.name}
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and all(
                isinstance(n, (ast.Name, ast.Tuple, ast.Store)) for t in
                (node.targets if isinstance(node, ast.Assign) else [node.target]) for n in walk(t)):
            statement.defines = assigned_names(node)
        statement.refs = names_in([node])
        if isinstance(node, ast.ClassDef):
            for item in (item for item in node.body if is_method(item)):
                statement.methods.setdefault(member_name(item), []).append(item)
        module.statements.append(statement)
    return module


# ----- what the run needs ---------------------------------------------------------------------------------------

class Program:
    """The modules reachable from the script and, of each, the statements something kept refers to; of a kept
    class, the methods that the kept code names (by a name, an attribute or a string: `x.step()`) or that a library
    base class has (nn.Module's forward, argparse's error: the library calls them)."""

    def __init__(self, script_module, folds, registries, omitted=(), decided=((), ())):
        self.folds, self.registries, self.omitted, self.decided = folds, registries, omitted, decided
        self.modules = {}
        self.kept = {}  # module name -> set of statement ids
        self.kept_methods = {}  # id(class statement) -> the names of its methods kept
        self.named = set()  # every attribute name and string of the kept code (attributes_in)
        self.waiting = {}  # method name -> [(module, class statement)]: kept once the kept code names it
        self.script = self.load(script_module)
        self.shake()
        self.check_constant_methods()

    def load(self, name):
        if name not in self.modules:
            self.modules[name] = load_module(name, self.folds, self.registries, self.omitted, self.decided)
            self.kept[name] = set()
        return self.modules[name]

    def resolve(self, module, name, seen=()):
        """(module, statement list) that define `name` as seen from `module`, following project imports; None for
        a builtin, a local or a plain import."""
        if module.definers(name):
            return module, module.definers(name)
        if name in module.project_imports:
            target_name, target = module.project_imports[name]
            if (target_name, target) in seen:
                return None
            return self.resolve(self.load(target_name), target, seen + ((target_name, target),))
        return None

    def keep(self, module, statements, work):
        fresh = [s for s in statements if id(s) not in self.kept[module.name]]
        if fresh and not self.kept[module.name]:  # a module that runs: its package's __init__ and side effects
            fresh += [s for s in module.statements if not s.is_definition]
            package = module.name.rsplit(".", 1)[0] if "." in module.name else module.name
            if is_project(package) and package != module.name and module_path(package).name == "__init__.py":
                init = self.load(package)
                self.keep(init, [s for s in init.statements if not s.is_definition], work)
        for s in fresh:
            if id(s) not in self.kept[module.name]:
                self.kept[module.name].add(id(s))
                work.append((module, s.own_nodes))
                self.kept_methods[id(s)] = set()
                called_by_library = self.library_methods(module, s) if s.methods else set()
                # the class body's names too (a class attribute's value may name another)
                attributes = [item.value for item in (s.node.body if s.methods else []) if isinstance(item, ast.Assign)]
                named = self.named | (names_in(s.own_nodes + attributes) if s.methods else set())
                for name in s.methods:
                    if called_by_library is None or name in called_by_library or name in named:
                        self.keep_method(module, s, name, work)
                    else:
                        self.waiting.setdefault(name, []).append((module, s))

    def keep_method(self, module, statement, name, work):
        self.kept_methods[id(statement)].add(name)
        work.append((module, statement.methods[name]))

    def library_methods(self, module, statement, depth=0):
        """The attribute names of the library classes a class derives from, through project classes; None where a
        base is neither (a call, a subscript, a metaclass): then every method is kept."""
        node = statement.node
        if node.keywords or depth > 20:
            return None
        names = set()
        for base in node.bases:
            dotted = ast.unparse(base)
            if not re.fullmatch(r"[\w.]+", dotted):
                return None
            found = self.resolve(module, dotted) if "." not in dotted else None
            if found is not None:
                target, definers = found
                if len(definers) != 1 or not isinstance(definers[0].node, ast.ClassDef):
                    return None
                inherited = self.library_methods(target, definers[0], depth + 1)
            else:
                library = library_class(module, dotted)
                inherited = None if library is None else set(dir(library))
            if inherited is None:
                return None
            names |= inherited
        return names

    def shake(self):
        work = []
        self.keep(self.script, [s for s in self.script.statements if not s.is_definition], work)
        while work:
            module, nodes = work.pop()
            for name in sorted(names_in(nodes)):
                found = self.resolve(module, name)
                if found is not None:
                    target, definers = found
                    self.keep(target, definers, work)
            for name in sorted(attributes_in(nodes) - self.named):
                self.named.add(name)
                for owner_module, statement in self.waiting.pop(name, []):
                    self.keep_method(owner_module, statement, name, work)

    def check_constant_methods(self):
        """Raises UsageError where a kept class defines a method another class's calls of it were folded for (a
        subclass overriding it: `self.name()` may call either)."""
        for module in self.modules.values():
            for name, owner in module.constant_methods.items():
                for other in self.modules.values():
                    # the classes as parsed: kept_statements has cut the methods nothing names (an override too)
                    overriding = [s.node.name for s in other.statements if id(s) in self.kept[other.name]
                                  and name in s.methods and (other, s.node.name) != (module, owner)]
                    if overriding:
                        raise UsageError(f"{EXPORT_FLAG}: {owner}.{name} was folded to its value, but "
                                         f"{other.path.name}'s {overriding[0]} defines {name} too: rename one")

    def kept_statements(self, module):
        """The kept statements of a module, each class without the methods left out."""
        kept = [s for s in module.statements if id(s) in self.kept[module.name]]
        return [without_methods(s, set(s.methods) - self.kept_methods[id(s)])
                if set(s.methods) - self.kept_methods[id(s)] else s for s in kept]

    def order(self):
        """The kept modules, each after those it imports (packages' __init__ first), the script last, in the order
        of the modular sources' own imports (source_import_order), not of what folding left: every file of one
        track and base lists its modules in one order, so two arms' files differ where their code does."""
        done, visiting = [], set()

        def visit(name):
            if name in done or name in visiting or not module_path(name).is_file():
                return
            visiting.add(name)
            for dependency in source_import_order(name):
                visit(dependency)
            done.append(name)
        for name in sorted(self.modules):
            if module_path(name).name == "__init__.py":
                visit(name)
        visit(self.script.name)
        return [self.modules[name] for name in done if name in self.modules and self.kept[name]]


def source_import_order(name):
    """The project modules `name`'s source imports, those at module level first, then the lazy ones (inside a
    function), each in the order of the source."""
    return imports_in_order(module_path(name).read_text())


@functools.cache
def imports_in_order(source):
    """source_import_order of a source text (cached by the text, not the module's name: a process that exports
    from two checkouts, as the tests do, must not read one's order for the other's)."""
    tree = parse(source)
    top = [node.module for node in tree.body if isinstance(node, ast.ImportFrom) and node.module
           and is_project(node.module)]
    lazy = [node.module for node in sorted((node for node in walk(tree) if isinstance(node, ast.ImportFrom)),
                                           key=lambda node: node.lineno) if node.module and is_project(node.module)]
    return tuple(dict.fromkeys(top + lazy))


# Where a module goes in the file, in upstream's reading order: the run's hyperparameters, the model (a module named
# nowhere here), the optimisers, the data, the training loop, then the run's infrastructure (CPU/gloo, checks, logs,
# the command line, checkpoints); a module the code above needs as it is defined moves up to just before it
# (file_order).
FILE_PARTS = (("hyperparameters", ("speedrun.presets",)),
              ("model", ()),
              ("optimisers", ("speedrun.muon", "speedrun.optimizers", "speedrun.r18.optim")),
              ("data", ("data.shard_format", "speedrun.schedule", "speedrun.data", "speedrun.r18.data",
                        "speedrun.r18.schedule")),
              ("training loop", ("speedrun.training", "speedrun.r18.train")),
              ("infrastructure", ("speedrun.compile_cache", "speedrun.errors", "speedrun.distributed",
                                  "speedrun.run_config", "speedrun.variants", "speedrun.logformat",
                                  "speedrun.checkpoint", "speedrun.cli", "speedrun.runlog", "speedrun.profiling")))
PART_NAMES = [name for name, _ in FILE_PARTS]
# A track script's sections (a line of dashes, then `# Name`) join the part of the same kind: its configuration
# leads the file, its model follows the project's, and so on. Its statements before the first section go with that
# section; a section of another name, and the script's last one, end the file (`main` and `if __name__` are there).
SCRIPT_SECTION_PARTS = {"Configuration": "hyperparameters", "Model": "model", "Optimisers": "optimisers",
                        "Command line": "infrastructure"}
SCRIPT_SECTION = re.compile(r"^# -{10,}\n# ([A-Z][A-Za-z ]*)\n", re.MULTILINE)


def file_part(module_name):
    """The rank of a module's part of the file (FILE_PARTS; a module named there in no part: the model's)."""
    return next((rank for rank, (_, names) in enumerate(FILE_PARTS) if module_name in names),
                PART_NAMES.index("model"))


@dataclass
class FileUnit:
    """A stretch of the file under one header: a module's kept statements, or one section of the script's."""
    module: Module
    statements: list  # kept Statement objects, in the source's order
    part: int  # rank in FILE_PARTS; len(FILE_PARTS): after them all
    section: str | None = None  # the script's section; None: a module, or a script that marks none


def script_units(program, last_part):
    """The script's kept statements as FileUnits, one per section it marks (SCRIPT_SECTION), the marking lines cut
    from them (the unit's header names the section); one unit at the end for a script that marks none."""
    script = program.script
    labels, current = [], None
    for original in script.statements:  # all of them: a section's marks stand before its first, kept or not
        marks = SCRIPT_SECTION.findall(original.text)
        current = marks[-1] if marks else current
        if id(original) in program.kept[script.name]:  # kept_statements' order
            labels.append(current)
    first = next((label for label in labels if label is not None), None)
    units = []
    for label, statement in zip(labels, program.kept_statements(script)):
        label = label or first
        if not units or units[-1].section != label:
            units.append(FileUnit(script, [], last_part, label))
        units[-1].statements.append(replace(statement, text=SCRIPT_SECTION.sub("", statement.text)))
    for unit in units[:-1]:
        part = SCRIPT_SECTION_PARTS.get(unit.section)
        unit.part = last_part if part is None else PART_NAMES.index(part)
    return units


def evaluated_when_defined(node):
    """The parts of a top-level statement Python evaluates as the file runs, its annotations aside (the file is
    `from __future__ import annotations`): a function's decorators and defaults; a class's bases, keywords,
    decorators and body, its methods as functions; any other statement whole."""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return [*node.decorator_list, *node.args.defaults, *(d for d in node.args.kw_defaults if d is not None)]
    if isinstance(node, ast.ClassDef):
        return [*node.decorator_list, *node.bases, *node.keywords,
                *(part for item in node.body for part in evaluated_when_defined(item))]
    if isinstance(node, ast.AnnAssign):
        return [node.value] if node.value is not None else []
    return [node]


def file_order(program, modules):
    """The file's units (FileUnit: the modules, package __init__s aside, and the script's sections) in the file's
    order: by their part (FILE_PARTS), each after every unit whose definitions its own need as they are defined
    (evaluated_when_defined), and otherwise in `modules`' order (Program.order), the script's sections in its own.
    A unit that code of an earlier part needs so moves up to just before it."""
    units = [FileUnit(m, program.kept_statements(m), file_part(m.name)) for m in modules if m is not program.script]
    units += script_units(program, len(FILE_PARTS)) if program.script in modules else []
    script_unit_of = {name: i for i, unit in enumerate(units) if unit.section is not None
                      for s in unit.statements for name in s.defines}
    module_unit_of = {unit.module.name: i for i, unit in enumerate(units) if unit.section is None}
    needs = []
    for i, unit in enumerate(units):
        names = names_in([part for s in unit.statements for part in evaluated_when_defined(s.node)])
        needed = set()
        for target, statements in filter(None, (program.resolve(unit.module, name) for name in names)):
            if target is program.script:
                needed |= {script_unit_of[name] for s in statements for name in s.defines if name in script_unit_of}
            elif target.name in module_unit_of:
                needed.add(module_unit_of[target.name])
        needs.append(needed - {i})
    below = [unit.part for unit in units]
    changed = True
    while changed:  # a unit needed as others are defined is placed with the earliest of them
        changed = False
        for i, needed in enumerate(needs):
            for other in needed:
                if below[other] > below[i]:
                    below[other], changed = below[i], True
    placed, left = [], list(range(len(units)))
    while left:
        ready = [i for i in left if needs[i] <= set(placed) | {i}]
        if not ready:  # needs in a circle: the units' own order, as the modular program imports them
            placed += left
            break
        chosen = min(ready, key=lambda i: (below[i], left.index(i)))
        placed.append(chosen)
        left.remove(chosen)
    return [units[i] for i in placed]


CONSTANT_NAME = re.compile(r"[A-Z][A-Z0-9_]*")


def class_constants(program):
    """`self.NAME` -> value of each upper-case class attribute the kept classes set, at class level only, to one
    literal value (a track's `USE_SNOO = False`): whatever class `self` is, it reads that value. None where the kept
    code calls setattr with a name it does not spell out."""
    values, assigned = {}, set()
    for module in program.modules.values():
        for statement in program.kept_statements(module):
            for node in walk(statement.node):
                if isinstance(node, ast.ClassDef):
                    for item in node.body:
                        targets = item.targets if isinstance(item, ast.Assign) else []
                        if len(targets) == 1 and isinstance(targets[0], ast.Name):
                            try:
                                values.setdefault(targets[0].id, []).append(ast.literal_eval(item.value))
                            except ValueError:
                                assigned.add(targets[0].id)
                elif isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load):
                    assigned.add(node.attr)
                elif isinstance(node, ast.Call) and ast.unparse(node.func) == "setattr":
                    name = node.args[1] if len(node.args) > 1 else None
                    if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                        return None
                    assigned.add(name.value)
    return {f"self.{name}": found[0] for name, found in values.items()
            if CONSTANT_NAME.fullmatch(name) and name not in assigned and is_scalar(found[0])
            and all(type(value) is type(found[0]) and value == found[0] for value in found)}


def folded_program(script_module, folds, registries, omitted=()):
    """The Program, shaken again with the class constants of its kept classes folded where they are tested and the
    calls its kept code decides (decided_calls) until neither finds more."""
    program = Program(script_module, folds, registries, omitted)
    while True:
        constants = class_constants(program) or {}
        found = decided_calls(program)
        decided = tuple(tuple(sorted(set(known) | set(new))) for known, new in zip(program.decided, found))
        if not set(constants) - set(program.folds) and decided == program.decided:
            return program
        program = Program(script_module, {**constants, **program.folds}, registries, omitted, decided)


# ----- the file ---------------------------------------------------------------------------------------------------

def used_imports(module, statements):
    refs = set().union(*(s.refs for s in statements)) if statements else set()
    return {bound: line for bound, line in module.plain_imports.items() if bound in refs}


def import_block(imports):
    """Plain imports as lines: `import x` ones, then the merged `from x import a, b` ones; stdlib first."""
    def third_party(module):
        return module.split(".")[0] not in sys.stdlib_module_names

    plain = sorted({line for line in imports if isinstance(line, str)},
                   key=lambda line: (third_party(line.split()[1]), line))
    merged = {}
    for line in imports:
        if not isinstance(line, str):
            source, name, asname = line
            merged.setdefault(source, set()).add(name + (f" as {asname}" if asname else ""))
    froms = [f"from {source} import {', '.join(sorted(names))}" for source, names in merged.items()]
    lines = [line for line in plain if not third_party(line.split()[1])]
    lines += sorted(line for line in froms if not third_party(line.split()[1]))
    lines += [""] if lines else []
    lines += [line for line in plain if third_party(line.split()[1])]
    lines += sorted(line for line in froms if third_party(line.split()[1]))
    return lines


def check_names(modules, program):
    """Raises UsageError where two kept modules bind one name differently (one file has one namespace)."""
    bound = {}
    for module in modules:
        statements = program.kept_statements(module)
        names = {name: module.name for s in statements for name in s.defines}
        names.update({b: line for b, line in used_imports(module, statements).items()})
        for name, origin in names.items():
            if name in bound and bound[name] != origin:
                raise UsageError(f"{EXPORT_FLAG}: `{name}` is bound by both {bound[name]} and {origin}: rename "
                                 f"one to export this run")
            bound[name] = origin
            if isinstance(origin, str) and hasattr(builtins, name):
                raise UsageError(f"{EXPORT_FLAG}: {origin} defines `{name}`, a builtin's name")


BASES = ("r14", "r18")


def hand_base_test(node):
    """Whether an expression compares a base by hand (`args.base == "r18"`, `parsed["base"] != "r14"`)."""
    sides = [node.left, *node.comparators] if isinstance(node, ast.Compare) else []
    return any(isinstance(side, ast.Constant) and side.value in BASES for side in sides) and any(
        isinstance(side, ast.Attribute) and side.attr == "base"
        or isinstance(side, ast.Subscript) and ast.unparse(side.slice) == "'base'" for side in sides)


def check_kept_code(modules, program):
    """Raises UsageError where the kept code relies on what the export changes (docs/export.md, rules 4 and 9): a
    base compared by hand (only calls of speedrun.cli.runs_r18 fold; another test keeps both bases' code), or a
    docstring read (`__doc__`: the file has none)."""
    for module in modules:
        where = module.path.relative_to(ROOT).as_posix()
        for statement in program.kept_statements(module):
            for node in walk(statement.node):
                if hand_base_test(node):
                    raise UsageError(f"{EXPORT_FLAG}: {where} tests the base as `{ast.unparse(node)}`: call "
                                     f"speedrun.cli.runs_r18, the test the export folds (docs/export.md, rule 4)")
                if isinstance(node, ast.Attribute) and node.attr == "__doc__":
                    raise UsageError(f"{EXPORT_FLAG}: {where} reads `{ast.unparse(node)}`, and the file keeps no "
                                     f"docstrings: write the text as a string (docs/export.md, rule 9)")


def check_off_study_fields(modules, program, active):
    """Raises UsageError where a kept statement still reads a field of a study that is off (`config.laurel` outside
    a test the export folds): the file's config has no such field."""
    off = {flag.dest for study in STUDIES if study not in active for flag in study.flags}
    for module in modules:
        for statement in program.kept_statements(module):
            for node in walk(statement.node):
                if isinstance(node, ast.Attribute) and node.attr in off and isinstance(node.value, ast.Name) \
                        and node.value.id in CONFIG_NAMES:
                    where = module.path.relative_to(ROOT).as_posix()
                    raise UsageError(f"{EXPORT_FLAG}: {where} reads {ast.unparse(node)} of a study that is off, "
                                     f"outside a test the export folds (if ...: / ... if ... else ...)")


def check_study_fields(modules, program, study_folds):
    """Raises UsageError where the kept code could read a folded field of a study that is on (study_field_folds)
    otherwise than as the run's value (docs/export.md, rule 13): an attribute of that name assigned, or a member of a
    kept class; a resolve function that is no top-level function of its module (its reads of the parsed flags would
    be folded), or that calls one of its module's that reads a folded field (as parsed, there)."""
    fields = set(fixed_field_values(study_folds))
    readers = study_folds.get(PARSED_READERS, ())
    for module in modules:
        where = module.path.relative_to(ROOT).as_posix()
        kept = program.kept_statements(module)
        for node in (n for statement in kept for n in walk(statement.node)):
            members = [member_name(item) or (item.target.id if isinstance(item, ast.AnnAssign)
                                             and isinstance(item.target, ast.Name) else None)
                       for item in (node.body if isinstance(node, ast.ClassDef) else [])]
            named = {node.attr} if isinstance(node, ast.Attribute) and not isinstance(node.ctx, ast.Load) else set()
            clash = sorted((named | set(members)) & fields)
            if clash:
                raise UsageError(f"{EXPORT_FLAG}: {where}:{node.lineno} binds `{clash[0]}`, a field of a study that "
                                 f"is on, which the export folds to the run's value: rename it (docs/export.md, "
                                 f"rule 13)")
        functions = {s.node.name: s.node for s in kept if isinstance(s.node, ast.FunctionDef)}
        for name in (function for owner, function in readers if owner == module.name):
            reader = functions.get(name)
            if reader is None:
                raise UsageError(f"{EXPORT_FLAG}: {where}: the study's resolve ({name}) must be a top-level "
                                 f"function of its module (docs/export.md, rule 13)")
            for call in (n for n in walk(reader) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
                callee = functions.get(call.func.id)
                if callee is not None and callee is not reader and any(
                        isinstance(n, ast.Attribute) and n.attr in fields for n in walk(callee)):
                    raise UsageError(f"{EXPORT_FLAG}: {where}: {name} passes the parsed flags to {callee.name}, "
                                     f"which reads a field the export folds: read it in {name} (docs/export.md, "
                                     f"rule 13)")


def section_header(module, study_line, ruled=False):
    """One comment line naming the source file (and, for a study's module, how the study enters; for a section of
    the script, which: `ruled`, the line runs to the RULE's length as a module's does)."""
    relative = module.path.relative_to(ROOT).as_posix()
    if study_line:
        return ["", f"# {relative}: {study_line} ".ljust(len(RULE), "-") if ruled else f"# {relative}: {study_line}"]
    return ["", f"# {relative} ".ljust(len(RULE), "-")]


def study_lines(active, fixed):
    """Module name -> the comment line saying which switched-on study its section is, its flags and how it enters."""
    lines = {}
    for study in active:
        names = {flag.name for flag in study.flags}
        flags = " ".join(token for name, values in flag_groups(fixed) if name in names for token in [name, *values])
        lines[study.resolve.__module__] = f"the {study.name} study ({flags}), on in this file: a part the model calls"
    return lines


def flag_groups(argv):
    """[(flag name, [its values])] of a command line (`--flag=value` split)."""
    groups = []
    for token in argv:
        if token.startswith("--"):
            name, _, value = token.partition("=")
            groups.append((name, [value] if value else []))
        elif groups:
            groups[-1][1].append(token)
    return groups


# Run flags that are no part of the file's defaults: where the log goes, and a stop before the schedule's end.
NOT_DEFAULTS = ("--log-dir", "--run-name", "--stop-after")
# The constants the export writes at the top of the file, in place of the modular code's empty ones.
FILE_CONSTANTS = ("FIXED_STUDIES", "FIXED_FLAGS", "RUN_DEFAULTS", "LEFT_OUT_FIELDS")


def run_defaults(run_argv, config, fixed):
    """The file's RUN_DEFAULTS: the run's preset, then every flag of run_argv that is neither fixed nor in
    NOT_DEFAULTS, each with its values."""
    names = {name for name, _ in flag_groups(fixed)} | set(NOT_DEFAULTS)
    given = [token for name, values in flag_groups(run_argv) if name not in names for token in [name, *values]]
    return given if "--preset" in given else ["--preset", config.preset, *given]


def packed_items(opening, items, closing, indent="    ", width=WIDTH):
    """`opening`, the items (source texts) joined by commas as lines of at most `width` characters, packed (an item
    is never split; the first on the opening line), a continued line starting with `indent`, then `closing`."""
    lines = [opening]
    for i, item in enumerate(items):
        piece = item + ("," if i < len(items) - 1 else "")
        if not i or len(lines[-1]) + 1 + len(piece) <= width:
            lines[-1] += (" " if i else "") + piece
        else:
            lines.append(indent + piece)
    lines[-1] += closing
    return lines


def packed_module_calls(text):
    """The file's text with each top-level `NAME = f(...)` that spans lines, holds no comment and has each argument
    on one line written packed (packed_items, continued under the first argument) where that takes fewer lines
    within WIDTH (a study's declaration once rules 16 and 28 rewrote and cut its keywords)."""
    tree = parse(text)
    lines = text.split("\n")
    commented = {token.start[0] for token in tokenize.generate_tokens(io.StringIO(text).readline)
                 if token.type == tokenize.COMMENT}
    edits = []
    for statement in tree.body:
        if not (isinstance(statement, ast.Assign) and len(statement.targets) == 1
                and isinstance(statement.targets[0], ast.Name) and isinstance(statement.value, ast.Call)
                and statement.end_lineno > statement.lineno):
            continue
        call = statement.value
        items = sorted(call.args + call.keywords, key=lambda n: (n.lineno, n.col_offset))
        if not items or any(item.lineno != item.end_lineno for item in items) \
                or commented & set(range(statement.lineno, statement.end_lineno + 1)) \
                or call.func.end_lineno != statement.lineno:
            continue
        opening = f"{statement.targets[0].id} = {ast.get_source_segment(text, call.func)}("
        packed = packed_items(opening, [ast.get_source_segment(text, item) for item in items], ")",
                              " " * len(opening))
        if len(packed) < statement.end_lineno - statement.lineno + 1 and max(map(len, packed)) <= WIDTH:
            edits.append((statement, packed))
    for statement, packed in reversed(edits):
        lines = replace_lines(lines, statement.lineno, statement.end_lineno, packed)
    return "\n".join(lines)


def packed_dict(opening, values, indent="    ", width=WIDTH):
    """`opening` then `{...}` of a dict of literals (packed_items)."""
    return packed_items(f"{opening}{{", [f"{key!r}: {value!r}" for key, value in values.items()], "}", indent, width)


def packed_assignment(name, values, width=WIDTH):
    """`name = {...}` (packed_dict)."""
    return packed_dict(f"{name} = ", values, width=width)


def export_source(script, config, fixed_flags, command, omitted=(), defaults=(), track_flags=(), probes=(),
                  resolutions=None, runs_baseline=False):
    """The text of the standalone file of a run of `script` (its resolved config) with these fixed flags and run
    defaults, its command line without the omitted run flags (omitted_run_flags), the flags it does not offer
    (flags_not_offered) and the choices its base does not run (choices_not_run); the fields of its studies folded
    where they hold one value in every config of `probes` (probe_configs; none: the run's config alone), and the
    resolution of those in `resolutions` (fixed_resolutions) held as the run's values; runs_baseline: whether the
    file with no flags runs the track's baseline (its --help says so)."""
    resolutions = resolutions or {}
    active = [study for study in STUDIES if study.active(config)]
    registries = {STUDIES_MODULE: {"STUDIES": [study in active for study in STUDIES]}}
    script_module = Path(script).resolve().relative_to(ROOT).with_suffix("").as_posix().replace("/", ".")
    not_offered = flags_not_offered(config)
    not_varied = [flag for flag in track_flags if flag.name in not_offered]
    if not_varied:
        registries[script_module] = {TRACK_FLAGS_NAME: [flag not in not_varied for flag in track_flags]}
    shared = [name for name in not_offered if name not in {flag.name for flag in track_flags}]
    fixed_arm = every_study_fixed(active, resolutions)
    # rule 16: the studies' flags leave the command line (their fields are logged from LEFT_OUT_FIELDS)
    unparsed = {flag.name for study in active for flag in study.flags} if fixed_arm else set()
    varied = [token for name, values in flag_groups(fixed_flags) if name not in {*not_offered, *unparsed}
              for token in [name, *values]]
    fixed_studies = tuple((piece, depths) for study, (_, depths, piece) in resolutions.items()) if fixed_arm else ()
    # the file's FIXED_FLAGS and FIXED_STUDIES, constants of it: the tests on them fold (none fixed: with_fixed_flags
    # adds nothing, no depth is checked), and with no study on or all fixed, the command line offers none; its
    # --help names the track's baseline only where the file, given no flags, runs it
    folds = dict(folded_tests(config, omitted, active, not_varied), FIXED_FLAGS=tuple(varied),
                 FIXED_STUDIES=tuple((piece, tuple(depths.items())) for piece, depths in fixed_studies),
                 **({"OFFERED_STUDIES": ()} if fixed_arm or not active else {}),
                 RUNS_BASELINE=runs_baseline)
    if fixed_studies:  # rule 25: the loops over them are written out, the file holds their values in place
        folds[UNROLLED] = (("FIXED_STUDIES", repr(fixed_studies)),)
    study_folds = study_field_folds(active, probes or [config], script_module, resolutions)
    folds.update(declaration_rewrites(resolutions, fixed_arm))
    folds.update(built_parts_written(active, fixed_arm, folds.get(R18_BASE, False)))
    folds[QUIET_DECLARATIONS] = tuple(declared_where(study) for study in active)
    folds.update(study_folds)
    if registry_unread(active, folds):  # rule 32: the model config holds no study field either
        registries[STUDIES_MODULE]["STUDIES"] = [False for _ in STUDIES]
        folds.update({"STUDIES": (), FIELDS_EVERYWHERE: True})
    folds[PASSIVE_MEMBERS] = passive_members(active, folds.get(R18_BASE, False))
    folds[PART_OWNED_MEMBERS] = part_owned_members(folds[PASSIVE_MEMBERS])
    folds.update(part_hook_folds(active, folds, script_module))
    folds.update(host_method_folds(folds))
    folds.update(forwarded_host_methods(folds))
    program = folded_program(script_module, folds, registries,
                             (*omitted, *EXPORT_ONLY_FLAGS, *shared, *choices_not_run(config)))
    modules = program.order()
    check_names(modules, program)
    check_kept_code(modules, program)
    check_off_study_fields(modules, program, active)
    check_study_fields(modules, program, study_folds)
    studies = study_lines(active, fixed_flags)
    script_docstring = program.script.docstring or ""
    out = ['"""' + script_docstring.split("\n\n")[0].rstrip(),
           "",
           "Exported as one file (the project modules the run executes, inlined in import order under a comment",
           "naming each source file) by", f"    {command}",
           'Runs as `python THIS.py` or `torchrun --standalone --nproc_per_node=N THIS.py`."""',
           "from __future__ import annotations  # the sections below need no types before theirs: see file_order"]
    emitted_imports = set()
    # Package __init__ side effects first: speedrun's sets the CUDA allocator's config before torch is imported.
    for module in [m for m in modules if m.path.name == "__init__.py"]:
        statements = program.kept_statements(module)
        imports = list(used_imports(module, statements).values())
        emitted_imports.update(imports)
        body = [s.text for s in statements]
        if body:
            out += ["", f"# {module.path.relative_to(ROOT).as_posix()}"] + import_block(imports) + body
    rest = [m for m in modules if m.path.name != "__init__.py"]
    imports = [line for m in rest for line in used_imports(m, program.kept_statements(m)).values()
               if line not in emitted_imports]
    out += [""] + import_block(list(dict.fromkeys(imports)))
    def kept_code_reads(name):
        return any(name in s.refs for m in rest for s in program.kept_statements(m))
    out += [""]
    if kept_code_reads("FIXED_FLAGS"):  # none fixed: the tests on them folded away, and the constant goes with them
        out += ["# The study and track flags of the run this file was exported for, read before the command line",
                "# (which refuses them and every other study flag).", f"FIXED_FLAGS = {tuple(varied)!r}"]
    if omitted:
        out += ["# Left out of the command line, as the run gave none (their code is folded away):",
                f"# {', '.join(omitted)}."]
    # in the order of the registry's flags, then the track's, whichever are on: a record's file differs from its
    # baseline's in the values of its study's fields only (the config line sorts its keys)
    left_out = [*left_out_flags(active, not_varied), *(flag for study in active for flag in study.flags
                                                          if flag.name in unparsed)]
    order = [flag.dest for study in STUDIES for flag in study.flags]
    placed = sorted(left_out, key=lambda flag: order.index(flag.dest) if flag.dest in order else len(order))
    left_out = {flag.dest: as_logged(getattr(config, flag.dest)) for flag in placed}
    if fixed_studies and kept_code_reads("FIXED_STUDIES"):
        out += ["# Its studies, fixed at the export (no flag of theirs is one of this file's): of each, its part of the",
                "# run's name, and the presets and layer counts where it runs as this file holds it.",
                f"FIXED_STUDIES = {fixed_studies!r}"]
    out += ["# The run's other flags: its defaults here (a flag given on the command line counts instead).",
            f"RUN_DEFAULTS = {tuple(defaults)!r}",
            "# The fields its config does not hold (studies off or fixed, flags left out) at the run's values, logged.",
            *packed_assignment("LEFT_OUT_FIELDS", left_out)]
    for unit in file_order(program, rest):
        statements = [s for s in unit.statements if not s.defines & set(FILE_CONSTANTS)]
        if not statements:
            continue
        if unit.module is not program.script:
            out += section_header(unit.module, studies.get(unit.module.name))
        else:
            out += section_header(unit.module, unit.section or "the track's model, optimisers and run", ruled=True)
        out += [s.text.strip("\n") if i == 0 else s.text for i, s in enumerate(statements)]
    folded = without_shadowed_methods(without_unread_study_fields(study_fields_read_as_literals(
        "\n".join(out).rstrip("\n") + "\n", folds)))
    # rules 19, 22, 24, 26 and 29 until none changes the file: a parameter cut can leave a function inert, and the
    # reverse; a function rule 24 reads as its value can leave attributes set to literals (LAuReL's `self.uses_rw,
    # ... =`); rule 23 with them: a lookup it reads as its value can leave a method inert (LAuReL's `rw_shape`);
    # rule 18's empty bases with them: a base whose no-op hooks rule 24 cut (BaseRun of a track's run)
    folded = to_fixed_point(lambda text: without_empty_bases(without_literal_residue(without_decided_residue(
        without_empty_locals(without_inert_code(without_literal_parameters(without_unset_parameters(
            without_constant_attributes(text)))))))), folded)
    # rule 18's empty bases again: a base whose members no code names (rule 8 at the end: r18's StudyHost)
    spaced = without_redundant_parentheses(without_unread_model_fields(to_fixed_point(
        lambda text: without_empty_bases(without_unread_definitions(text)),
        without_literal_residue(without_string_locals(without_single_use_aliases(folded))))))
    text = single_blank_lines(packed_module_calls(spaced))
    # a file that does not compile, or that a blank line inside a string made another program, is a bug here
    if ast.dump(parse(text)) != ast.dump(parse(spaced)):
        raise UsageError(f"{EXPORT_FLAG}: a string literal holds blank lines; the file cannot be written")
    return text


# ----- the file checked against the modular script ---------------------------------------------------------------

# Before the file is kept, both programs train the run's arm for VERIFY_STEPS steps of the tiny preset on CPU, on the
# bundled demo shards, validating every step, with the run's other flags and seed: every logged loss and scalar and
# every final parameter must be equal. The flags that size the run (SIZE_FLAGS) are the tiny preset's for both.
VERIFY_STEPS = 2
SIZE_FLAGS = ("--preset", "--num-iterations", "--stop-after", "--val-every", "--val-tokens", "--train-seq-len",
              "--val-seq-len", "--train-files", "--val-files", "--log-dir", "--run-name", "--save-final-checkpoint")
VERIFY_TIMEOUT_S = 600


def verification_argv(run_argv, fixed, resolve_args):
    """(the modular script's flags, the file's flags) of the check run: the arm (fixed, given to the modular script
    alone: the file holds it), the run's other flags, then the tiny preset's sizes and schedule. A run whose arm
    does not resolve at the tiny preset's depth is checked at its own (--num-layers); UsageError where neither
    resolves."""
    fixed_names = {name for name, _ in flag_groups(fixed)}
    run_flags = [token for name, values in flag_groups(run_argv) if name not in {*SIZE_FLAGS, *fixed_names}
                 for token in [name, *values]]
    demo = ROOT / "data" / "demo"
    check = ["--preset", "tiny", "--num-iterations", str(VERIFY_STEPS), "--val-every", "1", "--save-final-checkpoint",
             "--train-files", str(demo / "demo_train_*.bin"), "--val-files", str(demo / "demo_val_*.bin")]
    try:
        tiny = resolve_args([*fixed, *run_flags, *check])
    except UsageError as e:
        if "--num-layers" in fixed_names:
            raise UsageError(f"{EXPORT_FLAG}: cannot check the file at the tiny preset: {e}") from None
        depth = ["--num-layers", str(resolve_args(run_argv).num_layers)]
        try:
            tiny = resolve_args([*fixed, *run_flags, *check, *depth])
        except UsageError as e:
            raise UsageError(f"{EXPORT_FLAG}: cannot check the file at the tiny preset: {e}") from None
        check += depth
    # explicit, as the file's own defaults may be the run's sizes
    check += [token for flag in ("--val-tokens", "--train-seq-len", "--val-seq-len")
              for token in (flag, str(getattr(tiny, flag[2:].replace("-", "_"))))]
    return [*fixed, *run_flags, *check], [*run_flags, *check]


def logged_values(log):
    """[(step, 'val_loss' or 'scalars', the logged text)] of a run log, in order."""
    from speedrun.logformat import VAL_OR_SCALARS_LINE
    return [(int(m.group(1)), "val_loss" if m.group(3) is not None else "scalars",
             (m.group(3) if m.group(3) is not None else m.group(6)).decode()) for m in VAL_OR_SCALARS_LINE.finditer(log)]


def first_difference(modular, exported):
    """The first difference between the check runs in these folders, in words, or None where they are bit for bit
    alike (every logged loss and scalar, every final parameter)."""
    import torch

    from analysis.runs import training_config  # the one definition of what makes two logs one run
    from speedrun.logformat import read_config
    logs = [(folder / "run.txt").read_bytes() for folder in (modular, exported)]
    ours, theirs = (training_config(read_config(log) or {}) for log in logs)
    for key in sorted(set(ours) | set(theirs)):
        if key not in theirs or key not in ours or ours[key] != theirs[key]:
            return (f"config {key}: {ours.get(key, 'absent')!r} (modular script) vs {theirs.get(key, 'absent')!r} "
                    f"(exported file)")
    ours, theirs = (logged_values(log) for log in logs)
    for a, b in zip(ours, theirs):
        if a != b:
            return (f"step {a[0]}: {a[1]} {a[2]} (modular script) vs step {b[0]}: {b[1]} {b[2]} (exported file)")
    if len(ours) != len(theirs):
        return f"the modular script logs {len(ours)} losses and scalars, the exported file {len(theirs)}"
    ours, theirs = (torch.load(folder / "run.pt", map_location="cpu", weights_only=False)["model"]
                    for folder in (modular, exported))
    if ours.keys() != theirs.keys():
        only = sorted(set(ours) ^ set(theirs))[0]
        return f"final parameter {only} is in {'the modular script' if only in ours else 'the exported file'} only"
    differing = next((key for key in ours if not torch.equal(ours[key], theirs[key])), None)
    return None if differing is None else f"final parameter {differing} differs"


def last_line(path):
    lines = path.read_text(errors="replace").strip().splitlines()
    return lines[-1].removeprefix("error: ") if lines else "no message"


CHECKED_PREFIX = "checked: "


def checked_line(script, modular_argv):
    """The line saying what the check ran (the data globs aside), printed after the file is written."""
    flags = [token for name, values in flag_groups(modular_argv) if name not in ("--train-files", "--val-files")
             for token in [name, *values]]
    return (f"{CHECKED_PREFIX}`python {Path(script).name} {' '.join(flags)}` on CPU (the bundled demo shards) and "
            f"the file with the same run flags logged the same losses, scalars and config line and ended with the "
            f"same parameters, bit for bit")


def verify_export(script, text, modular_argv, file_argv, kept_in=None):
    """Trains the modular script and the file `text` side by side (the check run's flags) from a folder outside the
    checkout: a temporary one, or kept_in (--export-check-dir), where the file (exported.py) and both runs (modular/,
    exported/: log, final checkpoint, stderr) stay, the check passed or not. Raises UsageError naming the first
    difference, or the one that failed."""
    import contextlib
    import os
    import subprocess
    import tempfile
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))
    if kept_in is not None:
        Path(kept_in).mkdir(exist_ok=True)  # new or empty (check_kept_in)
    with (tempfile.TemporaryDirectory(prefix="export-check-") if kept_in is None
          else contextlib.nullcontext(kept_in)) as name:
        folder = Path(name).resolve()
        exported = folder / "exported.py"
        exported.write_text(text)
        runs = {"the modular script": (Path(script).resolve(), modular_argv, folder / "modular", ROOT),
                "the exported file": (exported, file_argv, folder / "exported", folder)}
        started = {}
        for who, (program, argv, logs, cwd) in runs.items():
            logs.mkdir()
            with open(logs / "stderr", "w") as stderr:
                started[who] = subprocess.Popen([sys.executable, str(program), *argv, "--log-dir", str(logs),
                                                 "--run-name", "run"], cwd=cwd, env=env,
                                                stdout=subprocess.DEVNULL, stderr=stderr)
        for who, process in started.items():
            try:
                failed = process.wait(timeout=VERIFY_TIMEOUT_S) != 0
            except subprocess.TimeoutExpired:
                for other in started.values():
                    other.kill()
                raise UsageError(f"{EXPORT_FLAG}: not written: checking the file took over {VERIFY_TIMEOUT_S} s")
            if failed:
                raise UsageError(f"{EXPORT_FLAG}: not written: {who} fails at the check's tiny preset "
                                 f"({last_line(runs[who][2] / 'stderr')})")
        difference = first_difference(runs["the modular script"][2], runs["the exported file"][2])
        if difference is not None:
            raise UsageError(f"{EXPORT_FLAG}: not written: the file trains otherwise than the modular script at the "
                             f"check's tiny preset: {difference}")


# ----- the command line -----------------------------------------------------------------------------------------

def split_export_flags(argv):
    """(OUT path, LOG path or None, whether --force is given, DIR or None, the other flags) of a command line with
    --export-script OUT [--from-log LOG] [--force] [--export-check-dir DIR]."""
    rest, values, force = [], {EXPORT_FLAG: None, FROM_LOG_FLAG: None, CHECK_DIR_FLAG: None}, False
    tokens = iter(argv)
    for token in tokens:
        name, equals, value = token.partition("=")
        if name in (*values, FORCE_FLAG) and (force if name == FORCE_FLAG else values[name] is not None):
            raise UsageError(f"{name} is given twice")
        if name == FORCE_FLAG and not equals:
            force = True
        elif name in values:
            values[name] = value if equals else next(tokens, None)
            if not values[name] or values[name].startswith("--"):
                raise UsageError(f"{name} needs a {'folder' if name == CHECK_DIR_FLAG else 'file'} name")
        else:
            rest.append(token)
    out = values[EXPORT_FLAG]
    if out is None:  # the script hands a command line here when it holds any of the export's own flags
        given = next(token.partition("=")[0] for token in argv if token.partition("=")[0] in EXPORT_ONLY_FLAGS)
        raise UsageError(f"{given}: only with {EXPORT_FLAG} OUT.py")
    if not out.endswith(".py"):
        raise UsageError(f"{EXPORT_FLAG}: the file name must end in .py, got {out!r}")
    return out, values[FROM_LOG_FLAG], force, values[CHECK_DIR_FLAG], rest


def tracked_files():
    """The checkout's files under version control (resolved paths); None where git cannot say."""
    import subprocess
    try:
        listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if listed.returncode != 0:
        return None
    return {(ROOT / name).resolve() for name in listed.stdout.decode().split("\0") if name}


def check_out_path(out, force):
    """Raises UsageError where OUT may not be written: a file of the checkout (under version control, or any
    existing file inside it where git cannot say) always, another existing file without --force."""
    path = Path(out).resolve()
    if ROOT in path.parents:
        tracked = tracked_files()
        if (path in tracked) if tracked is not None else path.exists():
            raise UsageError(f"{EXPORT_FLAG} {out}: a file of this checkout; choose another name")
    if path.exists() and not force:
        raise UsageError(f"{EXPORT_FLAG} {out}: exists; give {FORCE_FLAG} to replace it")
    if path.is_dir():
        raise UsageError(f"{EXPORT_FLAG} {out}: is a folder")
    if not path.parent.is_dir():  # before the check's minute of training, not after
        raise UsageError(f"{EXPORT_FLAG} {out}: no folder {path.parent}")


def check_kept_in(folder):
    """Raises UsageError where --export-check-dir DIR may not hold the check's runs: DIR must be a new or empty
    folder (the runs of two checks are not mixed), outside the checkout (the file is checked from a folder without
    the project; and each run's final checkpoint is ~260 MB), in an existing folder."""
    path = Path(folder).resolve()
    if path == ROOT or ROOT in path.parents:
        raise UsageError(f"{CHECK_DIR_FLAG} {folder}: inside this checkout; the file is checked from a folder "
                         f"without the project: choose one outside it")
    if path.exists() and not (path.is_dir() and not any(path.iterdir())):
        raise UsageError(f"{CHECK_DIR_FLAG} {folder}: exists and is not an empty folder")
    if not path.parent.is_dir():
        raise UsageError(f"{CHECK_DIR_FLAG} {folder}: no folder {path.parent}")


def write_atomically(out, text):
    """Writes OUT through a temporary file beside it renamed into place: never a partial file under its name."""
    import os
    import tempfile
    path = Path(out)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    except OSError as e:
        raise UsageError(f"{out}: cannot write ({e.strerror or e})") from None
    try:
        with os.fdopen(handle, "w") as file:
            file.write(text)
        os.chmod(temporary, 0o644)
        os.replace(temporary, path)
    except OSError as e:
        Path(temporary).unlink(missing_ok=True)
        raise UsageError(f"{out}: cannot write ({e.strerror or e})") from None


def flag_tokens(flag, value):
    """A flag and its value as command-line tokens (a switch alone, a list as its items)."""
    values = [] if value is True else list(value) if isinstance(value, (list, tuple)) else [value]
    return [flag.name, *map(str, values)]


def as_logged(value):
    return json.loads(json.dumps(value))


# The run flags of a logged run's schedule and sizes that --from-log rebuilds (the preset gives the others).
SCHEDULE_FLAGS = ("--num-iterations", "--val-every", "--val-tokens", "--train-seq-len", "--val-seq-len")


def flags_of_config(config, track_flags, resolve_args, run_argv=()):
    """The command line of a logged run's config (a dict): its preset, variant and depth, the track flags it set and
    its study flags, each study's switch first, then any other flag whose logged value the resolution without it
    does not give (a default derived from the others is left to be derived again: given, some are refused).
    run_argv: the run flags resolution needs besides (DLO's --init-from)."""
    flags = [f for study in STUDIES for f in study.flags] + list(track_flags)
    logged = {f: config.get(f.dest, f.unset) for f in flags}
    is_on = {f: logged[f] != f.unset and is_set(tuple(logged[f]) if isinstance(logged[f], list) else logged[f])
             for f in flags}
    chosen = [f for f in track_flags if is_on[f]] + [study.flags[0] for study in STUDIES if is_on[study.flags[0]]]
    base = ["--preset", config["preset"], "--variant", config["variant"], "--num-layers", str(config["num_layers"])]
    while True:
        argv = base + [token for f in chosen for token in flag_tokens(f, logged[f])]
        resolved = resolve_args(argv + list(run_argv))
        differing = [f for f in flags if f not in chosen and as_logged(getattr(resolved, f.dest, f.unset))
                     != as_logged(logged[f])]
        if not differing:  # then the schedule and sizes the log's run gave (those its preset does not)
            return argv + [token for flag in SCHEDULE_FLAGS for dest in [flag[2:].replace("-", "_")]
                           if dest in config and as_logged(getattr(resolved, dest)) != config[dest]
                           for token in (flag, str(config[dest]))]
        if not is_on[differing[0]]:
            raise UsageError(f"{FROM_LOG_FLAG}: the logged {differing[0].name} is unset, but this checkout derives "
                             f"a value for it: the run's config cannot be reproduced")
        chosen.append(differing[0])


def flags_from_log(log, script, track_flags, resolve_args, run_argv):
    """The flags of the run a log records, checked to have run this checkout's code (the script and every module
    the log embeds, unchanged); raises UsageError otherwise."""
    from speedrun.logformat import changed_source, code_section, read_config
    try:
        data = Path(log).read_bytes()
    except OSError as e:
        raise UsageError(f"{FROM_LOG_FLAG} {log}: cannot read ({e.strerror or e})") from None
    config, code = read_config(data), code_section(data)
    if config is None or code is None:
        raise UsageError(f"{FROM_LOG_FLAG} {log}: no run log of this project (no code section or config line)")
    changed = changed_source(code, ROOT, Path(script).name)
    if changed is not None:
        raise UsageError(f"{FROM_LOG_FLAG} {log}: the run's {changed} is not this checkout's: check out the commit "
                         f"it ran to export it")
    flags = flags_of_config(config, track_flags, resolve_args, run_argv)
    defining = {f.name: f.dest for f in [*track_flags, *(f for study in STUDIES for f in study.flags)]}
    defining.update({name: name[2:].replace("-", "_") for name in ("--preset", *ARM_FLAGS, *SCHEDULE_FLAGS)})
    given = [(name, values) for name, values in flag_groups(run_argv) if name in defining]
    if given:
        resolved = resolve_args(flags + list(run_argv))
        for name, values in given:
            dest = defining[name]
            if as_logged(getattr(resolved, dest, None)) != config.get(dest):
                raise UsageError(f"{FROM_LOG_FLAG} {log}: {' '.join([name, *values])} contradicts the log's run "
                                 f"({dest} {config.get(dest)!r}): export that run without it, or another log")
    return flags


def fixed_flags(argv, config, track_flags):
    """The flags of argv that define the arm (study, track and ARM_FLAGS, each with its values), plus --base."""
    names = {flag.name for study in STUDIES for flag in study.flags} | {f.name for f in track_flags} | set(ARM_FLAGS)
    fixed = [token for name, values in flag_groups(argv) if name in names for token in [name, *values]]
    if hasattr(config, "base") and "--base" not in fixed:
        fixed += ["--base", config.base]
    return fixed


def export_main(script, argv, resolve_args, track_flags):
    """Writes the standalone file of the run that argv (with --export-script OUT) describes; 0, or 2 with one line
    on stderr."""
    try:
        out, log, force, kept_in, run_argv = split_export_flags(argv)
        check_out_path(out, force)
        if kept_in is not None:
            check_kept_in(kept_in)
        if log is not None:
            run_argv = flags_from_log(log, script, track_flags, resolve_args, run_argv) + run_argv
        config = resolve_args(run_argv)
        command = " ".join(["python", Path(script).name, EXPORT_FLAG, Path(out).name, *run_argv])
        fixed = fixed_flags(run_argv, config, track_flags)
        check_refused_off_base(config, run_argv, resolve_args, track_flags)
        modular_argv, file_argv = verification_argv(run_argv, fixed, resolve_args)
        defaults = run_defaults(run_argv, config, fixed)
        # the file given no flags runs what the modular script does given none
        runs_baseline = fixed == fixed_flags([], resolve_args([]), track_flags) and defaults == ["--preset", "full"]
        text = export_source(script, config, fixed, command, omitted_run_flags(run_argv), defaults, track_flags,
                             probe_configs(config, run_argv, modular_argv, fixed, resolve_args),
                             fixed_resolutions(config, [study for study in STUDIES if study.active(config)],
                                               fixed, resolve_args, offers_depth(fixed, config)), runs_baseline)
        verify_export(script, text, modular_argv, file_argv, kept_in)
        check_out_path(out, force)  # again: the check took a while
        write_atomically(out, text)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {out}: {text.count(chr(10))} lines, one file")
    print(checked_line(script, modular_argv))
    if kept_in is not None:
        print(f"kept the check's runs in {kept_in}: the file as it ran (exported.py), modular/ and exported/ (each "
              f"run.txt, run.pt, stderr)")
    return 0
