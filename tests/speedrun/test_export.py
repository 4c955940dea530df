"""--export-script (speedrun/export.py): what the standalone file holds and what it refuses, without running it
(tests/scripts/test_export_runs.py trains with it)."""
import ast
import json
import re
from pathlib import Path

import pytest

import train_gpt as S
import train_gpt_medium as T
from speedrun.cli import with_fixed_flags
from speedrun.errors import UsageError
from speedrun.export import fixed_flags, split_export_flags, study_parts_of_base
from speedrun.studies import STUDIES
from conftest import file_as_module, file_logged_config, flags_named, flags_named_but_not_offered

STUDY_MODULES = ("backout", "rolling_skip", "laurel", "dlo", "gated_skip")


@pytest.fixture(autouse=True)
def unchecked_exports(monkeypatch):
    """These tests read the file's text: the check that trains it beside the modular script (verify_export) is left
    to tests/scripts/test_export_runs.py."""
    from speedrun import export as export_module
    monkeypatch.setattr(export_module, "verify_export", lambda *args: None)


def export(tmp_path, script_module, *flags):
    out = tmp_path / "exported.py"
    assert script_module.main(["--export-script", str(out), "--force", "--preset", "tiny", *flags]) == 0
    return out.read_text()


def fixed_flags_of(text):
    """The file's FIXED_FLAGS, or None where it has none (none fixed: nothing in it reads them)."""
    tree = ast.parse(text)
    assign = next((n for n in tree.body if isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "FIXED_FLAGS"),
                  None)
    return None if assign is None else ast.literal_eval(assign.value)


def inlined_sections(text):
    return [line.split()[1].rstrip(":") for line in text.splitlines() if line.startswith("# ")
            and line.split()[1].rstrip(":").endswith(".py")]


def script_sections(text, script):
    """The text of each section of the file from the script (`# train_gpt_medium.py: Model ---...`), in order."""
    parts = re.split(r"^(# \S+\.py(?:: | -).*)$", text, flags=re.MULTILINE)
    return [body for header, body in zip(parts[1::2], parts[2::2]) if header.startswith(f"# {script}:")]


def project_imports(text):
    return [ast.unparse(n) for n in ast.walk(ast.parse(text)) if isinstance(n, (ast.Import, ast.ImportFrom))
            and any(name.split(".")[0] in ("speedrun", "data", "train_gpt", "train_gpt_medium") for name in
                    ([a.name for a in n.names] if isinstance(n, ast.Import) else [n.module or ""]))]


def test_baseline_export_is_one_file_without_project_imports_or_study_modules(tmp_path):
    text = export(tmp_path, T)
    assert project_imports(text) == []
    sections = inlined_sections(text)
    assert "speedrun/model.py" in sections and sections[-1] == "train_gpt_medium.py"
    # upstream's reading order: model, optimisers, data, training loop; the run's infrastructure below them
    order = [sections.index(f"speedrun/{name}.py") for name in ("model", "muon", "data", "training", "cli")]
    assert order == sorted(order) and sections.index("speedrun/distributed.py") > order[-2]
    # a module the code above needs as it is defined moves up (UsageError is the base class of ShardError)
    assert sections.index("speedrun/errors.py") < sections.index("data/shard_format.py") < order[2]
    # the script's sections join their parts: its configuration (with the presets it builds on: the run's
    # hyperparameters) opens the file, its model follows the project's, its optimisers theirs, its command line the
    # rest of the command line's code, and its training (main) ends the file
    at = {name: text.index(f"# train_gpt_medium.py: {name} -") for name in
          ("Configuration", "Model", "Optimisers", "Command line", "Training")}
    assert text.index("# speedrun/presets.py") < at["Configuration"] < text.index("# speedrun/layers.py")
    assert text.index("# speedrun/model.py") < at["Model"] < text.index("# speedrun/muon.py")
    assert text.index("# speedrun/optimizers.py") < at["Optimisers"] < text.index("# speedrun/data.py")
    assert text.index("# speedrun/cli.py") < at["Command line"] < at["Training"] == text.rindex("\n# ") + 1
    assert "# Configuration\n" not in text and "# Model\n" not in text  # each section named once, in its header
    # which needs the file's annotations left unevaluated (Dist is defined below the functions it annotates)
    future = ast.parse(text).body[1]
    assert isinstance(future, ast.ImportFrom) and future.module == "__future__"
    assert not [s for s in sections if s.removeprefix("speedrun/").removesuffix(".py") in STUDY_MODULES]
    assert not [s for s in sections if s.startswith("speedrun/r18")]  # the base is folded to r14
    assert not [line for line in text.splitlines() if line.startswith("==> ")]  # no log-style module sections
    assert fixed_flags_of(text) is None  # the base is no flag of the file: it is the file's (no empty FIXED_FLAGS)
    assert "# The study and track flags of the run" not in text  # nor the comment over it
    # tree-shaken: the log readers of logformat.py and the exporter are not in the file
    assert "def parse_float" not in text and "def export_main" not in text and "def asks_for_export" not in text
    # the file's log embeds no project module (it imports none): the search for them is folded away
    assert "def package_sources" not in text and "def write_sources" in text
    # and StudyGPT's hooks with no study on: the calls fold to None, the methods nothing names go
    assert "mlp_router" not in text and "block_residuals" not in text and "def expansion_scalars" not in text
    # the allocator setting comes before torch is imported, as in the modular script
    assert text.index("PYTORCH_ALLOC_CONF") < text.index("import torch")


def node_place(node):
    return type(node).__name__, getattr(node, "lineno", None), getattr(node, "col_offset", None)


def test_the_shared_parse_and_walk_read_every_project_source_as_ast_does():
    from speedrun.export import parse, project_sources, walk
    for path in project_sources():
        text = path.read_text()
        tree = parse(text)
        assert parse(text) is tree  # one tree per text
        first = list(walk(tree))
        assert list(map(node_place, first)) == list(map(node_place, ast.walk(ast.parse(text)))), path
        assert list(walk(tree)) == first  # the listed walk, in the same order
        for function in [n for n in first if isinstance(n, ast.FunctionDef)][:1]:
            assert list(walk(function)) == list(ast.walk(function))  # a subtree's walk: its own nodes only
    assert parse("x") is not parse("y") and ast.dump(parse("x + 1", mode="eval")) == ast.dump(
        ast.parse("x + 1", mode="eval"))


def test_a_walked_tree_is_freed_when_dropped_without_waiting_for_a_collection():
    """The listed walks a tree keeps make no reference cycle: a tree the parse cache lets go is freed at once. In a
    cycle, each waited for a full collection, which the test suite makes only at a module's end (24-85 CPU-s there)."""
    import gc
    import weakref
    from speedrun import export as export_module
    tree = ast.parse(Path(export_module.__file__).read_text())
    inner = [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)][0]
    list(export_module.walk(tree)), list(export_module.walk(inner))  # a root's walk and a subtree's, listed and kept
    freed = [weakref.ref(tree), weakref.ref(inner)]
    gc.disable()
    try:
        del tree, inner
        assert [ref() for ref in freed] == [None, None]
    finally:
        gc.enable()


def test_no_rule_changes_a_tree_another_reader_shares(tmp_path, monkeypatch):
    """The exporter hands every reader of a text one shared tree (speedrun.export.parse): a rule that changed it in
    place would change what every later rule reads. After an export with a study on (most rules fire), each tree it
    was given still dumps as a fresh parse of its text."""
    from speedrun import export as export_module
    given, shared_parse = {}, export_module.parse

    def recorded_parse(source, mode="exec"):
        tree = shared_parse(source, mode)
        given[id(tree)] = (source, mode, tree)
        return tree
    monkeypatch.setattr(export_module, "parse", recorded_parse)
    export(tmp_path, T, "--backout-layers", "3", "--backout-transform", "relu")
    assert len(given) > 100
    changed = [source[:60] for source, mode, tree in given.values()
               if ast.dump(tree) != ast.dump(ast.parse(source, mode=mode))]
    assert changed == []


def test_export_inlines_only_the_studies_switched_on_with_their_flags_fixed(tmp_path):
    text = export(tmp_path, T, "--backout-layers", "4", "--laurel", "rw+lr+pa")
    sections = inlined_sections(text)
    assert "speedrun/backout.py" in sections and "speedrun/laurel.py" in sections
    assert "speedrun/dlo.py" not in sections and "speedrun/rolling_skip.py" not in sections
    assert fixed_flags_of(text) is None  # rule 16: the studies are fixed, their flags none of the file's
    # rule 25: the run's name pieces and depth checks written out where the file reads them, no FIXED_STUDIES
    assert "parts += ['backout-L4', 'laurel-rw+lr+pa-r32-k3']" in text and "FIXED_STUDIES" not in text
    # rules 31, 32: the model builds the two parts by name (LAuReL's last), the file holds no registry
    assert "self.build_parts([('backout', Backout), ('laurel', LaurelResiduals)], self.cfg)" in text
    assert not re.search(r"\bSTUDIES\b", text)
    assert "the backout study (--backout-layers 4)" in text  # the comment where the study enters
    # backout's r18 part and refusals are --base r18's only: not in an r14 file
    assert "R18Backout" not in text and "backout_on_r18" not in text and "class Backout(" in text


@pytest.mark.parametrize("script_module, flags", [(T, ["--backout-layers", "4"]), (S, ["--backout-layers", "4"]),
                                                   (T, ["--base", "r18", "--laurel", "rw"])])
def test_two_arms_files_list_their_common_modules_in_one_order(tmp_path, script_module, flags):
    """The modules of an arm's file keep the order they have in its baseline's (the modular sources' imports), so
    that `diff baseline.py arm.py` shows the arm's code, not modules moved by what the study imports."""
    base = inlined_sections(export(tmp_path, script_module, *[f for f in flags if f == "--base" or f == "r18"]))
    arm = inlined_sections(export(tmp_path, script_module, *flags))
    assert len(set(arm) - set(base)) >= 1
    assert [s for s in arm if s in base] == base


def test_r18_export_holds_the_r18_package_and_not_the_r14_model(tmp_path):
    text = export(tmp_path, T, "--base", "r18", "--laurel", "rw")
    sections = inlined_sections(text)
    assert project_imports(text) == [] and sections[-1] == "train_gpt_medium.py"
    assert "speedrun/r18/train.py" in sections and "speedrun/r18/model.py" in sections
    assert fixed_flags_of(text) is None and "parts += ['laurel-rw']" in text  # rule 25
    # the base folded to r18: r14's model and optimisers, and the r14 path after r18's return, are gone
    assert "class Optimizers(TrackOptimizers)" not in text and "MEDIUM = Track(" not in text
    script_part = "\n".join(script_sections(text, "train_gpt_medium.py"))
    # the Training section's first statement (r14's VAL_HEAD_CHUNKS) is folded away: its main still ends the file
    # under its own header, not the Command line's
    headers = re.findall(r"^# train_gpt_medium\.py: (\w[\w ]*) -", text, flags=re.MULTILINE)
    assert headers == ["Configuration", "Command line", "Training"] and "VAL_HEAD_CHUNKS" not in text
    last_header = re.findall(r"^# \S+\.py(?:: | -).*$", text, flags=re.MULTILINE)[-1]
    assert last_header.startswith("# train_gpt_medium.py: Training -")
    assert "def main(" in script_sections(text, "train_gpt_medium.py")[-1]
    assert "resolve_track_args(parsed, PRESETS, __file__, layer_pattern" not in script_part
    assert "r18_layer_pattern = layer_pattern" in text  # the renamed lazy import, bound where it stood


def test_r18_export_folds_away_the_modules_of_its_studies_that_are_off(tmp_path):
    baseline = inlined_sections(export(tmp_path, T, "--base", "r18"))
    assert not [s for s in baseline if s.removeprefix("speedrun/").removesuffix(".py") in STUDY_MODULES]
    with_laurel = inlined_sections(export(tmp_path, T, "--base", "r18", "--laurel", "rw"))
    assert "speedrun/laurel.py" in with_laurel
    assert "speedrun/backout.py" not in with_laurel and "speedrun/dlo.py" not in with_laurel


STUDY_CALL = ("S = Study(name='s', flags=F,\n          model_part=Part, on_r18=refuse, r18_model_part=R18Part)\n"
              "T = Study(name='t', model_part=Other)\n")


@pytest.mark.parametrize("on_r18, expected", [
    (False, "S = Study(name='s', flags=F,\n          model_part=Part)\nT = Study(name='t', model_part=Other)\n"),
    (True, "S = Study(name='s', flags=F,\n          model_part=R18Part, on_r18=refuse)\n"
           "T = Study(name='t', model_part=Other)\n"),
])
def test_a_study_keeps_the_part_of_the_export_base_only(on_r18, expected):
    assert study_parts_of_base(STUDY_CALL, on_r18) == expected


def test_the_file_leaves_out_the_run_flags_its_run_does_not_use(tmp_path):
    """--resume, --init-from, --checkpoint-every and --profile-steps, and the code only they reach; the config keeps
    their values (set_defaults) and --save-final-checkpoint stays."""
    text = export(tmp_path, T)
    def parses(flag):
        return f'add_argument("{flag}"' in text

    for flag in ("--resume", "--init-from", "--checkpoint-every", "--profile-steps", "--init-schedule"):
        assert not parses(flag), flag
    for gone in ("def load_resume_state", "def restore_run_state", "class StepProfiler", "def load_checkpoint"):
        assert gone not in text, gone
    assert "set_defaults(resume=None)" in text and "set_defaults(profile_steps=0)" in text
    assert parses("--save-final-checkpoint") and "def save_checkpoint" in text
    text = export(tmp_path, T, "--init-from", __file__)  # a run from a checkpoint keeps that code
    assert parses("--init-from") and parses("--init-schedule") and "def load_checkpoint" in text
    assert not parses("--resume")


def test_the_file_has_no_docstrings_and_single_blank_lines(tmp_path):
    text = export(tmp_path, T)
    tree = ast.parse(text)
    documented = [n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))
                  and ast.get_docstring(n) is not None]
    assert documented == [] and ast.get_docstring(tree) is not None  # the file's own header stays
    assert "\n\n\n" not in text
    # a definition follows another after one blank line (above its comments), a class whose docstring became
    # `pass` too (UsageError)
    lines = text.split("\n")

    def blank_above(node):
        above = node.lineno - 2
        while lines[above].startswith("#"):
            above -= 1
        return not lines[above].strip()
    assert [node.name for prev, node in zip(tree.body, tree.body[1:])
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.decorator_list
            and isinstance(prev, (ast.FunctionDef, ast.ClassDef)) and not blank_above(node)] == []


def test_a_body_that_was_its_docstring_keeps_the_blank_lines_after_it():
    """drop_docstrings: blank lines after a docstring with code below it go (the code follows the signature);
    after one that was the whole body, now `pass`, they stay (`class UsageError(Exception): pass` ran into the next
    class)."""
    from speedrun.export import drop_docstrings
    source = 'class A(Exception):\n    """Doc."""\n\n\nclass B:\n    """Doc."""\n\n    x = 1\n'
    assert drop_docstrings(source) == "class A(Exception):\n    pass\n\n\nclass B:\n    x = 1\n"


@pytest.mark.parametrize("source, expected", [
    ("if config.resume:\n    a()\nb()\n", "b()\n"),
    ("if not config.resume:\n    a()\nelse:\n    c()\n", "a()\n"),
    ("x = load(config.resume) if config.resume else None\n", "x = None\n"),
    ("if studies is None or not studies.dlo_groups:\n    a()\n", "a()\n"),  # a part that only reads names
    ("if f() or not studies.dlo_groups:\n    a()\n", None),  # a call would still run: not folded
    ("if config.backout_layers == ('none',):\n    a()\nb()\n", "b()\n"),
    ("def f():\n    for s in STUDIES:\n        a(s)\n", "def f():\n    pass\n"),
    ("if config.seed:\n    a()\n", None),  # a field the file's command line sets
    # an elif chain: the branch taken, as the chain's `if`, its `else` or without the link not taken
    ("if config.resume:\n    a()\nelif x:\n    b()\nelse:\n    c()\n", "if x:\n    b()\nelse:\n    c()\n"),
    ("if x:\n    a()\nelif not config.resume:\n    b()\nelse:\n    c()\n", "if x:\n    a()\nelse:\n    b()\n"),
    ("if x:\n    a()\nelif config.resume:\n    b()\nelif y:\n    c()\n", "if x:\n    a()\nelif y:\n    c()\n"),
    # a field of a study that is on, by any receiver that only reads names (the model config too)
    ("if self.cfg.mode == 'sum':\n    a()\nelif cfg.mode.endswith('-mlp'):\n    b()\n", "a()\n"),
    ("if f().mode == 'sum':\n    a()\n", None),  # a call would still run: not folded
    # not in the study's resolve, which reads its flags as parsed (unset: None)
    ("def resolve(args):\n    if args.mode == 'sum':\n        a()\n", None),
    ("if (None if self.parts else None):\n    a()\nb()\n", "b()\n"),  # either branch: one value
    ("if (None if self.parts else 0):\n    a()\n", None),
])
def test_tests_the_export_knows_are_folded(source, expected):
    from speedrun.export import PARSED_READERS, STUDY_FIELD, fold_ifs
    folds = {"config.resume": None, "studies.dlo_groups": 0, "config.backout_layers": None, "STUDIES": (),
             STUDY_FIELD + "mode": "sum", PARSED_READERS: (("x", "resolve"),)}
    assert fold_ifs(source, folds, readers=("resolve",)) == (source if expected is None else expected)


def test_a_field_of_a_study_that_is_off_read_outside_a_folded_test_is_refused():
    from types import SimpleNamespace

    from speedrun.export import ROOT, check_off_study_fields
    from speedrun.studies import STUDIES
    module = SimpleNamespace(path=ROOT / "speedrun" / "x.py")

    def program(source):
        return SimpleNamespace(kept_statements=lambda m: [SimpleNamespace(node=n) for n in ast.parse(source).body])
    check_off_study_fields([module], program("y = config.seed + flag.laurel"), active=[])
    laurel = next(study for study in STUDIES if study.name == "laurel")
    check_off_study_fields([module], program("y = config.laurel"), active=[laurel])
    with pytest.raises(UsageError, match="speedrun/x.py reads config.laurel of a study that is off"):
        check_off_study_fields([module], program("y = config.laurel"), active=[])


def test_a_field_of_a_study_that_is_on_bound_or_read_as_parsed_outside_its_resolve_is_refused():
    from types import SimpleNamespace

    from speedrun.export import PARSED_READERS, ROOT, STUDY_FIELD, check_study_fields
    module = SimpleNamespace(name="speedrun.x", path=ROOT / "speedrun" / "x.py")
    folds = {STUDY_FIELD + "backout_mode": "sum", PARSED_READERS: (("speedrun.x", "resolve"),)}

    def check(source):
        statements = [SimpleNamespace(node=n) for n in ast.parse(source).body]
        check_study_fields([module], SimpleNamespace(kept_statements=lambda m: statements), folds)
    check("def resolve(args):\n    return args.backout_mode or 'sum'\ny = cfg.backout_mode\n")
    with pytest.raises(UsageError, match="x.py:2 binds `backout_mode`.*rule 13"):
        check("def resolve(args):\n    x.backout_mode = 1\n")
    with pytest.raises(UsageError, match="x.py:1 binds `backout_mode`"):
        check("class C:\n    backout_mode = 'sum'\ndef resolve(args):\n    pass\n")
    with pytest.raises(UsageError, match="resolve passes the parsed flags to mode_of"):
        check("def mode_of(args):\n    return args.backout_mode\ndef resolve(args):\n    return mode_of(args)\n")
    with pytest.raises(UsageError, match=r"the study's resolve \(resolve\) must be a top-level function"):
        check("y = 1\n")


