"""The run log's line grammar, in one place: the builders the training scripts write lines with and the patterns and
parsers every reader uses (analysis, the study runner, the benchmarks, the tests' stand-in script). The format, with
an example of each line kind, is described in docs/log-format.md. No torch here: the readers must not load it.

A log is: the script's source and each project module it ran (under a `==> PATH <==` header), a separator line,
the environment lines (free text, `key: value` lines, the `config: {json}` line), a separator line, the step lines
(validation, scalars, training), and, for a finished run, the peak-memory line. Earlier upstream eras add a third
separator inside the environment section, write train_loss on step lines, train_time in seconds, or no peak line.
"""
from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass

SEPARATOR = "=" * 100
SEPARATOR_BYTES = SEPARATOR.encode()
_SEPARATOR_LINE = b"\n" + SEPARATOR_BYTES + b"\n"
CONFIG_PREFIX = "config: "
ADDED_PARAMS_PREFIX = "added_params: "
# The last line of every finished run of this project; the study runner counts a run done on it alone.
FINISHED_PREFIX = "peak memory allocated:"

# ----- builders (the writer: speedrun/runlog.py, speedrun/training.py, tests/fake_train.py) ------------------------


def source_header(path: str) -> str:
    """The line before an embedded project module's source; `path` relative to the repository (`speedrun/x.py`)."""
    return f"==> {path} <=="


def config_line(config: dict) -> str:
    return CONFIG_PREFIX + json.dumps(config, sort_keys=True)


# A run the study runner made says in its environment section which study it belongs to, so that it carries the
# study's claim rule wherever it is copied: for a sequential study (`run --until-decided`) the digest of its design
# (analysis.sequential.design_digest: no reader takes a fixed-sample claim from the runs without the study's record);
# for a fixed-sample study every arm of the study (the Holm family: a copy of a few arms is still adjusted over all
# of them). The runner hands the line's value to the script in this variable; logs made before it existed, and runs
# started by hand, lack the line.
STUDY_KEY = "study"
STUDY_VARIABLE = "SPEEDRUN_STUDY"


def study_value(study: str, design_digest: str | None = None, arms=None) -> str:
    """The line's value: a sequential study's `design_digest`, or a fixed study's `arms` (every one, baseline too)."""
    if (design_digest is None) == (arms is None):
        raise ValueError("a study's line holds its design digest (sequential) or its arms (fixed), one of them")
    return json.dumps({"study": study, **({"design_digest": design_digest} if design_digest is not None
                                          else {"arms": list(arms)})}, sort_keys=True)


def study_line(value: str) -> str:
    return f"{STUDY_KEY}: {value}"


def parse_study(value: str) -> dict | None:
    """{study, design_digest, arms} of a study line's value (design_digest for a sequential study, arms for a fixed
    one, the other None), or None when it does not read as one."""
    try:
        mark = json.loads(value)
    except ValueError:
        return None
    if not isinstance(mark, dict) or not (isinstance(mark.get("study"), str) and mark["study"]):
        return None
    digest, arms = mark.get("design_digest"), mark.get("arms")
    sequential = isinstance(digest, str) and digest and arms is None
    fixed = (digest is None and isinstance(arms, list) and arms
             and all(isinstance(arm, str) and arm for arm in arms) and len(set(arms)) == len(arms))
    if not (sequential or fixed):
        return None
    return {"study": mark["study"], "design_digest": digest, "arms": arms}


def added_params_line(added: dict) -> str:
    """Parameters each study adds to the model, by study, then their total."""
    return f"{ADDED_PARAMS_PREFIX}{json.dumps(added)} total {sum(added.values())}"


def _time_fields(step: int, train_ms: float) -> str:
    return f"train_time:{train_ms:.0f}ms step_avg:{train_ms / max(step, 1):.2f}ms"


def validation_line(step: int, total: int, val_loss: float, train_ms: float, decimals: int = 6) -> str:
    return f"step:{step}/{total} val_loss:{val_loss:.{decimals}f} {_time_fields(step, train_ms)}"


def train_step_line(step: int, total: int, train_ms: float) -> str:
    """After `step` optimiser steps, `train_ms` of training so far."""
    return f"step:{step}/{total} {_time_fields(step, train_ms)}"


def scalars_line(step: int, total: int, scalars: dict) -> str:
    return f"step:{step}/{total} scalars: {json.dumps(scalars)}"


