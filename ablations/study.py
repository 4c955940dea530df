"""Study files: ablations/<study>.toml, read with tomllib, checked, expanded into runs.

A study names a training script, the flags its arms share, the arms (name -> flags), the seeds and the processes per
run. Flag tables map a flag name without its dashes to a value: `true` gives the bare flag, `false` leaves it out
(so an arm can switch off a shared one), a list is joined with commas, anything else is passed as one string.
String values may name `{seed}`, `{arm}`, `{study}`, `{runs}` and the study's own `[vars]` (overridable with
`--set NAME=VALUE`). See ablations/README.md for the whole format.
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import re
import string
import tomllib
from pathlib import Path

from . import layer_orders
from .errors import StudyError

STUDY_DIR = Path(__file__).resolve().parent
REPO_ROOT = STUDY_DIR.parent

TOP_KEYS = {"description", "script", "nproc", "launcher", "seeds", "flags", "arms", "vars", "requires_results",
            "generate", "target", "time_limit", "until_decided", "max_seeds", "alpha", "claim",
            "max_factor", "family"}
LAUNCHERS = ("torchrun", "python")
CLAIMS = ("vs-baseline", "below-target")
# The runner sets these for every run; a study setting them would break the log layout.
RUNNER_FLAGS = {"seed", "log-dir", "run-name", "variant", "resume"}
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
MAX_SEEDS = 1000
# The training scripts split every step into 8 virtual ranks, so a torchrun world size must divide 8.
VIRTUAL_RANKS = 8


def check_world_size(nproc: int, launcher: str, where: str) -> None:
    if nproc < 1:
        raise StudyError(f"{where} must be at least 1")
    if launcher == "torchrun" and VIRTUAL_RANKS % nproc:
        raise StudyError(f"{where} {nproc} does not divide {VIRTUAL_RANKS}: the training scripts need 1, 2, 4 or 8 "
                         f"processes per run")


@dataclasses.dataclass
class Run:
    study: str
    arm: str
    seed: int
    flags: list[str]  # the arm's argv, without the runner's own flags


@dataclasses.dataclass
class Study:
    name: str
    path: Path
    description: str
    script: Path
    nproc: int
    launcher: str
    seeds: list[int]
    arms: dict[str, dict]  # arm -> merged flag table (shared flags overridden by the arm's)
    vars: dict[str, str]
    requires_results: str | None
    target: float
    time_limit: str | None
    generate: dict | None
    until_decided: bool = False  # group-sequential: seeds in batches until every arm is decided
    max_seeds: int | None = None  # the most seeds per arm under until_decided (default: len(seeds))
    alpha: float = 0.01  # the sequential design's type I error
    claim: str = "vs-baseline"  # or "below-target": each arm's mean final loss against the target
    max_factor: float | None = None  # or the most seeds per arm as this many times len(seeds) (the fixed-n design)
    family: bool = True  # False: the arms are exploratory, each tested at the full alpha, not family-controlled

    def runs(self, runs_dir: Path, arms: list[str] | None = None) -> list[Run]:
        """Every (arm, seed) run, seed by seed, so that a study stopped early has all arms at its first seeds."""
        chosen = arms if arms is not None else list(self.arms)
        return [Run(self.name, arm, seed, self.argv(arm, seed, runs_dir)) for seed in self.seeds for arm in chosen]

    def argv(self, arm: str, seed: int, runs_dir: Path) -> list[str]:
        builtins = {"seed": str(seed), "arm": arm, "study": self.name, "runs": str(runs_dir)}
        # Variables may themselves use the built-in placeholders (e.g. "{runs}/record/baseline/seed{seed}.pt").
        values = {name: substitute(value, builtins, f"{self.path.name}: [vars] {name}")
                  for name, value in self.vars.items()}
        values.update(builtins)
        argv: list[str] = []
        for key, value in self.arms[arm].items():
            if value is False:
                continue
            argv.append(f"--{key}")
            if value is True:
                continue
            if isinstance(value, list):
                value = ",".join(str(v) for v in value)
            argv.append(substitute(str(value), values, f"{self.path.name}: arm {arm!r}, flag --{key}"))
        return argv


def substitute(text: str, values: dict[str, str], where: str) -> str:
    try:
        fields = [field for _, field, _, _ in string.Formatter().parse(text)]
    except ValueError as e:  # "{seed" or a lone "}"
        raise StudyError(f"{where}: {text!r} is not a valid placeholder text ({e}; write {{{{ and }}}} for "
                         f"literal braces)") from None
    for field in fields:
        if field is not None and field not in values:
            raise StudyError(f"{where}: unknown placeholder {{{field}}} (known: {', '.join(sorted(values))})")
    return text.format_map(values)


def study_path(name_or_path: str) -> Path:
    """A study name (ablations/<name>.toml) or a path to a .toml file."""
    if name_or_path.endswith(".toml") or "/" in name_or_path:
        return Path(name_or_path)
    return STUDY_DIR / f"{name_or_path}.toml"


def available_studies() -> list[Path]:
    return sorted(STUDY_DIR.glob("*.toml"))


def describe_studies() -> list[tuple[str, str]]:
    """(name, description) of every bundled study; a broken file shows its error instead."""
    rows = []
    for path in available_studies():
        try:
            with open(path, "rb") as f:
                rows.append((path.stem, str(tomllib.load(f).get("description", ""))))
        except (OSError, ValueError) as e:  # ValueError: bad TOML or bytes that are not UTF-8
            rows.append((path.stem, f"(unreadable: {e})"))
    return rows


def _check_type(value, kind, where: str):
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        names = {int: "an integer", str: "a string", dict: "a table", list: "a list", float: "a number"}
        raise StudyError(f"{where} must be {names.get(kind, kind.__name__)}")
    return value


def _number(value, where: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise StudyError(f"{where} must be a number")
    return float(value)


def _flag_table(table, where: str) -> dict:
    _check_type(table, dict, where)
    for key, value in table.items():
        if key.startswith("-") or not NAME.match(key):
            raise StudyError(f"{where}: {key!r} is not a flag name (write it without dashes, e.g. backout-layers)")
        if key in RUNNER_FLAGS:
            raise StudyError(f"{where}: --{key} is set by the runner for every run; remove it from the study")
        if isinstance(value, dict) or isinstance(value, list) and any(isinstance(v, (dict, list)) for v in value):
            raise StudyError(f"{where}: --{key} must be a string, number, boolean or flat list")
    return dict(table)


def load_study(name_or_path: str, overrides: dict[str, str] | None = None, seeds: list[int] | None = None,
               runs_dir: Path = Path("runs"), _requiring: tuple[Path, ...] = ()) -> Study:
    """Reads and checks a study file; derived arms (the `generate` table) are computed here. `_requiring`: the
    studies whose requires_results led here (a cycle is refused instead of recursing for ever)."""
    path = study_path(name_or_path)
    if not path.is_file():
        known = ", ".join(p.stem for p in available_studies())
        raise StudyError(f"no study {name_or_path!r} ({path} does not exist); studies: {known}")
    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
    except tomllib.TOMLDecodeError as e:
        raise StudyError(f"{path}: not valid TOML: {e}") from None
    except UnicodeDecodeError as e:
        raise StudyError(f"{path}: not UTF-8 text (byte {e.start}); TOML files are UTF-8") from None
    except OSError as e:
        raise StudyError(f"{path}: cannot be read ({e.strerror or e})") from None
    where = path.name
    unknown = sorted(set(data) - TOP_KEYS)
    if unknown:
        raise StudyError(f"{where}: unknown key {unknown[0]!r} (known keys: {', '.join(sorted(TOP_KEYS))})")
    for key in ("description", "script", "seeds"):
        if key not in data:
            raise StudyError(f"{where}: missing key {key!r}")
    description = _check_type(data["description"], str, f"{where}: description")
    script = Path(_check_type(data["script"], str, f"{where}: script"))
    script = script if script.is_absolute() else REPO_ROOT / script
    nproc = _check_type(data.get("nproc", 1), int, f"{where}: nproc")
    launcher = _check_type(data.get("launcher", "torchrun"), str, f"{where}: launcher")
    if launcher not in LAUNCHERS:
        raise StudyError(f"{where}: launcher must be one of {', '.join(LAUNCHERS)}, not {launcher!r}")
    if launcher == "python" and nproc != 1:
        raise StudyError(f"{where}: launcher 'python' runs one process; nproc {nproc} needs torchrun")
    check_world_size(nproc, launcher, f"{where}: nproc")
    study_seeds = _check_type(data["seeds"], list, f"{where}: seeds")
    for seed in study_seeds:
        _check_type(seed, int, f"{where}: each seed")
    if seeds is not None:
        study_seeds = seeds
    if not study_seeds or len(set(study_seeds)) != len(study_seeds):
        raise StudyError(f"{where}: seeds must be a non-empty list without repeats")
    shared = _flag_table(data.get("flags", {}), f"{where}: [flags]")
    arm_tables = _check_type(data.get("arms", {}), dict, f"{where}: [arms]")
    variables = {k: str(v) for k, v in _check_type(data.get("vars", {}), dict, f"{where}: [vars]").items()}
    for key, value in (overrides or {}).items():
        if key not in variables:
            known = ", ".join(sorted(variables)) or "none"
            raise StudyError(f"--set {key}: study {path.stem} has no such variable (its variables: {known})")
        variables[key] = value
    requires = data.get("requires_results")
    if requires is not None:
        _check_type(requires, str, f"{where}: requires_results")
        chain = (*_requiring, path.resolve())
        if study_path(requires).resolve() in chain:
            names = " -> ".join(p.stem for p in (*chain, study_path(requires)))
            raise StudyError(f"{where}: requires_results forms a cycle ({names}); a study cannot need its own results")
    target = _number(data.get("target", 2.92), f"{where}: target")
    time_limit = data.get("time_limit")
    if time_limit is not None:
        _check_type(time_limit, str, f"{where}: time_limit")
    generate = data.get("generate")
    if generate is not None:
        _check_type(generate, dict, f"{where}: [generate]")

    arms: dict[str, dict] = {}
    for arm, table in arm_tables.items():
        if not NAME.match(arm):
            raise StudyError(f"{where}: arm name {arm!r} must be letters, digits and ._+- (it names a folder)")
        arms[arm] = {**shared, **_flag_table(table, f"{where}: [arms.{arm}]")}
    required_study = None if requires is None else check_results_exist(requires, runs_dir, where, chain)
    if generate is not None:
        for arm, table in layer_orders.generate_arms(generate, required_study, runs_dir, where).items():
            if arm in arms:
                raise StudyError(f"{where}: generated arm {arm!r} is also listed under [arms]")
            arms[arm] = {**shared, **table}
    if not arms:
        raise StudyError(f"{where}: the study has no arms")
    until_decided = _check_type(data.get("until_decided", False), bool, f"{where}: until_decided")
    max_seeds = data.get("max_seeds")
    if max_seeds is not None:
        _check_type(max_seeds, int, f"{where}: max_seeds")
    alpha = _number(data.get("alpha", 0.01), f"{where}: alpha")
    max_factor = data.get("max_factor")
    if max_factor is not None:
        max_factor = _number(max_factor, f"{where}: max_factor")
        if max_seeds is not None:
            raise StudyError(f"{where}: max_seeds and max_factor both set the most seeds per arm: keep one")
    family = _check_type(data.get("family", True), bool, f"{where}: family")
    claim = _check_type(data.get("claim", "vs-baseline"), str, f"{where}: claim")
    if claim not in CLAIMS:
        raise StudyError(f"{where}: claim must be one of {', '.join(CLAIMS)}, not {claim!r}")
    return Study(path.stem, path, description, script, nproc, launcher, list(study_seeds), arms, variables,
                 requires, target, time_limit, generate, until_decided, max_seeds, alpha, claim, max_factor,
                 family)


def check_results_exist(required: str, runs_dir: Path, where: str, chain: tuple[Path, ...] = ()) -> Study:
    """A derived study needs every arm of the study it builds on to have at least one complete run; returns that
    study."""
    from .runstate import log_is_complete  # noqa: PLC0415 (kept local: runstate is only needed here)

    base = load_study(required, runs_dir=runs_dir, _requiring=chain)
    missing = [arm for arm in base.arms
               if not any(log_is_complete(p) for p in (Path(runs_dir) / base.name / arm).glob("seed*.txt"))]
    if missing:
        raise StudyError(f"{where}: needs finished results of study {required!r} in {Path(runs_dir) / required}; "
                         f"arms with no complete run: {', '.join(missing)} (run `./run.sh {required}` first)")
    return base


def select_arms(study: Study, patterns: list[str] | None) -> list[str]:
    """Arms named by --arms (exact names or shell patterns); all arms when none given."""
    if not patterns:
        return list(study.arms)
    import fnmatch  # noqa: PLC0415

    chosen: list[str] = []
    for pattern in patterns:
        matches = [arm for arm in study.arms if fnmatch.fnmatchcase(arm, pattern)]
        if not matches:
            raise StudyError(f"--arms {pattern}: study {study.name} has no such arm "
                             f"(its arms: {', '.join(study.arms)})")
        chosen.extend(arm for arm in matches if arm not in chosen)
    return chosen


# ----- checking flags against the training script ---------------------------------------------------------------

def load_script(script: Path):
    """Imports the training script from its path (importing a training script runs nothing: its main is guarded)."""
    if not script.is_file():
        raise StudyError(f"training script {script} does not exist")
    spec = importlib.util.spec_from_file_location(f"_study_script_{script.stem.replace('-', '_')}", script)
    if spec is None:  # no loader for its suffix (a README.md, a folder named *.py)
        raise StudyError(f"training script {script} is not a Python file")
    module = importlib.util.module_from_spec(spec)
    captured = io.StringIO()
    try:
        with contextlib.redirect_stdout(captured), contextlib.redirect_stderr(captured):
            spec.loader.exec_module(module)
    except SystemExit:
        raise StudyError(f"{script.name}: importing it exited ({_last_line(captured.getvalue())})") from None
    except Exception as e:  # noqa: BLE001 (any failure to import is reported as one line)
        raise StudyError(f"{script.name}: cannot be imported: {type(e).__name__}: {e}") from None
    if not hasattr(module, "make_arg_parser"):
        raise StudyError(f"{script.name} has no make_arg_parser() to check the study's flags against")
    return module


def _last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "no message"


def check_flags(study: Study, runs: list[Run], runs_dir: Path, data: bool = False):
    """Parses every run's full argv with the script's own parser; the first rejected one is a StudyError. With
    `data`, also the shards each run would read, with the script's own check_data(args) when it has one (before
    launching: a bad shard found by every rank of a torchrun launch would end it in a traceback per process).
    Returns the imported script (its parser also tells what a run's recorded config should hold)."""
    module = load_script(study.script)
    parser = module.make_arg_parser()
    # A script may also offer resolve_args(argv), its full check of flag combinations (layer indices, flags that
    # need each other); when it does, a combination that cannot work is refused here rather than mid-study.
    resolve = getattr(module, "resolve_args", None)
    checked: set[tuple[str, ...]] = set()
    resolved = []  # (run, its parsed args) for the data check
    for run in runs:
        argv = tuple(run.flags + runner_flags(run, runs_dir))
        key = tuple(run.flags)
        if key in checked:
            continue
        checked.add(key)
        for token in run.flags:
            # Exact names only: argparse would take an abbreviation (--backout-layer) for the full flag.
            if token.startswith("--") and token not in parser._option_string_actions:
                raise StudyError(f"{study.path.name}: arm {run.arm!r}: {study.script.name} has no flag {token}")
        captured, args = io.StringIO(), None
        try:
            with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
                parser.parse_args(list(argv))
            args = resolve(list(argv)) if callable(resolve) else None
        except SystemExit as e:
            if e.code not in (0, None):
                message = _last_line(captured.getvalue()).split("error: ", 1)[-1]
                raise StudyError(f"{study.path.name}: arm {run.arm!r}: {study.script.name} rejects its flags: "
                                 f"{message}") from None
        except Exception as e:  # noqa: BLE001 (the script's own usage errors, whatever their class)
            raise StudyError(f"{study.path.name}: arm {run.arm!r}: {study.script.name} rejects its flags: "
                             f"{e}") from None
        if args is not None:
            resolved.append((run, args))
        init_from = _flag_value(run.flags, "--init-from")
        if init_from is not None and not Path(init_from).exists():
            raise StudyError(f"{study.path.name}: arm {run.arm!r} seed {run.seed}: --init-from {init_from} does not "
                             f"exist (run the study that writes it first, or point to it with --set)")
    check_data = getattr(module, "check_data", None)
    data_checked: set[tuple] = set()
    for run, args in resolved if data and callable(check_data) else ():  # after every flag: flags are named first
        inputs = tuple(getattr(args, key, None) for key in ("train_files", "val_files", "val_seq_len", "val_tokens"))
        if inputs not in data_checked:
            data_checked.add(inputs)
            try:
                check_data(args)
            except Exception as e:  # noqa: BLE001 (the script's own errors for bad shards, whatever their class)
                raise StudyError(f"{study.path.name}: arm {run.arm!r}: its data: {e}") from None
    return module


def _flag_value(argv: list[str], flag: str) -> str | None:
    for i, token in enumerate(argv[:-1]):
        if token == flag:
            return argv[i + 1]
    return None


def runner_flags(run: Run, runs_dir: Path) -> list[str]:
    """The flags the runner adds to every run's argv."""
    return ["--seed", str(run.seed), "--variant", run.arm,
            "--log-dir", str(Path(runs_dir) / run.study / run.arm), "--run-name", f"seed{run.seed}"]


def parse_seeds(text: str) -> list[int]:
    """--seeds 0,1,2 or 0-4 (at most MAX_SEEDS seeds, so that a slip such as 0-1000000000 is refused at once)."""
    seeds: list[int] = []
    for part in text.split(","):
        bounds = part.split("-", 1) if "-" in part.strip()[1:] else [part]
        try:
            low, high = int(bounds[0]), int(bounds[-1])
        except ValueError:
            raise StudyError(f"--seeds {text}: expected a list like 0,1,2 or a range like 0-4") from None
        if low < 0:  # the training scripts' own refusal would blame the study file
            raise StudyError(f"--seeds {text}: seed {low} is negative; seeds are 0 or more")
        if low > high:
            raise StudyError(f"--seeds {text}: range {part.strip()} runs backwards")
        if len(seeds) + high - low + 1 > MAX_SEEDS:
            raise StudyError(f"--seeds {text}: more than {MAX_SEEDS} seeds")
        repeated = sorted(set(seeds) & set(range(low, high + 1)))
        if repeated:
            raise StudyError(f"--seeds {text}: seed {repeated[0]} given twice; each seed runs once")
        seeds.extend(range(low, high + 1))
    return seeds


def parse_sets(items: list[str] | None) -> dict[str, str]:
    result = {}
    for item in items or []:
        if "=" not in item:
            raise StudyError(f"--set {item}: expected NAME=VALUE")
        key, value = item.split("=", 1)
        result[key.strip()] = value
    return result


def describe_run(run: Run) -> str:
    return f"{run.arm}/seed{run.seed}"
