"""Command line: python -m ablations list|run|status|slurm|run-one ..."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

from speedrun.errors import OneLineErrorParser
from speedrun.logformat import study_value

from . import sequential_study
from .errors import StudyError
from .progress import Reporter
from .runstate import log_config, log_is_complete, not_a_run, read_lock_info, read_progress, run_paths, run_state
from .runner import Options, detect_gpus, launch_command, run_study
from .staleness import ConfigCheck
from .slurm import SlurmOptions, batch_script, nodes_for, write_batch_script
from .study import (Run, Study, check_flags, check_world_size, describe_studies, load_script, load_study, parse_seeds,
                    parse_sets, select_arms)


def _study_options(parser: argparse.ArgumentParser, arms: bool = True) -> None:
    parser.add_argument("study", help="a study name (ablations/<name>.toml) or a path to a study file")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"),
                        help="where logs go: <runs-dir>/<study>/<arm>/seed<k>.txt (default: runs)")
    parser.add_argument("--seeds", help="seeds instead of the study's own, e.g. 0,1,2 or 0-4")
    parser.add_argument("--set", action="append", metavar="NAME=VALUE",
                        help="override a variable of the study's [vars] table (repeatable)")
    if arms:
        parser.add_argument("--arms", nargs="+", metavar="ARM",
                            help="only these arms (names or shell patterns such as 'late-to-early-*')")


def make_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="python -m ablations", description="Run studies (arms x seeds of a training "
                                "script) resumably; see ablations/README.md")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=OneLineErrorParser)

    commands.add_parser("list", help="list the studies with their descriptions")

    run = commands.add_parser("run", help="run every (arm, seed) of a study that is not complete yet")
    _study_options(run)
    run.add_argument("--parallel", type=int, help="most runs at once (default: 1 on CPU; on GPUs as many as fit)")
    run.add_argument("--gpus", type=int, help="GPUs to use on this node (default: all that nvidia-smi or "
                                              "CUDA_VISIBLE_DEVICES show; 0 hides them: runs on the CPU)")
    _launch_options(run)
    run.add_argument("--dry-run", action="store_true", help="check the study and print the commands; run nothing")
    run.add_argument("--report", action="store_true",
                     help="afterwards write the study report with `python -m analysis report`")
    run.add_argument("--until-decided", action="store_true",
                     help="group-sequential: add seeds in batches (what the node runs at once) until every arm is "
                          "decided against the baseline (or its target: study key claim), family-wise alpha over the "
                          "arms (Holm; study key family = false: exploratory), t-calibrated alpha t^3 spending; study "
                          "key until_decided = true")
    run.add_argument("--max-seeds", type=int, metavar="N",
                     help="--until-decided: the most seeds per arm (default: study key max_seeds, else "
                          "--max-factor's)")
    run.add_argument("--max-factor", type=float, metavar="F",
                     help="--until-decided: the most seeds per arm as F times the study's seed count, the fixed-n "
                          "design's, to the nearest seed (instead of --max-seeds; study key max_factor; default 1.15, "
                          "analysis/sequential.py DEFAULT_MAX_FACTOR: power 0.8 after looks and futility)")
    run.add_argument("--alpha", type=float, help="--until-decided: type I error (default: study key alpha, 0.01)")
    run.add_argument("--progress-every", type=float, default=30.0, metavar="SECONDS",
                     help="step progress lines at most this often (validation steps always; default 30)")
    run.add_argument("--grace", type=float, default=15.0, metavar="SECONDS",
                     help="when stopped, how long runs get to exit before SIGKILL (default 15)")

    one = commands.add_parser("run-one", help="run a single (arm, seed) of a study (what each Slurm task calls)")
    one.add_argument("study")
    one.add_argument("arm")
    one.add_argument("seed", type=int)
    one.add_argument("--runs-dir", type=Path, default=Path("runs"))
    one.add_argument("--set", action="append", metavar="NAME=VALUE")
    one.add_argument("--gpus", type=int)
    _launch_options(one)
    one.add_argument("--nnodes", type=int, default=1, help="nodes the run spans (launched through srun)")
    one.add_argument("--rdzv-endpoint", metavar="HOST:PORT", help="torchrun rendezvous for --nnodes > 1")

    status = commands.add_parser("status", help="done / running / failed / to do, per arm")
    _study_options(status, arms=False)
    status.add_argument("--json", action="store_true", help="print one JSON object instead of the table")

    slurm = commands.add_parser("slurm", help="write a Slurm batch script (job array, one task per run)")
    _study_options(slurm)
    slurm.add_argument("-o", "--output", type=Path, help="script path (default: <runs-dir>/<study>/slurm.sbatch)")
    slurm.add_argument("--gpus-per-node", type=int, default=8)
    slurm.add_argument("--partition")
    slurm.add_argument("--account")
    slurm.add_argument("--time", help="time limit per task, e.g. 00:45:00 (default: the study's, else 01:00:00)")
    slurm.add_argument("--max-parallel", type=int, help="at most this many tasks at once (array throttle)")
    slurm.add_argument("--cpus-per-task", type=int)
    slurm.add_argument("--rdzv-port", type=int, default=29500)
    slurm.add_argument("--sbatch", action="append", default=[], metavar="OPTION",
                       help="another #SBATCH option, e.g. --sbatch=--qos=high (repeatable)")
    slurm.add_argument("--no-resume", action="store_true", help="tasks restart unfinished runs from scratch")
    slurm.add_argument("--nproc", type=int, help="processes (GPUs) per run instead of the study's nproc")
    return parser


def _launch_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=int, help="processes (GPUs) per run instead of the study's nproc")
    parser.add_argument("--launcher", choices=("torchrun", "python"),
                        help="torchrun (default) or plain python (single-process runs only)")
    parser.add_argument("--no-resume", action="store_true",
                        help="restart unfinished runs from scratch even when a checkpoint exists")
    parser.add_argument("--redo-stale", action="store_true",
                        help="complete runs made with other flags than the study now asks (it was edited): set "
                             "their logs aside and run them again (default: refuse to start)")


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    try:
        return {"list": cmd_list, "run": cmd_run, "run-one": cmd_run_one, "status": cmd_status,
                "slurm": cmd_slurm}[args.command](args)
    except StudyError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("ablations: interrupted", file=sys.stderr)
        return 130
    except OSError as e:  # read-only or deleted folders, a full disk: one line, never a traceback
        print(f"error: {os_problem(e)}", file=sys.stderr)
        return 2


def os_problem(error: OSError) -> str:
    """`path: reason` for an OSError (both paths of a failed rename)."""
    where = " -> ".join(str(name) for name in (error.filename, error.filename2) if name is not None)
    reason = error.strerror or str(error)
    return f"{where}: {reason}" if where else reason


def cmd_list(_args) -> int:
    rows = describe_studies()
    width = max((len(name) for name, _ in rows), default=0)
    for name, description in rows:
        print(f"  {name:<{width}}  {description}")
    return 0


def _load(args) -> Study:
    seeds = parse_seeds(args.seeds) if getattr(args, "seeds", None) else None
    return _with_nproc(load_study(args.study, parse_sets(args.set), seeds, args.runs_dir), args)


def _with_nproc(study: Study, args) -> Study:
    nproc = getattr(args, "nproc", None)
    if nproc is not None:
        if study.launcher == "python" and nproc != 1:
            study.launcher = "torchrun"  # several processes per run need torchrun
        check_world_size(nproc, study.launcher, "--nproc")
        study.nproc = nproc
    return study


def _gpu_ids(study: Study, requested: int | None, nnodes: int = 1) -> list[str]:
    found = detect_gpus()
    if requested is not None:
        if requested < 0:
            raise StudyError("--gpus must be 0 or more")
        found = (found + [str(i) for i in range(len(found), requested)])[:requested]
    if found and nnodes == 1 and study.nproc > len(found):
        raise StudyError(f"study {study.name} runs {study.nproc} processes per run but this node has "
                         f"{len(found)} GPU(s); use a bigger node, `--gpus 0` for CPU processes, or "
                         f"`python -m ablations slurm {study.name}`")
    return found


def _config_check(study: Study, runs, module, args) -> ConfigCheck:
    """Refuses, in one line, to start a study whose complete runs were made with other flags than it now asks,
    unless --redo-stale; the runner redoes those and never resumes a checkpoint made with other flags."""
    check = ConfigCheck(module, study, args.runs_dir)
    stale = [f"{run.arm}/seed{run.seed} was made with {difference}"
             for run, difference in stale_runs(runs, check, args.runs_dir)]
    if stale and not args.redo_stale:
        raise StudyError(f"{len(stale)} complete run(s) of study {study.name} differ from the study now "
                         f"({stale[0]}); pass --redo-stale to set their logs aside and run them again, or undo the "
                         f"edit")
    return check


def stale_runs(runs, check: ConfigCheck, runs_dir: Path) -> list:
    """(run, what differs) for each run whose complete log was made with other flags than the study now asks."""
    found = []
    for run in runs:
        log = run_paths(runs_dir, run.study, run.arm, run.seed).log
        difference = check.difference(run, log_config(log)) if log_is_complete(log) else None
        if difference is not None:
            found.append((run, difference))
    return found


def _options(args, study: Study, nnodes: int = 1) -> Options:
    if getattr(args, "parallel", None) is not None and args.parallel < 1:
        raise StudyError("--parallel must be at least 1")
    if not getattr(args, "grace", 0.0) >= 0:  # also refuses nan
        raise StudyError(f"--grace {args.grace:g}: seconds runs get to exit when stopped, 0 or more")
    if not getattr(args, "progress_every", 0.0) >= 0:
        raise StudyError(f"--progress-every {args.progress_every:g}: seconds between progress lines, 0 or more (0: "
                         f"every step)")
    launcher = args.launcher
    if launcher == "python" and study.nproc != 1:
        raise StudyError(f"--launcher python runs one process; study {study.name} needs {study.nproc}")
    return Options(runs_dir=args.runs_dir, launcher=launcher, gpu_ids=_gpu_ids(study, args.gpus, nnodes),
                   hide_gpus=args.gpus == 0,
                   parallel=getattr(args, "parallel", None), resume=not args.no_resume, nnodes=nnodes,
                   rdzv_endpoint=getattr(args, "rdzv_endpoint", None),
                   grace_s=getattr(args, "grace", 15.0), progress_every_s=getattr(args, "progress_every", 30.0))


def cmd_run(args) -> int:
    study = _load(args)
    sequential = args.until_decided or study.until_decided
    # one runner per sequential study, taken before its record or runs are read: a second runner reading what the
    # first is writing was refused for the wrong reason (runs of "another design": move them aside)
    study_lock = (sequential_study.hold_study_lock(args.runs_dir / study.name)
                  if sequential and not args.dry_run else None)
    try:
        return _run_study_command(args, study, sequential)
    finally:
        if study_lock is not None:
            os.close(study_lock)  # closing the fd lets go of the lock (a dead runner's goes with it)


def _run_study_command(args, study: Study, sequential: bool) -> int:
    if sequential:
        if args.arms:
            raise StudyError("--until-decided tests every arm of the study: leave out --arms")
        if args.seeds:
            raise StudyError("--until-decided chooses the seeds itself (0, 1, ... in batches, up to --max-seeds): "
                             "leave out --seeds")
        record = sequential_study.read_state(args.runs_dir / study.name / sequential_study.STATE_FILE)
        design = sequential_study.plan(study, _options(args, study), args.max_seeds, args.alpha, args.max_factor,
                                       record["design"] if record else None)
        study.seeds = list(range(design["max_seeds"]))
    elif args.max_seeds is not None or args.alpha is not None or args.max_factor is not None:
        raise StudyError("--max-seeds, --max-factor and --alpha belong to --until-decided")
    runs = study.runs(args.runs_dir, select_arms(study, args.arms))
    module = check_flags(study, runs, args.runs_dir, data=True)
    options = _options(args, study)
    check = ConfigCheck(module, study, args.runs_dir)
    if sequential:  # a record of another design, a damaged one or stale looks: refused before anything is written
        sequential_state = sequential_study.load_state(args.runs_dir / study.name / sequential_study.STATE_FILE,
                                                       design)
        stale_looks = sequential_study.stale_looks(sequential_state, study, args.runs_dir, check)
    if args.dry_run:
        if sequential:  # what the recorded looks leave to run
            for line in sequential_study.describe_state(sequential_state, stale_looks):
                print(f"sequential {line}")
            runs = sequential_study.runs_still_open(sequential_state, stale_looks, runs)
        from benchmarks.step_cost import study_cost_lines  # here: only a dry run imports torch for it
        for line in study_cost_lines(study, list(dict.fromkeys(run.arm for run in runs))):
            print(line)
        for run in runs:
            paths = run_paths(args.runs_dir, run.study, run.arm, run.seed)
            state = run_state(paths)
            if state == "done" and check.difference(run, log_config(paths.log)) is not None:
                state = "stale"
            resume = paths.checkpoint if options.resume and paths.checkpoint.exists() else None
            print(f"{state:<8} {' '.join(launch_command(study, run, options, resume))}")
        return 0
    options.config_check = _config_check(study, runs, module, args)
    if sequential:
        sequential_study.check_stale_looks(stale_looks, args.redo_stale)
    reporter = Reporter(study.name, args.runs_dir / study.name / "runner.log")
    reporter.line("begin", f"{study.path} - {study.description}")
    if sequential:
        code = sequential_study.run_until_decided(study, options, reporter, design, sequential_state, stale_looks)
    else:
        code = run_study(study, runs, _fixed_study_mark(options, study), reporter)
    if args.report and code < 128:
        # every log of every arm, not only those of --arms or of the study's seeds now: a stale run is no result of
        # the study now, whichever seed it is
        stale = [run_paths(args.runs_dir, run.study, run.arm, run.seed).log
                 for run, _ in stale_runs(logged_runs(study, args.runs_dir), options.config_check, args.runs_dir)]
        code = max(code, write_report(study, args.runs_dir, reporter, stale))
    return code


def logged_runs(study: Study, runs_dir: Path) -> list:
    """A Run for every seed log in the study's arm folders (seed<k>.txt), whichever seeds the study names now."""
    found = []
    for arm in study.arms:
        seeds = sorted(int(log.stem[4:]) for log in (Path(runs_dir) / study.name / arm).glob("seed*.txt")
                       if log.stem[4:].isdigit())
        found += [Run(study.name, arm, seed, study.argv(arm, seed, runs_dir)) for seed in seeds]
    return found


