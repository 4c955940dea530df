"""Group-sequential studies (`--until-decided`): seeds are added in batches until every arm is decided.

A batch is what the node runs at once (the runner's slots), shared by the arms: each look adds
max(1, slots // arms) seeds per arm. After each batch every undecided arm is tested (analysis/sequential.py):
against the baseline (two-sided Welch, claim "vs-baseline") or its mean against the study's target (one-sided,
claim "below-target"). A decided arm (efficacy or futility) gets no more seeds. The looks are recorded in
runs/<study>/sequential.json, written atomically after each one; a resumed study replays the recorded looks and
never takes a look again, so its decisions never depend on a different history. Each look also records what the
study asked of the arm's (and the baseline's) runs then: after an edit, the looks of an arm whose runs are no longer
those the study asks for are stale; `run --redo-stale` moves them to the record's "dropped" entry and the arm is
looked at afresh on its redone runs."""
from __future__ import annotations

import dataclasses
import errno
import fcntl
import json
import math
import os
import re
import socket
from pathlib import Path

from speedrun.logformat import study_value

from .errors import StudyError
from .runstate import log_config, log_is_complete, run_paths
from .runner import Options, run_study
from .staleness import ConfigCheck
from .study import Run, Study

STATE_FILE = "sequential.json"
# flock()ed by the one runner of a sequential study: the kernel lets go when that runner dies, however it dies
LOCK_FILE = "sequential.lock"
# The boundaries' kind: a record of another rule (the normal boundaries before t-calibration) is never resumed
RULE = "t-calibrated power spending (rho 3), Holm family"


