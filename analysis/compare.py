"""`compare`: arms against a baseline arm with Welch's t-test on final loss and train time, confidence intervals
of the differences and, for more than one arm, Holm and Benjamini-Hochberg corrections."""
from __future__ import annotations

from .claims import NO_VARIANCE, comparison_untested, family_holm, family_note, family_of_runs, no_variance
from .runs import pooled_trainings
from .sequential import decision_shown, family_phrase, study_verdicts
from .stats import benjamini_hochberg, fixed_rule_claims, holm, loss_time_stats, mean_std, welch
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


def claims(result: dict, alpha: float, family: bool = True, sequential_state: dict | None = None) -> dict:
    """One verdict per arm on its final loss: {"family": what the claims are controlled as, "arms": [{variant,
    claim ("lower", "higher" or None), p (the p-value the claim rests on), text}]}. A study that ran sequentially
    (its sequential.json, claims.find_study_record) gives the sequential verdicts and p-values, for the comparison
    it tested only: the fixed-sample p is shown only as not valid after looking. Otherwise Holm over every arm of
    the study (`result["family_size"]` arms, also those not shown), or each arm at alpha when the arms are
    exploratory. An arm with a diverged run, or a baseline with one, makes no claim; nor does an arm whose runs and
    baseline's all ended at one loss each (no variance), nor one whose runs, or the baseline's, pool several
    trainings (runs.pooled_trainings)."""
    baseline = result["baseline"]
    diverged = {arm["variant"]: arm["n_diverged"] for arm in result["arms"]}
    untested = (comparison_untested(sequential_state, baseline, alpha, result["alternative"])
                if sequential_state else None)
    verdicts = study_verdicts(sequential_state) if sequential_state and untested is None else {}
    comparisons = result["comparisons"]
    size = result.get("family_size", len(comparisons))
    shown = f" ({len(comparisons)} shown)" if size != len(comparisons) else ""
    if sequential_state:
        phrase = "sequential: " + family_phrase(sequential_state["design"])
    elif family and size > 1 and result.get("study_family"):
        phrase = (f"{result['study_family']}, against {baseline}, family-wise alpha {alpha:g} (Holm-adjusted p; the "
                  f"unadjusted p beside it)")
    elif family and size > 1:
        phrase = (f"family of {size} arms against {baseline}{shown}, family-wise alpha {alpha:g} (Holm-adjusted "
                  f"p; the unadjusted p beside it)")
    else:
        phrase = (f"{len(comparisons)} arm(s) against {baseline} at alpha {alpha:g}"
                  + ("; exploratory: NOT family-controlled" if not family and len(comparisons) > 1 else ""))
    arms = []
    for c in comparisons:
        name, diff, raw = c["variant"], c["loss_diff"], c["loss_p"]
        entry = {"variant": name, "claim": None, "p": None}
        if diverged.get(name) or diverged.get(baseline):
            who = name if diverged.get(name) else baseline
            entry["text"] = (f"{name}: no claim: {diverged[who]} run(s) of {who} diverged (final loss nan or inf), a failed "
                             f"run of any claim")
        elif c.get("pooled"):
            entry["text"] = (f"{name}: no claim: {c['pooled']}, stale runs beside current ones; fixed-sample p "
                             f"{pval(raw)}")
        elif sequential_state and (untested or name not in verdicts):
            why = untested or f"the sequential study did not test {name}"
            entry["text"] = (f"{name}: no claim: {why}; fixed-sample p {pval(raw)} (not valid after looking)")
        elif name in verdicts:
            v = verdicts[name]
            entry.update(claim=("lower" if v["claim"] == "better" else "higher") if v["claim"] else None,
                         p=v["family_p"])
            entry["text"] = (f"{name}: " + (f"{v['claim']} than {baseline}: a real difference at family-wise alpha "
                                            f"{sequential_state['design']['alpha']:g}" if v["claim"] else
                                            f"no claim (sequential decision: {decision_shown(v)})")
                             + f" after {v['n']} seeds; sequential p {pval(v['adjusted_p'])}, family p "
                               f"{pval(v['family_p'])}; fixed-sample p {pval(raw)} (not valid after looking)")
        elif raw is None and c.get("no_variance"):
            entry["text"] = (f"{name}: {NO_VARIANCE} (the runs of {name} and of {baseline} each ended at one loss): "
                             f"no claim")
        elif raw is None:
            entry["text"] = f"{name}: too few complete runs for a test (two per arm at least)"
        else:
            holm_applies = family and size > 1
            p = c["loss_p_holm"] if holm_applies else raw
            shown = fixed_rule_claims(p, alpha)
            entry.update(claim=("lower" if diff < 0 else "higher") if shown else None, p=p)
            adjusted = f"Holm p {pval(p)}, unadjusted p {pval(raw)}" if holm_applies else f"p {pval(raw)}"
            entry["text"] = (f"{name}: final loss {abs(diff):.4f} {'lower' if diff < 0 else 'higher'} than "
                             f"{baseline} ({adjusted}); " + (f"a real difference at the {alpha:g} level" if shown
                                                              else f"not distinguishable from seed noise at the "
                                                                   f"{alpha:g} level"))
        arms.append(entry)
    return {"family": phrase, "arms": arms, "sequential": bool(sequential_state)}


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