def write_report(study: Study, runs_dir: Path, reporter: Reporter, stale=()) -> int:
    """The analysis package's report of the study folder, when that package is installed."""
    folder = runs_dir / study.name
    if importlib.util.find_spec("analysis") is None:
        reporter.line("report", "skipped: the analysis package is not available here (python -m analysis)")
        return 0
    # Only the arms the study has now: the logs of a renamed or removed arm stay in the folder but are no arm of it;
    # and of those, the arms with a log (the report refuses an arm it has no log of).
    arms = ",".join(arm for arm in study.arms
                    if any(run_paths(runs_dir, study.name, arm, seed).log.exists() for seed in study.seeds))
    if not arms:
        reporter.line("report", "skipped: no arm of the study has a log yet")
        return 0
    exploratory = [] if study.family else ["--exploratory"]  # family = false: claims not family-controlled
    exploratory += [item for log in stale for item in ("--stale", str(log))]
    command = ["analysis", "report", str(folder), "--target", str(study.target), "--arms", arms, *exploratory]
    reporter.line("report", f"python -m {' '.join(command)}")
    result = subprocess.run([sys.executable, "-m", *command], check=False)
    if result.returncode != 0:
        reporter.line("report", f"failed with exit status {result.returncode}")
        return 1
    # The study's result in a few lines on the terminal (analysis/terminal.py), below the report's path.
    subprocess.run([sys.executable, "-m", "analysis.terminal", str(folder), "--target", str(study.target),
                    "--arms", arms, *exploratory], check=False)
    return 0