def batch_seeds(study: Study, options: Options) -> int:
    slots = options.parallel or (len(options.gpu_ids) // study.nproc if options.gpu_ids else 1)
    return max(1, slots // len(study.arms))


def plan(study: Study, options: Options, max_seeds: int | None, alpha: float | None,
         max_factor: float | None = None, recorded: dict | None = None) -> dict:
    """The design of a sequential study, checked: StudyError (one line, exit 2) on bad input. The most seeds per
    arm: `max_seeds`, or `max_factor` times the study's seed count (its fixed-n design), else the study's keys of
    the same names, else DEFAULT_MAX_FACTOR times its seed count. `recorded`: the design of the study's record; a
    maximum the same request gave before the rule changed (no factor: the seed count; a factor: rounded up) is
    kept, so a study started then resumes with the boundaries it was looked at with."""
    from analysis.sequential import DEFAULT_MAX_FACTOR, sequential_max_seeds  # the analysis package sits next door

    alpha = study.alpha if alpha is None else alpha
    if max_seeds is not None and max_factor is not None:
        raise StudyError("--max-seeds and --max-factor both set the most seeds per arm: give one")
    if max_seeds is None and max_factor is None:
        max_seeds, max_factor = study.max_seeds, study.max_factor
    seeds = len(study.seeds)
    earlier_rule = None  # (max_seeds, max_factor) the same request planned before
    if max_seeds is None and max_factor is None:
        earlier_rule, max_factor = (seeds, 1.0), DEFAULT_MAX_FACTOR
    if not 0 < alpha < 1:
        raise StudyError(f"--until-decided: alpha {alpha:g} is not strictly between 0 and 1")
    if max_factor is not None:
        if not 1 <= max_factor < math.inf:
            raise StudyError(f"--max-factor {max_factor:g} is not a number of at least 1 (the most seeds per arm "
                             f"over the study's {seeds} seeds of the fixed-n design)")
        max_seeds = sequential_max_seeds(seeds, max_factor)
        earlier_rule = earlier_rule or (math.ceil(max_factor * seeds - 1e-9), max_factor)
    if recorded is not None and (recorded.get("max_seeds"), recorded.get("max_factor", 1.0)) == earlier_rule:
        max_seeds, max_factor = earlier_rule
    batch = batch_seeds(study, options)
    if max_seeds < max(2, batch):
        raise StudyError(f"at most {max_seeds} seeds per arm is below one batch ({max(2, batch)} seeds per arm: "
                         f"the node runs {batch} per arm at once, and a test needs 2)")
    return {"max_seeds": max_seeds, "max_factor": max_factor or 1.0, "batch": batch} | study_design(study, alpha)


def study_design(study: Study, alpha: float) -> dict:
    """The keys of a sequential design the study file sets (whatever node runs it): claim, alpha, baseline, target,
    tested arms, family."""
    arms = list(study.arms)
    baseline = None
    if study.claim == "vs-baseline":
        if len(arms) < 2:
            raise StudyError(f"--until-decided: study {study.name} has one arm; testing against a baseline needs "
                             f"two (or claim = \"below-target\")")
        baseline = "baseline" if "baseline" in arms else arms[0]
    tested = [arm for arm in arms if arm != baseline]
    return {"alpha": alpha, "claim": study.claim, "baseline": baseline,
            "target": study.target if study.claim == "below-target" else None,
            "arms": tested, "family": study.family, "family_size": len(tested) if study.family else 1, "rule": RULE}


def _design(design: dict):
    from analysis.sequential import Design

    return Design(alpha=design["alpha"], max_seeds=design["max_seeds"], batch=design["batch"],
                  sides=2 if design["claim"] == "vs-baseline" else 1, max_factor=design["max_factor"],
                  family_size=design.get("family_size", 1))


def _losses(runs_dir: Path, study: str, arm: str, seeds: int) -> list[float]:
    from analysis.logs import LogUnreadable, parse_log

    losses = []
    for seed in range(seeds):
        try:
            log = parse_log(run_paths(runs_dir, study, arm, seed).log)
        except (LogUnreadable, OSError):
            continue
        if log.complete:
            losses.append(log.final_val_loss)
    return losses


def read_state(path: Path) -> dict | None:
    """The recorded design and looks of a sequential study (None when it has none); StudyError when the file is
    not one this runner wrote: the check every reader shares (analysis/sequential.py: read_record)."""
    from analysis.sequential import read_record
    from speedrun.errors import UsageError

    try:
        state = read_record(path)
    except UsageError as problem:
        raise StudyError(f"{problem} to start the sequential study afresh") from None
    if state is not None:
        state["design"].setdefault("max_factor", 1.0)  # records written before the key existed: the factor was 1
    return state


def hold_study_lock(folder: Path) -> int:
    """Takes the study's runner lock (an fd this process keeps until it exits) or refuses in one line when another
    runner holds it: two runners of one sequential study would take looks at one record with two designs."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_FILE
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as error:
        os.close(fd)
        if error.errno not in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise
        holder = path.read_text(errors="replace").strip() or "another process"
        raise StudyError(f"another runner runs the sequential study in {folder} ({holder}): one runner per "
                         f"sequential study; this one starts nothing") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)
    return fd


def arm_config(check: ConfigCheck, study: Study, runs_dir: Path, arm: str) -> dict:
    """What the study asks of an arm's runs (the script's parsed flags, seed aside, and its track): recorded with
    each look, so that a look at runs of an arm since edited is known as stale."""
    expected = {dest: value for dest, value in check.expected(_run(study, runs_dir, arm, 0)).items() if dest != "seed"}
    return expected | ({"track": check.track} if check.track is not None else {})


def _run(study: Study, runs_dir: Path, arm: str, seed: int) -> Run:
    return Run(study.name, arm, seed, study.argv(arm, seed, runs_dir))


def _runs_difference(check: ConfigCheck, study: Study, runs_dir: Path, arm: str, recorded: dict | None,
                     seeds: int) -> str | None:
    """How the runs a look of `arm` saw differ from what the study asks now: the config recorded with the look,
    then the complete logs of its seeds (records written before looks held a config), then a log it counted that
    is gone or unfinished now (deleted, or a run started again); None when they agree."""
    logs = {seed: run_paths(runs_dir, study.name, arm, seed).log for seed in range(seeds)}
    logged = (check.difference(_run(study, runs_dir, arm, seed), log_config(log)) for seed, log in logs.items()
              if log_is_complete(log))
    difference = check.difference(_run(study, runs_dir, arm, 0), recorded) or next(filter(None, logged), None)
    if difference is not None:
        return f"{arm}'s runs were made with {difference}"
    lost = next((log for log in logs.values() if not log_is_complete(log)), None)
    if lost is not None:
        return f"the look counted {lost}, which is {'unfinished' if lost.exists() else 'missing'} now"
    return None


def stale_looks(state: dict, study: Study, runs_dir: Path, check: ConfigCheck) -> dict[str, str]:
    """arm -> why its recorded looks are of runs the study no longer asks for (the arm or the baseline edited)."""
    design = state["design"]
    stale = {}
    for arm in design["arms"]:
        if not state["looks"][arm]:
            continue
        last = state["looks"][arm][-1]
        reason = _runs_difference(check, study, runs_dir, arm, last.get("config"), last["n"])
        if reason is None and design["baseline"] and last.get("n_baseline"):
            reason = _runs_difference(check, study, runs_dir, design["baseline"], last.get("baseline_config"),
                                      last["n_baseline"])
        if reason is not None:
            stale[arm] = reason
    return stale


def check_stale_looks(stale: dict[str, str], redo_stale: bool) -> None:
    """Refuses (one line) to replay looks of runs the study no longer asks for, unless --redo-stale drops them."""
    if stale and not redo_stale:
        arm, reason = next(iter(stale.items()))
        raise StudyError(f"the sequential looks of {len(stale)} arm(s) are stale ({arm}: {reason}); pass "
                         f"--redo-stale to drop them, redo the runs and look again, or undo the edit")


def load_state(path: Path, design: dict) -> dict:
    state = read_state(path)
    if state is None:
        state = {"design": design, "looks": {arm: [] for arm in design["arms"]}}
    else:
        check_design(path, state["design"], design)
    check_runs_design(path.parent, state)
    return state


_SEED_LOG = re.compile(r"seed\d+\.txt")


def check_runs_design(folder: Path, state: dict) -> None:
    """Refuses (one line) to look at runs made for another sequential design (their logs' study line):
    a record moved aside and the study started afresh with other settings would count them, and every analysis
    command then refuses the claims (analysis.claims.find_study_record), since those runs were looked at under the
    other design."""
    from analysis.claims import sequential_marks
    from analysis.logs import LogUnreadable, parse_log
    from analysis.sequential import design_digest
    from speedrun.errors import UsageError

    design = state["design"]
    ours = (folder.name, design_digest(design))
    for arm in [*([design["baseline"]] if design.get("baseline") else []), *design["arms"]]:
        for log in sorted((folder / arm).glob("seed*.txt")):
            if not _SEED_LOG.fullmatch(log.name):
                continue  # a log set aside (unfinished, stale): never counted
            try:
                marks = sequential_marks([parse_log(log)])
            except (LogUnreadable, OSError):
                continue
            except UsageError as problem:
                raise StudyError(str(problem)) from None
            other = next((mark for mark in marks if mark != ours), None)
            if other is not None:
                raise StudyError(f"{log} was made for sequential study {other[0]} under design {other[1]}, not this "
                                 f"one ({ours[1]}): its looks belong to that design's record; restore that record "
                                 f"(and its settings), or move the runs aside to start afresh")


def check_design(path: Path, recorded: dict, design: dict) -> None:
    """Refuses (one line) a record whose design differs from `design` in any key `design` holds."""
    changed = next((key for key in sorted(design) if design.get(key) != recorded.get(key)), None)
    if changed is not None:
        raise StudyError(f"{path} records looks of another design ({changed} {recorded.get(changed)!r}, now "
                         f"{design.get(changed)!r}); run with the same settings, or move the file aside to start "
                         f"the sequential study afresh")


def _save_state(path: Path, state: dict) -> None:
    from analysis.atomic import write_text_atomically
    from analysis.sequential import design_digest

    state["design_digest"] = design_digest(state["design"])
    write_text_atomically(path, json.dumps(state, indent=1) + "\n")


def describe_design(design: dict) -> str:
    """One line: the claim, the spending design, the maximum and the looks, the futility rule."""
    from analysis.sequential import family_phrase, look_counts

    rule = _design(design)
    factor = f" ({design['max_factor']:g} x the fixed-n design's seeds)" if design["max_factor"] != 1 else ""
    looks = ",".join(map(str, look_counts(design["max_seeds"], design["batch"])))
    against = f" against {design['baseline']}" if design["baseline"] else f" mean < {design['target']:g}"
    return (f"group-sequential, claim {design['claim']}{against}: {family_phrase(design)}; alpha t^3 spending, "
            f"t-calibrated boundaries, up to {design['max_seeds']} seeds per arm{factor} in looks at {looks}; futility: "
            f"conditional power under the effect the fixed-n design detects with power {rule.design_power:g} < "
            f"{rule.futility_power:g}")


def describe_state(state: dict, stale: dict[str, str] | None = None) -> list[str]:
    """What `status` shows of a sequential study: its design, and each arm's last look (its decision, p-value and,
    once decided, adjusted p) or that it has none yet; a stale look says so and why."""
    from analysis.sequential import describe_look

    design = state["design"]
    lines = [describe_design(design)]
    for arm in design["arms"]:
        looks = state["looks"][arm]
        line = describe_look(arm, looks[-1], design) if looks else f"{arm}: no look yet"
        if arm in (stale or {}):
            line = (f"STALE {line} ({stale[arm]}; `run --until-decided --redo-stale` drops this look and redoes the "
                    f"runs)")
        lines.append(line)
    return lines + [verdict_line(state, stale)]


def runs_still_open(state: dict, stale: dict[str, str], runs: list[Run]) -> list[Run]:
    """The runs a sequential study may still start or count: an arm decided by a look that is not stale needs no
    seed beyond that look's, and once every tested arm is, the baseline needs none beyond the looks' either."""
    from analysis.sequential import decided

    last = {arm: looks[-1] for arm, looks in state["looks"].items() if looks and arm not in stale}
    seeds_needed = {arm: look["n"] for arm, look in last.items() if decided(look)}
    baseline = state["design"]["baseline"]
    if baseline and len(seeds_needed) == len(state["design"]["arms"]):
        seeds_needed[baseline] = max((look.get("n_baseline", 0) for look in last.values()), default=0)
    return [run for run in runs if run.seed < seeds_needed.get(run.arm, math.inf)]


def run_until_decided(study: Study, options: Options, reporter, design: dict, state: dict,
                      stale: dict[str, str]) -> int:
    """Runs the batches and takes the looks; `state` is the record read by load_state, `stale` its arms whose looks
    are of runs the study no longer asks for (check_stale_looks let them through: they are dropped here)."""
    from analysis.sequential import decided, describe_look, design_digest, look_counts, take_look

    state_path = options.runs_dir / study.name / STATE_FILE
    for leftover in state_path.parent.glob(f".{STATE_FILE}.*.tmp"):
        leftover.unlink(missing_ok=True)  # a record's write killed before its rename (analysis/atomic.py's name)
    check = options.config_check
    # every run of the study carries the study and its design into its log (read by analysis.claims): copied
    # without this record, the runs still refuse a fixed-sample claim
    options = dataclasses.replace(options, study_mark=study_value(study.name,
                                                                  design_digest=design_digest(state["design"])))
    state["study"] = study.name  # two studies of one design (arms, alpha, seeds) differ in their runs' flags
    sequential_design = _design(design)
    final_boundary = sequential_design.final_boundary()
    schedule = look_counts(design["max_seeds"], design["batch"])
    reporter.line("design", describe_design(design))
    for arm, reason in stale.items():
        dropped = state["looks"][arm]
        state.setdefault("dropped", {}).setdefault(arm, []).extend(dict(look, dropped_because=reason)
                                                                    for look in dropped)
        state["looks"][arm] = []
        _save_state(state_path, state)
        reporter.line("dropped", f"{arm}: {len(dropped)} stale look(s) ({reason}) moved to the record's "
                                 f"\"dropped\"; its runs are redone and looked at afresh")
    for arm, looks in state["looks"].items():
        for look in looks:
            reporter.line("replayed", describe_look(arm, look, design))
    for seeds in schedule:
        open_arms = [arm for arm in design["arms"] if not (state["looks"][arm] and decided(state["looks"][arm][-1]))]
        if not open_arms:
            break
        taken = [arm for arm in open_arms if state["looks"][arm] and state["looks"][arm][-1]["n"] >= seeds]
        arms = ([design["baseline"]] if design["baseline"] else []) + open_arms
        study.seeds = list(range(seeds))
        code = run_study(study, study.runs(options.runs_dir, arms), options, reporter)
        if code:
            return code  # failed or interrupted: never look at a batch with runs missing
        baseline_losses = (_losses(options.runs_dir, study.name, design["baseline"], seeds)
                           if design["baseline"] else None)
        for arm in open_arms:
            if arm in taken:
                continue
            look = take_look(sequential_design, state["looks"][arm], _losses(options.runs_dir, study.name, arm, seeds),
                             baseline_losses, design["target"], final_boundary)
            if look is None:
                continue
            if check is not None:
                look["config"] = arm_config(check, study, options.runs_dir, arm)
                if design["baseline"]:
                    look["baseline_config"] = arm_config(check, study, options.runs_dir, design["baseline"])
            state["looks"][arm].append(look)
            _save_state(state_path, state)
            reporter.line("look", describe_look(arm, look, design))
    undecided = [arm for arm in design["arms"] if not (state["looks"][arm] and decided(state["looks"][arm][-1]))]
    reporter.line("decided", verdict_line(state))
    return 1 if undecided else 0


def verdict_line(state: dict, stale: dict[str, str] | None = None) -> str:
    """The study's verdicts in one line: the family, then per arm its claim (or why none) and p-values. A stale
    look (`stale`: of runs the study no longer asks for) is no evidence: its arm has no claim and enters the family
    as an arm not yet looked at."""
    from analysis.sequential import family_phrase, study_verdicts, verdict_text

    stale = stale or {}
    current = dict(state, looks={arm: [] if arm in stale else looks for arm, looks in state["looks"].items()})
    return family_phrase(state["design"]) + ": " + "; ".join(
        f"{arm}: no claim (stale look)" if arm in stale else verdict_text(arm, v)
        for arm, v in study_verdicts(current).items())
