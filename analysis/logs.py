"""Reading run logs: this project's format and upstream modded-nanogpt record logs (docs/log-format.md; the line
grammar and the sections a reader looks into are speedrun/logformat.py's). Here: which runs a log holds, whether each
finished, and how logs are found, grouped and counted once. Only whole lines that match the expected shapes count.
"""
from __future__ import annotations

import hashlib
import math
import multiprocessing
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from speedrun.logformat import (CONFIG_PREFIX, ENV_LINE, LLMC_LINE, SOURCE_HEADER, STEP_LINE, VAL_OR_SCALARS_LINE,  # noqa: F401
                                code_section, parse_json_object, parse_peak_line, split_sections, step_from_match)

from .runs import config_line_count, contradiction, pooled_trainings, run_identity

from .textfmt import one_line
from .tracks import track_of_run

# Logs the study runner set aside (`seed0.unfinished-<time>.txt`, `seed0.stale-<time>.txt`) never count.
_SET_ASIDE = re.compile(r"\.(?:unfinished|stale)-[^.]*\.txt$")
_SEED_IN_NAME = re.compile(r"seed[_-]?(\d+)$|^(\d+)$")

class LogUnreadable(Exception):
    """The file is not a run log (empty, binary, no separator line) or cannot be read."""


@dataclass
class ParsedLog:
    path: Path
    variant: str
    seed: int | str | None
    complete: bool
    upstream: bool  # no `config:` line: an upstream record log (or a log that stopped before its config)
    config: dict = field(default_factory=dict)
    env: dict = field(default_factory=dict)  # `key: value` lines of the environment section, values as text
    total_steps: int | None = None  # N of `step:s/N`
    final_step: int | None = None  # s of the last step line
    train_time_ms: float | None = None  # train_time of the last step line
    val_steps: list = field(default_factory=list)
    val_losses: list = field(default_factory=list)
    val_times_ms: list = field(default_factory=list)
    scalars: list = field(default_factory=list)  # [(step, {name: value})] in log order
    peak_allocated_mib: float | None = None
    peak_reserved_mib: float | None = None
    problem: str | None = None  # why the run is not complete; None when it is
    folder: str = ""  # the arm a log without config line belongs to: its folder, relative to the PATH given
    digest: str = ""  # of the log's bytes: two copies of one log are one run, whatever their names
    mtime_ns: int = 0  # of the log file: of several logs of one run the newest finished one counts
    not_a_run: bool = False  # its lines contradict each other (analysis/runs.py): named, never counted or resumed

    @property
    def diverged(self) -> bool:
        """A finished run whose final validation loss is nan or inf: a failed run, never a missing one."""
        return self.complete and not math.isfinite(self.final_val_loss)

    @property
    def final_val_loss(self) -> float | None:
        return self.val_losses[-1] if self.val_losses else None

    @property
    def train_time_s(self) -> float | None:
        return None if self.train_time_ms is None else self.train_time_ms / 1000.0

    @property
    def step_time_ms(self) -> float | None:
        if self.train_time_ms is None or not self.final_step:
            return None
        return self.train_time_ms / self.final_step

    @property
    def final_scalars(self) -> dict:
        return self.scalars[-1][1] if self.scalars else {}

    def setting(self, *keys: str):
        """The first of `keys` found in the config line, then in the `key: value` environment lines."""
        for key in keys:
            if key in self.config:
                return self.config[key]
        for key in keys:
            if key in self.env:
                return self.env[key]
        return None


@dataclass
class Unreadable:
    path: Path
    problem: str


@dataclass
class Duplicate(Unreadable):
    """A log of a run another log already holds (a copy, the same folder given twice): left out, so that no run is
    counted twice; `problem` says which log was kept."""
    kept: Path = None


class MixedTracks(ValueError):
    """An arm holds runs of both tracks: never pooled (the message names the arm and a log of each track)."""


def _seed_from_name(path: Path) -> int | str:
    match = _SEED_IN_NAME.search(path.stem)
    if match:
        return int(match.group(1) or match.group(2))
    return path.stem


