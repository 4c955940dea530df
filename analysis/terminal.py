"""The few lines a study leaves on the terminal when it ends: per arm its complete runs, mean final loss +- std and
step/time to the target; each arm against the baseline (Welch t-test, 99% CI, unadjusted p); one claim per arm (Holm
over the family of arms, or the sequential verdict after `--until-decided`); logs not counted and why; the report and
plot paths.

    python -m analysis.terminal DIR --target LOSS [--baseline NAME] [--report FILE]

Bad input ends with one `error:` line on stderr and exit status 2."""
from __future__ import annotations

import sys
from pathlib import Path

from speedrun.errors import OneLineErrorParser, UsageError

from .cli import STALE_HELP, comma_list, positive_float, split_stale
from .compare import compare_arms
from .logs import MixedTracks, group_runs, load_runs
from .claims import arm_claims, find_study_record, target_untested
from .sequential import AFTER_LOOKING, family_phrase, study_verdicts, verdict_text
from .summary import summarize
from .textfmt import interval, num, pval, table

CONFIDENCE = 0.99


def _to_target(group: dict) -> str:
    if not group["n_reached_target"]:
        return f"0/{group['n']} reached"
    return (f"{group['n_reached_target']}/{group['n']} reached, step {num(group['mean_step_to_target'], 1)}, "
            f"{num(group['mean_time_to_target_s'], 1)} s")


def terminal_summary(study_dir: Path, runs, target: float, baseline: str = "baseline",
                     report: Path | None = None, family: bool = True, left_out=(), arms=None) -> str:
    """The summary text of the complete runs among `runs` (logs of the study folder `study_dir`); `arms`: the arms
    shown (default all); the others' complete runs still count in the Holm family of the claims."""
    report = report or study_dir / "report.md"
    family_groups = group_runs(runs)
    runs = [run for run in runs if arms is None or run.variant in arms]
    groups = group_runs(runs)
    lines = [f"result of {study_dir} (target val loss {target:g}; "
             f"{sum(len(g) for g in groups.values())} complete runs of {len(runs)} logs)"]
    if not groups:
        return "\n".join(lines + ["no complete runs: nothing to compare"])
    if baseline in groups:  # the baseline first
        groups = {baseline: groups[baseline], **{k: v for k, v in groups.items() if k != baseline}}
    by_arm = {g["variant"]: g for g in summarize(runs, target)["groups"]}
    state = find_study_record(runs)
    compared = (compare_arms(family_groups, baseline, CONFIDENCE, sequential=state is not None, shown=set(groups))
                if baseline in groups else None)
    comparisons = {c["variant"]: c for c in compared["comparisons"]} if compared else {}
    rows = []
    for name in groups:
        arm, versus = by_arm[name], comparisons.get(name)
        loss = f"{num(arm['mean_val_loss'])} +- {num(arm['std_val_loss'])}"
        rows.append([name, arm["n"], loss,
                     num(versus["loss_diff"], signed=True) if versus else "-",
                     interval(versus["loss_ci"]) if versus else "-",
                     pval(versus["loss_p"]) if versus else "-", _to_target(arm)])
    p_label = f"p (Welch, {AFTER_LOOKING})" if state is not None else "p (Welch, unadjusted)"
    lines.append(table(["arm", "n", "final val loss (mean +- std)", f"diff vs {baseline}", "99% CI", p_label,
                        f"to target {target:g}"], rows))
    if baseline not in groups:
        lines.append(f"no complete runs of a baseline arm '{baseline}': no comparison")
    if compared:
        verdicts = arm_claims(compared, 1 - CONFIDENCE, family, state)
        lines.append(f"claims: {verdicts['family']}")
        lines += [arm["text"] for arm in verdicts["arms"]]
    if state is not None and state["design"]["claim"] == "below-target":  # record claims: no baseline to compare
        untested = target_untested(state, target)
        lines.append(f"claims: sequential: {family_phrase(state['design'])}")
        lines += [untested] if untested else [verdict_text(name, verdict) for name, verdict
                                              in study_verdicts(state).items() if name in groups]
    lines += [f"not counted: {entry.path}: {entry.problem}" for entry in left_out]
    if report.is_file():
        lines.append(f"report: {report}")
        plots = sorted(report.parent.glob(f"{report.stem}_*.png"))
        if plots:
            lines.append("plots:  " + " ".join(str(p) for p in plots))
    else:
        lines.append(f"report: not written (python -m analysis report {study_dir} --target {target:g})")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = OneLineErrorParser(prog="python -m analysis.terminal", description=__doc__.split("\n\n")[0])
    parser.add_argument("dir", type=Path, help="the study folder (runs/<study>)")
    parser.add_argument("--target", type=positive_float, required=True, help="target validation loss")
    parser.add_argument("--baseline", default="baseline", help="the arm the others are compared with")
    parser.add_argument("--report", type=Path, default=None, help="the report file (default DIR/report.md)")
    parser.add_argument("--exploratory", action="store_true",
                        help="the arms are exploratory (study key family = false): each at alpha, not family-controlled")
    parser.add_argument("--stale", action="append", type=Path, default=[], metavar="LOG", help=STALE_HELP)
    parser.add_argument("--arms", type=comma_list,
                        help="comma-separated arms to show, as in the report; the others still count in the claims' "
                             "Holm family (default: every arm with a log)")
    args = parser.parse_args(argv)
    if not args.dir.is_dir():
        print(f"error: not a folder: {args.dir}", file=sys.stderr)
        return 2
    runs, unreadable = load_runs([args.dir])
    shown_logs = {run.path for run in runs if args.arms is None or run.variant in args.arms}
    runs, stale = split_stale(runs, args.stale)
    unreadable += [entry for entry in stale if entry.path in shown_logs]
    try:
        print(terminal_summary(args.dir, runs, args.target, args.baseline, args.report, not args.exploratory,
                               unreadable, args.arms))
    except (MixedTracks, UsageError) as problem:  # UsageError: a damaged sequential record
        print(f"error: {problem}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