def peak_line(allocated_mib: int, reserved_mib: int) -> str:
    return f"{FINISHED_PREFIX} {allocated_mib} MiB reserved: {reserved_mib} MiB"


# ----- patterns (bytes: analysis scans whole logs of hundreds of MB) ------------------------------------------------

# Every era: `step:s/N [val_loss:v ][train_loss:l ]train_time:T step_avg:Ams` (step_avg may be `nan`); T is in
# milliseconds (`123ms`) or, in some upstream logs, in seconds (`813.819s`). Groups: step, total, val_loss, T, unit.
_STEP_FIELDS = (rb"step:(\d+)/(\d+) (?:val_loss:([^ \n]+) )?(?:train_loss:[^ \n]+ )?"
                rb"train_time:(\d+(?:\.\d*)?)(ms|s) step_avg:[^ \n]*ms")
STEP_LINE = re.compile(rb"^" + _STEP_FIELDS + rb"[ \t]*$", re.MULTILINE)
# Validation and scalars lines in one pass; the leading newline is a literal prefix, so the regex engine jumps
# between candidate lines quickly. Groups: step, total, val_loss, T, unit, scalars JSON.
VAL_OR_SCALARS_LINE = re.compile(
    rb"\nstep:(\d+)/(\d+) (?:val_loss:([^ \n]+) (?:train_loss:[^ \n]+ )?"
    rb"train_time:(\d+(?:\.\d*)?)(ms|s) step_avg:[^ \n]*ms|scalars: (\{[^\n]*\}))[ \t]*(?=\n|$)"
)
_SCALARS_LINE = re.compile(rb"^step:(\d+)/(\d+) scalars: (\{[^\n]*\})[ \t]*$")
# llm.c logs (`main.log`): `s:STEP tel:LOSS` / `s:STEP trl:LOSS ...` lines, losses without any time.
LLMC_LINE = re.compile(rb"^s:\d+ t[er]l:", re.MULTILINE)
CONFIG_LINE = re.compile(rb"^config: (\{.*\})[ \t]*$", re.MULTILINE)
ENV_LINE = re.compile(rb"^([A-Za-z_][\w.\-]*): ([^\n]*?)[ \t]*$", re.MULTILINE)
# Ours and upstream since 2025: allocated + reserved; early upstream eras: `peak memory consumption: N MiB`.
_PEAK_LINE = re.compile(
    r"^peak memory (?:allocated: (\d+(?:\.\d+)?) MiB reserved: (\d+(?:\.\d+)?) MiB"
    r"|consumption: (\d+(?:\.\d+)?) MiB)\s*$"
)
_ADDED_PARAMS_LINE = re.compile(r"added_params: (\{.*\}) total (\d+)")
SOURCE_HEADER = re.compile(r"^==> ((?:speedrun|data)/[A-Za-z_][A-Za-z0-9_/]*\.py) <==$", re.MULTILINE)

# ----- parsers ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class StepLine:
    step: int
    total: int
    val_loss: float | None  # None on a training line; nan where the text is no number
    train_time_ms: float


def parse_float(text: bytes) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def milliseconds(value: bytes, unit: bytes) -> float:
    return float(value) * (1000.0 if unit == b"s" else 1.0)


def _as_bytes(line: str | bytes) -> bytes:
    return line.encode("utf-8", "replace") if isinstance(line, str) else line


def step_from_match(match) -> StepLine:
    """A StepLine from a match of STEP_LINE (or of VAL_OR_SCALARS_LINE's validation branch)."""
    val_loss = None if match.group(3) is None else parse_float(match.group(3))
    return StepLine(int(match.group(1)), int(match.group(2)), val_loss, milliseconds(match.group(4), match.group(5)))


def parse_step_line(line: str | bytes) -> StepLine | None:
    """A validation or training step line of any era, or None when `line` is not one."""
    match = STEP_LINE.fullmatch(_as_bytes(line).rstrip(b"\r\n"))
    return step_from_match(match) if match else None


def parse_scalars_line(line: str | bytes) -> tuple[int, dict] | None:
    """(step, {name: value}) of a scalars line, or None when `line` is not one (or its JSON is no object)."""
    match = _SCALARS_LINE.fullmatch(_as_bytes(line).rstrip(b"\r\n"))
    if not match:
        return None
    try:
        values = json.loads(match.group(3))
    except (ValueError, UnicodeDecodeError):
        return None
    return (int(match.group(1)), values) if isinstance(values, dict) else None