def _last_step_line(steps: bytes):
    """The last full step line (validation or training) of the step region, as a StepLine, or None."""
    end = len(steps)
    while end > 0:
        start = steps.rfind(b"\nstep:", 0, end)
        if start < 0:
            return None
        line_end = steps.find(b"\n", start + 1)
        line_end = len(steps) if line_end < 0 else line_end
        match = STEP_LINE.match(steps, start + 1, line_end)
        if match:
            return step_from_match(match)
        end = start
    return None


def _last_nonempty_line(data: bytes) -> str:
    stripped = data.rstrip()
    start = stripped.rfind(b"\n") + 1
    return stripped[start:].decode("utf-8", errors="replace")


def _unsupported_reason(data: bytes) -> str:
    """Why a text file without a separator line is not read: named, so no file is passed over in silence."""
    if LLMC_LINE.search(data):
        return "unsupported format: llm.c log (its `s:STEP tel:LOSS` lines hold losses but no train time)"
    return "unsupported format: no line of 100 '=' (not a modded-nanogpt run log)"


def planned_last_step(run: ParsedLog) -> int | None:
    """The step a run plans to end at: N of `step:s/N`, or the config's `stop_after` (a run told to stop early
    validates and ends there)."""
    stop_after = run.config.get("stop_after")
    if isinstance(stop_after, int) and not isinstance(stop_after, bool) and stop_after > 0:
        return stop_after
    return run.total_steps


def _incomplete_reason(run: ParsedLog, has_peak_line: bool, config_ok: bool) -> str | None:
    """Why the run is not finished, or None when it is. Finished: a config line that is a JSON object (this
    project's logs), a final validation at the planned last step and no step line after it going back to an
    earlier step; for this project's logs (those with a config line) also the closing peak-memory line, whole.
    Upstream logs of 2024 end at their final validation line, before logs had a peak-memory line."""
    if not config_ok:
        return "its config line is not a JSON object: the log is damaged"
    if run.final_step is None:
        return "no step line: stopped before training"
    last = planned_last_step(run)
    if not run.val_steps or run.val_steps[-1] != last:
        if run.final_step == last:
            return "no final validation: the log stops after its last training step"
        return f"stopped at step {run.final_step}/{last}"
    if run.final_step != last:
        return (f"its steps go back to step {run.final_step} after the final validation at step {last}: "
                f"two runs written into one log")
    if not run.upstream and not has_peak_line:
        return "no peak-memory line after the final validation: the log was cut off"
    return None


