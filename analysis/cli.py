"""Command line: python -m analysis summarize|compare|record-check|plot|report|record ...

Bad input ends with one line on stderr naming the problem and exit status 2."""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import re
import sys
from pathlib import Path

from speedrun.errors import OneLineErrorParser, UsageError

from .atomic import write_text_atomically
from .compare import compare_arms, render_compare
from .logs import MixedTracks, Unreadable, arm_warnings, group_runs, load_runs
from . import power
from .record import RecordError, package_record
from .claims import arm_claims, find_study_record, record_claim, target_untested
from .sequential import (AFTER_LOOKING, DEFAULT_MAX_FACTOR, family_phrase, sequential_max_seeds, study_verdicts,
                         verdict_text)
from .record_check import record_check, render_record_check
from .studies import render_resource_table
from .summary import summarize
from .textfmt import num, pval, table
from .tracks import TARGETS, base_record_of, track_of
from .upstream_records import RECORDS_TABLE, RecordsTableError, find_record, load_records


# ----------------------------------------------------------------------------------------------- argument types

def _number(text: str, check, what: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not math.isfinite(value) or not check(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}")
    return value


def positive_float(text):
    return _number(text, lambda v: v > 0, "a positive number")


def probability(text):
    return _number(text, lambda v: 0 < v < 1, "strictly between 0 and 1")


def positive_int(text):
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive integer")
    return value


def at_least_one(text):
    return _number(text, lambda v: v >= 1, "a number of at least 1")


def at_least_two(text):
    value = positive_int(text)
    if value < 2:
        raise argparse.ArgumentTypeError(f"{text!r} is below 2")
    return value


def iso_date(text):
    try:
        return datetime.date.fromisoformat(text).isoformat()
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a date YYYY-MM-DD") from None


def record_name(text):
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", text):
        raise argparse.ArgumentTypeError(f"{text!r}: use letters, digits, '_', '-', '.'")
    return text


def comma_list(text):
    return [item for item in text.split(",") if item]


# ----------------------------------------------------------------------------------------------- shared steps

def _load(paths, jobs=None, what="PATH", by="variant"):
    try:
        runs, unreadable = load_runs(paths, jobs=jobs, by=by)
    except FileNotFoundError as missing:
        raise UsageError(f"{what} not found: {missing}") from None
    if not runs and not unreadable:
        raise UsageError(f"no *.txt or *.log logs under {' '.join(map(str, paths))}")
    if not runs:
        raise UsageError(f"no run logs among the {len(unreadable)} files under {' '.join(map(str, paths))} "
                         f"(first: {unreadable[0].path}: {unreadable[0].problem})")
    return runs, unreadable


def _no_complete_runs(runs) -> UsageError:
    """The error for logs none of which is a finished run, with the reason of the first."""
    first = next(run for run in runs if not run.complete)
    return UsageError(f"no complete runs among {len(runs)} run log(s) (first: {first.path}: {first.problem})")


def _complete_groups(runs, by, arms=None):
    groups = group_runs(runs, by=by)
    if not groups:
        raise _no_complete_runs(runs)
    if arms:
        missing = [a for a in arms if a not in groups]
        if missing:
            raise UsageError(f"--arms: no complete runs for {', '.join(missing)} (arms: {', '.join(groups)})")
        groups = {name: groups[name] for name in arms}
    return groups


def _track(args, runs) -> str | None:
    """--track when given, else the track the logs name (config line, or an upstream records folder)."""
    return getattr(args, "track", None) or track_of(runs)


def _target(args, runs, required: bool = True) -> float | None:
    """--target when given, else the target of the logs' track; without either: an error, or None when the
    command can do without."""
    if args.target is not None:
        return args.target
    track = _track(args, runs)
    if track is None and required:
        raise UsageError("--target is needed: the logs name no single track (config `track`, or a "
                         "records/track_1_short|track_2_medium folder)")
    return None if track is None else TARGETS[track]


def _json_safe(value):
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def _print_json(value):
    print(json.dumps(_json_safe(value), indent=1, allow_nan=False))


def _add_paths(parser, help_text="log files or folders (searched recursively for *.txt and *.log)"):
    parser.add_argument("paths", nargs="+", metavar="PATH", help=help_text)
    parser.add_argument("--by", choices=("variant", "folder"), default="variant",
                        help="what makes an arm: the config line's variant (logs without one: their folder "
                             "relative to the PATH; default) or that folder for every log")
    parser.add_argument("--jobs", type=positive_int, default=None,
                        help="processes parsing logs (default: the CPUs available)")


# ----------------------------------------------------------------------------------------------- commands

def _status(run_record: dict) -> str:
    if run_record["diverged"]:
        return "DIVERGED"
    return "complete" if run_record["complete"] else "UNFINISHED"


def _n_text(group: dict) -> str:
    return f"{group['n']} ({group['n_diverged']} diverged)" if group["n_diverged"] else str(group["n"])


def _print_warnings(warnings):
    for warning in warnings:
        print(f"warning: {warning}")


def cmd_summarize(args):
    runs, unreadable = _load(args.paths, args.jobs, by=args.by)
    target = _target(args, runs)
    result = summarize(runs, target, unreadable, by=args.by)
    state = find_study_record(runs)
    if state is not None:  # the groups' p is fixed-sample: the study's claims are the sequential verdicts
        result["p_value_note"] = AFTER_LOOKING
        result["sequential"] = {"family": family_phrase(state["design"]), "verdicts": study_verdicts(state)}
        result["sequential"]["untested"] = target_untested(state, target)
    if args.json:
        _print_json(result)
        return 0
    run_rows = [[r["variant"], r["seed"], _status(r),
                 f"{num(r['final_step'])}/{num(r['steps'])}", num(r["final_val_loss"]), num(r["train_time_s"], 2),
                 num(r["time_to_target_s"], 2), num(r["step_to_target"], 1), r["path"]] for r in result["runs"]]
    print(table(["variant", "seed", "status", "step", "final loss", "time s", "time to target s",
                 "step to target", "path"], run_rows))
    print()
    group_rows = [[g["variant"], _n_text(g), num(g["mean_val_loss"]), num(g["std_val_loss"], 5), pval(g["p_value"]),
                   num(g["mean_time_s"], 2), num(g["std_time_s"], 2), f"{g['n_reached_target']}/{g['n']}",
                   num(g["mean_time_to_target_s"], 2)] for g in result["groups"]]
    after_looking = f" ({AFTER_LOOKING})" if state is not None else ""
    print(f"groups (complete runs only; std: n-1; p: one-sided t-test of mean < {target:g}{after_looking}; "
          f"diverged runs count in n, not in mean/std, and leave p empty)")
    if result["study_family"] and state is None:  # the claim's p: adjusted over the study's arms
        print(f"p Holm: {result['study_family']}")
        for row, group in zip(group_rows, result["groups"]):
            row.insert(5, pval(group.get("p_family")))
    print(table(["variant", "n", "mean loss", "std loss", "p fixed-sample" if state is not None else "p",
                 *(["p Holm"] if result["study_family"] and state is None else []),
                 "mean time s", "std time s", "reached", "mean time to target s"], group_rows)
          if group_rows else "no complete runs")
    if state is not None and result["sequential"].get("untested"):
        print(f"sequential study ({result['sequential']['family']}): {result['sequential']['untested']}")
    elif state is not None:
        print(f"sequential verdicts ({result['sequential']['family']}):")
        for arm, verdict in result["sequential"]["verdicts"].items():
            print(f"  {verdict_text(arm, verdict)}")
    for item in result["runs"]:
        if not item["complete"]:
            print(f"unfinished: {item['path']}: {item['problem']}")
    for item in result["unreadable"]:
        print(f"unreadable: {item['path']}: {item['problem']}")
    _print_warnings(result["warnings"])
    return 0


def cmd_compare(args):
    runs, unreadable = _load(args.paths, args.jobs, by=args.by)
    shown = _complete_groups(runs, args.by, args.arms)
    groups = _complete_groups(runs, args.by)  # every arm: the family is the study's, whichever arms are shown
    baseline = args.baseline
    if baseline is None:  # runs come in PATH order, so the first group is the first PATH's arm
        baseline = "baseline" if "baseline" in groups else next(iter(groups))
    if baseline not in groups:
        raise UsageError(f"--baseline: no complete runs for {baseline!r} (arms: {', '.join(groups)})")
    if len(groups) < 2:
        raise UsageError(f"only one arm ({baseline}) has complete runs: nothing to compare")
    if len(set(shown) | {baseline}) < 2:
        raise UsageError(f"--arms: only the baseline {baseline} is named: nothing to compare")
    groups = {baseline: groups[baseline], **{k: v for k, v in groups.items() if k != baseline}}
    state = find_study_record(runs)
    result = compare_arms(groups, baseline, args.confidence, args.alternative, shown=set(shown),
                          sequential=state is not None)
    result["claims"] = arm_claims(result, 1 - args.confidence, not args.exploratory, state)
    result["warnings"] += arm_warnings(groups)
    result["not_counted"] = not_counted(runs, unreadable)
    if args.json:
        _print_json(result)
    else:
        print(render_compare(result, markdown=args.markdown))
        _print_not_counted(result["not_counted"])
    return 0


def split_stale(runs, stale_paths) -> tuple[list, list]:
    """(the runs to count, an Unreadable for each run whose log is one of `stale_paths`)."""
    stale = {Path(path).resolve() for path in stale_paths}
    kept = [run for run in runs if run.path.resolve() not in stale]
    return kept, [Unreadable(run.path, "stale: made with other flags than the study now asks, left out")
                  for run in runs if run.path.resolve() in stale]


def not_counted(runs, unreadable) -> list[dict]:
    """Every log a command read but did not count, with why: unfinished, unreadable, another log of a run."""
    return ([{"path": str(run.path), "why": f"unfinished: {run.problem}"} for run in runs if not run.complete]
            + [{"path": str(entry.path), "why": entry.problem} for entry in unreadable])


def _print_not_counted(entries):
    for entry in entries:
        print(f"not counted: {entry['path']}: {entry['why']}")


def _single_variant(runs, chosen, flag):
    groups = group_runs(runs)
    if chosen is not None:
        if chosen not in groups:
            raise UsageError(f"{flag}: no complete runs for {chosen!r} (arms: {', '.join(groups) or 'none'})")
        return groups[chosen]
    if not groups:
        raise _no_complete_runs(runs)
    if len(groups) > 1:
        raise UsageError(f"the runs hold several variants ({', '.join(groups)}): choose one with {flag}")
    return next(iter(groups.values()))


def cmd_record_check(args):
    runs, unreadable = _load(args.paths, args.jobs)
    candidates = _single_variant(runs, args.variant, "--variant")
    baseline = None
    read = list(runs)
    if args.baseline:
        base_runs, base_unreadable = _load(args.baseline, args.jobs, what="--baseline path")
        unreadable = unreadable + base_unreadable
        read += base_runs
        baseline = _single_variant(base_runs, args.baseline_variant, "--baseline-variant")
    track = _track(args, candidates)
    record = None
    if track is not None:
        try:
            against = args.against if args.against is not None else base_record_of(candidates)
            record = find_record(load_records(args.records), track, against)
        except RecordsTableError as problem:
            raise UsageError(str(problem)) from None
    elif args.against is not None:
        raise UsageError("--against needs the track: the logs name none, give --track")
    target = _target(args, candidates)
    result = record_check(candidates, target, baseline, alpha=args.alpha, batch=args.runs,
                          resamples=args.resamples, seed=args.seed, power=args.power, max_runs=args.max_runs,
                          confidence=args.confidence, record=record,
                          sequential=sequential_claim(candidates, target, args.alpha))
    result["warnings"] = arm_warnings({candidates[0].variant: candidates})
    result["not_counted"] = not_counted(read, unreadable)
    if args.json:
        _print_json(result)
    else:
        print(render_record_check(result))
        _print_warnings(result["warnings"])
        _print_not_counted(result["not_counted"])
    return 0 if result["verdict"] == "pass" else 1


def sequential_claim(candidates, target: float, alpha: float) -> dict | None:
    """The sequential study's verdict on the record claim of `candidates` (one arm's runs) below `target` at
    `alpha`, or why that study never tested it (claims.record_claim); None when the runs were never looked at
    sequentially."""
    return record_claim(find_study_record(candidates), candidates[0].variant, target, alpha)


def cmd_plan(args):

    if args.diff is None and args.pilot_mean is None:
        raise UsageError("give --diff D (two arms) and/or --pilot-mean M (a record claim against the target)")
    if args.std is not None:
        estimate = power.StdEstimate(args.std, 0, {}, "--std")
        description = f"std {args.std:.6g}: given with --std"
        target = args.target if args.target is not None else TARGETS[args.track or "medium"]
    else:
        try:
            if args.paths:
                runs, _ = _load(args.paths, args.jobs, by=args.by)
                groups = group_runs(runs, by=args.by)
                estimate = power.pooled_std({name: [run.final_val_loss for run in members]
                                             for name, members in groups.items()}, " ".join(map(str, args.paths)))
                target = _target(args, runs, required=args.pilot_mean is not None)
            else:
                track = args.track or "medium"
                estimate = power.pooled_std(power.published_losses(track, args.published),
                                            f"{args.published} ({track} track)")
                target = args.target if args.target is not None else TARGETS[track]
        except ValueError as problem:
            raise UsageError(str(problem)) from None
        description = estimate.describe()
    print(description)
    result = {"std": estimate.std, "std_runs": estimate.runs, "std_source": description,
              "alpha": args.alpha, "power": args.power}
    if args.diff is not None:
        n = power.seeds_for_difference(args.diff, estimate.std, args.alpha / args.family, args.power)
        result["seeds_per_arm"] = n
        result["family"] = args.family
        family = (f" (family of {args.family} arms: alpha {args.alpha:g} / {args.family} per arm, Holm's first step)"
                  if args.family > 1 else "")
        print(f"two arms, final-loss difference {args.diff:g} (d = {args.diff / estimate.std:.3g} std), two-sided "
              f"Welch t-test at alpha {args.alpha:g}{family}, power {args.power:g}: "
              f"{n if n else f'more than {power.MAX_SEEDS}'} seeds per arm")
        _plan_sequential(args, n, result, "sequential_max_seeds_per_arm")
    if args.pilot_mean is not None:
        n = power.seeds_for_record(args.pilot_mean, target, estimate.std, args.alpha, args.power)
        result["record_seeds"] = n
        result["target"] = target
        if n is None:
            print(f"record claim: pilot mean {args.pilot_mean:g} is not below the target {target:g}; no number "
                  f"of seeds gives a likely pass")
        else:
            print(f"record claim mean < {target:g} (pilot mean {args.pilot_mean:g}, one-sided t-test at alpha "
                  f"{args.alpha:g}, power {args.power:g}): {n} seeds")
            _plan_sequential(args, n, result, "sequential_max_record_seeds")
    if args.json:
        _print_json(result)
    return 0


def _plan_sequential(args, fixed_seeds: int | None, result: dict, key: str) -> None:
    """With --max-factor: the most seeds of the group-sequential design (`--until-decided`) that may use that many
    times the fixed-n design's seeds."""
    if args.max_factor is None or not fixed_seeds:
        return
    most = sequential_max_seeds(fixed_seeds, args.max_factor)
    result[key] = most
    print(f"  group-sequential (--until-decided --max-factor {args.max_factor:g} on a study of {fixed_seeds} seeds): "
          f"at most {most} seeds, stopping early when decided (simulated runs saved: "
          f"benchmarks/sequential_sim.py)")


STALE_HELP = ("a log made with other flags than its study now asks (the study runner names them): left out of the "
              "statistics and listed; repeatable")
EXPLORATORY_HELP = ("the arms are exploratory (a study's family = false): each claim at alpha on its own, NOT "
                    "family-controlled (default: Holm over the arms compared with the baseline)")

PLOT_KINDS = ("val-loss-step", "val-loss-time", "scalars", "lambda-by-layer", "loss-by-layer",
              "loss-vs-num-layers", "loss-vs-distance", "resource-table")


def _existing_folder_for(out: Path, flag: str):
    """Output files go into folders that exist: a mistyped --out must not create folders anywhere."""
    folder = out.parent
    if not folder.is_dir():
        raise UsageError(f"{flag}: folder {folder} does not exist")


def cmd_plot(args):
    from . import plots  # matplotlib loads only for the commands that draw: summarize starts faster

    if args.out is not None:
        _existing_folder_for(args.out, "--out")
    runs, _ = _load(args.paths, args.jobs, by=args.by)
    groups = _complete_groups(runs, args.by, args.arms)
    complete = [run for members in groups.values() for run in members]
    if args.kind == "resource-table":
        text = render_resource_table(groups, args.baseline if args.baseline in groups else None)
        if args.out:
            write_text_atomically(args.out, text + "\n")
            print(args.out)
        else:
            print(text)
        return 0
    if args.out is None:
        raise UsageError(f"--out FILE.png is needed for {args.kind}")
    builders = {
        "val-loss-step": lambda: plots.val_loss_figure(groups, "step", _target(args, runs, required=False)),
        "val-loss-time": lambda: plots.val_loss_figure(groups, "time", _target(args, runs, required=False)),
        "scalars": lambda: plots.scalars_figure(groups, args.scalars),
        "lambda-by-layer": lambda: plots.lambda_by_layer_figure(complete, args.prefix),
        "loss-by-layer": lambda: plots.loss_by_layer_figure(groups, args.baseline),
        "loss-vs-num-layers": lambda: plots.loss_vs_num_layers_figure(groups, args.baseline),
        "loss-vs-distance": lambda: plots.loss_vs_distance_figure(groups, args.baseline),
    }
    try:
        figure = builders[args.kind]()
    except ValueError as problem:
        raise UsageError(f"{args.kind}: {problem}") from None
    plots.save_figure(figure, args.out)
    print(args.out)
    return 0


def cmd_report(args):
    from .report import build_report  # matplotlib, as in cmd_plot

    if not args.dir.is_dir():
        raise UsageError(f"DIR is not a folder: {args.dir}")
    if args.out is not None:
        _existing_folder_for(args.out, "--out")
    runs, unreadable = _load([args.dir], args.jobs, what="DIR")
    missing = [arm for arm in args.arms or [] if arm not in {run.variant for run in runs}]
    if missing:
        raise UsageError(f"--arms: no run logs of {', '.join(missing)} in {args.dir} (arms with logs: "
                         f"{', '.join(dict.fromkeys(run.variant for run in runs))})")
    out = args.out or args.dir / "report.md"
    runs, stale = split_stale(runs, args.stale)
    print(build_report(args.dir, runs, unreadable + stale, _target(args, runs), args.baseline, out, args.scalars,
                       args.arms, not args.exploratory))
    return 0


def cmd_record(args):
    if not args.dir.is_dir():
        raise UsageError(f"DIR is not a folder: {args.dir}")
    runs, unreadable = _load([args.dir], args.jobs, what="DIR")
    if args.variant is not None:
        arms = list(dict.fromkeys(run.variant for run in runs))
        if args.variant not in arms:
            raise UsageError(f"--variant {args.variant}: no run logs of it in {args.dir} (arms: {', '.join(arms)})")
        runs = [run for run in runs if run.variant == args.variant]
    complete = [run for run in runs if run.complete]
    if not complete:
        raise _no_complete_runs(runs)
    variants = {run.variant for run in complete}
    target = args.target if args.target is not None else TARGETS[args.track]
    state = find_study_record(complete) if len(variants) == 1 else None
    sequential = record_claim(state, complete[0].variant, target) if len(variants) == 1 else None
    try:
        path = package_record(runs, args.track, args.name, args.date, args.records_root, args.target,
                              sequential=sequential, not_counted=not_counted([], unreadable),
                              sequential_record=Path(state["path"]) if state is not None else None)
    except RecordError as problem:
        raise UsageError(str(problem)) from None
    print(path)
    return 0


# ----------------------------------------------------------------------------------------------- parser

def make_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(prog="python -m analysis", description=(
        "Statistics, plots, reports and record packaging for speedrun run logs (this project's logs and upstream "
        "modded-nanogpt record logs of every era). Only finished runs (a final validation at the planned last step; "
        "for this project's logs also the closing peak-memory line) enter statistics."))
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND",
                                     parser_class=OneLineErrorParser)

    p = commands.add_parser("summarize", help="runs and groups: final losses, times, p-values, time to target",
                            description="Per run: final loss, train time, time/step to target (linear interpolation "
                                        "between the validations around it). Per group: mean, sample std, one-sided "
                                        "one-sample t-test p-value against --target.")
    _add_paths(p)
    p.add_argument("--target", type=positive_float,
                   help="target validation loss (default: the track's - 2.92 medium, 3.28 small - from the config "
                        "line or the records/track_* folder)")
    p.add_argument("--json", action="store_true", help="print the JSON object (keys: analysis/README.md)")
    p.set_defaults(handler=cmd_summarize)

    p = commands.add_parser("compare", help="arms against a baseline arm: Welch t-tests, CIs, Holm/BH",
                            description=(
                                "Arms are groups of complete runs: by the config line's variant (upstream logs: "
                                "their folder relative to the PATH), or with --by folder by that folder. So "
                                "`compare runs/STUDY` compares a study's arms, `compare records/A records/B` two "
                                "upstream records. Every arm is compared with the baseline arm by Welch's t-test "
                                "on final loss and on train time, with the difference (arm - baseline) and its "
                                "confidence interval (Welch-Satterthwaite df). With several arms, Holm "
                                "(family-wise) and Benjamini-Hochberg (FDR) adjusted p-values are given, and a "
                                "warning names the arm with the lowest value, whose unadjusted p-value "
                                "overstates the evidence (or says that no arm is below the baseline)."))
    _add_paths(p)
    p.add_argument("--baseline", help="baseline arm (default: the arm named 'baseline', else the arm of the "
                                       "first complete run in PATH order)")
    p.add_argument("--arms", type=comma_list, help="comma-separated arms to include (default: all)")
    p.add_argument("--confidence", type=probability, default=0.99, help="confidence level of the CIs (0.99)")
    p.add_argument("--alternative", choices=("two-sided", "less", "greater"), default="two-sided",
                   help="alternative of the Welch tests, arm vs baseline (default two-sided)")
    p.add_argument("--exploratory", action="store_true", help=EXPLORATORY_HELP)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--markdown", action="store_true", help="print Markdown tables")
    p.set_defaults(handler=cmd_compare)

    p = commands.add_parser("record-check", help="upstream's record rules and how reliable the verdict is",
                            description=(
                                "Passes when no run diverged (final loss nan or inf), the mean final loss is below the "
                                "target at p < --alpha (one-sided one-sample t-test), the mean train time is below "
                                "the current upstream record of the track (--against N for record N; the table is "
                                "records/upstream_records.csv) and, with --baseline, the runs are faster than the "
                                "baseline's (one-sided Welch t-test on train times, same --alpha). Also prints the "
                                "bootstrap "
                                "chance that a fresh batch of --runs runs passes the loss test, and the batch size "
                                "needed for a --power chance. Exit status 0 on pass, 1 on fail, 2 on bad input."))
    _add_paths(p, "the candidate's logs or folders")
    p.add_argument("--target", type=positive_float, help="target loss (default: the track's, from the logs)")
    p.add_argument("--variant", help="the candidate variant when the PATHs hold several")
    p.add_argument("--baseline", nargs="+", metavar="PATH", help="logs of the runs to beat (same hardware)")
    p.add_argument("--baseline-variant", help="the baseline variant when the --baseline PATHs hold several")
    p.add_argument("--alpha", type=probability, default=0.01, help="significance level (0.01)")
    p.add_argument("--runs", type=at_least_two, help="batch size for the bootstrap chance (default: as many as given)")
    p.add_argument("--resamples", type=positive_int, default=10000, help="bootstrap resamples (10000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the bootstrap's numpy Generator (0)")
    p.add_argument("--power", type=probability, default=0.9, help="wanted chance of passing (0.9)")
    p.add_argument("--max-runs", type=at_least_two, default=100, help="largest batch size searched (100)")
    p.add_argument("--confidence", type=probability, default=0.99, help="confidence level of the time CI (0.99)")
    p.add_argument("--track", choices=("medium", "small"), help="the track (default: from the logs)")
    p.add_argument("--against", type=positive_int, metavar="N",
                   help="the upstream record number to beat (default: the record the runs' --base reproduces, "
                        "#18 for --base r18; else the track's current record)")
    p.add_argument("--records", type=Path, default=RECORDS_TABLE,
                   help="the upstream record table (records/upstream_records.csv)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.set_defaults(handler=cmd_record_check)

    p = commands.add_parser("plan", help="seeds per arm from the measured seed-to-seed std (power analysis)",
                            description=(
                                "How many seeds a study needs: --diff D gives the runs per arm for a two-sided "
                                "Welch t-test to detect a final-loss difference D between two arms; --pilot-mean M "
                                "the runs for a record claim (one-sided one-sample t-test of mean < target) when "
                                "the true mean is M. Exact noncentral-t power (scipy.stats.nct). The std is the "
                                "pooled within-arm sample std of the PATHs' finished runs (a study folder, any "
                                "logs); without PATHs the track's published per-seed losses "
                                "(records/published_seed_losses.csv); or --std. It says where the std came from "
                                "and how many runs it rests on."))
    p.add_argument("paths", nargs="*", metavar="PATH", help="logs or folders to measure the std from (optional)")
    p.add_argument("--by", choices=("variant", "folder"), default="variant", help="what makes an arm (variant)")
    p.add_argument("--jobs", type=positive_int, default=None, help="processes parsing logs")
    p.add_argument("--diff", type=positive_float, help="final-loss difference to detect between two arms")
    p.add_argument("--pilot-mean", type=positive_float, help="the candidate's expected mean final loss")
    p.add_argument("--target", type=positive_float, help="record target (default: the track's)")
    p.add_argument("--track", choices=("medium", "small"), help="track for published losses / target (medium)")
    p.add_argument("--std", type=positive_float, help="seed-to-seed std to use instead of measuring one")
    p.add_argument("--published", type=Path, default=power.PUBLISHED_LOSSES, help="per-seed loss table "
                   "(records/published_seed_losses.csv)")
    p.add_argument("--alpha", type=probability, default=0.01, help="significance level (0.01)")
    p.add_argument("--power", type=probability, default=0.8, help="wanted power (0.8)")
    p.add_argument("--family", type=positive_int, default=1, metavar="M",
                   help="arms compared with the baseline (the family whose claims share alpha, Holm): --diff plans "
                        "each at alpha / M (1)")
    p.add_argument("--max-factor", type=at_least_one, metavar="F",
                   help="also the most seeds of a group-sequential study (--until-decided --max-factor F) allowed "
                        f"F times the fixed-n design's seeds, to the nearest seed (the runner's default F: "
                        f"{DEFAULT_MAX_FACTOR:g})")
    p.add_argument("--json", action="store_true", help="also print JSON")
    p.set_defaults(handler=cmd_plan)

    p = commands.add_parser("plot", help="one plot (PNG) or the resource table (Markdown)",
                            description=(
                                "Kinds: val-loss-step, val-loss-time (every run thin, each arm's mean with a +-1 "
                                "std band); scalars (each learned scalar by step, per run and mean); "
                                "lambda-by-layer (final <prefix>L<k> scalars of all runs by layer); loss-by-layer "
                                "(layer sweep: arms named L<k> or with config backout_layers); loss-vs-num-layers "
                                "(one line per selection order); loss-vs-distance (mean distance of the skipped "
                                "layers to the output); resource-table (params, final loss, peak memory, step "
                                "time, effective FLOPs per arm; Markdown)."))
    p.add_argument("kind", choices=PLOT_KINDS, metavar="KIND", help=", ".join(PLOT_KINDS))
    _add_paths(p)
    p.add_argument("--out", type=Path, help="output file (PNG; Markdown for resource-table, default stdout)")
    p.add_argument("--target", type=positive_float, help="draw the target loss (default: the logs' track's)")
    p.add_argument("--scalars", nargs="+", metavar="PATTERN", help="scalar names or globs (e.g. 'backout.*')")
    p.add_argument("--prefix", default="backout.", help="scalar prefix for lambda-by-layer (backout.)")
    p.add_argument("--baseline", default="baseline", help="baseline arm drawn as a reference line (baseline)")
    p.add_argument("--arms", type=comma_list, help="comma-separated arms to include (default: all)")
    p.set_defaults(handler=cmd_plot)

    p = commands.add_parser("report", help="Markdown report of a study folder, plots next to it",
                            description="Reads DIR (runs/<study>/<arm>/seed<k>.txt) and writes DIR/report.md (or "
                                        "--out) with the arm table, comparisons with the baseline arm, resources, "
                                        "plots (PNG files next to the report) and unfinished/unreadable logs.")
    p.add_argument("dir", type=Path, metavar="DIR")
    p.add_argument("--target", type=positive_float, help="target loss (default: the track's, from the logs)")
    p.add_argument("--baseline", default="baseline", help="baseline arm (baseline)")
    p.add_argument("--out", type=Path, help="report file (default DIR/report.md)")
    p.add_argument("--scalars", nargs="+", metavar="PATTERN", help="extra scalar globs to plot")
    p.add_argument("--arms", type=comma_list,
                   help="comma-separated arms to report (the study runner names its study's arms); logs of other "
                        "arms are listed as left out, and still count in the claims' Holm family (default: every "
                        "arm with a log)")
    p.add_argument("--exploratory", action="store_true", help=EXPLORATORY_HELP)
    p.add_argument("--stale", action="append", type=Path, default=[], metavar="LOG", help=STALE_HELP)
    p.add_argument("--jobs", type=positive_int, default=None, help="processes parsing logs")
    p.set_defaults(handler=cmd_report)

    p = commands.add_parser("record", help="package complete runs as records/<track>/<date>_<Name>/",
                            description="Copies DIR's complete runs with a README (losses, times, means, sample "
                                        "stds, p-value, the Python that recomputes it) and the script that ran "
                                        "into RECORDS_ROOT/track_2_medium (medium) or track_1_short (small)/"
                                        "<date>_<NAME>/. Refuses when there is no complete run or the folder "
                                        "exists.")
    p.add_argument("dir", type=Path, metavar="DIR")
    p.add_argument("--track", choices=("medium", "small"), required=True)
    p.add_argument("--name", type=record_name, required=True, help="record name, e.g. Backout")
    p.add_argument("--date", type=iso_date, default=datetime.date.today().isoformat(), help="YYYY-MM-DD (today)")
    p.add_argument("--variant", help="package only this variant's runs")
    p.add_argument("--target", type=positive_float, help="target loss (default: the track's)")
    p.add_argument("--records-root", type=Path, default=Path("records"), help="records folder (records)")
    p.add_argument("--jobs", type=positive_int, default=None, help="processes parsing logs")
    p.set_defaults(handler=cmd_record)
    return parser


def main(argv=None) -> int:
    parser = make_parser()
    args = parser.parse_args(argv)
    try:
        return args.handler(args)
    except (UsageError, MixedTracks) as problem:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # output piped into `head` and the like: stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as problem:  # an output file or folder that cannot be written
        where = f"{problem.filename}: " if problem.filename is not None else ""
        print(f"error: {where}{problem.strerror or problem}", file=sys.stderr)
        return 2
