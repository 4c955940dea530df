"""`summarize`: per-run facts and per-group statistics, as the JSON object analysis/README.md describes."""
from __future__ import annotations

from .claims import family_holm, family_note, family_of_runs
from .logs import Duplicate, arm_warnings, duplicate_warnings, group_runs
from .stats import crossing, loss_time_stats, mean_std


def run_record(run, target: float) -> dict:
    # a diverged run never reached the target, whatever its last validation (-inf) is below
    time_to_target, step_to_target = ((None, None) if run.diverged else
                                      crossing(run.val_steps, run.val_losses, run.val_times_ms, target))
    return {
        "path": str(run.path),
        "variant": run.variant,
        "seed": run.seed,
        "complete": run.complete,
        "problem": run.problem,
        "diverged": run.diverged,
        "steps": run.total_steps,
        "final_step": run.final_step,
        "final_val_loss": run.final_val_loss,
        "train_time_s": run.train_time_s,
        "time_to_target_s": time_to_target,
        "step_to_target": step_to_target,
    }


def group_record(variant: str, records: list[dict], target: float) -> dict:
    """Statistics of one group's complete runs: losses and times, how many runs reached the target and
    the mean/std of their time and step to target (runs that never reach it are left out of those)."""
    reached = [r for r in records if r["time_to_target_s"] is not None]
    mean_ttt, std_ttt = mean_std([r["time_to_target_s"] for r in reached])
    mean_stt, _ = mean_std([r["step_to_target"] for r in reached])
    return {
        "variant": variant,
        "n": len(records),
        **loss_time_stats([r["final_val_loss"] for r in records], [r["train_time_s"] for r in records], target),
        "n_reached_target": len(reached),
        "mean_time_to_target_s": mean_ttt,
        "std_time_to_target_s": std_ttt,
        "mean_step_to_target": mean_stt,
    }


def summarize(runs, target: float, unreadable=(), by: str = "variant") -> dict:
    records = [run_record(run, target) for run in runs]
    by_path = {r["path"]: r for r in records}
    grouped = group_runs(runs, by=by)
    groups = [group_record(name, [by_path[str(run.path)] for run in members], target)
              for name, members in grouped.items()]
    # runs that name a fixed-sample study of more arms than are given: each group's p adjusted over all of them
    study_family = family_of_runs([run for members in grouped.values() for run in members if run.complete], grouped)
    if study_family:
        for group, p_family in zip(groups, family_holm([g["p_value"] for g in groups], study_family[0])):
            group["p_family"] = p_family
    return {
        "target": target,
        "study_family": family_note(*study_family) if study_family else None,
        "runs": records,
        "groups": groups,
        "warnings": arm_warnings(grouped) + duplicate_warnings(unreadable),
        "unreadable": [{"path": str(u.path), "problem": u.problem} for u in unreadable if not isinstance(u, Duplicate)],
        "duplicates": [{"path": str(u.path), "kept": str(u.kept)} for u in unreadable if isinstance(u, Duplicate)],
    }