def cmd_run_one(args) -> int:
    study = _with_nproc(load_study(args.study, parse_sets(args.set), None, args.runs_dir), args)
    if args.arm not in study.arms:
        raise StudyError(f"study {study.name} has no arm {args.arm!r} (its arms: {', '.join(study.arms)})")
    if args.nnodes > 1 and not args.rdzv_endpoint:
        raise StudyError("--nnodes above 1 needs --rdzv-endpoint HOST:PORT")
    study.seeds = [args.seed]
    runs = study.runs(args.runs_dir, [args.arm])
    module = check_flags(study, runs, args.runs_dir, data=True)
    options = _options(args, study, nnodes=args.nnodes)
    options.wait_for_others = False
    options.config_check = _config_check(study, runs, module, args)
    reporter = Reporter(study.name, args.runs_dir / study.name / "runner.log")
    if not study.until_decided:  # a sequential study's runs carry its design only from its look loop
        options = _fixed_study_mark(options, study)
    return run_study(study, runs, options, reporter)


def _fixed_study_mark(options: Options, study: Study) -> Options:
    """Each run of a fixed-sample study carries every arm of the study into its log (speedrun.logformat.study_value):
    a copy of some arms' runs (the baseline and the best arm, say) is still Holm-adjusted over all of them."""
    return dataclasses.replace(options, study_mark=study_value(study.name, arms=study.arms))