def parse_log(path: str | os.PathLike) -> ParsedLog:
    """Parse one log file. Raises LogUnreadable when it is not a run log at all."""
    path = Path(path)
    try:
        data = path.read_bytes()
        mtime_ns = path.stat().st_mtime_ns
    except OSError as error:
        raise LogUnreadable(f"cannot be read ({error.strerror or error})") from None
    has_nul = b"\x00" in data
    if has_nul:  # a node that died mid-write can leave NUL-filled blocks in a text log: drop them
        data = data.replace(b"\x00", b"")
    if not data.strip():
        raise LogUnreadable("empty file" if not has_nul else "binary data (NUL bytes only)")
    if b"\r\n" in data:
        data = data.replace(b"\r\n", b"\n")
    data = b"\n" + data  # so a separator on the very first line is found like any other
    sections = split_sections(data)
    if sections is None:
        raise LogUnreadable("binary data, not a text log" if has_nul else _unsupported_reason(data))
    steps = sections.steps
    has_config = sections.config_json is not None
    parsed_config = parse_json_object(sections.config_json) if has_config else None
    config = parsed_config or {}
    env = {}
    for match in ENV_LINE.finditer(sections.environment):
        key = match.group(1).decode("ascii", errors="replace")
        if key != "config":
            env.setdefault(key, match.group(2).decode("utf-8", errors="replace"))

    run = ParsedLog(path=path, variant="", seed=None, complete=False, upstream=not has_config,
                 config=config, env=env, folder=path.parent.name or ".", digest=hashlib.blake2b(data).hexdigest(),
                 mtime_ns=mtime_ns)
    by_step = {}
    for match in VAL_OR_SCALARS_LINE.finditer(steps):
        step = int(match.group(1))
        if match.group(6) is None:
            line = step_from_match(match)
            by_step[step] = (line.val_loss, line.train_time_ms)
            run.total_steps = line.total
            continue
        values = parse_json_object(match.group(6))
        if values is not None:
            run.scalars.append((step, values))
    for step in sorted(by_step):  # a resumed log may repeat steps: the later line wins
        run.val_steps.append(step)
        run.val_losses.append(by_step[step][0])
        run.val_times_ms.append(by_step[step][1])
    last = _last_step_line(steps)
    if last:
        run.final_step, run.total_steps, run.train_time_ms = last.step, last.total, last.train_time_ms
    elif b"\nstep:" in steps and not has_config:
        raise LogUnreadable("unsupported format: its `step:` lines do not read "
                            "`step:S/N [val_loss:V ]train_time:T(ms|s) step_avg:Ams`")

    peak = parse_peak_line(_last_nonempty_line(steps))
    if peak:
        run.peak_allocated_mib, run.peak_reserved_mib = peak
    # A `config: ` line that is no JSON object (or too damaged to match the config pattern): a damaged log of ours
    config_ok = parsed_config is not None if has_config else f"\n{CONFIG_PREFIX}".encode() not in sections.environment
    code = code_section(data[1:]) or ""
    contradicted = contradiction(run, config_line_count(sections.environment),
                                 SOURCE_HEADER.search(code) is not None)
    run.not_a_run = contradicted is not None
    run.problem = contradicted or _incomplete_reason(run, peak is not None, config_ok)
    run.complete = run.problem is None

    variant = config.get("variant")
    run.variant = str(variant) if variant not in (None, "") else run.folder
    seed = config.get("seed")
    run.seed = seed if isinstance(seed, (int, str)) and not isinstance(seed, bool) else _seed_from_name(path)
    return run


def log_problem(path: str | os.PathLike) -> str | None:
    """Why the log at `path` is not a finished run (missing, unreadable, cut, damaged: the reasons of parse_log),
    or None when it is one. The one definition of "finished" that the study runner, `status` and every analysis
    command share: a log that is not finished is rerun by the runner and never counted by analysis."""
    return _parse_or_unreadable(Path(path)).problem


def natural_key(text: str):
    """Sort key putting 'L3' before 'L11' and ignoring case: digit runs compare as numbers."""
    return [(0, int(part), "") if part.isdigit() else (1, 0, part.casefold()) for part in re.split(r"(\d+)", text)]


LOG_PATTERNS = ("*.txt", "*.log")  # .log: llm.c baselines (`main.log`), named as unsupported rather than skipped
RUNNER_LOG = "runner.log"  # the study runner's progress lines in each study folder: never a run log


def _folder_key(root: Path | None, log: Path) -> str:
    """The arm of a log without config line: its folder relative to the folder PATH that found it (the PATH's
    own name for logs directly in it); for a log given as a file, its folder's name."""
    if root is None:
        return log.parent.name or Path.cwd().name
    relative = log.parent.relative_to(root)
    return relative.as_posix() if relative.parts else (root.resolve().name or str(root))


