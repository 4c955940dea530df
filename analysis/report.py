"""`report DIR`: a Markdown report of a study folder (runs/<study>/<arm>/seed<k>.txt) with its plots written
next to it: per-arm statistics, comparisons with the baseline arm, resources, plots, unfinished and unreadable
logs."""
from __future__ import annotations

import datetime
from pathlib import Path

from . import plots
from .atomic import write_text_atomically
from .compare import compare_arms, render_compare
from .logs import Duplicate, group_runs
from .claims import arm_claims, find_study_record, target_untested
from .sequential import AFTER_LOOKING, render_markdown
from .studies import render_resource_table, selection_order, skip_layers
from .summary import summarize
from .textfmt import num, pval, table

# Scalar families worth a plot of their own in a report (the studies' learned scalars).
SCALAR_FAMILIES = ("backout", "laurel", "dlo")


def _shown(path: Path, study_dir: Path) -> str:
    """A log's path relative to the study folder, as the report's reader sees the folder."""
    try:
        return str(path.relative_to(study_dir))
    except ValueError:
        return str(path)


def _arm_table(summary: dict, runs, after_looking: bool = False) -> str:
    """Every arm with a log, also those with no complete run (their figures show as '-'). `after_looking`: the
    study ran sequentially, so the p column is labelled as the fixed-sample p it is."""
    unfinished = {}
    for run in runs:
        unfinished.setdefault(run.variant, 0)
        if not run.complete:
            unfinished[run.variant] += 1
    groups = summary["groups"] + [{"variant": name, "n": 0, "n_diverged": 0, "n_reached_target": 0}
                                  for name in unfinished if name not in {g["variant"] for g in summary["groups"]}]
    groups = [{key: None for key in ("mean_val_loss", "std_val_loss", "p_value", "mean_time_s", "std_time_s",
                                     "mean_time_to_target_s", "mean_step_to_target")} | g for g in groups]
    rows = [[g["variant"], g["n"], g["n_diverged"], unfinished.get(g["variant"], 0), num(g["mean_val_loss"]),
             num(g["std_val_loss"], 5), pval(g["p_value"]), num(g["mean_time_s"], 2), num(g["std_time_s"], 2),
             f"{g['n_reached_target']}/{g['n']}", num(g["mean_time_to_target_s"], 2),
             num(g["mean_step_to_target"], 1)] for g in groups]
    p_label = f"p (mean < target; {AFTER_LOOKING})" if after_looking else "p (mean < target)"
    return table(["arm", "complete", "diverged", "unfinished", "mean loss", "std loss", p_label,
                  "mean time s", "std time s", "reached target", "mean time to target s", "mean step to target"],
                 rows, markdown=True)


def _planned_figures(groups: dict, runs, baseline: str | None, target: float, scalar_patterns):
    """(file suffix, caption, builder) for each plot this study's data supports."""
    complete = [run for members in groups.values() for run in members]
    planned = [("val_loss_step", "Validation loss by step", lambda: plots.val_loss_figure(groups, "step", target)),
               ("val_loss_time", "Validation loss by train time",
                lambda: plots.val_loss_figure(groups, "time", target))]
    families = [[f"{family}.*"] for family in SCALAR_FAMILIES if plots.scalar_names(complete, [f"{family}.*"])]
    if scalar_patterns:
        families.append(list(scalar_patterns))
    for index, patterns in enumerate(families):
        planned.append((f"scalars_{index}", f"Learned scalars {', '.join(patterns)} by step",
                        lambda patterns=patterns: plots.scalars_figure(groups, patterns)))
    if plots.final_layer_values(complete):
        planned.append(("lambda_by_layer", "Final skip lambdas by layer, all runs",
                        lambda: plots.lambda_by_layer_figure(complete)))
    layered = {name: skip_layers(name, members) for name, members in groups.items() if name != baseline}
    single = [name for name, layers in layered.items() if layers and len(layers) == 1]
    multi = [name for name, layers in layered.items() if layers and len(layers) > 1]
    if len(single) >= 2:
        planned.append(("loss_by_layer", "Final loss by skipped layer (layer sweep)",
                        lambda: plots.loss_by_layer_figure(groups, baseline)))
    # by order only when a multi-layer arm has one: a lone `--backout-layers 10,11` arm belongs to no order
    if any(selection_order(name, groups[name]) is not None for name in multi):
        planned.append(("loss_vs_num_layers", "Final loss by number of skipped layers, per selection order",
                        lambda: plots.loss_vs_num_layers_figure(groups, baseline)))
    if multi:
        planned.append(("loss_vs_distance", "Final loss by mean distance of the skipped layers to the output",
                        lambda: plots.loss_vs_distance_figure(groups, baseline)))
    return planned