STATES = (("done", "done"), ("stale", "stale"), ("running", "running"), ("failed", "failed"), ("todo", "to do"))


def study_status(study: Study, runs_dir: Path, check: ConfigCheck | None = None) -> dict:
    """Every run's state; with `check`, a complete run made with other flags than the study now asks is "stale"
    (what `run` refuses, or redoes with --redo-stale), not done."""
    arms = {}
    for arm in study.arms:
        entry = {state: [] for state, _ in STATES} | {"kept_aside": 0}
        for run in study.runs(runs_dir, [arm]):
            paths = run_paths(runs_dir, study.name, arm, run.seed)
            state = run_state(paths)
            if state == "done" and check is not None and check.difference(run, log_config(paths.log)) is not None:
                state = "stale"
            item: dict = {"seed": run.seed}
            if state == "running":
                progress = read_progress(paths.log)
                item.update(step=progress.step, total=progress.total, host=read_lock_info(paths).get("host"))
            elif state in ("failed", "todo"):
                item["not_a_run"] = not_a_run(paths.log)
            entry[state].append(item)
            entry["kept_aside"] += len(paths.kept_aside())
        arms[arm] = entry
    totals = {state: sum(len(a[state]) for a in arms.values()) for state, _ in STATES}
    return {"study": study.name, "folder": str(runs_dir / study.name), "runs": len(study.arms) * len(study.seeds),
            **totals, "arms": arms}