def find_logs(paths) -> list[tuple[Path, str]]:
    """(log file, arm folder key) for the logs named by `paths`: files as given, folders searched recursively for
    *.txt and *.log (in natural order of their paths). Two different folders never share a key: where they would
    (same-named folders under different PATHs), both are keyed by their path as given. Raises FileNotFoundError
    naming the first path that does not exist."""
    found: dict[Path, tuple[str, Path]] = {}
    seen: set[Path] = set()  # resolved: a file named twice (a folder given twice, or inside another PATH) is one log
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            # Whatever bears a log's name (a dangling symlink, a folder, a FIFO) is kept, to be named as unreadable
            # rather than passed over without a word.
            logs = (p for pattern in LOG_PATTERNS for p in path.rglob(pattern)
                    if not _SET_ASIDE.search(p.name) and p.name != RUNNER_LOG)
            candidates = [(log, path) for log in sorted(set(logs), key=lambda p: natural_key(str(p)))]
        elif path.exists() or path.is_symlink():
            candidates = [(path, None)]
        else:
            raise FileNotFoundError(str(raw))
        for log, root in candidates:
            resolved = log.resolve()
            if resolved not in seen:
                seen.add(resolved)
                found[log] = (_folder_key(root, log), log.parent)
    folders_of_key: dict[str, set] = {}
    for key, folder in found.values():
        folders_of_key.setdefault(key, set()).add(folder.resolve())
    return [(log, key if len(folders_of_key[key]) == 1 else folder.as_posix())
            for log, (key, folder) in found.items()]


def find_log_files(paths) -> list[Path]:
    """The log files named by `paths` (see find_logs)."""
    return [log for log, _ in find_logs(paths)]


def _parse_or_unreadable(path: Path):
    if path.is_symlink() and not path.exists():
        return Unreadable(path, f"dangling symlink: its target {os.readlink(path)} does not exist")
    # never opened: reading a FIFO would wait for a writer (a missing log is parse_log's "cannot be read")
    if path.exists() and not path.is_file():
        kind = "a folder" if path.is_dir() else "a FIFO" if path.is_fifo() else "not a regular file"
        return Unreadable(path, f"{kind}, not a log file")
    try:
        return parse_log(path)
    except LogUnreadable as error:
        return Unreadable(path, str(error))


def drop_duplicates(runs, by: str = "variant") -> tuple[list, list]:
    """(runs with each run once, in file order; a Duplicate for each other log of a run). Logs of one run
    (run_identity: a copy, a resumed copy, a rerun of the seed with the same config in another runs folder or on
    other hardware) are one sample: the newest finished log counts (by modification time, then path), else the
    newest log; the others are named. by="folder": arms are folders (one config run on two machines, say), so
    logs in different folders are different runs."""
    same_run: dict = {}
    for run in runs:
        same_run.setdefault((run_identity(run), run.folder if by == "folder" else None), []).append(run)
    kept, duplicates = set(), []
    for logs in same_run.values():
        keep = max(logs, key=lambda run: (run.complete, run.mtime_ns, natural_key(str(run.path))))
        kept.add(id(keep))
        duplicates += [Duplicate(other.path, f"another log of the run {keep.path} holds (same track, variant, seed "
                                             f"and config): one run is one sample, counted once as its newest "
                                             f"finished log", kept=keep.path)
                       for other in logs if other is not keep]
    return [run for run in runs if id(run) in kept], duplicates


def duplicate_warnings(unreadable) -> list[str]:
    """One warning per log left out as another log of a run (see drop_duplicates)."""
    return [f"{entry.path} is {entry.problem}" for entry in unreadable if isinstance(entry, Duplicate)]


# Below this many files one process is faster than starting workers.
_PARALLEL_MIN_FILES = 48