def test_a_field_of_a_study_that_is_on_folds_only_where_every_probe_config_holds_its_value():
    from types import SimpleNamespace

    from speedrun.export import PARSED_READERS, STUDY_FIELD, study_field_folds
    from speedrun.studies import STUDIES
    backout, dlo = (next(s for s in STUDIES if s.name == name) for name in ("backout", "dlo"))
    run = {flag.dest: flag.unset for flag in backout.flags} | dict(backout_layers=(11,), backout_mode="sum",
                                                                  backout_concat_dim=128)
    # a default that followed the width: the tiny preset's differs
    tiny = dict(run, backout_concat_dim=64)
    folds = study_field_folds([backout], [SimpleNamespace(**run), SimpleNamespace(**tiny)], "train_gpt_medium")
    assert folds[STUDY_FIELD + "backout_mode"] == "sum" and folds[STUDY_FIELD + "backout_layers"] == (11,)
    assert STUDY_FIELD + "backout_concat_dim" not in folds
    assert folds[PARSED_READERS] == (("speedrun.backout", "resolve_backout_args"),)
    # DLO's model fields are computed (model_config=): the model config's values are not the run's
    dlo_run = SimpleNamespace(**{flag.dest: 2 for flag in dlo.flags})
    assert study_field_folds([dlo], [dlo_run], "train_gpt_medium") == {}


def test_the_backout_record_file_holds_the_code_of_its_own_mode_alone(tmp_path):
    text = export(tmp_path, T, "--backout-layers", "11", "--preset", "full")
    assert "class Backout(" in text and "def mixed_head_input" in text
    # concat-head, concat-mlp, the transforms' similarity record and new-embed: other arms' code
    for marker in ("self.down_w", "torch.zeros(rows, D * (1 + k))", "def backout_mlp_hidden", "SIMILARITY_TOKENS",
                   "self.new_embed = ", 'cfg.backout_mode == "concat-mlp"', 'if cfg.backout_transform != "none"',
                   # the model's branches for the hooks no part of the file answers: MLP routers, widened MLPs
                   "def parts_mlp_router", "def layer_before_mlp", "def parts_mlp_extra", "def mlp_extra"):
        assert marker not in text, marker
    assert "def head_input" in text  # the hook backout answers, its one part called there (rule 33)


@pytest.mark.parametrize("script_module, flags, refused_depth, other_depth", [
    (T, ["--backout-layers", "11"], 12, 14),  # 11 is the last of 12 layers: sum mode refuses it
    (S, ["--backout-layers", "8"], 9, 10),
    (T, ["--laurel", "lr", "--laurel-layers", "3"], 3, 8),
])
def test_a_switched_on_study_resolves_in_the_file_to_the_runs_values_at_the_depths_where_it_does(
        tmp_path, monkeypatch, script_module, flags, refused_depth, other_depth):
    """Rules 14 and 16: the file holds the arm's resolution as values (no flag checks, defaults or naming of its
    own; with every study fixed, no study code on its command line), and at another depth it resolves as the
    modular script does, or refuses as it does."""
    out = tmp_path / "arm.py"
    assert script_module.main(["--export-script", str(out), "--force", *flags]) == 0
    text = out.read_text()
    assert "check_fixed_depth(config, {" in text
    # rule 32: every field of the study holds one value in each probe config, so the file has no registry and no
    # declaration (the model config is the baseline's; the part reads the values as literals)
    assert not re.search(r"\bSTUDIES\b|\bmodel_config=lambda|\bmodel_fields=", text)
    for command_line in ("fixed_resolution", "def refused_flags", "def flag_piece", "OFFERED_STUDIES"):
        assert command_line not in text, command_line
    for resolution in ("def resolve_backout_args", "def backout_variant_name", "BACKOUT_NAME_PIECES",
                       "def resolve_laurel_args", "def laurel_variant_name"):
        assert resolution not in text, resolution
    exported = file_as_module(out, monkeypatch)
    at = ["--preset", "tiny", "--run-name", "r", "--num-layers"]
    with pytest.raises(UsageError):
        script_module.resolve_args([*flags, *at, str(refused_depth)])
    with pytest.raises(Exception, match=f"does not run with --num-layers {refused_depth} at --preset tiny"):
        exported.resolve_args(exported.with_fixed_flags([*at, str(refused_depth)]))
    as_file = file_logged_config(exported, [*at, str(other_depth)])
    modular = script_module.resolve_args([*flags, *at, str(other_depth)]).as_dict()
    logged = [json.loads(json.dumps({k: v for k, v in config.items() if k not in ("train_files", "val_files")}))
              for config in (as_file, modular)]  # data: by the file
    assert logged[0] == logged[1]
    assert as_file["variant"].startswith(f"layers{other_depth}_")
    # rule 15: the file refuses every flag of the study, so their help and the study's description are not in it
    on = [study for study in STUDIES if study.active(script_module.resolve_args(flags))]
    assert on and all(flag.help not in text for study in on for flag in study.flags)
    # rule 16: nor their declarations
    assert not [flag.name for study in on for flag in study.flags if f'Flag("{flag.name}"' in text]
    assert all(study.description not in text for study in on if study.description)


def test_the_help_texts_of_a_study_the_file_refuses_are_emptied_and_its_flags_joined_where_they_fit():
    from speedrun.export import quiet_declarations
    source = "\n".join([
        'FLAGS = (',
        '    Flag("--a", "one "',
        '                "two", resume=True,',
        '         kind=int),',
        '    Flag("--b", help="kept on its lines: a comment", resume=True,  # why',
        '         kind=int),',
        '    Flag("--c", "x" * 3, resume=False),',
        ')',
        'OTHER = (Flag("--d", "another study\'s", resume=True),)',
        'S = Study(name="s", description="about s",',
        '          flags=FLAGS)',
        ''])
    assert quiet_declarations(source, ["S"]).split("\n") == [
        'FLAGS = (',
        '    Flag("--a", "", resume=True, kind=int),',
        '    Flag("--b", help="", resume=True,  # why',
        '         kind=int),',
        '    Flag("--c", "x" * 3, resume=False),',  # no text: an expression is left as it is
        ')',
        'OTHER = (Flag("--d", "another study\'s", resume=True),)',
        'S = Study(name="s",',
        '          flags=FLAGS)',
        '']


def test_a_study_declaration_the_export_cannot_rewrite_is_refused_naming_the_rule():
    from speedrun.export import rewritten_declarations
    source = "STUDY = Study(**OPTIONS)\n"  # no resolve= keyword to rewrite
    with pytest.raises(UsageError, match="rule 14"):
        rewritten_declarations(source, [("STUDY", "resolve", "fixed_resolution({}, {})")], "speedrun/x.py")
    rewritten = rewritten_declarations("X = 1\nSTUDY = Study(name='s', resolve=resolve_it)\n",
                                       [("STUDY", "resolve", "resolve=fixed_resolution({}, {})")], "speedrun/x.py")
    assert rewritten.splitlines() == ["X = 1", "from speedrun.study import fixed_resolution",
                                      "STUDY = Study(name='s', resolve=fixed_resolution({}, {}))"]
    # rule 16: keywords replaced by others (on lines of their own where they span several; the comment right above
    # one that starts its line goes with it), one cut
    source = "STUDY = Study(\n    name='s',\n    # about F\n    flags=F, resolve=resolve_it, variant_name=name_it,\n)\n"
    rewritten = rewritten_declarations(source, [("STUDY", "flags", "flags=(), model_fields=(('a', int, None),)"),
                                                ("STUDY", "resolve", "model_config=lambda m, c: {\n        'a': 1}"),
                                                ("STUDY", "variant_name", None)], "speedrun/x.py")
    assert rewritten.splitlines() == ["STUDY = Study(", "    name='s',", "    flags=(), model_fields=(('a', int, None),),",
                                      "    model_config=lambda m, c: {", "        'a': 1},", ")"]


def parts_loops(text):
    """The methods of the file's StudyHost that loop over its parts (a `for` or a comprehension over self.parts)."""
    host = next(n for n in ast.walk(ast.parse(text)) if isinstance(n, ast.ClassDef) and n.name == "StudyHost")
    return {m.name for m in host.body if isinstance(m, ast.FunctionDef) for n in ast.walk(m)
            if isinstance(n, (ast.For, ast.comprehension)) and ast.unparse(n.iter) == "self.parts"}


@pytest.mark.parametrize("script, flags, loops, answered", [
    # backout answers head_input and named_scalars alone: the loops for the other hooks and routes_mlp go, and the
    # model calls its one part for those two (rule 33)
    (T, ["--backout-layers", "4"], set(), {"head_input", "named_scalars"}),
    (S, ["--backout-layers", "8"], set(), {"head_input", "named_scalars"}),
    # #18's backout also replaces the base's head input (a flag it sets): that loop stays
    (T, ["--base", "r18", "--backout-layers", "11"], {"replaces_base_head_input"}, {"head_input", "named_scalars"}),
    # the rolling skip overrides block_input: its hook stays, block_output's goes
    (T, ["--rolling-skip"], set(), {"block_input", "named_scalars"}),
])
def test_a_hook_no_switched_on_part_overrides_leaves_the_file(tmp_path, script, flags, loops, answered):
    """The backout record file kept StudyHost's loops over its one part for every hook (block_input, block_output,
    before_step, after_step, routes_mlp) and ModelPart's default methods, which change nothing."""
    text = export(tmp_path, script, *flags)
    assert parts_loops(text) == loops
    assert all(f"def {hook}(" in text for hook in answered)
    assert ("def block_input" in text) == ("block_input" in answered)
    assert "def block_output" not in text and "def before_step" not in text and "def after_step" not in text
    # no part routes the MLPs: the model's compile branch for a router goes with routes_mlp
    assert "routes_mlp" not in text and "capture_dynamic_output_shape_ops" not in text
    # the hooks then pass their input through or do nothing: called nowhere
    assert "parts_block_output" not in text and "parts_before_step" not in text and "parts_after_step" not in text


HOST = '''
class Host:
    def passed_on(self, i, x):
        for part in self.parts:
            x = part.block_input(self, i, x)
        return x

    def other_target(self, i, x):
        for part in self.parts:
            y = part.block_input(self, i, x)
        return y

    def steps(self):
        for part in model.parts:
            part.before_step(self)

    def scalars(self):
        out = {}
        for part in self.parts:
            out.update(part.named_scalars(self))
        return out

    def flags(self):
        return any(part.routes_mlp for part in self.parts), any(part.undeclared for part in self.parts)

    def overridden(self, x):
        for part in self.parts:
            x = part.head_input(self, x)
        return x
'''


def test_a_loop_over_the_parts_that_asks_only_passive_members_is_read_as_over_none():
    from speedrun.export import PASSIVE_MEMBERS, fold_constants, neutral_defaults, passive_loops_read
    forms = neutral_defaults()
    assert forms["block_input"] == ("argument", 2) and forms["before_step"] == ("returns", "None")
    assert forms["named_scalars"] == ("returns", "{}") and forms["routes_mlp"] == ("flag", "False")
    passive = {name: form for name, form in forms.items() if name != "head_input"}  # a part overrides head_input
    text = passive_loops_read(HOST, {PASSIVE_MEMBERS: tuple(passive.items())})
    assert text.count("in ()") == 4  # passed_on, steps, scalars, routes_mlp's any; `undeclared` is no member
    assert "y = part.block_input(self, i, x)" in text and "for part in self.parts:\n            y" in text
    assert "undeclared for part in self.parts" in text and "x = part.head_input" in text
    folded, _ = fold_constants(HOST, {PASSIVE_MEMBERS: tuple(passive.items())})
    assert "def passed_on(self, i, x):\n        return x\n" in folded and "out = {}\n        return out" in folded
    assert "any(())" in folded
    assert passive_loops_read(HOST, {}) == HOST  # none passive: nothing changes


PASSING = '''
def forward(self, model, i, x):
    x = self.through(i, x)
    y = self.through(i, x + 1)
    model.nothing(i, x)
    z = model.nothing(i, x)
    out.update(self.empty())
    out.update(self.nothing(i, x))
    kept = self.through(f(i), x)
    return self.through(i, norm(x)), other.through(i, x), kept, y, z
'''


def test_calls_of_a_host_method_that_passes_an_argument_through_or_does_nothing_fold():
    from speedrun.export import PASSED_THROUGH, fold_constants
    text, _ = fold_constants(PASSING, {PASSED_THROUGH: (("through", 1), ("nothing", None), ("empty", "{}"))})
    assert text == ("\ndef forward(self, model, i, x):\n    y = (x + 1)\n    z = model.nothing(i, x)\n"
                    "    out.update(self.nothing(i, x))\n"
                    "    kept = self.through(f(i), x)\n    return norm(x), other.through(i, x), kept, y, z\n")


def test_a_declared_neutral_default_of_another_form_is_refused(monkeypatch, tmp_path):
    """A static method returning what it computes (not a parameter, {}, False or None) is of another form."""
    from speedrun import export as export_module
    (tmp_path / "study.py").write_text("class ModelPart:\n    def block_input(self, model, i, x):\n        return x\n\n"
                                       "    @staticmethod\n    def base_config(cfg):\n        return cfg.base\n")
    monkeypatch.setattr(export_module, "ROOT", tmp_path)
    monkeypatch.setattr(export_module, "module_path", lambda module: tmp_path / "study.py")
    monkeypatch.setattr(export_module, "NEUTRAL_DEFAULTS", ("block_input", "base_config"))
    with pytest.raises(UsageError, match=r"study.py: NEUTRAL_DEFAULTS names base_config, but ModelPart.base_config is "
                                         r"neither"):
        export_module.neutral_defaults()


def test_what_folding_leaves_unused_goes_with_its_comments():
    from speedrun.export import drop_dead_constants, fold_ifs
    source = ("def f(config):\n    # loads it\n    state = load(config.resume) if config.resume else None\n"
              "    # the study's own\n    if config.resume:\n        use(state)\n    kept = None\n    return kept\n")
    folded = fold_ifs(source, {"config.resume": None})
    assert folded == "def f(config):\n    # loads it\n    state = None\n    kept = None\n    return kept\n"
    assert drop_dead_constants(folded) == "def f(config):\n    kept = None\n    return kept\n"
    assert drop_dead_constants("def g():\n    a = 1\n    b = 2\n") == "def g():\n    pass\n"
    nested = "def h():\n    a = None\n    def inner():\n        return a\n    return inner\n"
    assert drop_dead_constants(nested) == nested  # read by a nested function


def test_an_omitted_flag_becomes_its_default_in_the_parser():
    from speedrun.export import omit_arguments
    source = ('def make(p):\n    p.add_argument("--resume", default=None,\n                   help="x")\n'
              '    p.add_argument("--save-final-checkpoint", action="store_true")\n'
              '    p.add_argument("--checkpoint-every", type=int, default=0)\n')
    assert omit_arguments(source, ("--resume", "--save-final-checkpoint")) == (
        'def make(p):\n    p.set_defaults(resume=None)\n    p.set_defaults(save_final_checkpoint=False)\n'
        '    p.add_argument("--checkpoint-every", type=int, default=0)\n')


def test_small_track_export_keeps_its_track_flag(tmp_path):
    text = export(tmp_path, S, "--fp8-head", "off", "--seed", "3")
    assert fixed_flags_of(text) == ("--fp8-head", "off")  # --seed stays a run flag of the file
    assert inlined_sections(text)[-1] == "train_gpt.py" and project_imports(text) == []


@pytest.mark.parametrize("flags, message", [
    (["--export-script", "out.txt"], "--export-script is given twice"),
    (["--num-layers", "1"], "--num-layers must be at least 2"),
])
def test_an_export_it_cannot_make_is_refused_in_one_line(tmp_path, capsys, flags, message):
    argv = ["--export-script", str(tmp_path / "x.py"), "--preset", "tiny"] + flags
    assert T.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1
    assert not (tmp_path / "x.py").exists()


def test_split_and_fixed_flags():
    out, log, force, kept_in, rest = split_export_flags(["--seed", "1", "--export-script=a.py", "--laurel", "rw",
                                                         "--log-dir", "l"])
    assert out == "a.py" and log is None and not force and kept_in is None
    assert rest == ["--seed", "1", "--laurel", "rw", "--log-dir", "l"]
    assert split_export_flags(["--force", "--export-script", "a.py"])[2]
    for twice in (["--export-script", "a.py", "--export-script=b.py"], ["--export-script", "a.py", "--force"] * 2):
        with pytest.raises(UsageError, match="is given twice"):
            split_export_flags(twice)
    with pytest.raises(UsageError, match="must end in .py"):
        split_export_flags(["--export-script", "out.txt"])
    config = T.resolve_args(["--preset", "tiny"] + rest)
    assert fixed_flags(rest, config, T.TRACK_FLAGS) == ["--laurel", "rw", "--base", "r14"]


def test_a_fixed_or_study_flag_given_to_an_exported_file_is_refused(monkeypatch):
    import speedrun.cli as cli
    assert with_fixed_flags(["--laurel", "rw"]) == ["--laurel", "rw"]  # the modular script: nothing fixed
    monkeypatch.setattr(cli, "FIXED_FLAGS", ("--laurel", "rw"))
    assert with_fixed_flags(["--seed", "2"]) == ["--laurel", "rw", "--seed", "2"]
    for flag in ("--laurel=lr", "--backout-layers"):
        with pytest.raises(UsageError, match=f"{flag.split('=')[0]}: this file runs one arm"):
            with_fixed_flags([flag])


def test_a_study_excluding_another_that_is_not_in_the_file_resolves():
    """DLO excludes --backout-layers; a DLO file holds no backout study (a KeyError before the fix)."""
    from dataclasses import replace

    from speedrun.studies import STUDIES
    dlo = next(study for study in STUDIES if study.name == "dlo")
    config = T.resolve_args(["--preset", "tiny", "--init-from", __file__, "--dlo-groups", "2"])
    dlo.check_exclusions(config, [dlo])  # the excluded flag's study is absent: off
    with pytest.raises(UsageError, match="cannot be combined with --backout-layers"):
        dlo.check_exclusions(replace(config, backout_layers=(4,)), STUDIES)


@pytest.mark.parametrize("script_module, arm", [
    (T, ["--backout-layers", "4"]),
    (T, ["--backout-layers", "2", "4", "--backout-mode", "concat-mlp"]),
    (T, ["--laurel", "rw+lr+pa", "--laurel-rank", "8"]),
    (T, ["--init-from", __file__, "--dlo-groups", "2", "--dlo-add", "1", "--dlo-sparsity", "0.2"]),
    (T, ["--rolling-skip"]),
    (T, ["--base", "r18", "--laurel", "rw+lr"]),
    (S, ["--fp8-head", "off", "--gated-skip-layer", "3"]),
])
def test_the_flags_of_a_logged_config_resolve_to_that_config(script_module, arm):
    """--from-log rebuilds a run's flags from its logged config (JSON): given back, they resolve to it exactly."""
    import json

    from speedrun.export import flags_of_config
    run = ["--preset", "tiny", "--run-name", "r"]
    config = script_module.resolve_args(run + arm)
    logged = json.loads(json.dumps(config.as_dict()))
    extra = ["--init-from", __file__] if "--init-from" in arm else []  # a run flag DLO's resolution needs
    argv = flags_of_config(logged, script_module.TRACK_FLAGS, script_module.resolve_args, extra)
    assert script_module.resolve_args(argv + extra + ["--run-name", "r"]) == config


def exported_program(tmp_path, monkeypatch, library, script, folds=None):
    """The kept source of a program of two files, speedrun/lib.py and script.py, in a project rooted at tmp_path."""
    from speedrun import export as export_module
    monkeypatch.setattr(export_module, "ROOT", tmp_path)
    (tmp_path / "speedrun").mkdir()
    (tmp_path / "speedrun" / "__init__.py").write_text("")
    (tmp_path / "speedrun" / "lib.py").write_text(library)
    (tmp_path / "script.py").write_text(script)
    program = export_module.folded_program("script", folds or {}, {})
    return "\n".join(s.text for m in program.order() for s in program.kept_statements(m))


