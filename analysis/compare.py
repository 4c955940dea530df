"""`compare`: arms against a baseline arm with Welch's t-test on final loss and train time, confidence intervals
of the differences and, for more than one arm, Holm and Benjamini-Hochberg corrections."""
from __future__ import annotations

from .claims import family_holm, family_note, family_of_runs, no_variance
from .runs import pooled_trainings
from .stats import benjamini_hochberg, holm, loss_time_stats, mean_std, welch
from .textfmt import interval, num, pval, table

# (key in the comparison, what a run contributes, readable name, digits)
METRICS = (("loss", lambda run: run.final_val_loss, "final val loss", 4),
           ("time", lambda run: run.train_time_s, "train time (s)", 2))


def arm_record(name: str, runs) -> dict:
    return {"variant": name, "n": len(runs),
            **loss_time_stats([r.final_val_loss for r in runs], [r.train_time_s for r in runs])}


def _selection_warning(comparisons, key: str, label: str, baseline: str, sequential: bool) -> str | None:
    """The caveat for the best of several arms: picked after the fact, its raw p-value overstates the case. When
    no arm is below the baseline there is no best arm to warn about, only the closest one."""
    tested = [c for c in comparisons if c[f"{key}_diff"] is not None]
    if len(tested) < 2:
        return None
    best = min(tested, key=lambda c: c[f"{key}_diff"])
    if best[f"{key}_diff"] >= 0:
        return (f"no arm has a lower {label} than '{baseline}': every one of the {len(tested)} arms is at or above "
                f"it (the closest, '{best['variant']}', by {best[f'{key}_diff']:+.4g}).")
    return (f"{len(comparisons)} arms were compared with '{baseline}'; the lowest {label} ('{best['variant']}', "
            f"difference {best[f'{key}_diff']:+.4g}) was picked after seeing the results, so its unadjusted "
            f"p = {pval(best[f'{key}_p'])} overstates the evidence. "
            + ("Quote the sequential family p of the claims (the fixed-sample Holm p is not valid after looking) "
               if sequential else f"Quote the Holm-adjusted p = {pval(best[f'{key}_p_holm'])} (or BH q = "
                                  f"{pval(best[f'{key}_p_bh'])}) ")
            + "or confirm it with fresh runs; do not present it as if it had been chosen in advance.")


def compare_arms(groups: dict, baseline: str, confidence: float = 0.99, alternative: str = "two-sided",
                 shown=None, sequential: bool = False) -> dict:
    """`groups`: arm name -> complete runs, every arm of the study. Every other arm is compared with `baseline` (arm
    minus baseline); Holm and BH adjust over all of them (`family_size`), and only the arms in `shown` (default:
    all) are kept in the result: choosing arms after the fact never shrinks the family. `sequential`: the runs were
    looked at sequentially (the warnings then point at the sequential p)."""
    others = [name for name in groups if name != baseline]
    comparisons = []
    for name in others:
        entry = {"variant": name, "baseline": baseline, "n": len(groups[name]), "n_baseline": len(groups[baseline]),
                 "no_variance": no_variance([r.final_val_loss for r in groups[name]],
                                            [r.final_val_loss for r in groups[baseline]]),
                 "pooled": next((f"{arm} {pooled}" for arm in (name, baseline)
                                 if (pooled := pooled_trainings(groups[arm])) is not None), None)}
        for key, value_of, _, _ in METRICS:
            test = welch([value_of(r) for r in groups[name]], [value_of(r) for r in groups[baseline]],
                         confidence=confidence, alternative=alternative)
            entry.update({f"{key}_diff": test["diff"], f"{key}_ci": test["ci"], f"{key}_df": test["df"],
                          f"{key}_p": test["p"]})
        comparisons.append(entry)
    # runs that name a fixed-sample study of more arms than are given: adjusted over every arm of it
    study_family = family_of_runs([run for runs in groups.values() for run in runs], groups, baseline)
    missing = study_family[0] - len(comparisons) if study_family else 0
    for key, _, _, _ in METRICS:
        raw = [c[f"{key}_p"] for c in comparisons]
        adjusted = family_holm(raw, len(comparisons) + missing) if missing else holm(raw)
        for entry, p_holm, p_bh in zip(comparisons, adjusted, benjamini_hochberg(raw + [1.0] * missing)):
            entry[f"{key}_p_holm"], entry[f"{key}_p_bh"] = p_holm, p_bh

    warnings = []
    for key, _, label, _ in METRICS:
        warning = _selection_warning(comparisons, key, label, baseline, sequential)
        if warning:
            warnings.append(warning)
    baseline_std = mean_std([r.final_val_loss for r in groups[baseline]])[1]
    family_size = len(comparisons) + missing
    if shown is not None:
        others = [name for name in others if name in shown]
        comparisons = [c for c in comparisons if c["variant"] in shown]
    for name in [baseline] + others:
        diverged = sum(run.diverged for run in groups[name])
        if diverged:
            warnings.append(f"'{name}': {diverged} of {len(groups[name])} runs diverged (final loss nan or inf); they "
                            f"count as failed runs, and the loss figures are of the other runs only.")
        if len(groups[name]) < 2:
            warnings.append(f"'{name}' has {len(groups[name])} complete run: no test is possible, and one run's "
                            f"difference is within seed noise (baseline loss std {num(baseline_std, 5)}).")
    return {"baseline": baseline, "confidence": confidence, "alternative": alternative,
            "arms": [arm_record(name, groups[name]) for name in [baseline] + others],
            "comparisons": comparisons, "family_size": family_size, "warnings": warnings,
            "study_family": family_note(family_size, len(comparisons)) if missing else None}


def render_compare(result: dict, markdown: bool = False, arm_table: bool = True) -> str:
    """The comparison as text or Markdown; `arm_table=False` leaves out the per-arm table (a report shows its own)."""
    level = f"{result['confidence'] * 100:g}%"
    parts = []
    if arm_table:
        parts.append(table(["arm", "n", "mean loss", "std loss", "mean time s", "std time s"],
                           [[a["variant"], a["n"], num(a["mean_val_loss"]), num(a["std_val_loss"], 5),
                             num(a["mean_time_s"], 2), num(a["std_time_s"], 2)] for a in result["arms"]], markdown))
    for key, _, label, digits in METRICS:
        rows = [[c["variant"], c["n"], num(c[f"{key}_diff"], digits, signed=True),
                 interval(c[f"{key}_ci"], digits), pval(c[f"{key}_p"]), pval(c[f"{key}_p_holm"]),
                 pval(c[f"{key}_p_bh"])] for c in result["comparisons"]]
        after_looking = (result.get("claims") or {}).get("sequential")
        title = (f"{label}: arm - {result['baseline']}, Welch t-test ({result['alternative']}), "
                 f"{level} CI (Welch-Satterthwaite df)"
                 + ("; fixed-sample p-values and CIs, not valid after the sequential looks" if after_looking else ""))
        parts.append(("**" + title + "**" if markdown else title) + "\n\n" + table(
            ["arm", "n", "diff", f"{level} CI", "p", "p Holm", "p BH"], rows, markdown))
    if result.get("claims"):
        verdicts = result["claims"]
        parts.append(("**Claims** " if markdown else "claims: ") + verdicts["family"] + "\n\n" + "\n".join(
            ("- " if markdown else "  ") + arm["text"] for arm in verdicts["arms"]))
    for warning in result["warnings"]:
        parts.append(("> **Warning:** " if markdown else "WARNING: ") + warning)
    return "\n\n".join(parts)