def load_runs(paths, jobs: int | None = None, by: str = "variant"):
    """Parse every log under `paths`. Returns (runs, unreadable), both in file order; `unreadable` ends with a
    Duplicate for each log of a run another log holds (each run counts once). Large sets are parsed by a process
    pool (`jobs` workers, default: the CPUs this process may use)."""
    logs = find_logs(paths)
    files = [log for log, _ in logs]
    if jobs is None:
        jobs = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    if jobs > 1 and len(files) >= _PARALLEL_MIN_FILES:
        # spawned workers: a fork of a process with other threads (torch's, a test runner's) can inherit a held lock
        with ProcessPoolExecutor(max_workers=jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            results = list(pool.map(_parse_or_unreadable, files, chunksize=max(1, len(files) // (jobs * 8))))
    else:
        results = [_parse_or_unreadable(path) for path in files]
    for result, (_, key) in zip(results, logs):
        if isinstance(result, ParsedLog):
            if result.config.get("variant") in (None, ""):  # no config variant: the arm is the folder
                result.variant = key
            result.variant = one_line(result.variant)  # a line break in it would break tables and reports
            result.folder = key
    not_runs = [Unreadable(r.path, r.problem) for r in results if isinstance(r, ParsedLog) and r.not_a_run]
    runs, duplicates = drop_duplicates([r for r in results if isinstance(r, ParsedLog) and not r.not_a_run], by)
    unreadable = [r for r in results if isinstance(r, Unreadable)] + not_runs
    return runs, unreadable + duplicates


def group_runs(runs, by: str = "variant", complete_only: bool = True) -> dict:
    """Runs grouped by variant (config line, else folder) or by folder (relative to the PATH given), in
    first-seen order. Raises MixedTracks when an arm would pool runs of both tracks."""
    groups: dict[str, list[ParsedLog]] = {}
    for run in runs:
        if complete_only and not run.complete:
            continue
        groups.setdefault(run.variant if by == "variant" else run.folder, []).append(run)
    for name, members in groups.items():
        tracks: dict[str, ParsedLog] = {}
        for run in members:
            tracks.setdefault(track_of_run(run), run)
        tracks.pop(None, None)
        if len(tracks) > 1:
            examples = "; ".join(f"{track}: {run.path}" for track, run in tracks.items())
            raise MixedTracks(f"arm '{name}' holds runs of both tracks ({examples}); their losses are never pooled: "
                              f"give each track's logs on their own")
    return groups


def planned_steps_warnings(groups: dict) -> list[str]:
    """What an arm pools that it should not: runs that planned different step counts (different trainings). One
    warning per arm. (Several logs of one seed with one config never reach here: drop_duplicates counts them once.)"""
    warnings = []
    for name, runs in groups.items():
        counts: dict = {}
        for run in runs:
            counts.setdefault(run.total_steps, []).append(run)
        if len(counts) < 2:
            continue
        usual = max(counts, key=lambda steps: len(counts[steps]))
        others = "; ".join(f"{steps} steps: {', '.join(r.path.name for r in members)}"
                           for steps, members in counts.items() if steps != usual)
        warnings.append(f"arm '{name}' pools runs that planned different step counts ({len(counts[usual])} of "
                        f"{len(runs)} planned {usual}; {others}); they are pooled as one arm: put runs of "
                        f"different step counts in separate folders or variants to compare like with like")
    return warnings


def attention_warnings(groups: dict) -> list[str]:
    """One warning per arm whose --base r18 runs ran another attention than FlashAttention-3, the kernel record #18
    was timed with: their losses compare with the record's, their train_time does not."""
    warnings = []
    for name, runs in groups.items():
        others = sorted({str(run.config.get("attention")) for run in runs
                         if run.config.get("base") == "r18" and run.config.get("attention") != "fa3"})
        if others:
            warnings.append(f"arm '{name}' ran --base r18 with attention {', '.join(others)}, not fa3: its train_time "
                            f"is comparable with upstream's only when fa3 ran (its losses are)")
    return warnings


def training_warnings(groups: dict) -> list[str]:
    """One warning per arm whose runs trained differently beyond their seed (analysis/runs.py: pooled_trainings),
    e.g. logs of an arm edited since some of its runs were made: stale runs pooled with current ones."""
    return [f"arm '{name}' {pooled}: runs made before an edit of the arm are stale; leave them out (the study "
            f"runner's --redo-stale redoes them)" for name, runs in groups.items()
            if (pooled := pooled_trainings(runs)) is not None]


def arm_warnings(groups: dict) -> list[str]:
    """Everything an arm's figures need said beside them (pooling problems, timings not comparable)."""
    return training_warnings(groups) + planned_steps_warnings(groups) + attention_warnings(groups)