LIBRARY = '''import torch.nn as nn


def helper():
    return 1


class Net(nn.Module):
    def forward(self, x):  # nn.Module.__call__ calls it: kept
        return x

    def used(self):
        return getattr(self, "by_string")()

    def by_string(self):
        return 2

    # the only caller of helper
    @staticmethod
    def unused():
        return helper()


class Plain:
    def __init__(self):
        self.n = 0

    def unused(self):
        return 3
'''


def test_methods_nothing_names_are_left_out_with_what_only_they_use(tmp_path, monkeypatch):
    script = "from speedrun.lib import Net, Plain\n\nif __name__ == '__main__':\n    print(Net().used(), Plain().n)\n"
    text = exported_program(tmp_path, monkeypatch, LIBRARY, script)
    for kept in ("def forward", "def used", "def by_string", "def __init__"):
        assert kept in text
    assert "unused" not in text and "helper" not in text and "@staticmethod" not in text
    ast.parse(text)


def test_a_class_whose_methods_all_go_keeps_a_pass(tmp_path, monkeypatch):
    script = "from speedrun.lib import Plain\n\nif __name__ == '__main__':\n    print(Plain)\n"
    library = "class Plain:\n    def unused(self):\n        return 3\n"
    assert exported_program(tmp_path, monkeypatch, library, script).startswith("class Plain:\n    pass\n")


HOOKS = '''class Model:
    def router(self):
        found = [r for r in (part.router(self) for part in self.parts) if r is not None]
        assert len(found) <= 1, "two parts route"
        return found[0] if found else None

    def routes(self):
        return any(part.routes for part in self.parts)

    def forward(self, x):
        router = self.router()
        mode = self.mode or "sum"
        if router is None:
            x = self.block(x, extra=router, mode=mode)
        else:
            x = router(x)
        if self.routes():
            x = x + 1
        return x
'''


def test_a_method_that_computes_a_constant_folds_where_it_is_called_and_through_locals():
    from speedrun.export import drop_dead_constants, fold_constants
    text, folded = fold_constants(HOOKS, {"self.parts": ()})
    text = drop_dead_constants(text)
    assert text[text.index("    def forward"):] == ('    def forward(self, x):\n        mode = self.mode or "sum"\n'
                                            '        x = self.block(x, extra=None, mode=mode)\n        return x\n')
    assert folded == {"router": "Model", "routes": "Model"}
    assert fold_constants(HOOKS, {}) == (HOOKS, {})  # parts not known: nothing folds


@pytest.mark.parametrize("source, value", [
    ("x or 'sum'", "UNKNOWN"),  # true, but of unknown value
    ("(x or 'sum') == 'sum'", "UNKNOWN"),
    ("len([a for a in ()])", 0),
    ("any(p for p in ())", False),
    ("None if () else 3", 3),
    ("self.hook(a, b)", None),
    ("self.hook(f())", "UNKNOWN"),  # the argument's call would still run
])
def test_values_the_export_decides(source, value):
    from speedrun.export import UNKNOWN, folded_value
    found = folded_value(ast.parse(source, mode="eval").body, {"self.hook()": None}, test=False)
    assert found == value if value != "UNKNOWN" else found is UNKNOWN


def test_the_parts_list_is_true_where_the_file_builds_parts_and_so_is_a_display_of_names():
    """Where rule 31 wrote the run's parts (BUILT_PARTS, one at least), every model of the file holds them: a test on
    the list of parts is true; its value stays unknown. A display of items that evaluate nothing is true too."""
    from speedrun.export import BUILT_PARTS, UNKNOWN, folded_value

    def value(source, folds, test=True):
        return folded_value(ast.parse(source, mode="eval").body, folds, test=test)

    built = {BUILT_PARTS: (("backout", "speedrun.backout", "Backout"),)}
    assert value("self.parts", built) is True and value("not model.parts", built) is False
    assert value("x if self.parts else y", built) is UNKNOWN  # decided, but the branch's value is unknown
    assert value("self.parts", {}) is UNKNOWN  # the registry decides the parts: unknown
    assert value("self.parts", built, test=False) is UNKNOWN  # only its truth is known
    assert value("len(self.parts)", built) is UNKNOWN and value("other.parts", built) is UNKNOWN
    assert value("[('backout', Backout)]", {}) is True and value("(cfg.layers,)", {}) is True
    assert value("[('backout', Backout)]", {}, test=False) is UNKNOWN
    assert value("[f()]", {}) is UNKNOWN and value("[*xs]", {}) is UNKNOWN and value("[]", {}) == ()


def test_a_folded_method_another_class_overrides_is_refused(tmp_path, monkeypatch):
    library = ("class Base:\n    def hook(self):\n        return None\n\n"
               "    def run(self):\n        return self.hook()\n")
    script = ("from speedrun.lib import Base\n\n\nclass Mine(Base):\n    def hook(self):\n        return 1\n\n\n"
              "if __name__ == '__main__':\n    print(Mine().run())\n")
    with pytest.raises(UsageError, match="Base.hook was folded to its value, but script.py's Mine defines hook"):
        exported_program(tmp_path, monkeypatch, library, script)


def test_an_override_of_a_folded_method_is_refused_when_the_file_would_drop_it(tmp_path, monkeypatch):
    """A track's GPT overriding a model hook, beside methods the file keeps: the override is named nowhere once the
    calls fold, so the file would drop it and train the base's hook (rc 0 before the fix)."""
    library = ("class Base:\n    def hook(self, scale=1.0):\n        return None\n\n"
               "    def run(self):\n        residuals = self.hook()\n        return residuals\n")
    script = ("from speedrun.lib import Base\n\n\nclass Mine(Base):\n    def hook(self, scale=0.9):\n"
              "        return scale\n\n    def used(self):\n        return self.run()\n\n\n"
              "if __name__ == '__main__':\n    print(Mine().used())\n")
    with pytest.raises(UsageError, match="Base.hook was folded to its value, but script.py's Mine defines hook"):
        exported_program(tmp_path, monkeypatch, library, script)


@pytest.mark.parametrize("library, folds", [
    # rule 7: it returns its argument
    ("class StudyHost:\n    def through(self, i, x):\n        return x\n", {"PASSED_THROUGH": (("through", 1),)}),
    # rule 33: it asks the parts in turn, and one part of the file's model answers
    ("class StudyHost:\n    def through(self, i, x):\n        for part in self.parts:\n"
     "            x = part.block_input(self, i, x)\n        return x\n",
     {"FORWARDED": (("through", "block_input", "rolling", "chain", 2),)}),
])
def test_an_override_of_a_host_method_folded_where_called_is_refused(tmp_path, monkeypatch, library, folds):
    """StudyHost.parts_block_input folds to `x` (no part answers it) or to the one part's call where it is called: a
    model class defining its own would be dropped with the calls, and the file would train without it."""
    from speedrun import export as export_module
    folds = {getattr(export_module, key): value for key, value in folds.items()}
    script = ("from speedrun.lib import StudyHost\n\n\nclass Mine(StudyHost):\n    def through(self, i, x):\n"
              "        return x + 1\n\n    def used(self):\n        return self.through(0, 2)\n\n\n"
              "if __name__ == '__main__':\n    print(Mine().used())\n")
    with pytest.raises(UsageError, match="StudyHost.through was folded to its value, but script.py's Mine defines"):
        exported_program(tmp_path, monkeypatch, library, script, folds)


def test_a_left_out_run_flag_folds_to_the_parsers_default_not_a_number_of_the_exporters():
    """--checkpoint-every's default changed in speedrun/cli.py: the file's code is folded with the new default (the
    config's value), as its parser states it."""
    from dataclasses import replace

    from speedrun.export import folded_tests
    config = replace(T.resolve_args(["--preset", "tiny"]), checkpoint_every=7, profile_steps=3)
    folds = folded_tests(config, ("--checkpoint-every", "--profile-steps"))
    assert folds["config.checkpoint_every"] == folds["args.checkpoint_every"] == 7
    assert folds["config.profile_steps"] == 3


def test_the_check_runs_the_arm_at_the_tiny_preset_and_at_the_runs_depth_where_tiny_has_too_few_layers():
    from speedrun.export import ROOT, verification_argv
    run = ["--backout-layers", "11", "--num-iterations", "5550", "--seed", "3", "--log-dir", "x"]
    config = T.resolve_args(run)
    fixed = fixed_flags(run, config, T.TRACK_FLAGS)
    modular, exported = verification_argv(run, fixed, T.resolve_args)
    assert modular[:len(fixed)] == fixed and exported == modular[len(fixed):]
    assert "--backout-layers" not in exported and exported[:2] == ["--seed", "3"]
    assert "5550" not in exported and "x" not in exported
    assert exported[exported.index("--num-layers") + 1] == "16"  # layer 11 needs the record's depth
    assert exported[exported.index("--train-files") + 1] == str(ROOT / "data" / "demo" / "demo_train_*.bin")
    checked = T.resolve_args(modular)
    assert (checked.preset, checked.num_iterations, checked.backout_layers, checked.seed) == ("tiny", 2, (11,), 3)
    modular, exported = verification_argv(["--laurel", "rw"], ["--laurel", "rw", "--base", "r14"], T.resolve_args)
    assert "--num-layers" not in exported  # tiny's own 6 layers


CONSTANTS = '''class Base:
    def __init__(self):
        self.extra = self.make_extra() if self.USE_EXTRA else None

    def make_extra(self):
        return Extra()


class Extra:
    pass
'''


@pytest.mark.parametrize("subclasses, folded", [
    ("class Mine(Base):\n    USE_EXTRA = False\n", True),
    ("class Mine(Base):\n    USE_EXTRA = False\n\n\nclass Other(Base):\n    USE_EXTRA = True\n", False),
    ("class Mine(Base):\n    USE_EXTRA = False\n\n\nMine.USE_EXTRA = True\n", False),  # set elsewhere
    ("class Mine(Base):\n    USE_EXTRA = False\n\n\nNAME = 'USE_EXTRA'\nsetattr(Mine, NAME, True)\n", False),
])
def test_a_class_constant_the_kept_classes_agree_on_folds(tmp_path, monkeypatch, subclasses, folded):
    uses = "print(Mine().extra" + (", Other().extra)" if "Other" in subclasses else ")")
    script = f"from speedrun.lib import Base\n\n\n{subclasses}\n\nif __name__ == '__main__':\n    {uses}\n"
    text = exported_program(tmp_path, monkeypatch, CONSTANTS, script)
    assert ("self.extra = None" in text and "make_extra" not in text and "class Extra" not in text) == folded
    assert ("self.extra = self.make_extra() if self.USE_EXTRA else None" in text) != folded


def test_a_local_is_read_as_its_value_only_where_a_literal_spells_it():
    from speedrun.export import propagate_locals
    source = "def f(self):\n    x = g()\n    return h(x)\n"
    assert propagate_locals(source, {"g()": 2}) == "def f(self):\n    x = 2\n    return h(2)\n"
    assert propagate_locals(source, {"g()": float("inf")}) == source  # repr 'inf' would be a name


def file_constant(text, name):
    return next(ast.literal_eval(n.value) for n in ast.parse(text).body if isinstance(n, ast.Assign)
                and ast.unparse(n.targets[0]) == name)


def test_the_file_with_no_flags_resolves_to_the_exported_run(tmp_path, monkeypatch):
    """The record's file trains the record: its schedule (--num-iterations 5550) and preset are its defaults, which
    a flag given to it overrides; with none given it resolves to the modular run's config (before: 5590 steps)."""
    import speedrun.cli as cli
    out = tmp_path / "rec.py"
    run = ["--backout-layers", "11", "--num-iterations", "5550", "--seed", "3", "--log-dir", "logs2"]
    assert T.main(["--export-script", str(out), *run]) == 0
    text = out.read_text()
    assert file_constant(text, "RUN_DEFAULTS") == ("--preset", "full", "--num-iterations", "5550", "--seed", "3")
    exported = file_as_module(out, monkeypatch)
    as_file, modular = file_logged_config(exported, ["--run-name", "r"]), T.resolve_args(run + ["--run-name", "r"])
    as_file["backout_layers"] = tuple(as_file["backout_layers"])  # logged as a list, as JSON has no tuple
    data = ("train_files", "val_files")  # found by the file relative to its own folder
    assert {k: v for k, v in as_file.items() if k not in data} == {
        k: v for k, v in dict(modular.as_dict(), log_dir="logs").items() if k not in data}
    assert file_logged_config(exported, ["--num-iterations", "9", "--run-name", "r"])["num_iterations"] == 9
    # the studies the file leaves out are logged at their values, as the modular run logs them; the one it fixes
    # at the run's (rule 16)
    left_out = file_constant(text, "LEFT_OUT_FIELDS")
    assert left_out["laurel"] is None and left_out["rolling_skip"] is False and left_out["backout_layers"] == [11]
    # in the registry's order, as the baseline's file holds them: the two files differ in the backout's values only
    assert list(left_out)[:3] == ["backout_layers", "backout_mode", "backout_transform"]
    assert list(left_out).index("backout_mlp_ratio") < list(left_out).index("rolling_skip")


EXPORTED = ", changed by the flags of the command at the top of this file."


@pytest.mark.parametrize("script, flags, no_flags", [
    (T, [], "the upstream baseline."),
    (S, [], "upstream record #21."),
    (T, ["--num-iterations", "5550"], "the upstream baseline" + EXPORTED),  # the schedule alone is another run
    (T, ["--preset", "tiny"], "the upstream baseline" + EXPORTED),
    (T, ["--base", "r18"], "the upstream baseline" + EXPORTED),
    (T, ["--backout-layers", "11"], "the upstream baseline" + EXPORTED),
    (S, ["--backout-layers", "8"], "upstream record #21" + EXPORTED),
])
def test_the_files_help_says_what_it_runs_with_no_flags(tmp_path, script, flags, no_flags):
    """An arm's file said "With no flags: the upstream baseline" (the modular script's words) where it trains its
    arm; a file names the track's baseline only where, given no flags, it runs it."""
    out = tmp_path / "x.py"
    assert script.main(["--export-script", str(out), *flags]) == 0
    help_text = " ".join(run_file(out, "--help").stdout.split())
    assert f"With no flags: {no_flags}" in help_text
    assert ("RUNS_BASELINE" in out.read_text()) is False  # decided at the export, as the file's run is


def logged_run(tmp_path, *flags):
    """A log of this checkout's medium script (its code section and config line, no steps)."""
    from conftest import MEDIUM_SCRIPT, embedded_sources
    from speedrun.logformat import SEPARATOR, config_line
    config = T.resolve_args(["--preset", "tiny", "--run-name", "r", *flags]).as_dict()
    log = tmp_path / "r.txt"
    log.write_text("\n".join([embedded_sources(MEDIUM_SCRIPT), SEPARATOR, config_line(config), SEPARATOR, ""]))
    return log