def parse_json_object(text: bytes | str) -> dict | None:
    """The config line's JSON as a table; None when it is no JSON object."""
    try:
        parsed = json.loads(text)
    except (ValueError, UnicodeDecodeError):
        return None
    return parsed if isinstance(parsed, dict) else None


def parse_added_params(line: str) -> tuple[dict, int] | None:
    """({study: parameters it adds}, total) of an added_params line, or None when `line` is not one."""
    match = _ADDED_PARAMS_LINE.fullmatch(line.rstrip("\r\n"))
    if not match:
        return None
    added = parse_json_object(match.group(1))
    return None if added is None else (added, int(match.group(2)))


def parse_peak_line(line: str) -> tuple[float, float | None] | None:
    """(allocated MiB, reserved MiB or None for the early upstream `consumption` form), or None."""
    match = _PEAK_LINE.match(line)
    if not match:
        return None
    if match.group(3) is not None:
        return float(match.group(3)), None
    return float(match.group(1)), float(match.group(2))


def is_finished_line(line: str | None) -> bool:
    """Whether `line`, the last non-empty line of a log of this project, says the run finished."""
    return line is not None and line.startswith(FINISHED_PREFIX)


# ----- sections ----------------------------------------------------------------------------------------------------


def last_two_separators(data: bytes) -> tuple[int, int]:
    """Offsets of the last two separator lines of `data` (each with the newline before it, so `data` should start
    with a newline); -1 where there is none."""
    last = data.rfind(_SEPARATOR_LINE)
    if last < 0:
        return -1, -1
    return last, data.rfind(_SEPARATOR_LINE, 0, last + 1)  # + 1: two separator lines in a row share a newline


@dataclass
class Sections:
    """The parts of a log that readers look into. The source at the top may hold text that looks like step,
    config or peak lines, so those are only read here: step lines after the LAST separator, the config and
    `key: value` lines between the last two separators (after the last one when the log stops inside the
    environment section)."""
    steps: bytes  # from the newline before the first line after the last separator to the end
    environment: bytes
    config_json: bytes | None  # the config line's JSON text; None when the log has no config line


def split_sections(data: bytes) -> Sections | None:
    """The Sections of a log's bytes (newline-normalised, starting with a newline); None without a separator."""
    last, previous = last_two_separators(data)
    if last < 0:
        return None
    step_start = last + len(_SEPARATOR_LINE) - 1  # keep the newline: step patterns start with "\n"
    env_start = previous + len(_SEPARATOR_LINE) if previous >= 0 else step_start
    steps = data[step_start:]
    environment, config_match = steps, None
    if b"\nstep:" not in steps:
        for config_match in CONFIG_LINE.finditer(steps):
            pass
    if config_match is None and env_start < step_start:
        environment = data[env_start:step_start]
        for config_match in CONFIG_LINE.finditer(environment):
            pass  # the last one: a well-formed section holds exactly one
    return Sections(steps, environment, config_match.group(1) if config_match else None)


def code_section(data: bytes) -> str | None:
    """The source at the top of a log: everything before the separator that opens the environment section (the
    second-to-last separator line), or None when the log has fewer than two."""
    data = b"\n" + data
    _, previous = last_two_separators(data)
    if previous < 0:
        return None
    return data[1:previous + 1].decode("utf-8", errors="replace")


def split_sources(code: str) -> tuple[str, dict[str, str]]:
    """(the script's source, {module path: source}) of a log's code section."""
    headers = list(SOURCE_HEADER.finditer(code))
    if not headers:
        return code, {}
    modules = {}
    for header, following in zip(headers, headers[1:] + [None]):
        end = following.start() if following else len(code)
        modules[header.group(1)] = code[header.end() + 1:end]
    return code[:headers[0].start()], modules


def changed_source(code: str, root, script_name: str) -> str | None:
    """The first file of a log's code section (the script, as script_name, then each embedded module) whose text
    differs from the file under `root` (a checkout), as a path relative to it; None when every one is the same."""
    script, modules = split_sources(code)
    for path, text in [(script_name, script), *modules.items()]:
        file = root / path
        if not file.is_file() or file.read_text().rstrip("\n") != text.rstrip("\n"):
            return path
    return None


def read_config(data: bytes) -> dict | None:
    """The config of a log's bytes, or None when it has no config line (yet) or its JSON is no object."""
    data = b"\n" + data.replace(b"\r\n", b"\n")
    sections = split_sections(data)
    if sections is None or sections.config_json is None:
        return None
    return parse_json_object(sections.config_json)
