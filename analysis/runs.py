"""One definition of a run, for every command and for the study runner: what makes two logs one run (one sample),
and what makes a log no run at all.

Identity: the training a log did - its track, its seed and every config entry that changes the trajectory (the base,
the sizes, the schedule, every study flag), and the arm it was made for. Entries that only say where or how the run was made or watched (the log
folder, validation cadence, compilation, the kernel, the machine) make no other sample: a rerun of a seed that
differs only there is the same run. A study flag left at its "off" value and a study flag absent from the config line
are one thing (the single-file export writes only the studies it carries), so "off" entries are left out before
comparing.

A log is no run when its lines contradict each other: a log of this project's script without a config line (or with
two), or step lines that count to another number of steps than the config plans. Such a log is named once, with the
reason, by every command; the runner counts it as not done."""
from __future__ import annotations

import json
import re
from pathlib import Path

# Config entries that leave training alone, each with why. Every other entry (including any a later flag adds) is
# part of the run's identity: a new flag makes another sample until it is listed here.
NOT_TRAINING = {
    "log_dir": "where the log went",
    "run_name": "the log's file name",
    "resume": "the checkpoint a run continued from: a resumed run is the same run",
    "checkpoint_every": "how often a checkpoint is written",
    "save_final_checkpoint": "whether the last checkpoint is written",
    "profile_steps": "steps traced by the profiler",
    "val_every": "validation cadence: validation never changes the weights",
    "val_tokens": "validation size: validation never changes the weights",
    "compile": "compiled or eager: the same function",
    "warmup_steps": "kernel warm-up steps, undone before training starts",
    "coordinate_descent_tuning": "inductor kernel tuning: the same function",
    "attention": "the attention kernel: the same function",
    "world_size": "processes the global batch was split over",
    "device": "the machine kind",
    "params": "a count the run reports about itself",
}
# `variant` (the arm's name) stays in the identity: an arm is what a study named, and two arms never share a run.
# What a study flag holds when its study is off (speedrun/study.py flags default to these): equal to absent.
OFF_VALUES = (None, False, [], "")


def _is_off(value) -> bool:
    return any(value == off and type(value) is type(off) for off in OFF_VALUES)


def training_config(config: dict) -> dict:
    """The entries of a config line that make the run's trajectory, "off" study entries left out."""
    return {key: value for key, value in config.items() if key not in NOT_TRAINING and not _is_off(value)}


def run_identity(run):
    """What makes two logs one run, one sample: ("run", track, seed, training config) for this project's logs; for a
    log without a config line (upstream's) its arm and its bytes."""
    if run.upstream:
        return ("bytes", run.variant, run.digest)
    return ("run", str(run.config.get("track")), str(run.seed), json.dumps(training_config(run.config), sort_keys=True))


_CONFIG_LINE_START = re.compile(rb"^config: ", re.MULTILINE)
# Files the study runner keeps in a study folder: a log in <study>/<arm>/ beside them was written by this project's
# script through the runner, so it has a config line.
RUNNER_FILES = ("runner.log", "sequential.json")


def config_line_count(environment: bytes) -> int:
    return len(_CONFIG_LINE_START.findall(environment))


def written_by_runner(path: Path) -> bool:
    return any((path.parent.parent / name).is_file() for name in RUNNER_FILES)


def contradiction(run, config_lines: int, embeds_modules: bool) -> str | None:
    """Why a parsed log is no run (its lines contradict each other), or None. `config_lines`: config lines in its
    environment section; `embeds_modules`: it embeds this project's modules (so it is no upstream log)."""
    if config_lines > 1:
        return f"not a run: {config_lines} config lines (two runs written into one log, or an edited log)"
    if config_lines == 0 and run.final_step is not None and (embeds_modules or written_by_runner(run.path)):
        where = "it embeds this project's modules" if embeds_modules else "it sits in a study folder of the runner"
        return f"not a run: no config line, yet {where}: what it trained cannot be known"
    planned = run.config.get("num_iterations")
    if (isinstance(planned, int) and not isinstance(planned, bool) and run.total_steps is not None
            and run.total_steps != planned):
        return (f"not a run: its step lines count to {run.total_steps} steps, its config line plans {planned}: the "
                f"log contradicts itself")
    return None


def pooled_trainings(runs) -> str | None:
    """How one arm's runs pool more than one training (their training configs differ beyond the seed: runs made
    before an edit of the arm, stale, beside the current ones), as a phrase naming the first key that differs and a
    log of each side; None when they are one training. Such runs are no sample of one arm: no claim rests on them."""
    trainings: dict[str, list] = {}
    for run in runs:
        if not run.upstream:
            config = {k: v for k, v in training_config(run.config).items() if k != "seed"}
            trainings.setdefault(json.dumps(config, sort_keys=True), []).append(run)
    if len(trainings) < 2:
        return None
    (first_key, first_runs), (second_key, second_runs) = list(trainings.items())[:2]
    first, second = json.loads(first_key), json.loads(second_key)
    key = next(k for k in sorted(set(first) | set(second)) if first.get(k) != second.get(k))
    return (f"pools runs of {len(trainings)} different trainings ({key} {first.get(key)!r} in "
            f"{first_runs[0].path.name}, {second.get(key)!r} in {second_runs[0].path.name})")