def build_report(study_dir: Path, runs, unreadable, target: float, baseline: str | None, out: Path,
                 scalar_patterns=None, arms=None, family: bool = True) -> Path:
    """Write the report to `out` and its PNGs next to it (named <report stem>_<plot>.png). Returns `out`. `arms`:
    the only arms reported (the study's arms as it stands now); logs of other arms are listed as left out, and
    their complete runs still count in the Holm family of the claims (a claim holds whichever arms are named)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    left_out = [run for run in runs if arms is not None and run.variant not in arms]
    runs = [run for run in runs if arms is None or run.variant in arms]
    duplicates = [entry for entry in unreadable if isinstance(entry, Duplicate)]
    unreadable = [entry for entry in unreadable if not isinstance(entry, Duplicate)]
    summary = summarize(runs, target, unreadable + duplicates)
    groups = group_runs(runs)
    if baseline in groups:  # the baseline first, everywhere in the report
        groups = {baseline: groups[baseline], **{k: v for k, v in groups.items() if k != baseline}}
        summary["groups"].sort(key=lambda g: g["variant"] != baseline)
    complete = sum(run.complete for run in runs)
    state = find_study_record(runs)
    after_looking = (f" The study ran sequentially (`--until-decided`): that p is {AFTER_LOOKING}; its claims are "
                     f"the sequential verdicts (Comparisons, Sequential looks)." if state is not None else "")
    lines = [f"# Study report: {study_dir.name}", "",
             f"Generated {datetime.date.today().isoformat()} from `{study_dir}`; target validation loss {target:g}. "
             f"{len(runs)} run logs: {complete} complete, {len(runs) - complete} unfinished; "
             f"{len(unreadable)} unreadable file(s), {len(duplicates)} duplicate log(s) counted once, "
             f"{len(left_out)} log(s) of arms the study no longer has left out. Only complete runs enter the "
             f"statistics; std is the sample standard deviation (n-1); p is the one-sided one-sample t-test of the "
             f"mean final loss against the target.{after_looking} A diverged run (final loss nan or inf) counts as "
             f"complete; the loss figures are of the other runs.",
             "", "## Arms", "", _arm_table(summary, runs, state is not None), ""]
    if summary["warnings"]:
        lines += [f"> **Warning:** {warning}" for warning in summary["warnings"]] + [""]

    lines += ["## Comparisons", ""]
    if not groups:
        lines.append("No complete runs to compare.")
    elif baseline in groups and len(groups) > 1:
        # the arms left out still count in the family: naming arms after the fact never shrinks it
        compared = compare_arms(group_runs(runs + left_out), baseline, sequential=state is not None,
                                shown=set(groups))
        compared["claims"] = arm_claims(compared, 1 - compared["confidence"], family, state)
        lines.append(render_compare(compared, markdown=True, arm_table=False))
    elif baseline in groups:
        lines.append(f"Only the baseline arm `{baseline}` has complete runs.")
    else:
        lines.append(f"No baseline arm `{baseline}` among the complete runs (arms: {', '.join(groups)}); "
                     f"name one with --baseline.")
    lines.append("")
    if state is not None:
        untested = target_untested(state, target)
        lines += ["## Sequential looks", "", *([f"**Target {target:g}: {untested}.**", ""] if untested else []),
                  render_markdown(state), ""]

    if groups:
        lines += ["## Parameters, memory, step time, effective FLOPs", "",
                  render_resource_table(groups, baseline if baseline in groups else None), "",
                  "## Plots", ""]
        for suffix, caption, build in _planned_figures(groups, runs, baseline, target, scalar_patterns):
            image = out.with_name(f"{out.stem}_{suffix}.png")
            plots.save_figure(build(), image)
            lines += [f"### {caption}", "", f"![{caption}]({image.name})", ""]

    lines += ["## Unfinished runs", ""]
    unfinished = [run for run in runs if not run.complete]
    lines += [f"- `{_shown(run.path, study_dir)}` ({run.variant}): {run.problem}" for run in unfinished] or ["None."]
    lines += ["", "## Unreadable files", ""]
    lines += [f"- `{_shown(u.path, study_dir)}`: {u.problem}" for u in unreadable] or ["None."]
    lines += ["", "## Duplicate logs (each run counted once)", ""]
    lines += [f"- `{_shown(d.path, study_dir)}`: another log of the run `{_shown(d.kept, study_dir)}` holds (same "
              f"track, variant, seed and config): left out, one run is one sample" for d in duplicates] or ["None."]
    if arms is not None:
        lines += ["", "## Logs of arms the study no longer has (left out)", ""]
        lines += [f"- `{_shown(run.path, study_dir)}` ({run.variant})" for run in left_out] or ["None."]
    write_text_atomically(out, "\n".join(lines) + "\n")
    return out