def cmd_status(args) -> int:
    study = _load(args)
    check = ConfigCheck(load_script(study.script), study, args.runs_dir)
    status = study_status(study, args.runs_dir, check)
    record = args.runs_dir / study.name / sequential_study.STATE_FILE
    try:
        status["sequential"] = sequential_study.read_state(record)
        sequential_lines = []
        if status["sequential"]:  # what `run` would refuse (a design the study file no longer asks), refused here
            sequential_study.check_design(record, status["sequential"]["design"],
                                          sequential_study.study_design(study, study.alpha))
            stale = sequential_study.stale_looks(status["sequential"], study, args.runs_dir, check)
            status["sequential"]["stale"] = stale
            sequential_lines = sequential_study.describe_state(status["sequential"], stale)
    except StudyError as problem:  # status still shows the runs
        status["sequential"] = {"problem": str(problem)}
        sequential_lines = [f"cannot be shown: {problem}"]
    if args.json:
        print(json.dumps(status))
        return 0
    print(f"{status['study']} ({status['folder']}): {status['runs']} runs: {status['done']} done, "
          + (f"{status['stale']} stale (made with other flags than the study now asks), " if status["stale"] else "")
          + f"{status['running']} running, {status['failed']} failed, {status['todo']} to do")
    width = max(len(arm) for arm in status["arms"])
    for arm, entry in status["arms"].items():
        parts = []
        for state, label in STATES:
            if entry[state]:
                seeds = " ".join(_seed_text(item) for item in entry[state])
                parts.append(f"{label}: {seeds}")
        if entry["kept_aside"]:
            parts.append(f"({entry['kept_aside']} unfinished log(s) kept aside)")
        print(f"  {arm:<{width}}  {'  '.join(parts)}")
    if sequential_lines:
        print(f"sequential ({record}): {sequential_lines[0]}")
        for line in sequential_lines[1:]:
            print(f"  {line}")
    return 0


def _seed_text(item: dict) -> str:
    text = f"seed{item['seed']}"
    if item.get("step") is not None:
        text += f" (step {item['step']}/{item['total']}" + (f" on {item['host']}" if item.get("host") else "") + ")"
    if item.get("not_a_run"):
        text += f" ({item['not_a_run']})"
    return text


def cmd_slurm(args) -> int:
    study = _load(args)
    runs = study.runs(args.runs_dir, select_arms(study, args.arms))
    check_flags(study, runs, args.runs_dir)
    options = SlurmOptions(gpus_per_node=args.gpus_per_node, partition=args.partition, account=args.account,
                           time_limit=args.time, max_parallel=args.max_parallel, cpus_per_task=args.cpus_per_task,
                           rdzv_port=args.rdzv_port, extra=args.sbatch)
    if options.gpus_per_node < 1:
        raise StudyError("--gpus-per-node must be at least 1")
    nodes_for(study, options)
    passed_on = [f"--set={item}" for item in args.set or []] + (["--no-resume"] if args.no_resume else []) \
        + ([f"--nproc={args.nproc}"] if args.nproc else [])
    text = batch_script(study, runs, args.runs_dir, options, passed_on)
    path = args.output or args.runs_dir / study.name / "slurm.sbatch"
    write_batch_script(path, text, (args.runs_dir / study.name / "slurm").resolve())
    print(f"wrote {path}: {len(runs)} array tasks; submit with: sbatch {path}")
    return 0