def test_from_log_keeps_the_logged_schedule_and_refuses_a_flag_that_contradicts_the_log(tmp_path, capsys):
    from speedrun.export import flags_from_log
    log = logged_run(tmp_path, "--backout-layers", "4", "--num-iterations", "7")
    flags = flags_from_log(log, T.__file__, T.TRACK_FLAGS, T.resolve_args, [])
    assert flags[:2] == ["--preset", "tiny"] and flags[flags.index("--num-iterations") + 1] == "7"
    assert flags_from_log(log, T.__file__, T.TRACK_FLAGS, T.resolve_args, ["--backout-layers", "4", "--seed", "2"])
    out = tmp_path / "x.py"
    assert T.main(["--export-script", str(out), "--from-log", str(log), "--backout-layers", "2"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--backout-layers 2 contradicts the log's run (backout_layers [4])" in err
    assert not out.exists()


def test_an_existing_file_is_replaced_only_with_force_and_atomically(tmp_path, monkeypatch, capsys):
    import os
    out = tmp_path / "x.py"
    out.write_text("mine\n")
    assert T.main(["--export-script", str(out), "--preset", "tiny"]) == 2
    assert "exists; give --force to replace it" in capsys.readouterr().err and out.read_text() == "mine\n"

    def full_disk(*args):
        raise OSError(28, "No space left on device")
    with monkeypatch.context() as patched:
        patched.setattr(os, "replace", full_disk)
        assert T.main(["--export-script", str(out), "--preset", "tiny", "--force"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "No space left on device" in err
    assert out.read_text() == "mine\n" and sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]  # no temp left
    assert T.main(["--export-script", str(out), "--preset", "tiny", "--force"]) == 0
    assert "RUN_DEFAULTS" in out.read_text() and sorted(p.name for p in tmp_path.iterdir()) == ["x.py"]


@pytest.mark.slow
def test_a_file_of_the_checkout_is_never_the_export(tmp_path):
    """Guards: --export-script over a file git tracks in the checkout is refused even with --force (it asks git)."""
    from speedrun.export import ROOT, check_out_path
    for tracked in (ROOT / "speedrun" / "model.py", ROOT / "train_gpt_medium.py"):
        with pytest.raises(UsageError, match="a file of this checkout"):
            check_out_path(str(tracked), force=True)
    check_out_path(str(ROOT / "not_tracked_export.py"), force=False)  # a new name in the checkout is fine


def test_help_lists_the_export_flags_and_the_file_has_none(tmp_path, capsys):
    with pytest.raises(SystemExit):
        T.main(["--help"])
    shown = capsys.readouterr().out
    assert "--export-script OUT.py" in shown and "--from-log LOG" in shown and "--force" in shown
    assert "--export-check-dir DIR" in shown
    text = export(tmp_path, T)
    assert not [flag for flag in ("--export-script", "--from-log", "--force", "--export-check-dir")
                if f'add_argument("{flag}"' in text]
    assert "import SUPPRESS" not in text


def test_a_run_writing_checkpoints_every_k_steps_keeps_resume_in_its_file(tmp_path):
    text = export(tmp_path, T, "--checkpoint-every", "5")
    assert 'add_argument("--checkpoint-every"' in text and 'add_argument("--resume"' in text
    assert "def load_resume_state" in text or "def restore_run_state" in text


def test_the_check_compares_the_keys_that_make_the_run_and_every_final_parameter(tmp_path):
    """The check's comparison itself (verify_export is stubbed in this file's other tests): a run-local entry (the log
    folder) and a study left off are no difference; a training entry, a logged loss and a final parameter are."""
    import torch

    from analysis_logs import our_log_text
    from speedrun.export import first_difference

    def run(name, config, final=3.0, weight=0.0):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "run.txt").write_text(our_log_text(config=config, total_steps=4, val_every=2,
                                                     losses=lambda step: 4.0 if step < 4 else final))
        torch.save({"model": {"w": torch.tensor([weight])}}, folder / "run.pt")
        return folder

    modular = run("modular", {"log_dir": "logs/a", "backout_layers": [], "num_layers": 6})
    assert first_difference(modular, run("same", {"log_dir": "elsewhere", "num_layers": 6})) is None
    assert first_difference(modular, run("deeper", {"log_dir": "logs/a", "num_layers": 7})) == (
        "config num_layers: 6 (modular script) vs 7 (exported file)")
    assert first_difference(modular, run("loss", {"num_layers": 6}, final=3.5)).startswith("step 4: val_loss")
    assert first_difference(modular, run("weight", {"num_layers": 6}, weight=1.0)) == "final parameter w differs"


def test_the_base_folds_by_the_function_called_not_by_how_the_script_names_its_locals():
    """The issue's case: renaming the local `parsed` of train_gpt_medium.resolve_args left the base test unfolded
    (the exporter matched the text `parsed['base'] == 'r18'`), so an r14 export pulled in the r18 package and
    failed on a name both define."""
    from conftest import MEDIUM_SCRIPT
    from speedrun.export import folded_tests, parsed_module
    source = MEDIUM_SCRIPT.read_text()
    assert source.count('runs_r18(parsed["base"])') == 1
    renamed = source.replace("parsed", "options")
    for base, kept in (("r14", "resolve_track_args(options, PRESETS"), ("r18", "resolve_r18_args(")):
        folds = folded_tests(T.resolve_args(["--preset", "tiny", "--base", base]))
        module = parsed_module("train_gpt_medium", renamed, tuple(sorted(folds.items())), (), ())
        resolve = next(s.text for s in module.statements if s.defines == {"resolve_args"})
        assert "runs_r18" not in resolve and kept in resolve


@pytest.mark.parametrize("line, message", [
    ("    if args.base == 'r18':", r"script.py tests the base as `args.base == 'r18'`: call speedrun.cli.runs_r18, "
                                   r"the test the export folds \(docs/export.md, rule 4\)"),
    ("    if run.__doc__:", r"script.py reads `run.__doc__`, and the file keeps no docstrings"),
])
def test_kept_code_that_relies_on_what_the_export_changes_is_refused_naming_the_rule(tmp_path, monkeypatch, line,
                                                                                      message):
    from speedrun import export as export_module
    script = (f"import sys\n\n\ndef run(args):\n    \"\"\"Doc.\"\"\"\n{line}\n        return 1\n    return 0\n\n\n"
              "if __name__ == '__main__':\n    print(run(sys.argv))\n")
    exported_program(tmp_path, monkeypatch, "", script)
    program = export_module.folded_program("script", {}, {})
    with pytest.raises(UsageError, match=message):
        export_module.check_kept_code(program.order(), program)


def test_an_out_in_a_missing_folder_is_refused_before_the_check_trains(tmp_path, monkeypatch, capsys):
    from speedrun import export as export_module
    checked = []
    monkeypatch.setattr(export_module, "verify_export", lambda *args: checked.append(args))
    out = tmp_path / "missing" / "x.py"
    assert T.main(["--export-script", str(out), "--preset", "tiny"]) == 2
    assert capsys.readouterr().err == f"error: --export-script {out}: no folder {out.parent}\n"
    assert checked == []


def test_both_locals_of_a_decided_tuple_assignment_fold_and_go():
    """The r18 model's `residuals, router = self.parts_residuals(), self.parts_mlp_router()` left `if residuals is
    None` tests and `router.finish(...)` in the baseline file."""
    from speedrun.export import drop_dead_constants, fold_constants
    source = ("def forward(self, x):\n    residuals, router = self.a(), self.b()\n"
              "    x = f(x, augment=None if residuals is None else residuals(1))\n"
              "    if router is not None:\n        router.finish(x)\n    return x\n")
    text, _ = fold_constants(source, {"self.a()": None, "self.b()": None})
    assert drop_dead_constants(text) == "def forward(self, x):\n    x = f(x, augment=None)\n    return x\n"
    kept, _ = fold_constants(source.replace("self.b()", "g()"), {"self.a()": None})
    assert "residuals, router = None, g()" in drop_dead_constants(kept)  # one item unknown: the statement stays


def test_a_class_attribute_nothing_reads_goes_with_what_only_it_names(tmp_path, monkeypatch):
    """#18's `depth_expansion = R18DepthExpansion`, read by DLO alone, kept an empty `class R18DepthExpansion: pass`
    in every r18 file without DLO."""
    library = ("class Expansion:\n    def grow(self):\n        return 2\n\n\nclass Model:\n"
               "    expansion = Expansion  # read by a study that is off\n    size = 3\n    ratio = size * 2\n\n"
               "    def run(self):\n        return self.ratio\n")
    script = "from speedrun.lib import Model\n\nif __name__ == '__main__':\n    print(Model().run())\n"
    r18 = export(tmp_path, T, "--base", "r18")
    assert "class R18DepthExpansion" not in r18 and "depth_expansion" not in r18
    assert "router = " not in r18 and "residuals = " not in r18 and "residuals is None" not in r18
    (tmp_path / "program").mkdir()
    text = exported_program(tmp_path / "program", monkeypatch, library, script)
    assert "Expansion" not in text and "read by a study" not in text
    assert "    size = 3\n    ratio = size * 2\n" in text  # what a kept attribute's value names stays


REGISTRY_LIBRARY = '''STUDIES = ()


def check(config, studies=STUDIES):
    for study in studies:
        study.check(config)


def build(config, studies):
    names = tuple(study.name for study in studies) + ()
    return sorted(studies, key=lambda study: study.name), names


def passed_on(config, studies):
    return build(config, studies)


def kept(config, studies=()):
    return [study for study in studies]


def run(config, other):
    check(config)
    return passed_on(config, STUDIES), kept(config, other)
'''


def test_an_empty_registry_and_what_only_passes_it_on_fold_away(tmp_path, monkeypatch):
    """With no study on, `STUDIES = ()` was kept and looped over, passed on as a parameter (`studies=STUDIES`) through
    three functions, and check_r18_studies kept as a function doing nothing, called."""
    from speedrun import export as export_module
    monkeypatch.setattr(export_module, "ROOT", tmp_path)
    (tmp_path / "speedrun").mkdir()
    (tmp_path / "speedrun" / "__init__.py").write_text("")
    (tmp_path / "speedrun" / "lib.py").write_text(REGISTRY_LIBRARY)
    (tmp_path / "script.py").write_text("from speedrun.lib import run\n\nif __name__ == '__main__':\n"
                                        "    print(run(1, 2))\n")
    program = export_module.folded_program("script", {"STUDIES": ()}, {})
    text = "\n".join(s.text for m in program.order() for s in program.kept_statements(m))
    assert "STUDIES" not in text and "check" not in text  # the registry, and the call that did nothing
    # `config`, never read, goes with what every call passes it, a name (stop 46); found a pass before `studies`,
    # which a pass after it finds first in the cut signature: both go (the second was once taken for the first)
    assert "def build():\n    names = ()\n    return [], names\n" in text
    assert "def passed_on():\n    return build()\n" in text and "passed_on(), " in text
    # a parameter a call passes something else keeps it
    assert "def kept(studies=()):" in text and "kept(other)" in text


def test_exported_baselines_hold_no_empty_registry_nor_what_does_nothing_with_it(tmp_path):
    for text in (export(tmp_path, T), export(tmp_path, T, "--base", "r18"), export(tmp_path, S)):
        tree = ast.parse(text)
        assert "STUDIES" not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
        functions = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
        assert not [f.name for f in functions if "studies" in [a.arg for a in f.args.args]
                    and f.name in ("make_parser", "resolve_study_args", "model_config_from_args", "preset_config",
                                   "check_r18_studies")]
        assert "check_r18_studies" not in text
        # rule 24: what returns its input or a literal with no study on, and what nothing reads
        assert "given_study_flags" not in text and "resolve_study_args" not in text
        assert "    layer_pattern(config.num_layers)  # refuses a --num-layers" in text  # the check stays
        assert not re.search(r"\n( +)for [^\n]*:\n\1    pass\n", text)  # no loop left doing nothing
        # none fixed: the refusal of fixed flags and their hiding from --help fold away (FIXED_FLAGS is the file's)
        assert "refused_flags" not in text and "action.help = SUPPRESS" not in text
        # the model's hooks that return their input or do nothing: their calls fold to the input or go
        for hook in ("parts_block_input", "parts_block_output", "parts_head_input", "parts_before_step",
                     "parts_after_step", "parts_named_scalars"):
            assert hook not in text, hook
        # rule 29: the hook arguments no call of a baseline sets (the blocks' `augment`, `mlp_extra`, r18's
        # `routed_mlp`) and the tests on them
        assert not re.search(r"\b(augment|mlp_extra|routed_mlp)\b", text)


def run_file(path, *flags):
    import subprocess
    import sys
    return subprocess.run([sys.executable, str(path), *flags], capture_output=True, text=True, timeout=300,
                          cwd=path.parent)


@pytest.mark.parametrize("base, refused, offered, not_offered", [
    # r14 runs --compile regional; --attention chooses r18's kernel (r14: FlexAttention/SDPA), refused before
    ("r14", ["--attention", "fa3"], ["[--compile {auto,on,regional,off}]", "[--num-layers NUM_LAYERS]"],
     ["--attention", "--base"]),
    # r18 runs only #18's 16 layers and no regional compilation (its optimisers average after the backward)
    ("r18", ["--compile", "regional"], ["[--compile {auto,on,off}]", "[--attention {auto,fa3,varlen,flex,sdpa}]"],
     ["--num-layers", "regional", "--base"]),
])
def test_an_exported_file_offers_only_the_flags_and_choices_its_base_runs(tmp_path, base, refused, offered,
                                                                         not_offered):
    """The issue's residue: an r14 file listed --base {r14,r18} and --attention, an r18 one --compile regional and
    --num-layers; each refused them only after parsing. Its --help now lists neither, and the parser refuses them."""
    out = tmp_path / "exported.py"
    out.write_text(export(tmp_path, T, "--base", base))
    shown = run_file(out, "--help").stdout
    usage = " ".join(shown.split("options:")[0].split())
    assert all(flag in usage for flag in offered) and not [flag for flag in not_offered if flag in usage]
    # nor does its help name a flag it does not have (the other base's notes are in --base's help, not the file's)
    assert flags_named_but_not_offered(shown, flags_named(usage) | {"--help"}) == []
    for flags in (["--base", base], refused):
        result = run_file(out, *flags)
        assert result.returncode == 2 and result.stderr.count("\n") == 1, result.stderr
        assert f"{flags[0]}" in result.stderr and result.stdout == ""
    # nor explains a choice it does not offer (the r18 file's --compile help explained regional)
    assert ("regional:" in shown) == ("regional" in offered[0])
    # the fields of the flags it does not offer are logged at the run's values, as the modular run logs them
    assert file_constant(out.read_text(), "LEFT_OUT_FIELDS")["base"] == base


def test_a_declared_base_only_choice_that_the_base_runs_is_refused(tmp_path, monkeypatch, capsys):
    """The export drops what speedrun/cli.py declares another base's; a declaration the modular script contradicts
    (r18 runs --compile on) would make a file that lacks what its run can do."""
    import speedrun.export as export_module
    monkeypatch.setattr(export_module, "BASE_ONLY_CHOICES", {"--compile": {"regional": "r14", "on": "r14"}})
    out = tmp_path / "x.py"
    assert T.main(["--export-script", str(out), "--preset", "tiny", "--base", "r18"]) == 2
    err = capsys.readouterr().err
    assert "--compile on is declared another base's" in err and err.count("\n") == 1 and not out.exists()


def test_a_cut_choice_leaves_the_help_with_its_note():
    """cut_choices cuts a choice from choices=[...] and its note from help=choices_help(...), one note or several,
    and keeps a help of another form whole."""
    from speedrun.export import cut_choices
    from speedrun.flag_scopes import choices_help
    source = ('p.add_argument("--c", choices=["a", "b", "r"], help=choices_help("C.", a="A.", r="R.", b="B."))\n'
              'p.add_argument("--d", choices=["a", "r"], help="r: kept")\n')
    cut = cut_choices(source, [("--c", ("r", "b")), ("--d", ("r",))])
    calls = [ast.parse(line).body[0].value for line in cut.splitlines()]
    assert [ast.literal_eval(call.keywords[0].value) for call in calls] == [["a"], ["a"]]
    assert eval(ast.unparse(calls[0].keywords[1].value), {"choices_help": choices_help}) == "C. a: A."
    assert ast.unparse(calls[1].keywords[1].value) == "'r: kept'"
    assert cut_choices(source, [("--c", ("a",))]).count("a=") == 0


def test_a_help_of_choice_notes_is_written_as_its_string():
    """The file says a choices_help(...) of literals as the string it makes, within the line length, and carries no
    helper; one with a computed part stays a call."""
    from speedrun.export import WIDTH, choices_helps_written
    from speedrun.flag_scopes import choices_help
    long_note = "each block and the head compiled apart, " * 4
    source = (f'def f(p, k):\n    p.add_argument("--c", help=choices_help("C.", auto="on CUDA.", r={long_note!r}))\n'
              '    p.add_argument("--d", help=choices_help("D.", **k))\n')
    written = choices_helps_written(source)
    calls = [n for n in ast.walk(ast.parse(written)) if isinstance(n, ast.Call)
             and ast.unparse(n.func) == "p.add_argument"]
    assert ast.literal_eval(calls[0].keywords[0].value) == choices_help("C.", auto="on CUDA.", r=long_note)
    assert max(map(len, written.splitlines())) <= WIDTH < max(map(len, source.splitlines()))
    assert ast.unparse(calls[1].keywords[0].value) == "choices_help('D.', **k)"


def test_a_registry_entry_sharing_a_line_is_refused_naming_the_rule():
    """Pruning cuts whole lines: an entry that shares one with `(`, `)` or another entry would take them along."""
    from speedrun.export import prune_registry
    source = 'TRACK_FLAGS = (\n    Flag("--a"),\n    Flag("--b"),\n)\n'
    assert prune_registry(source, "TRACK_FLAGS", [True, False], "t.py").count("Flag(") == 1
    for shared in ('TRACK_FLAGS = (Flag("--a"),\n    Flag("--b"))\n',
                   'TRACK_FLAGS = (\n    Flag("--a"), Flag("--b"),\n)\n'):
        with pytest.raises(UsageError, match="must stand on lines of its own"):
            prune_registry(shared, "TRACK_FLAGS", [True, False], "t.py")


def test_a_pruned_registry_of_names_is_one_line_under_the_file_s_note():
    """The record's `STUDIES = (\n    BACKOUT,\n)` under the modular layout's comment read as the modular registry:
    one line under the note of what the file holds; entries with comments or calls keep their lines."""
    from speedrun.export import prune_registry
    source = "# One entry a line: how to add one.\nSTUDIES = (\n    A,\n    B,\n    C,\n)\nprint(STUDIES)\n"
    one = prune_registry(source, "STUDIES", [True, False, False], "s.py")
    assert one == ("# In this file: the studies its run uses; the others of s.py are left out.\n"
                   "STUDIES = (A,)\nprint(STUDIES)\n")
    assert "STUDIES = (A, C)\n" in prune_registry(source, "STUDIES", [True, False, True], "s.py")
    assert "STUDIES = ()\n" in prune_registry(source, "STUDIES", [False] * 3, "s.py")
    commented = source.replace("    B,\n", "    # B's own\n    B,\n")
    kept = prune_registry(commented, "STUDIES", [True, True, False], "s.py")
    assert "STUDIES = (\n    A,\n    # B's own\n    B,\n)\n" in kept and "One entry" not in kept
    calls = 'TRACK_FLAGS = (\n    Flag("--a"),\n    Flag("--b"),\n)\n'
    assert prune_registry(calls, "TRACK_FLAGS", [True, False], "t.py").endswith('= (\n    Flag("--a"),\n)\n')


def test_a_study_file_parses_its_fixed_flags_but_does_not_offer_them(tmp_path):
    """The file refuses its study's flags and its fixed ones on its command line (one arm): its --help listed them
    all (the backout group, every mode and transform), as if it ran them."""
    out = tmp_path / "exported.py"
    out.write_text(export(tmp_path, T, "--backout-layers", "4", "--variant", "b4"))
    help_text = run_file(out, "--help").stdout
    assert "--backout" not in help_text and "--variant" not in help_text and "--seed" in help_text
    headings = [line for line in help_text.splitlines() if line.endswith(":") and not line.startswith(" ")]
    assert headings == ["options:", "run:", "checkpoints:"]
    result = run_file(out, "--backout-mode", "concat-head")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "unrecognized arguments: --backout-mode concat-head" in result.stderr  # no flag of the file (rule 16)
    result = run_file(out, "--variant", "b5")
    assert result.returncode == 2 and "--variant: this file runs one arm" in result.stderr


# ----- stop 45 (h-residue45): residue the backout record kept --------------------------------------------------------

def test_an_unread_local_of_names_and_attributes_goes_until_none_is_left():
    """`D, k = cfg.model_dim, 1` is no constant yet reads nothing the run needs; a dropped `a = t` leaves `t` unread."""
    from speedrun.export import drop_dead_constants
    source = ("def f(cfg, x):\n    D, k = cfg.model_dim, 1\n    t = cfg.mode\n    a = t\n"
              "    kept, gone = cfg.width, None\n    y = g(x)\n    return kept + x\n")
    assert drop_dead_constants(source) == ("def f(cfg, x):\n    kept, gone = cfg.width, None\n    y = g(x)\n"
                                           "    return kept + x\n")  # a call stays: it may act; one item read: too


def test_a_decided_string_partitioned_into_names_folds_their_tests():
    """`t = cfg.mode` decided, `a, _, b = t.partition("-")`: each name is read as its part, so `if b:` folds and the
    partition line and `t` are left unread."""
    from speedrun.export import drop_dead_constants, fold_constants
    source = ('def f(cfg, x):\n    t = cfg.mode\n    act, _, linear = t.partition("-")\n    x = ACT.get(act, I)(x)\n'
              '    if linear:\n        x = lin(x)\n    return x, t.upper()\n')
    text, _ = fold_constants(source, {".mode": "relu"})
    assert drop_dead_constants(text) == ("def f(cfg, x):\n    t = 'relu'\n    x = ACT.get('relu', I)(x)\n"
                                         "    return x, t.upper()\n")  # another method of t: t stays read
    assert "lin(x)" in fold_constants(source, {".mode": "relu-linear"})[0]
    unknown = fold_constants(source, {})[0]
    assert unknown == source  # undecided: nothing moves



MIXES = '''def mix(mode, x, y, scale=2):
    if mode == "sub":
        return x - y
    return (x + y) * scale


def label(x, what):
    return f"{what}{x}"


def pick(on, x):
    return x if on else -x


def width(n):
    return n.bit_length()
'''


def test_a_parameter_every_call_passes_one_decided_scalar_is_read_as_it(tmp_path, monkeypatch):
    """`mix(cfg.mode, ...)` at every call, cfg.mode decided: `mode` is read as its value, so the branch the run
    never takes goes, and it leaves the signature and the calls. A literal the source passes (`label(x, "L")`), a
    default some call leaves as it is (`scale`) and a value that differs between calls (`pick`) stay."""
    script = ("from speedrun.lib import mix, label, pick, width\n\n\ndef run(cfg, x):\n"
              "    return mix(cfg.mode, x, x), mix(cfg.mode, x, 1, scale=cfg.mode == 'add'), label(x, 'L'), "
              "pick(cfg.a, x), pick(cfg.b, x), width(cfg.n)\n\n\nif __name__ == '__main__':\n    run(None, 1)\n")
    folds = {".mode": "add", ".a": True, ".b": False, ".n": 5}
    text = exported_program(tmp_path, monkeypatch, MIXES, script, folds)
    assert "def mix(x, y, scale=2):\n    return (x + y) * scale\n" in text
    assert "return mix(x, x), mix(x, 1, scale=cfg.mode == 'add'), label(x, 'L'), pick(cfg.a, x), pick(cfg.b, x)" \
        in text
    assert "def label(x, what):" in text and "def pick(on, x):" in text
    assert "def width():\n    return (5).bit_length()" in text  # `5.bit_length()` would not parse
    # a function that reads the flags as parsed (PARSED_READERS) is not folded with the studies' fields
    from speedrun.export import PARSED_READERS
    (tmp_path / "parsed").mkdir()
    text = exported_program(tmp_path / "parsed", monkeypatch, MIXES, script,
                            {**folds, PARSED_READERS: (("script", "run"),)})
    assert "def mix(mode, x, y, scale=2):" in text and "mix(cfg.mode, x, x)" in text


PARTS = '''class Part:
    def __init__(self, cfg):
        self.reserve(cfg.mode, 3)
        self.named(cfg.mode)
        getattr(self, "named")(cfg.mode)

    def reserve(self, mode, n):
        self.mode = mode
        if mode == "sum":
            self.n = n

    def named(self, mode):
        self.label = mode
'''


def test_a_method_every_self_call_passes_one_decided_scalar_reads_it(tmp_path, monkeypatch):
    """A method of one class reached only by `self.reserve(cfg.mode, ...)` calls reads the decided mode as its
    literal and loses it from its signature and calls; one a string also names (getattr) keeps it."""
    script = "from speedrun.lib import Part\n\n\nif __name__ == '__main__':\n    Part(None)\n"
    text = exported_program(tmp_path, monkeypatch, PARTS, script, {".mode": "sum"})
    assert "self.reserve(3)" in text and "def reserve(self, n):\n        self.mode = 'sum'\n        self.n = n" in text
    assert "def named(self, mode):" in text and "self.named(cfg.mode)" in text


# ----- stop 46: the record file's study declaration keeps what the file reads ----------------------------------------

DECLARED = '''from dataclasses import dataclass


@dataclass(frozen=True)
class Study:
    name: str
    title: str = ""  # the --help group's title
    # A comment about the field below goes with it.
    excludes: tuple = ()
    kept: int = 0
    model_part: type | None = None

    def __post_init__(self):
        object.__setattr__(self, "title", self.title or self.name)


def title(parser, description):  # a name or another call's keyword reads no field
    return parser.add(description=description, title=title)


BACKOUT = Study(name="backout", title="backout (docs)", excludes=("--x",),
                kept=3, model_part=None)
print(BACKOUT.kept, BACKOUT.model_part)
'''


def test_a_field_of_the_study_declarations_that_nothing_reads_goes_with_its_keywords_and_setter():
    from speedrun.export import without_unread_study_fields
    text = without_unread_study_fields(DECLARED)
    study = text.split("def title")[0]
    assert "title" not in study and "excludes" not in study and "A comment" not in study  # declared, set, commented
    assert "__post_init__" not in study  # it set only the title
    assert "kept: int = 0" in study and "model_part: type | None = None" in study
    assert "name: str" not in study  # read only where the title was set
    assert "BACKOUT = Study(kept=3, model_part=None)" in text
    exec(compile(text, "declared", "exec"), {"__name__": "declared"})  # still a program


@pytest.mark.parametrize("reader", ["print(BACKOUT.excludes)", "print(getattr(BACKOUT, 'excludes'))",
                                    "print(replace(BACKOUT, excludes=()))"])
def test_a_field_read_anywhere_stays(reader):
    from speedrun.export import without_unread_study_fields
    text = without_unread_study_fields(DECLARED + reader + "\n")
    assert "excludes: tuple = ()" in text and 'excludes=("--x",)' in text and "title" not in text.split("def ")[0]


def test_an_attribute_of_a_library_classs_instance_reads_no_field():
    """`Path(script_path).resolve()` kept the record's Study.resolve; a call of a function (replace() may return a
    Study) still reads."""
    from speedrun.export import without_unread_study_fields
    text = without_unread_study_fields("from pathlib import Path\n" + DECLARED + "print(Path('.').excludes)\n")
    assert "excludes: tuple" not in text and "Path('.').excludes" in text
    kept = without_unread_study_fields(DECLARED + "def made():\n    return BACKOUT\n\nprint(made().excludes)\n")
    assert "excludes: tuple = ()" in kept


def test_a_declaration_passing_keywords_as_a_dict_or_positions_keeps_the_fields_it_may_pass():
    from speedrun.export import without_unread_study_fields
    given = DECLARED + 'OTHER = Study(**{"name": "x"})\n'
    assert without_unread_study_fields(given) == given
    positional = without_unread_study_fields(DECLARED + 'OTHER = Study("x", "t", ("--y",))\n')
    assert "title: str" in positional and "excludes: tuple" in positional  # passed by position


SHADOWED = '''class Base:
    flag = False

    def answered(self):
        return None

    def asked_of_super(self):
        return 1

    def fallback(self):
        return 0


class Part(Base):
    def answered(self):
        return 2

    def asked_of_super(self):
        return super().asked_of_super() + 1


class Other(Base):
    def answered(self):
        return 3

    def fallback(self):
        return 4


print([(p.answered(), p.fallback(), p.flag) for p in (Part(), Other())], Part().asked_of_super())
'''


def test_a_method_every_subclass_defines_of_a_class_named_only_as_a_base_goes():
    """ModelPart's head_input and named_scalars, which backout (the record's one part) defines: no instance runs them.
    One that a subclass leaves to it, or calls through super(), stays; so do all where the class is named otherwise."""
    from speedrun.export import without_shadowed_methods
    text = without_shadowed_methods(SHADOWED)
    base = text.split("class Part")[0]
    assert "def answered" not in base and "def asked_of_super" in base and "def fallback" in base
    assert "flag = False" in base and text.count("def answered") == 2
    outputs = []
    for source in (SHADOWED, text):
        printed = []
        exec(compile(source, "shadowed", "exec"), {"print": lambda *a: printed.append(a)})
        outputs.append(printed)
    assert outputs[0] == outputs[1]
    named = SHADOWED + "print(isinstance(Part(), Base))\n"
    assert without_shadowed_methods(named) == named


UNASKED = '''class Base:
    def head_input(self, x):
        return x

    def named(self):
        return {}


class Part(Base):
    def named(self):
        return {"a": 1}


class Model:
    def head_input(self, x):
        return x * 2

    def forward(self, x):
        return self.head_input(x) + 1


class Mixed(Model):
    def run(self, x):
        return self.head_input(x)


print(Model().forward(3), Mixed().run(4), Part().named())
'''


def test_rule_18_a_method_of_a_base_that_nothing_asks_of_its_subclasses_goes():
    """The LAuReL file kept ModelPart's head_input (no part answers it, the model calls its own `self.head_input`):
    every read is `self.head_input` in a class outside the base's family (Mixed inherits Model's), so no part is
    asked. A subclass of the base among that class's subclasses, or a string of the name, keeps it."""
    from speedrun.export import without_shadowed_methods
    text = without_shadowed_methods(UNASKED)
    assert "class Base" not in text and "class Part:" in text and text.count("def head_input") == 1
    assert run_printed(text) == run_printed(UNASKED) == [(7, 8, {"a": 1})]
    kept = "class Base:\n    def head_input(self, x):\n        return x\n"
    joined = UNASKED.replace("class Mixed(Model):", "class Mixed(Model, Base):")  # a Base whose self is a Mixed
    named = UNASKED + "print(getattr(Part(), 'head_input')(5))\n"
    for source in (joined, named):
        text = without_shadowed_methods(source)
        assert text.startswith(kept) and run_printed(text) == run_printed(source)
    # a name a library calls unread (nn.Module's __call__ runs `forward`): the export lost GPT's base's forward
    library = UNASKED.replace("class Part(Base):", "    def forward(self, x):\n        return x\n\n\nclass Part(Base):")
    assert "def forward(self, x):" in without_shadowed_methods(library).split("class Part")[0]


def test_rule_18_drops_a_class_attribute_every_subclass_sets_and_an_emptied_base_leaves_the_bases():
    """R18Backout sets replaces_base_head_input, so ModelPart's is never read; ModelPart, then `pass`, goes, and its
    subclasses derive from nn.Module in its place (not twice where they list it already)."""
    from speedrun.export import without_shadowed_methods
    source = ("class Root:\n    def who(self):\n        return 'root'\n\n"
              "class Base(Root):\n    flag = False\n\n    def hook(self):\n        return None\n\n"
              "class Mixin:\n    def mixed(self):\n        return 'mixin'\n\n"
              "class Part(Mixin, Base):\n    flag = True\n\n    def hook(self):\n        return 1\n\n"
              "class Plain(Base, Root):\n    flag = 2\n\n    def hook(self):\n        return 2\n\n"
              "print([(type(p).__mro__[1:], p.flag, p.hook(), p.who()) for p in (Part(), Plain())], Part().mixed())\n")
    text = without_shadowed_methods(source)
    assert "class Base" not in text and "class Part(Mixin, Root):" in text and "class Plain(Root):" in text
    printed = []
    for code in (source, text):
        names = {"print": lambda *a: printed.append([(tuple(c.__name__ for c in mro if c.__name__ != "Base"), *rest)
                                                     for mro, *rest in a[0]] + [a[1]])}
        exec(compile(code, "bases", "exec"), names)
    assert printed[0] == printed[1]
    named = source + "print(issubclass(Part, Base))\n"  # read otherwise: the class and its members stay
    assert without_shadowed_methods(named) == named


PART_MEMBERS = '''
def build(studies, cfg, track_pattern, n):
    ordered = sorted([study for study in studies if study.on(cfg)],
                     key=lambda study: study.model_part.built_last)
    own = [pattern for pattern in (study.model_part.model_layer_pattern(cfg, track_pattern)
                                   for study in ordered) if pattern is not None]
    pattern = own[0] if own else track_pattern(n)
    grown = {study.name: study.model_part.base_config(cfg) for study in ordered
             if study.model_part.base_config(cfg) is not None}
    counts = {}
    for name, base in grown.items():
        counts[name] = base
    if n > 1 and not grown:
        counts["layers"] = n
    return [study.name for study in ordered], pattern, counts
'''


def test_members_only_a_part_has_fold_by_any_receiver_with_the_sort_the_filters_and_the_tests_on_them():
    """What the model asks every part class before its parts exist (built_last, model_layer_pattern, base_config),
    where the file's parts leave them as ModelPart does: the sort, the comprehension, the loop and the test go, and the
    folded function returns what the source does for parts that answer the defaults."""
    from speedrun.export import (PART_OWNED_MEMBERS, PASSIVE_MEMBERS, drop_dead_constants, fold_constants,
                                 part_owned_members, passive_members)
    from speedrun.study import ModelPart
    owned = dict(part_owned_members(passive_members([], False)))
    assert owned == {"built_last": ("flag", "False"), "model_layer_pattern": ("returns", "None"),
                     "base_config": ("returns", "None"), "load_init_state": ("returns", "False"),
                     "before_step": ("returns", "None"), "after_step": ("returns", "None")}
    text = drop_dead_constants(fold_constants(PART_MEMBERS, {PART_OWNED_MEMBERS: tuple(owned.items())})[0])
    body = text.split("def build")[1]
    assert "ordered = [study for study in studies if study.on(cfg)]\n" in body  # the sort went, the list stays
    assert "pattern = track_pattern(n)" in body and "own" not in body and "grown" not in body
    assert "if n > 1:" in body and "for name" not in body

    class Part(ModelPart):
        pass

    class On:
        model_part, name = Part, "on"

        def on(self, cfg):
            return True

    results = []
    for code in (PART_MEMBERS, text):
        names = {}
        exec(compile(code, "members", "exec"), names)
        results.append(names["build"]([On(), On()], None, lambda n: f"track{n}", 3))
    assert results[0] == results[1] == (["on", "on"], "track3", {"layers": 3})


@pytest.mark.parametrize("other", ["class Track:\n    def model_layer_pattern(self):\n        return 1\n",
                                   "def f(x):\n    x.model_layer_pattern = None\n",
                                   "def f(x):\n    return getattr(x, 'model_layer_pattern')\n"])
def test_a_member_another_class_defines_sets_or_reads_by_name_is_not_a_parts_alone(other, tmp_path, monkeypatch):
    import speedrun.export as export
    extra = tmp_path / "other.py"
    extra.write_text(other)
    sources = export.project_sources()
    monkeypatch.setattr(export, "project_sources", lambda: sources + [extra])
    owned = dict(export.part_owned_members(export.passive_members([], False)))
    assert "model_layer_pattern" not in owned and "built_last" in owned


def test_an_empty_local_read_in_the_body_of_a_test_on_it_folds_with_that_body():
    """R18GPT's `parts = []` (what rule 19 leaves of its unpacking): `if parts:` never runs, so what its body does with
    the list does not count; a read outside it still does."""
    from speedrun.export import without_empty_locals
    source = ("def f(build):\n    parts = []\n    if parts:\n        build(parts)\n        print(parts)\n"
              "    return 1\n")
    assert without_empty_locals(source) == "def f(build):\n    parts = []\n    return 1\n"  # rule 24 cuts the rest
    for outside in ("    build(parts)\n", "    if not parts:\n        build(parts)\n"):
        kept = source.replace("    return 1\n", outside + "    return 1\n")
        assert "if parts:" in without_empty_locals(kept)


def test_an_empty_local_folds_only_where_nothing_can_fill_it():
    """`own = []` read in a test folds; one passed to a call (which may append to it) is left as it is."""
    from speedrun.export import fold_constants, drop_dead_constants
    source = ("def f(a, fill):\n    seen = []\n    kept = {}\n    fill(kept)\n"
              "    for k in kept.items():\n        a += 1\n"
              "    if a and not seen:\n        return seen[0] if seen else a\n"
              "    return kept or a\n")
    text = drop_dead_constants(fold_constants(source, {})[0])
    assert "seen" not in text and "if a:\n        return a\n" in text
    assert "kept = {}" in text and "for k in kept.items()" in text and "return kept or a" in text


@pytest.mark.parametrize("reader", ["print(asdict(BACKOUT))", "print([f.name for f in fields(Study)])"])
def test_a_program_reading_every_field_of_a_declaration_keeps_them_all(reader):
    from speedrun.export import without_unread_study_fields
    given = DECLARED + reader + "\n"
    assert without_unread_study_fields(given) == given


def test_a_block_whose_every_statement_goes_keeps_one_pass():
    """Two statements of one block cut together left it empty (a file that does not compile); one alone did not."""
    import ast as ast_module
    from speedrun.export import without_statements
    source = "class Base:\n    def a(self):\n        return 1\n\n    def b(self):\n        return 2\n\n\nx = 1\ny = 2\n"
    tree = ast_module.parse(source)
    base = tree.body[0]
    text = without_statements(source, tree, [*base.body, tree.body[2]])
    assert text.startswith("class Base:\n    pass\n") and "def " not in text and "y = 2" not in text
    compile(text, "cut", "exec")


ATTRIBUTES = '''class Lambdas:
    def reserve(self):
        self.mode = 'sum'

    def lambdas(self, scale):
        x = None
        if self.mode == "sum":
            x = self.x_lambda if hasattr(self, "x_lambda") else scale * 2
        return x, self.mode


part = Lambdas()
part.reserve()
print(part.lambdas(3))
'''


def run_printed(source):
    printed = []
    exec(compile(source, "printed", "exec"), {"print": lambda *a: printed.append(a)})
    return printed


def test_rule_19_an_attribute_set_to_one_literal_and_a_hasattr_of_one_never_set_fold():
    """The record's `self.mode = 'sum'` and the frozen lambdas' buffer tests: the branch runs unconditionally, the
    dead `x = None` goes, and the program prints the same."""
    from speedrun.export import without_constant_attributes
    text = without_constant_attributes(ATTRIBUTES)
    assert "self.mode =" not in text and "hasattr" not in text and "x = None" not in text
    assert "    def lambdas(self, scale):\n        x = scale * 2\n        return x, 'sum'\n" in text
    assert run_printed(text) == run_printed(ATTRIBUTES) == [((6, "sum"),)]


def test_rule_19_an_attribute_set_to_one_tuple_of_constants_folds_and_its_loop_of_one_item_is_written_out():
    """R18Backout's `self.sources = (11,)` (rule 13 on `tuple(cfg.backout_layers)`): its tests fold, the
    comprehension over it is its one element (rule 25), and the program prints the same."""
    from speedrun.export import without_constant_attributes
    source = ("class Part:\n    def __init__(self):\n        self.sources = (3,)\n\n"
              "    def mixed(self, outputs):\n        if not self.sources:\n            return outputs\n"
              "        return [outputs[s] if s != 'embed' else None for s in self.sources], len(self.sources)\n\n\n"
              "print(Part().mixed([0, 1, 2, 3, 4]))\n")
    text = without_constant_attributes(source)
    assert "self.sources" not in text and "return [outputs[3]], len((3,))" in text
    assert run_printed(text) == run_printed(source) == [(([3], 1),)]
    two = source.replace("(3,)", "(3, 1)")  # two items: the comprehension stays
    assert "for s in (3, 1)]" in without_constant_attributes(two)


DECIDED = """def mixed(a, b, c):
    x = False and a.missing
    z = True and (b or c) and (a if b else c)
    w = False or a
    v = c or True and (a or b)
    if a:
        return 1
        print("never")
    for i in (a, b):
        if i:
            continue
            print("never")
    return x, z, w, v
    print("never")


def generator():
    return
    yield 1


def local_read():
    return [seen for seen in ("no", "yes")]
    seen = 1


def rebound(raw):
    w = raw * 2
    return w + 1
    w = raw * 3


def only_dead_bindings():
    return [w for w in (7,)]
    w = 1
    w = 2


print(mixed(0, 2, 0), mixed(3, 0, 0), list(generator()), local_read(), rebound(1), only_dead_bindings())
"""


def test_rule_26_what_folding_leaves_decided_goes():
    """LAuReL's file: `return sum_in_order(g, parts)` after the return `if self.uses_rw:` left unconditional, and
    `self.product_per_input = False and ...`. A yield after a return (a generator) and a binding of a name read
    elsewhere stay, unless the block binds the name before its end (LAuReL's `w = scale * torch.sigmoid(raw)` after
    `return w[:, 0], w[:, 1]`); the program prints the same."""
    from speedrun.export import to_fixed_point, without_decided_residue
    text = to_fixed_point(without_decided_residue, DECIDED)
    assert text.count('print("never")') == 0 and "x = False\n" in text and "w = a\n" in text
    assert "z = (b or c) and (a if b else c)\n" in text and "v = c or (a or b)\n" in text
    assert "    yield 1\n" in text and "    seen = 1\n" in text
    assert "raw * 3" not in text and "    w = 1\n    w = 2\n" in text  # bound before the end; bound by dead ones only
    assert run_printed(text) == run_printed(DECIDED) == [((False, 0, 0, 2), 1, [], ["no", "yes"], 3, [7])]


def test_rule_19_an_unpacking_of_literals_folds_its_attributes_and_keeps_its_other_items():
    """LAuReL's `self.rw, self.lr, self.pa, self.pa_lowrank = (True, True, False, False)` (rule 24's value): each
    attribute is its literal, its tests fold; an item that is no literal (or an attribute stored elsewhere too)
    stays in an unpacking of the rest, and the program prints the same."""
    from speedrun.export import without_constant_attributes
    source = ("class Part:\n    def __init__(self, k):\n        self.uses_pa, self.k, self.dim = (False, k, 4)\n"
              "        self.uses_rw, self.uses_lr = True, False\n\n"
              "    def forward(self, x):\n        if self.uses_pa:\n            x = x * self.k\n"
              "        if self.uses_rw:\n            x = x + self.dim\n"
              "        return x if not self.uses_lr else -x\n\n\n"
              "print(Part(3).forward(1))\n")
    text = without_constant_attributes(source)
    assert "        self.k = k\n" in text and "uses_" not in text and "self.dim" not in text
    assert "    def forward(self, x):\n        x = x + 4\n        return x\n" in text
    assert run_printed(text) == run_printed(source) == [(5,)]
    elsewhere = source.replace("print(", "class Other:\n    def reset(self):\n        self.uses_pa = True\n\n\nprint(")
    folded = without_constant_attributes(elsewhere)
    assert "self.uses_pa, self.k = False, k" in folded and "if self.uses_pa:" in folded
    starred = source.replace("self.uses_rw, self.uses_lr = True, False", "self.uses_rw, *rest = True, False")
    assert "if self.uses_rw:" in without_constant_attributes(starred)


@pytest.mark.parametrize("extra, kept", [
    ("setattr(part, input() if False else 'mode', 'x')\n", "every"),  # a name computed: nothing folds
    ("part.register_buffer('x_lambda', None) if False else None\n", "hasattr"),  # set by name
    ("other = Lambdas()\nother.mode = 'sum'\n", "self.mode ="),  # stored by another receiver
    ("class Later:\n    def reset(self):\n        self.mode = 'subtract'\n", "self.mode ="),  # two literals
    ("class Flagged:\n    mode = 'sum'\n", "self.mode ="),  # a class member of that name
    ("print(vars(self) if False else None)\n", "every"),  # the attributes reached wholesale
    ("print('mode')\n", "self.mode ="),  # the name as a string: getattr may read it
])
def test_rule_19_keeps_what_another_statement_could_set(extra, kept):
    from speedrun.export import without_constant_attributes
    source = ATTRIBUTES + extra
    text = without_constant_attributes(source)
    if kept == "every":
        assert text == source
    else:
        assert kept in text


NESTED = '''def outer(scale):
    def inner(a):
        x = None
        x = a + 1
        return x
    y = 2
    z = 3
    return inner(y) * z + scale


print(outer(4))
'''


def test_a_nested_function_is_folded_once():
    """Every function's blocks are its own: the `x = None` of a function inside another goes once, not once for
    each function around it (twice took its next statement with it and the program failed)."""
    from speedrun.export import without_overwritten_locals, without_single_use_aliases
    text = without_overwritten_locals(NESTED)
    assert "    def inner(a):\n        x = a + 1\n        return x\n" in text
    assert run_printed(text) == run_printed(NESTED) == [(13,)]
    closure = "def f():\n    x = None\n    read = lambda: x\n    x = read()\n    return x\n\n\nprint(f())\n"
    declared = "def g():\n    global y\n    y = 1\n    y = h()\n\n\ndef h():\n    return y\n\n\ng()\nprint(y)\n"
    # the lambda, written before the pair, reads the first value when the second calls it
    read_first = "def k():\n    read = lambda: x\n    x = None\n    x = read()\n    return x\n\n\nprint(k())\n"
    for kept in (closure, declared, read_first):  # the second value reads the first through a lambda or the global
        assert without_overwritten_locals(kept) == kept
        assert run_printed(kept) == ([(1,)] if kept is declared else [(None,)])
    aliased = without_single_use_aliases(text)
    assert "    def inner(a):\n        return a + 1\n" in aliased
    assert run_printed(aliased) == [(13,)]


def test_rule_19_keeps_a_torch_module_attribute():
    """`self.training` is set by Module.train() where the file shows no store of it."""
    from speedrun.export import without_constant_attributes
    source = ("class M:\n    def f(self):\n        self.training = False\n\n"
              "    def g(self):\n        return self.training\n")
    assert without_constant_attributes(source) == source


ALIASES = '''def named(self, model):
    cfg = self.cfg
    out = self.scalars(model, cfg.layers)
    return out


def mixed(self, outputs):
    cfg = self.cfg
    vectors = []
    for name in cfg.layers:
        moved = outputs[name]
        normed = moved * 2
        vectors.append(normed)
    return vectors


def looped(self, items):
    scale = self.scale
    for item in items:
        self.scale = item
        print(scale)


def twice(self):
    cfg = self.cfg
    return cfg.a + cfg.b


def called(self):
    cfg = self.cfg
    self.reset()
    return cfg.a
'''


def test_rule_20_a_local_read_once_is_written_in_its_read():
    from speedrun.export import without_single_use_aliases
    text = without_single_use_aliases(ALIASES)
    assert "def named(self, model):\n    return self.scalars(model, self.cfg.layers)\n" in text
    assert "    vectors = []\n    for name in self.cfg.layers:\n" in text  # past an assignment that evaluates nothing
    assert "normed = outputs[name] * 2" in text  # an item moves into the next statement, which reads it first
    assert "vectors.append(normed)" in text  # a product needs brackets of its own: it stays a local
    assert "    scale = self.scale\n    for item in items:" in text  # read in a loop's body: each pass would re-read
    assert "cfg.a + cfg.b" in text  # read twice
    assert "    cfg = self.cfg\n    self.reset()\n    return cfg.a" in text  # a call between could change it


MOVED_VALUES = """import math


def norm(x):
    return [v / math.hypot(*x) for v in x]


def mixed(outputs):
    vectors = []
    source = outputs[1]
    moved = norm(source)
    vectors.append(moved)
    return vectors


def stays(outputs, flag, log):
    a = norm(outputs[0])
    first = a if flag else None
    b = norm(outputs[1])
    second = log.append(0) or b
    c = outputs[0][0] + outputs[1][0]
    third = c * 2
    d = norm(outputs[1])  # the first source: its comment stays
    sixth = [d]
    # the second: so does this one
    e = norm(outputs[0])
    seventh = [e]
    f = len(log)
    log.append(f)
    g = outputs[1][0]
    fourth = 0 < g < 10
    h = norm(outputs[0])
    fifth = [log.pop(), h]
    return first, second, third, fourth, fifth, sixth, seventh


def sites(n, log):
    chosen = range(n)
    first = [(i, "mlp") for i in chosen]
    count = len(first)
    after = [count, log.pop()]
    inner = range(2)
    pairs = [(i, j) for i in range(n) for j in inner]
    last = len(log)
    scaled = [i * last for i in log]
    slot = len(pairs)
    log[slot % 3] = 7
    kind = type(log)
    made = kind(log)
    return first, after, pairs, scaled, log, made


def grown(log):
    out = [len(log)]
    out.append(log)
    seen = []
    seen.append(len(seen))
    late = []
    late.append(1)
    return out, seen, late, (lambda: late)()


print(mixed([[3.0, 4.0], [6.0, 8.0]]), stays([[3.0, 4.0], [6.0, 8.0]], True, [5]), grown([1]),
      sites(3, [4, 5, 6]))
"""


def test_rule_20_a_value_moves_into_the_next_statement_that_reads_it_first():
    """A call or an item read once, first, in the next statement is written there; a list built by one append is
    its display. Not where it would be evaluated conditionally, after another call, in a comprehension's later
    sequence or element, in an assignment's target or as what a call calls, or needs brackets, nor where a comment
    of its own would go, nor an append of an item that reads the list (or a lambda that can)."""
    from speedrun.export import without_single_use_aliases
    text = without_single_use_aliases(MOVED_VALUES)
    assert "def mixed(outputs):\n    return [norm(outputs[1])]\n" in text
    assert "    log.append(len(log))\n" in text  # the method is read before the call, as it was
    assert "first = [(i, 'mlp') for i in range(n)]" in text.replace('"', "'")  # a comprehension's first sequence
    assert "after = [len(first), log.pop()]" in text  # a call evaluated after it sees it done, as it did
    for kept in ("inner = range(2)", "last = len(log)", "slot = len(pairs)", "kind = type(log)"):
        assert kept in text, kept
    for kept in ("a = norm(outputs[0])", "b = norm(outputs[1])", "third = c * 2", "its comment stays",
                 "# the second: so does this one\n    e = norm(outputs[0])", "fourth = 0 < g < 10",
                 "h = norm(outputs[0])", "out = [len(log), log]", "seen = []\n    seen.append(len(seen))",
                 "late = []\n    late.append(1)"):
        assert kept in text, kept
    assert run_printed(text) == run_printed(MOVED_VALUES)


def test_rule_20_a_moved_value_keeps_the_line_width():
    from speedrun.export import WIDTH, without_single_use_aliases
    def program(count):
        call = "f(" + "x, " * count + "x)"
        return f"def f(*a):\n    return a\n\n\ndef g(x):\n    value = {call}\n    return len(value), '{'p' * 40}'\n"
    short, wide = program(3), program(30)
    assert max(map(len, wide.split("\n"))) <= WIDTH
    assert without_single_use_aliases(short).count("\n") == short.count("\n") - 1  # moved: a line fewer
    assert without_single_use_aliases(wide) == wide  # it would not fit


STRING_LOCALS = """def named(sites, values):
    suffix = ""
    tag = '.m'
    late = "x"
    both = "y"
    spec = "z"
    out = {}
    for n, site in enumerate(sites):
        out[f"{site}.alpha{suffix}"], out[f'{site}.beta{tag}{{}}'] = values[n], f"{suffix}"
        out[f"{site}.{spec:>3}"], out[both] = f"{both}", len(late)
    suffix = "twice"
    return out, f"{late}"


def spaced(sites):
    label = "s"
    return [f"{label}{site}" for site in sites], locals()


print(named(["a", "b"], [1, 2]), spaced(["c"])[0])
"""


def test_rule_20_a_string_local_read_only_in_f_strings_is_their_text():
    """LAuReL's `suffix = ""` of its other RW forms, read in `f"{key}.alpha{suffix}"`: the f-strings hold its text and
    it goes; not one stored twice, read otherwise (a format spec, a plain read), or in a function reading locals();
    the program prints the same."""
    from speedrun.export import without_string_locals
    text = without_string_locals(STRING_LOCALS)
    assert "tag =" not in text and "out[f\"{site}.beta.m{{}}\"]" in text
    assert 'suffix = ""' in text and 'out[f"{site}.alpha{suffix}"]' in text  # stored twice
    assert all(f"{name} = " in text for name in ("late", "both", "spec", "label"))
    assert run_printed(text) == run_printed(STRING_LOCALS)
    once = STRING_LOCALS.replace('    suffix = "twice"\n', "")
    folded = without_string_locals(once)
    assert "suffix" not in folded and 'out[f"{site}.alpha"], ' in folded and '= values[n], ""\n' in folded
    assert run_printed(folded) == run_printed(once)


def test_a_definition_the_final_rules_left_unread_goes_and_an_emptied_section_with_it():
    """`backout_on_r18` was read only by the declaration's on_r18= (cut by rule 17); a section header stays over
    the code left in its section and goes with the last of it."""
    from speedrun.export import without_unread_definitions
    header = "# speedrun/{}.py ".format
    source = ("from __future__ import annotations\nimport math\nimport torch.nn as nn\nfrom itertools import "
              "accumulate, chain\nfrom functools import cache\nfrom os.path import *\n"
              "FIXED_FLAGS = ()\n\n" + header("a").ljust(120, "-") + "\n# what MODES are\nMODES = ('sum',)\n\n"
              "def check(config):\n    return config.mode in MODES\n\nKEPT = 1\n\n"
              + header("b").ljust(120, "-") + "\ndef unused():\n    return KEPT\n\n"
              "# speedrun/c.py: the c study, switched on in this file\ndef named():\n    return 2\n\n"
              "def used():\n    return globals()['named']() + KEPT + len(list(chain(nn.__name__)))\n\nprint(used())\n")
    text = without_unread_definitions(source)
    assert "MODES" not in text and "check" not in text and "what MODES" not in text
    assert header("a") in text and "KEPT = 1" in text  # its section keeps a statement
    assert header("b") not in text and "def unused" not in text  # its one statement went
    assert "# speedrun/c.py: the c study" in text and "def named" in text  # a string of its name reads it
    assert "FIXED_FLAGS = ()" in text  # the file's own constants are the exporter's to write
    # an import nothing reads goes, one that binds several names keeps those read; __future__ and * imports stay
    assert "import math" not in text and "from functools import cache" not in text
    assert "\nimport torch.nn as nn\nfrom itertools import chain\n" in text
    assert text.startswith("from __future__ import annotations\n") and "from os.path import *" in text
    exec(compile(text, "unread", "exec"), {"print": lambda *a: None})  # still runs


MEMBERS = '''import argparse
import torch.nn as nn

class Host:
    parts = ()
    named_by_string = 1
    sized = 2
    width = sized * 2

    def build_parts(self):
        return 1

    @staticmethod
    def helper():
        return 2

    @property
    def shown(self):
        return 3

    def forward(self, x):
        return x

class Model(Host, nn.Module):
    def run(self):
        return getattr(self, "named_by_string") + self.shown

class Formatter(argparse.HelpFormatter):
    def _format_usage(self, *args):
        return ""

print((Model().run(), Formatter.__name__))
'''


def test_a_member_the_final_rules_left_unnamed_goes():
    """A method or class attribute nothing in the file names (by attribute, string or in a class body) goes where
    nothing outside the file can ask it by name: not a name torch's Module has, not a member of a class with a
    library base other than Module, and nowhere the file lists members or asks one by a name it builds."""
    from speedrun.export import unnamed_members, without_unread_definitions
    gone = {getattr(m, "name", None) or ast.unparse(m.targets[0]) for m in unnamed_members(ast.parse(MEMBERS))}
    assert gone == {"parts", "width", "build_parts", "helper"}
    text = without_unread_definitions(MEMBERS)
    assert "parts = ()" not in text and "def build_parts" not in text and "def helper" not in text
    assert "sized = 2" not in text  # read by `width` alone: it goes with it, a round later
    assert "named_by_string = 1" in text and "def forward" in text and "def _format_usage" in text
    printed = []
    exec(compile(text, "members", "exec"), {"print": printed.append})
    assert printed == [(4, "Formatter")]
    for wholesale in ("print(Model.__dict__)", "print(dir(Model))", "print(vars(Host))",
                      "print(getattr(Model(), 'build' + '_parts'))", "print(getattr(Model(), f'{x}'))"):
        assert unnamed_members(ast.parse(MEMBERS + wholesale + "\n")) == [], wholesale
    assert len(unnamed_members(ast.parse(MEMBERS + "print(vars(args), getattr(args, name))\n"))) == 4


RESIDUE = '''def mixed(xs):
    out = []
    for j, x in enumerate(xs):
        out.append(float(2) * x + int(3.7) + len((5, 6)) - len([7]))
    for i, y in enumerate(xs):
        out.append(i * y)
    return out, float("inf") > float(1e999) - 1, float(True), len(xs), len((xs,))


def spaced(xs):
    for j, x in enumerate(xs):
        print(x, locals()["j"])


def counted(xs):
    global last
    for last, x in enumerate(xs):
        pass


def bumped(xs):
    for j, x in enumerate(xs):
        j += 1
        print(x)


print(mixed([1, 2]))
spaced([5])
counted([7, 8])
print(last)
bumped([9])
'''


@pytest.mark.parametrize("binding", ["", "float = int\n", "len = sum\n", "from math import floor as enumerate\n"])
def test_rule_23_a_number_conversion_of_a_literal_and_an_unread_loop_index_fold(binding):
    """What the record's backout leaves: `torch.tensor(float(1.0))`, `for j, name in enumerate(layers)` with `j`
    read by a transform folded away; a builtin the file binds, and a function reading its locals, stay."""
    from speedrun.export import without_literal_residue
    source = binding + RESIDUE
    text = without_literal_residue(source)
    assert ("for x in xs:" in text) == (binding != "from math import floor as enumerate\n")
    assert ("2.0 * x + 3 + 2 - 1" in text) == (binding not in ("float = int\n", "len = sum\n"))
    assert ("len((5, 6))" in text) == (binding == "len = sum\n")
    assert "len(xs), len((xs,))" in text  # no display, or one of a name
    assert "for i, y in enumerate(xs):" in text  # its index is read
    assert "float(\"inf\")" in text and "float(True)" in text  # not a number literal
    assert "float(1e999)" in text  # a literal of no finite value: `inf` is no literal
    assert "for j, x in enumerate(xs):\n        print(x, locals()" in text
    assert "for last, x in enumerate(xs):" in text  # a global index
    assert "for j, x in enumerate(xs):\n        j += 1" in text  # updated in place: read
    if not binding:
        assert run_printed(text) == run_printed(source) == [(([2.0 + 4, 4.0 + 4, 0, 2], False, 1.0, 2, 1),), (5, 0),
                                                            (1,), (9,)]


LOOKUPS = """def shapes(n, dim, form, made):
    table = {"single": (n, 1), "vector": (n, 2, dim)}
    return ({"single": (n, 1), "vector": (n, 2, dim)}.get('softmax', (n, 2)),
            {"single": (n, 1), "single": (n, 3)}["single"], {"a": n}.get("b"), table.get("single"),
            {"a": n, "b": made()}.get("a"), {"a": n}.get(form, dim), {"a": n, 1: dim}[1.0])


print(shapes(4, 8, "a", list))
"""


def test_rule_23_a_lookup_by_a_literal_in_a_dict_display_is_its_value():
    """LAuReL's `{"single": (n, 1), "vector": (n, 2, dim)}.get('softmax', (n, 2))` once its form folded: a lookup by a
    literal key in a display of literal keys is the value it finds (the later of a key given twice; `1.0` finds `1`),
    or the default; not in a display held by a name, one whose values call something, or by a key that is no
    literal; the program prints the same."""
    from speedrun.export import without_literal_residue
    text = without_literal_residue(LOOKUPS)
    assert "    return (((n, 2)),\n            ((n, 3)), None, table.get(\"single\"),\n" in text
    assert '{"a": n, "b": made()}.get("a"), {"a": n}.get(form, dim), dim)' in text
    assert run_printed(text) == run_printed(LOOKUPS) == [(((4, 2), (4, 3), None, (4, 1), 4, 4, 8),)]
    missing = 'print({"a": 1}["b"])\n'  # raises: it stays
    assert without_literal_residue(missing) == missing


TABLES = """import math

ACTIVATIONS = {"sqrt": math.sqrt, "abs": abs, "floor": math.floor}
CHANGED = {"a": math.sqrt}
CHANGED["a"] = abs
HANDED = {"a": math.sqrt}


def floor(x):
    return x


SHADOWED = {"a": floor}


def use(x, floor=math.floor):
    return floor(x)


def f(x, key):
    return ACTIVATIONS["sqrt"](x), ACTIVATIONS.get("abs")(-x), ACTIVATIONS[key](x), CHANGED["a"](-x), \\
        HANDED["a"](x), use(x), SHADOWED["a"](x)


print(f(4.0, "floor"), len(HANDED))
"""


def test_rule_23_a_lookup_in_a_module_constant_table_is_its_value():
    """Multi-layer backout's `BACKOUT_ACTIVATIONS['relu']`: a lookup by a literal in a module constant bound to a
    dict display is the value, where every read of the name is a lookup (nothing can change it: not one stored
    into or handed on) and the value's names are bound once, at the module's top level."""
    from speedrun.export import without_literal_residue
    text = without_literal_residue(TABLES)
    assert "return math.sqrt(x), abs(-x), ACTIVATIONS[key](x), CHANGED[\"a\"](-x)," in text
    assert 'HANDED["a"](x), use(x), SHADOWED["a"](x)' in text  # handed to len; `floor` bound twice
    assert run_printed(text) == run_printed(TABLES)


LOOP_TESTS = """def mixed(outputs, first):
    out = []
    for j, name in enumerate((9, 11)):
        source = first if name == "embed" else outputs[name]
        out.append((source, "lead" if j == 0 else "rest", name != "x", 10 < name))
    for k in [1, 2]:
        out.append(k == 1)
        late = lambda: k == 3  # called once k is no item
    k = 3
    out.append(late())
    for m in (3, 4):
        m = m * 2
        out.append(m == 6)
    return out


print(mixed(list(range(12)), -1))
"""


def test_rule_23_a_comparison_every_item_of_a_constant_loop_decides_alike_is_its_truth():
    """Over `(9, 11)` a layer is never "embed": the conditional expression is its branch; a comparison the items
    decide apart, one in a lambda, and one of a target the body stores stay."""
    from speedrun.export import without_literal_residue
    text = without_literal_residue(LOOP_TESTS)
    assert "        source = outputs[name]\n" in text
    assert 'out.append((source, "lead" if j == 0 else "rest", True, 10 < name))' in text
    assert "out.append(k == 1)" in text and "late = lambda: k == 3" in text and "out.append(m == 6)" in text
    assert run_printed(text) == run_printed(LOOP_TESTS)


PACKED = """def study(**given):
    return given


SPREAD = study(
    name="backout", fields=(("layers", tuple, ()),),
    config=lambda cfg, run: {"layers": (11,)},
    part=None,
)
NOTED = study(
    name="a",  # why
    part=1,
)
TALL = study(name="b", part={
    "x": 1})
DENSE = study(name="c",
              part=2)
LONG = study(name="aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
             fields=(("layers", tuple, ()),), part=2)
print(SPREAD["name"], NOTED, TALL, DENSE, LONG)
"""


def test_rule_30_a_module_call_on_lines_it_need_not_take_is_packed():
    """A study's declaration once its keywords were rewritten and cut: packed under its first argument, fewer lines,
    the same program; not one holding a comment, an argument on lines of its own, or one packing would not shorten."""
    from speedrun.export import WIDTH, packed_module_calls
    text = packed_module_calls(PACKED)
    assert 'SPREAD = study(name="backout", fields=(("layers", tuple, ()),), config=lambda cfg, run: {"layers": (11,)}, ' \
        'part=None)\n' in text and 'DENSE = study(name="c", part=2)\n' in text
    for kept in ('NOTED = study(\n    name="a",  # why\n', 'TALL = study(name="b", part={\n', '\n             fields=(("layers", tuple, ()),), part=2)\n'):
        assert kept in text, kept
    assert max(map(len, text.split("\n"))) <= WIDTH
    assert ast.dump(ast.parse(text)) == ast.dump(ast.parse(PACKED)) and run_printed(text) == run_printed(PACKED)


PARENTHESES = """def f(n, start, a, b, c, x, y):
    made = (list)((n, 2))
    counts = ([1] * n)
    index = start[0] + (0)
    shape = tuple(((n, 2)))
    keep = (a + b) * c
    pair, call = (x, y), max((x, y))
    real = (1).real
    text = f"{(a)}"
    multi = (a +
             b)
    pair = pair if not (x) else (y)
    first, second = (x, 0.0)
    return (made, counts, index, shape, keep, pair, call, real, text, multi, first, second)


print(f(2, [5], 1, 2, 3, 4, 5))
"""


def test_rule_27_parentheses_folding_leaves_around_one_expression_go():
    """LAuReL's file kept `(laurel_column_orthogonal)(count, 16, dim)`, `counts = ([1] * len(self.sites))` and `+ (0)`
    of folded conditional expressions: they go, so do those around a tuple an assignment unpacks; a call's, a
    returned tuple's, a grouping's, a multi-line expression's, a
    number's before its attribute and an f-string's stay; the program prints the same."""
    from speedrun.export import without_redundant_parentheses
    text = without_redundant_parentheses(PARENTHESES)
    assert "made = list((n, 2))\n" in text and "counts = [1] * n\n" in text and "start[0] + 0\n" in text
    assert "shape = tuple((n, 2))\n" in text and "keep = (a + b) * c\n" in text
    assert "pair, call = (x, y), max((x, y))\n" in text and "(1).real" in text and 'f"{(a)}"' in text
    assert "multi = (a +\n" in text and "if not x else y" in text and "return (made, counts" in text
    assert "first, second = x, 0.0\n" in text  # an unpacked tuple of a folded `... if resume else (0, 0.0)`
    assert run_printed(text) == run_printed(PARENTHESES)
    assert without_redundant_parentheses(text) == text


MODEL_FIELDS = """from dataclasses import dataclass, make_dataclass, field, replace

LEFT_OUT_FIELDS = {'on': [3], 'mode': 'sum', 'scale': 2.0, 'width': 8, 'label': 'x'}


@dataclass(frozen=True)
class Study:
    name: str
    model_fields: tuple
    model_config: object


ARM = Study(
    name="arm", model_fields=(('on', tuple, ()), ('mode', str, None), ('scale', float, None), ('width', int, None),
        ('label', str, None)),
    model_config=lambda model_cfg, config: {'on': (3,), 'mode': 'sum', 'scale': 2.0, 'width': 8, 'label': 'x'},
)
Config = make_dataclass("Config", [(n, k, field(default=d)) for n, k, d in ARM.model_fields])
cfg = replace(Config(), **ARM.model_config(None, None))
wider = replace(cfg, width=cfg.scale * 4)
print(sorted(LEFT_OUT_FIELDS), wider.width, getattr(cfg, "label"), {n: d for n, _, d in ARM.model_fields})
"""


def test_rule_28_a_fixed_declarations_model_fields_the_file_reads_nowhere_go():
    """The record's backout_mode, ..., folded into its code, leave its declaration: a field read by no attribute,
    keyword or string but LEFT_OUT_FIELDS' keys goes from model_fields and model_config; the first stays (in_model
    reads it by position), as do one read as an attribute (`scale`), a keyword (`width=`) or a string (`"label"`)."""
    from speedrun.export import without_unread_model_fields
    text = without_unread_model_fields(MODEL_FIELDS)
    assert "    name=\"arm\", model_fields=(('on', tuple, ()), ('scale', float, None), ('width', int, None), " \
        "('label', str, None)),\n" in text
    assert "model_config=lambda model_cfg, config: {'on': (3,), 'scale': 2.0, 'width': 8, 'label': 'x'},\n" in text
    assert "'mode'" not in text.split("LEFT_OUT_FIELDS = {")[1].split("}", 1)[1]  # logged still
    printed = run_printed(text)
    assert printed[0][:3] == run_printed(MODEL_FIELDS)[0][:3] and "mode" not in printed[0][3]
    assert without_unread_model_fields(text) == text


def test_rule_22_a_parameter_every_call_passes_as_one_literal_and_only_tests_folds():
    from speedrun.export import without_literal_parameters
    source = ("def mixed(mode, x, scale):\n    if mode == 'subtract':\n        return -x\n"
              "    return x * scale if mode else x\n\n\ndef sized(rank, dim):\n    return rank * dim\n\n\n"
              "print(mixed('sum', 2, 3), mixed('sum', 4, 3), sized(32, 2))\n")
    text = without_literal_parameters(source)
    assert "def mixed(x, scale):\n    return x * scale\n" in text and "mixed(2, 3), mixed(4, 3)" in text
    assert "def sized(rank, dim):" in text  # a literal it computes with keeps its name
    assert run_printed(text) == run_printed(source) == [(6, 12, 64)]
    differing = source.replace("mixed('sum', 4, 3)", "mixed('subtract', 4, 3)")
    assert without_literal_parameters(differing) == differing
    passed_on = source + "f = mixed\n"  # named otherwise: a call elsewhere may pass anything
    assert without_literal_parameters(passed_on) == passed_on


def test_rule_22_a_parameter_never_read_leaves_the_signature_where_every_call_passes_a_read():
    """r18's `mixed_head_input(x, ...)` once its subtract mode folded: `x` is no longer read, the call passed
    `outputs[-1]`; a call that passes a call keeps its argument (it may print, as here)."""
    from speedrun.export import without_literal_parameters
    source = ("def mixed(x, head_in, lam):\n    return lam * head_in\n\n\n"
              "def f(outputs, h):\n    return mixed(outputs[-1], h, 2) + mixed(outputs[0], h, 3)\n\n\n"
              "def g(a, b):\n    return b\n\n\nprint(f([1, 2], 5), g(print('side'), 1))\n")
    text = without_literal_parameters(source)
    assert "def mixed(head_in, lam):" in text and "return mixed(h, 2) + mixed(h, 3)" in text
    assert "def g(a, b):" in text and "g(print('side'), 1)" in text
    assert run_printed(text) == run_printed(source) == [("side",), (25, 1)]


def test_rule_22_a_method_alone_in_answering_its_name_loses_a_parameter_it_never_reads():
    """BaseRun.settle(config, compiled, init_state, resume_state) in a file that resumes nothing: the states are
    never read, every call `run.settle(...)` passes a name; not where another class answers the name too, where a
    call passes self by position (`Run.settle(run, ...)`), or where the name is a library object's attribute."""
    from speedrun.export import without_inert_code, without_literal_parameters
    source = ("class Run:\n    def settle(self, config, state):\n        return config + 1\n\n\n"
              "def main(run, config):\n    state = None\n    return run.settle(config, state)\n\n\n"
              "print(main(Run(), 1))\n")
    text = without_literal_parameters(source)
    assert "def settle(self, config):" in text and "return run.settle(config)" in text
    assert "state = None" not in without_inert_code(text)
    assert run_printed(text) == run_printed(source) == [(2,)]
    another = source + "\n\nclass Other:\n    def settle(self, config, state):\n        return state\n"
    assert without_literal_parameters(another) == another
    unbound = source.replace("run.settle(config, state)", "Run.settle(run, config, state)")
    assert without_literal_parameters(unbound) == unbound
    library = source.replace("settle", "step")  # an optimiser's and a tensor's attribute: the call may reach one
    assert without_literal_parameters(library) == library


UNSET = """class Block:
    def __call__(self, *args, **kwargs):
        return self.forward(*args, **kwargs)

    def forward(self, x, *extra, augment=None, routed=None):
        x = self.mix(x, *extra, augment=augment)
        if routed is not None:
            return routed(x)
        return self.residual(x, 1, augment)

    def mix(self, x, y, *, augment=None):
        return x + y if augment is None else augment(x, y)

    @staticmethod
    def residual(x, fx, augment):
        return x + fx if augment is None else augment(x, fx)


class Model:
    def __init__(self):
        self.blocks = [Block(), Block()]

    def run_block(self, block, x, augment=None):
        return block(x, 2, augment=augment)

    def hidden(self, x):
        for block in self.blocks:
            x = self.run_block(block, x, augment=None)
        return x


def save(path, extra=None, scale=3):
    return dict(extra or {}, path=path, scale=scale)


print(Model().hidden(1), save("p", extra=None))
"""


def test_rule_29_a_sentinel_no_call_sets_folds_through_a_modules_forward_and_what_it_feeds():
    """The baseline's `augment=None` from run_block through the blocks' forward (called as `block(...)`: unknown
    callers) into mix_and_attend (keyword-only) and the static residual (by position): each reads None, the tests
    fold, the program prints the same. A number default keeps its name; a positional parameter a `*args` call
    reaches stays."""
    from speedrun.export import without_unset_parameters
    text = without_unset_parameters(UNSET)
    assert "def forward(self, x, *extra):\n        x = self.mix(x, *extra)\n        return self.residual(x, 1)\n" \
        in text
    assert "def mix(self, x, y):\n        return x + y\n" in text  # the bare `*` went with its parameter
    assert "def residual(x, fx):\n        return x + fx\n" in text
    assert "def run_block(self, block, x):\n        return block(x, 2)\n" in text and "self.run_block(block, x)\n" in text
    assert "def save(path, scale=3):" in text and 'save("p")' in text
    assert run_printed(text) == run_printed(UNSET) == [(7, {"path": "p", "scale": 3})]


@pytest.mark.parametrize("change, kept", [
    # a call passes something else: neither run_block's nor forward's parameter is unset
    (('self.run_block(block, x, augment=None)', 'self.run_block(block, x, augment=print)'),
     "def run_block(self, block, x, augment=None):"),
    # a string of the name: a `**` argument may carry it to forward; getattr may call run_block
    (('print(Model()', 'NAMES = ["augment", "run_block"]\nprint(Model()'), "def forward(self, x, *extra, augment=None"),
    (('print(Model()', 'NAMES = ["augment", "run_block"]\nprint(Model()'), "def run_block(self, block, x, augment"),
    # a library's callable given the keyword (its default may be another): forward's stays
    (('        return x\n\n\ndef save', '        return x\n\n    def other(self):\n'
      '        return math.floor(1, augment=None)\n\n\ndef save'), "def forward(self, x, *extra, augment=None"),
    # a lambda with the name, which an unknown call may land in
    (('print(Model()', 'f = lambda augment: augment\nprint(Model()'), "def forward(self, x, *extra, augment=None"),
    # a forward pre-hook may hand forward other keywords than the call's
    (('print(Model()', 'Block().register_forward_pre_hook(print)\nprint(Model()'),
     "def forward(self, x, *extra, augment=None"),
    # the entry point: whoever imports the file calls it too (`main(argv)`), whatever the file's own call passes
    (('print(Model()', 'def main(argv=None):\n    return argv\n\n\nif __name__ == "__main__":\n    main()\n'
      'print(Model()'), "def main(argv=None):"),
    # run_block named otherwise than as called: a caller may pass anything
    (('print(Model()', 'g = Model.run_block\nprint(Model()'), "def run_block(self, block, x, augment=None):"),
])
def test_rule_29_a_parameter_something_else_may_set_stays(change, kept):
    from speedrun.export import without_unset_parameters
    source = UNSET.replace(*change)
    assert source != UNSET
    assert kept in without_unset_parameters("import math\n" + source)


INIT_SENTINEL = '''class Model:
    def __init__(self, size, registry=None):
        self.size = size if registry is None else size + len(registry)


class Loader:
    def __init__(self, load=None):
        self.load = load or print


print(Model(3).size, Model(4).size, Loader().load is print)
'''


@pytest.mark.parametrize("change", [
    None,
    ("print(Model(3)", "class Deeper(Model):\n    pass\n\n\nprint(Model(3)"),  # a subclass's __init__ reaches it
    ("print(Model(3)", "print(isinstance(1, Model))\nprint(Model(3)"),  # the class read as a value
    ("print(Model(3)", "print(type(Model(1))(2, registry=[1]).size)\nprint(Model(3)"),  # an object's class built
    ("print(Model(3)", "NAMES = ['Model']\nprint(Model(3)"),  # a string: getattr(module, 'Model')
    ("class Loader:", "    @classmethod\n    def made(cls):\n        return cls(1, registry=[1])\n\n\n"
                      "class Loader:"),  # a classmethod builds one
    ("print(Model(3)", "import types\nprint(types.SimpleNamespace(Model=Model).Model(1, [2]).size)\n"
                       "print(Model(3)"),  # called through an attribute
    ("Model(4).size", "Model(4, [1]).size"),  # a call sets it
])
def test_rule_29_a_class_whose_calls_all_leave_an_init_parameter_at_its_sentinel_folds_it(change):
    """`Class(...)` calls its __init__: where the class is read only as called (and no object's class is built, no
    subclass), a parameter every call leaves at None is read as None (r18's `registry`, the loaders' `load`)."""
    from speedrun.export import without_unset_parameters
    source = INIT_SENTINEL if change is None else INIT_SENTINEL.replace(*change)
    assert change is None or source != INIT_SENTINEL
    text = without_unset_parameters(source)
    assert ("def __init__(self, size):" in text) == (change is None)
    if change is None:
        assert "def __init__(self):" in text and "self.load = None or print" in text  # Loader's: always unset
    assert run_printed(text) == run_printed(source)


def test_a_parameter_cut_from_the_source_keeps_its_stores_in_a_branch_folding_takes_away():
    """decided_calls reads the folded `mixed_head_input(mode, x, ...)`, where the subtract branch that reads and
    stores `x` is gone, and cuts `x` from the source before folding: its reads there become the literal, its store
    stays a store (`None = None - ...` did not parse), and folding `mode` then removes the branch."""
    from speedrun.export import fold_ifs, without_calls_decided
    source = ("def mixed(mode, x, head):\n    if mode == 'subtract':\n        x = x - head\n        return x\n"
              "    return head * 2\n\n\nprint(mixed(MODE, [1][-1], 3))\n")
    cut = without_calls_decided(source, [("mixed", "mode", 0, "'sum'"), ("mixed", "x", 1, "None")], ())
    assert "        x = None - head\n" in cut and "mixed(3)" in cut
    folded = fold_ifs(cut, {})
    assert folded.startswith("def mixed(head):\n    return head * 2\n")
    assert run_printed(folded) == run_printed(source.replace("MODE", "'sum'")) == [(6,)]


GLOBAL_PASSED = '''def total(values, scale):
    return sum(values) * scale


def first(values):
    return values[0]


def run(base):
    return base.count(2) + first(REGISTRY)


REGISTRY = (1, 2)
print(total(REGISTRY, 2), total(REGISTRY, 3), run(REGISTRY))
'''


@pytest.mark.parametrize("extra, folds", [
    ("", True),
    ("def later():\n    global REGISTRY\n    REGISTRY = ()\n", False),  # rebound: another object at some call
    ("REGISTRY = (3,)\n", False),  # assigned twice
    ("def shadow(REGISTRY):\n    return REGISTRY\n", False),  # a parameter of that name
    ("def REGISTRY():\n    return ()\n", False),  # a definition of that name binds it again
])
def test_rule_22_a_parameter_every_call_passes_one_module_constant_reads_it(extra, folds):
    """The registry the tracks pass to model_config_from_args and preset_config (`STUDIES`) and the run they pass
    to run_training (`MEDIUM`): the parameter goes and the function reads the constant; not where the name is bound
    twice or anywhere as a parameter or a global."""
    from speedrun.export import without_literal_parameters
    source = GLOBAL_PASSED + extra
    text = without_literal_parameters(source)
    assert ("def total(scale):\n    return sum(REGISTRY) * scale\n" in text) == folds
    assert ("    return REGISTRY.count(2) + first()" in text) == folds  # a name as a receiver needs no parentheses
    assert run_printed(text) == run_printed(source) == [(6, 9, 2)]


def test_a_module_read_again_from_another_root_gets_its_own_import_order(tmp_path, monkeypatch):
    """The import order was cached by the module's name: a program exported after one whose `script` imported no
    project module kept none of its own (four tests failed so, in an order xdist happened to pick)."""
    alone = "import sys\n\nif __name__ == '__main__':\n    print(sys.argv)\n"
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert "speedrun" not in exported_program(tmp_path / "a", monkeypatch, "", alone)
    library = "class Model:\n    size = 3\n\n    def run(self):\n        return self.size\n"
    script = "from speedrun.lib import Model\n\nif __name__ == '__main__':\n    print(Model().run())\n"
    assert "class Model" in exported_program(tmp_path / "b", monkeypatch, library, script)


INERT = '''def given_flags():
    return []


def resolved(config, pattern):
    return config


def checked(n):
    if n < 2:
        raise ValueError(n)
    return [n] * n


def noisy(x):
    print("noisy", x)
    return x


def parse(config, n, counts):
    given = given_flags()
    pattern = checked(n)  # refuses a depth the model cannot build
    config = resolved(config, pattern)
    for name, part in counts.items():
        pass
    for item in noisy([1]):
        pass
    unused = noisy(config)
    spare = counts
    count = 0
    count += 1
    return config


def kept(x):
    out = noisy(x)
    other = x
    return locals()["out"]


print(parse(5, 3, {"a": 1}), kept(2))
'''


def test_rule_24_inert_calls_unread_locals_and_empty_loops_go():
    """What the baseline files kept: `given = given_study_flags()` (a function returning `[]`), `config =
    resolve_study_args(config, pattern)` (returning its config, no study being on), `pattern = layer_pattern(n)`
    read by no study (its call stays: it refuses a bad depth), r18's `for name, part in self.study.items(): pass`."""
    from speedrun.export import without_inert_code
    text = without_inert_code(INERT)
    assert "given" not in text.split("def parse")[1] and "resolved(" not in text.split("def parse")[1]
    assert "    checked(n)  # refuses a depth the model cannot build\n" in text  # the call's check stays
    assert "counts.items()" not in text and "for item in noisy([1]):\n        pass" in text  # a call may do more
    assert "    noisy(config)\n" in text and "spare" not in text  # a call stays, a read goes
    assert "    out = noisy(x)\n    other = x\n    return locals()" in text  # a function that reads its namespace
    assert "    count = 0\n    count += 1\n" in text  # updated in place: read
    assert run_printed(text) == run_printed(INERT) == [("noisy", [1]), ("noisy", 5), ("noisy", 2), (5, 2)]
    with pytest.raises(ValueError):  # the kept call still refuses
        run_printed(text.replace("print(parse(5, 3,", "print(parse(5, 1,"))
    for named_elsewhere in ("f = resolved\n", "resolved = None\n"):  # passed on or rebound: may be anything
        assert "resolved(config, pattern)" in without_inert_code(INERT + named_elsewhere)
    impure = INERT.replace("config = resolved(config, pattern)", "config = resolved(config, noisy(pattern))")
    assert "resolved(config, noisy(pattern))" in without_inert_code(impure)  # an argument that does something



UNROLL = """TABLE = (('a', 1), ('b', 2))

def names():
    return [name for name, _ in TABLE]

def checks(x):
    for name, limit in TABLE:  # the file's studies
        print(name, x <= limit)
    return x

def read_after():
    for name, limit in TABLE:
        pass
    return name

def breaks():
    for name, limit in TABLE:
        if limit > 1:
            break
        print(name)

def late():
    out = []
    for name, limit in TABLE:
        out.append(lambda: name)
    return [f() for f in out]

def stores():
    for name, limit in TABLE:
        name = name * 2
        print(name)

def filtered():
    return [name for name, limit in TABLE if limit > 1]

def inner():
    return [[name for name in 'xy'] for name, _ in TABLE]

print(names()); checks(1); print(read_after()); breaks(); print(late()); stores(); print(filtered()); print(inner())
"""


def test_rule_25_loops_over_a_constant_tuple_are_written_out():
    """What the file's FIXED_STUDIES was read by: `[piece for piece, _ in FIXED_STUDIES]` and `for _, depths in
    FIXED_STUDIES: check_fixed_depth(config, depths)`, written out per item with the values in place; a loop whose
    target is read after it, that breaks, stores its target or reads it late (a lambda) stays, as does a filter."""
    from speedrun.export import UNROLLED, constant_tuples_unrolled, to_fixed_point
    folds = {UNROLLED: (("TABLE", "(('a', 1), ('b', 2))"),)}
    text = to_fixed_point(lambda t: constant_tuples_unrolled(t, folds), UNROLL)
    assert "    return ['a', 'b']\n" in text
    assert "def checks(x):\n    print('a', x <= 1)\n    print('b', x <= 2)\n    return x\n" in text
    assert text.count("for name, limit in TABLE:") == 4  # read after, breaks, late, stores
    assert "[name for name, limit in TABLE if limit > 1]" in text
    assert "[[name for name in 'xy'] for name, _ in TABLE]" in text  # the element binds the target again
    assert run_printed(text) == run_printed(UNROLL) == [
        (["a", "b"],), ("a", True), ("b", True), ("b",), ("a",), (["b", "b"],), ("aa",), ("bb",), (["b"],),
        ([["x", "y"], ["x", "y"]],)]
    assert constant_tuples_unrolled(UNROLL, {}) == UNROLL  # no constant held: nothing to write out
    wrong_shape = {UNROLLED: (("TABLE", "(('a', 1, 0),)"),)}  # an item the target does not unpack to
    assert constant_tuples_unrolled(UNROLL, wrong_shape) == UNROLL


FIELDS = """class Part:
    def __init__(self, cfg):
        self.cfg = cfg
        self.sources = tuple(cfg.layers)
        self.tag, self.seen = cfg.mode, cfg
        self.summed = cfg.mode == "sum"

    def never_called(self):
        self.ordered = self.cfg.mode < 3  # incomparable: kept as it is

    def mixed(self, outputs):
        out = []
        for name in self.cfg.layers:
            out.append(outputs[name] if name != "embed" else 0)
        count = len(self.cfg.layers)
        return out, self.scale(self.cfg.mode), count, self.sources, self.cfg.mode == "sum"

    def scale(self, mode):
        return mode * 2

def parse(args):
    return args.layers

class Cfg:
    layers, mode = (3,), "sum"

print(Part(Cfg()).mixed([10, 11, 12, 13]), parse(Cfg()))
"""


def test_rule_13_a_fixed_fields_other_reads_are_its_value_and_a_loop_of_one_item_is_its_body():
    """What the record's backout read of its fields outside tests: `for j, name in enumerate(self.cfg.backout_layers)`
    is the body at layer 11 (rule 25 on the one-item tuple, rule 5 on `11 == "embed"`); a field passed to a call
    stays a read (rule 22 decides that parameter by it), but a builtin's; a function reading the parsed flags
    (the study's resolve) keeps its reads."""
    from speedrun.export import STUDY_FIELD, constant_tuples_unrolled, fixed_fields_read, fold_ifs, to_fixed_point
    folds = {STUDY_FIELD + "layers": (3,), STUDY_FIELD + "mode": "sum"}
    read = fixed_fields_read(FIELDS, folds, readers=("parse",))
    assert "self.sources = (3,)" in read and "count = len((3,))" in read and "for name in (3,):" in read
    assert "self.tag, self.seen = 'sum', cfg" in read  # an unpacking's item is a whole value
    # passed to a call, inside an expression, or in the parsed flags' reader: still a read; a whole value comparing
    # it with a literal: the comparison's truth
    assert "self.scale(self.cfg.mode)" in read and "return args.layers" in read
    assert 'self.cfg.mode == "sum"' in read and "self.summed = True" in read
    assert "self.ordered = self.cfg.mode < 3" in read
    text = to_fixed_point(lambda t: fold_ifs(constant_tuples_unrolled(t, {}), {}), read)
    assert "        out = []\n        out.append(outputs[3])\n        count = len((3,))\n" in text
    assert run_printed(text) == run_printed(FIELDS) == [(([13], "sumsum", 1, (3,), True), (3,))]
    assert fixed_fields_read(FIELDS, {}) == FIELDS  # no study on


PURE = """def parts():
    chosen = set(('rw+lr').split("+"))
    pa = "pa" in chosen
    return "rw" in chosen, "lr" in chosen and not pa, pa, pa and 'identity' != "identity"


def not_pure():
    chosen = set(FORM.split("+"))
    return "b" in chosen


def shapes():
    return len((1, 2)), [3]


FORM = "a+b"


class Part:
    def __init__(self):
        self.rw, self.lr, self.pa, self.pa_lowrank = parts()
        self.k = 3

    def forward(self, x):
        if self.rw:
            x = x + 1
        if self.pa:
            x = x * 2
        return x * self.k if self.pa_lowrank else x


print(Part().forward(1), not_pure(), shapes())
"""


def test_rule_24_a_function_that_computes_from_literals_alone_is_its_value():
    """LAuReL's file kept `laurel_parts()` over its folded `'rw+lr'` (`set(('rw+lr').split("+"))`, `'identity' !=
    "identity"`): the call is its literal and the function goes; one that reads a global, or returns a list (a new
    object at each call), stays, as does one using a builtin the file rebinds."""
    from speedrun.export import without_inert_code
    text = without_inert_code(PURE)
    assert "def parts" not in text and "self.rw, self.lr, self.pa, self.pa_lowrank = (True, True, False, False)" in text
    assert "def not_pure" in text and "def shapes" in text and "shapes()" in text
    assert run_printed(text) == run_printed(PURE) == [(2, True, (2, [3]))]
    assert "parts()" in without_inert_code(PURE + "set = list\n")

INERT_METHODS = '''class Base:
    def check(self, config):
        pass

    def extra(self):
        return None

    def settle(self, config):
        return 3

    def named(self):
        return 1

    def items(self):
        return ()

    def reached(self):
        return 2


class Track(Base):
    def settle(self, config):
        return config


class Field:
    named: int = 4


class Declared:
    def __init__(self, given):
        self.given = given

    def summed(self, a, b):
        return self.given(a, b)

    def swapped(self, a, b):
        return self.given(b, a)


run = Track()
run.check(5)
print(run.extra(), run.settle(6), run.named(), run.items(), getattr(run, "reached")())
declared = Declared(lambda a, b: a - b)
print(declared.summed(1, 2), declared.swapped(1, 2))
'''


def test_rule_24_a_no_op_method_nothing_else_can_answer_is_its_literal():
    """BaseRun's `check_inputs`, `after_restore` and `checkpoint_extra`, which the r14 and small tracks' run does
    not override: the calls and the methods go; Study's `model_values` is its model_config's call. Not a name
    another class defines (an override, a dataclass field), one a library object has (`items`), nor one a string
    reaches (getattr)."""
    from speedrun.export import without_inert_code
    text = without_inert_code(INERT_METHODS)
    assert "run.check(5)" not in text and "def check" not in text and "def extra" not in text
    assert "print(None, run.settle(6), run.named(), run.items()," in text
    assert "def reached" in text and "def items" in text and text.count("def settle") == 2
    # a method that passes its parameters on to an attribute's call (Study's model_values) is that call
    assert "print(declared.given(1, 2), declared.swapped(1, 2))" in text and "def summed" not in text
    assert run_printed(text) == run_printed(INERT_METHODS) == [(None, 6, 1, (), 2), (-1, 1)]


CLASS_DISPLAY = '''class Part:
    pass


class Other:
    pass


def parts():
    return [('part', Part), ('other', Other)]


def shadowed():
    return (Other,)


def named(value):
    Other = value + 1
    return Other * 2


print([name for name, _ in parts()], [cls.__name__ for cls in shadowed()], named(1))
'''
UNSHADOWED = CLASS_DISPLAY.replace("    Other = value + 1\n    return Other * 2\n", "    return (value + 1) * 2\n")


def test_rule_31_a_function_returning_a_display_of_the_files_classes_is_that_display_where_called():
    """The model's `study_parts()` once rule 31 wrote it: `[('backout', Backout)]` at its call; a class name the file
    binds again (here a parameter) may read that binding at the call, so its function stays."""
    from speedrun.export import without_inert_code
    assert UNSHADOWED != CLASS_DISPLAY
    text = without_inert_code(UNSHADOWED)
    assert "def parts" not in text and "def shadowed" not in text
    assert "print([name for name, _ in [('part', Part), ('other', Other)]], " \
           "[cls.__name__ for cls in (Other,)]" in text
    assert run_printed(text) == run_printed(CLASS_DISPLAY) == [(["part", "other"], ["Other"], 4)]
    kept = without_inert_code(CLASS_DISPLAY)  # `Other` is also a local of `named`
    assert "def parts" in kept and "def shadowed" in kept


def test_rule_31_the_parts_are_written_where_every_model_the_file_builds_holds_the_runs():
    """No study on, or every one fixed: the model builds the run's parts by name, not from the registry; a study on
    that the file's command line varies, or a part that builds its model from another config (DLO's base: no DLO
    part), keeps the registry's."""
    from speedrun.export import WRITTEN_FUNCTIONS, built_parts_written
    backout, laurel, dlo = (next(s for s in STUDIES if s.name == name) for name in ("backout", "laurel", "dlo"))
    assert laurel.model_part.built_last and not backout.model_part.built_last
    (written,) = built_parts_written([laurel, backout], fixed_arm=True)[WRITTEN_FUNCTIONS]
    assert written == ("speedrun.model", "study_parts", "[('backout', Backout), ('laurel', LaurelResiduals)]",
                       (("Backout", "speedrun.backout"), ("LaurelResiduals", "speedrun.laurel")))
    assert built_parts_written([], fixed_arm=False)[WRITTEN_FUNCTIONS][0][2] == "[]"
    assert built_parts_written([backout], fixed_arm=False) == {}
    assert built_parts_written([dlo, backout], fixed_arm=True) == {}


@pytest.mark.parametrize("script_module, flags, built", [
    (T, [], None),
    (S, [], None),
    (T, ["--base", "r18"], None),
    (T, ["--backout-layers", "11", "--preset", "full"], "[('backout', Backout)]"),
    (S, ["--rolling-skip"], "[('rolling', RollingSkip)]"),
])
def test_rule_31_the_file_builds_its_parts_by_name_and_reads_no_registry_for_them(tmp_path, script_module, flags,
                                                                                  built):
    """A record builds its parts by name; a baseline builds none and holds no study container or bookkeeping: no
    `study`, no parts' parameter counts or groups, no registry field in its model config."""
    text = export(tmp_path, script_module, *flags)
    assert not re.search(r"\bstudy_parts\b|\bin_model\b|\bcfg\.studies\b", text)
    tree = ast.parse(text)
    # what the file defines or reads by attribute (a function's locals `parts` and `study` are the run name's)
    bodies = [*tree.body, *(s for n in ast.walk(tree) if isinstance(n, ast.ClassDef) for s in n.body)]
    named = ({n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
             | {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
             | {n.id for s in bodies if isinstance(s, (ast.Assign, ast.AnnAssign))
                for t in (s.targets if isinstance(s, ast.Assign) else [s.target]) for n in ast.walk(t)
                if isinstance(n, ast.Name)})
    bookkeeping = {"build_parts", "study", "parts", "study_params", "added_params_by_study", "TRACK_SCALARS",
                   "extra_param_counts", "model_config_class", "studies", "named_parts", "r18_parts", "part_config",
                   "study_cfg", "study_scalars", "r18_study_parts"}
    if "--base" in flags:  # #18's model keeps its own scalars: of the study host it holds nothing
        bookkeeping |= {"StudyHost", "begin_scalars", "add_scalars", "scalar_slice"}
    if built is None:
        assert not named & bookkeeping, named & bookkeeping
        assert "added_params_line({})" in text or "\n        counts = {}\n" in text  # no study's count
    else:
        assert f"        self.build_parts({built}, self.cfg)\n" in text
        assert {"study_params", "added_params_by_study"} <= named


def test_rule_32_the_registry_goes_only_where_the_parts_are_written_and_every_field_of_a_study_on_folds():
    from speedrun.export import (FIELDS_EVERYWHERE, R18_BASE, STUDY_FIELD, WRITTEN_FUNCTIONS, built_parts_written,
                                 registry_unread, study_fields_read_as_literals)
    backout = next(s for s in STUDIES if s.name == "backout")
    every_field = {STUDY_FIELD + name: None for name, _, _ in backout.model_fields}
    written = built_parts_written([backout], fixed_arm=True)
    assert registry_unread([backout], {**every_field, **written})
    assert not registry_unread([], {**every_field, **written})  # no study on: the registry is already empty
    assert not registry_unread([backout], every_field)  # the parts come from the registry
    assert not registry_unread([backout], {**every_field, **written, R18_BASE: True})  # R18GPT reads it
    one_short = {key: value for key, value in every_field.items() if key != STUDY_FIELD + "backout_concat_dim"}
    assert not registry_unread([backout], {**one_short, **written})  # a field that differs between probe configs
    source = "def f(cfg, config):\n    return g(cfg.backout_layers, self.cfg.backout_mode, other.backout_mode())\n"
    folds = {STUDY_FIELD + "backout_layers": (11,), STUDY_FIELD + "backout_mode": "sum"}
    assert study_fields_read_as_literals(source, folds) == source
    assert study_fields_read_as_literals(source, {**folds, FIELDS_EVERYWHERE: True}) == \
        "def f(cfg, config):\n    return g((11,), 'sum', other.backout_mode())\n"


def model_config_code(text):
    """The file's GPTConfig, model_config_class, preset_config and model_config_from_args, as source."""
    tree = ast.parse(text)
    return [ast.unparse(n) for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))
            and n.name in ("GPTConfig", "model_config_class", "preset_config", "model_config_from_args")]


@pytest.mark.parametrize("script_module, flags", [
    (T, ["--backout-layers", "11", "--preset", "full"]),
    (T, ["--backout-layers", "9", "11", "--backout-transform", "relu", "--preset", "full"]),
    (S, ["--rolling-skip"]),
])
def test_rule_32_a_record_file_configures_its_model_as_its_baseline_does(tmp_path, script_module, flags):
    """No registry, no Study and no study field in the model config: the record's model config code is the
    baseline file's, its study's settings are literals in its part."""
    record, baseline = export(tmp_path, script_module, *flags), export(tmp_path, script_module)
    assert "STUDIES" not in {n.id for n in ast.walk(ast.parse(record)) if isinstance(n, ast.Name)}
    assert not re.search(r"class Study\b|\bcfg\.(backout|rolling)_", record)
    assert len(model_config_code(record)) >= 3 and model_config_code(record) == model_config_code(baseline)


DISPATCH_HOST = '''class Host:
    def chain(self, v, extra):
        for part in self.parts:
            v = part.head_input(self, v, extra)
        return v

    def merge(self):
        out = {}
        for part in self.parts:
            out.update(part.named_scalars(self))
        return out

    def reordered(self, v, extra):
        for part in self.parts:
            v = part.head_input(self, extra, v)
        return v

    def kept(self, v):
        for part in self.parts:
            v = part.head_input(self, v) + 1
        return v
'''


def test_rule_33_the_host_methods_that_ask_each_part_in_turn_are_recognised_by_their_form():
    from speedrun.export import dispatch_form
    methods = {n.name: n for n in ast.parse(DISPATCH_HOST).body[0].body}
    assert dispatch_form(methods["chain"]) == ("head_input", "chain")
    assert dispatch_form(methods["merge"]) == ("named_scalars", "merge")
    assert dispatch_form(methods["reordered"]) is None and dispatch_form(methods["kept"]) is None


def test_rule_33_a_call_of_a_host_method_whose_hook_one_part_answers_is_that_parts_call():
    """Where the file's model holds the backout part alone, `self.parts_head_input(norm(x), ...)` is backout's
    head_input; a merging method only as update()'s argument (its own dict would otherwise be a new one)."""
    from speedrun.export import FORWARDED, forwarded_calls_read
    folds = {FORWARDED: (("chain", "head_input", "backout", "chain", 2),
                         ("merge", "named_scalars", "backout", "merge", 0))}
    source = ("def f(self, model, x, e):\n    y = self.chain(norm(x), e) + model.chain(x, e)\n"
              "    out.update(self.merge())\n    kept = self.merge()\n    return other.chain(x, e), self.chain(x)\n")
    assert forwarded_calls_read(source, folds) == (
        "def f(self, model, x, e):\n    y = self.study['backout'].head_input(self, norm(x), e) + "
        "model.study['backout'].head_input(model, x, e)\n    out.update(self.study['backout'].named_scalars(self))\n"
        "    kept = self.merge()\n    return other.chain(x, e), self.chain(x)\n")
    assert forwarded_calls_read(source, {}) == source


def test_rule_33_only_a_hook_one_built_part_alone_overrides_is_forwarded():
    from speedrun.export import BUILT_PARTS, FORWARDED, built_parts_written, forwarded_host_methods
    backout = next(s for s in STUDIES if s.name == "backout")
    one = forwarded_host_methods({BUILT_PARTS: (("backout", "speedrun.backout", "Backout"),)})[FORWARDED]
    assert {(method, hook, kind) for method, hook, _, kind, _ in one} == {
        ("parts_head_input", "head_input", "chain"), ("parts_named_scalars", "named_scalars", "merge")}
    # with LAuReL's part too: both answer named_scalars, backout alone head_input
    both = forwarded_host_methods({BUILT_PARTS: (("backout", "speedrun.backout", "Backout"),
                                                 ("laurel", "speedrun.laurel", "LaurelResiduals"))})[FORWARDED]
    assert [method for method, *_ in both] == ["parts_head_input"]
    assert forwarded_host_methods({}) == {}
    # on --base r18 the parts are the studies' r18 parts (#18's backout: R18Backout)
    (r18,) = built_parts_written([backout], fixed_arm=True, on_r18=True)[BUILT_PARTS]
    assert r18 == ("backout", "speedrun.backout", "R18Backout") and backout.r18_part.__name__ == "R18Backout"


def test_rule_33_the_backout_record_calls_its_part_where_the_model_asks_it(tmp_path):
    text = export(tmp_path, T, "--backout-layers", "11", "--preset", "full")
    assert "return self.study['backout'].head_input(self, norm(x), outputs, x_embed, input_seq)" in text
    assert "out.update(self.study['backout'].named_scalars(self))" in text
    assert "def parts_head_input" not in text and "def parts_named_scalars" not in text
