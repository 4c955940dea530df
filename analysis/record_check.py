"""`record-check`: upstream's rules for a new record and how reliable the verdict is.

Rules: no run diverged, the mean final validation loss is below the target at p < alpha (one-sided one-sample
t-test), the mean train time is below the current record of the track (or another record of the upstream table),
and, with baseline runs, the runs are faster than the baseline's runs on the same hardware (Welch's t-test on train
times, one-sided). A diverged run (final loss nan or inf) is a failed run of the claim: it counts in n and fails the check.
Reliability:
the bootstrap chance that a fresh batch of n runs passes the loss test, and the batch size needed for a chosen
chance."""
from __future__ import annotations

from .claims import NO_VARIANCE, record_loss_claim
from .sequential import decision_shown
from .stats import bootstrap_pass_chance, fixed_rule_claims, loss_time_stats, mean_std, runs_needed, welch
from .textfmt import interval, num, pval


def record_check(candidates, target: float, baseline=None, alpha: float = 0.01, batch: int | None = None,
                 resamples: int = 10000, seed: int = 0, power: float = 0.9, max_runs: int = 100,
                 confidence: float = 0.99, record=None, sequential: dict | None = None) -> dict:
    """`record`: the UpstreamRecord whose time the runs must beat, or None (not checked). `sequential`: the
    verdict of a sequential study on this claim (cli.sequential_claim); the loss test is then its verdict and
    p-value, since the fixed-sample p is not valid after looking."""
    losses = [r.final_val_loss for r in candidates]
    times = [r.train_time_s for r in candidates]
    loss_time = loss_time_stats(losses, times, target)
    batch = batch or len(candidates)
    result = {
        "n": len(candidates), "target": target, "alpha": alpha, "confidence": confidence,
        **loss_time,
        **record_loss_claim(candidates, loss_time["p_value"], loss_time["n_diverged"], alpha, sequential),
        "record": None, "record_diff_s": None, "record_ok": None,
        "baseline": None, "time_diff_s": None, "time_ci": None, "time_p": None, "time_ok": None,
        "bootstrap": {
            "runs": batch, "resamples": resamples, "seed": seed,
            "pass_chance": bootstrap_pass_chance(losses, target, batch, alpha, resamples, seed),
        },
        "power": power, "max_runs": max_runs,
        "runs_needed": runs_needed(losses, target, power, alpha, resamples, seed, max_runs),
    }
    if baseline:
        base_mean, base_std = mean_std([r.train_time_s for r in baseline])
        faster = welch(times, [r.train_time_s for r in baseline], confidence=confidence, alternative="less")
        result.update({"baseline": {"n": len(baseline), "mean_time_s": base_mean, "std_time_s": base_std},
                       "time_diff_s": faster["diff"], "time_ci": faster["ci"], "time_p": faster["p"],
                       "time_ok": faster["p"] is not None and bool(fixed_rule_claims(faster["p"], alpha))})
    if record is not None and loss_time["mean_time_s"] is not None:
        result.update({"record": record.as_dict(), "record_diff_s": loss_time["mean_time_s"] - record.record_time_s,
                       "record_ok": loss_time["mean_time_s"] < record.record_time_s})
    result["sequential"] = sequential
    passed = result["loss_ok"] and result["time_ok"] is not False and result["record_ok"] is not False
    result["verdict"] = "pass" if passed else "fail"
    return result


def render_record_check(result: dict) -> str:
    ok = {True: "PASS", False: "FAIL", None: "not checked"}
    diverged = result["n_diverged"]
    lines = [
        f"runs: {result['n']}" + (f" ({diverged} diverged: final loss nan or inf)" if diverged else "") +
        f"  mean final loss {num(result['mean_val_loss'])} (std {num(result['std_val_loss'], 5)})"
        f"  mean time {num(result['mean_time_s'], 2)} s (std {num(result['std_time_s'], 2)})",
        f"loss below {result['target']:g} at p < {result['alpha']:g}: {ok[result['loss_ok']]}"
        + (f" ({diverged} of {result['n']} runs diverged: a diverged run fails the claim)" if diverged else
           f" (no claim: the arm {result['pooled']}, stale runs beside current ones)" if result.get("pooled") else
           f" ({NO_VARIANCE}: every run ended at one loss)" if result.get("no_variance") else
           f" (one-sided one-sample t-test p = {pval(result['p_value'])}"
           + (", not valid after looking)" if result["sequential"] else
              f"; {result['study_family']}: p = {pval(result['p_family'])})" if result.get("study_family") else ")")),
    ]
    sequential = result["sequential"]
    if sequential is not None and sequential.get("untested"):
        lines.append(f"sequential study ({sequential['family']}): {sequential['untested']}")
    elif sequential is not None:
        lines.append(f"sequential verdict ({sequential['family']}): "
                     f"{sequential['claim'] or 'no claim (' + decision_shown(sequential) + ')'} after "
                     f"{sequential['n']} seeds, sequential p {pval(sequential['adjusted_p'])}, family p "
                     f"{pval(sequential['family_p'])}")
    record = result["record"]
    if record is None:
        lines.append("faster than the current record: not checked (the logs name no track: give --track)")
    else:
        beats = "beats" if result["record_ok"] else "misses"
        lines.append(
            f"faster than record #{record['number']} of the {record['track']} track ({record['record_time']} = "
            f"{record['record_time_s']:g} s, {record['date'] or 'no date'}, {record['description']}"
            + (f"; its mean loss {record['mean_val_loss']:g} over {record['n']} runs"
               if record["mean_val_loss"] is not None and record["n"] else "") + "): "
            f"{ok[result['record_ok']]} (mean time {beats} it by {abs(result['record_diff_s']):.2f} s)")
    if result["baseline"] is None:
        lines.append("faster than the baseline: not checked (no --baseline runs given)")
    else:
        base = result["baseline"]
        lines.append(
            f"faster than the baseline ({base['n']} runs, mean {num(base['mean_time_s'], 2)} s): "
            f"{ok[result['time_ok']]} (difference {num(result['time_diff_s'], 2, signed=True)} s, "
            f"{result['confidence'] * 100:g}% CI {interval(result['time_ci'], 2)}, "
            f"one-sided Welch p = {pval(result['time_p'])})")
    boot = result["bootstrap"]
    lines.append(f"chance that a fresh batch of {boot['runs']} runs reaches p < {result['alpha']:g}: "
                 f"{boot['pass_chance']:.1%} (bootstrap, {boot['resamples']} resamples, seed {boot['seed']})")
    needed = result["runs_needed"]
    lines.append(f"runs needed for a {result['power']:.0%} chance: "
                 + (str(needed) if needed is not None else f"more than {result['max_runs']} (or never)"))
    lines.append(f"verdict: {result['verdict'].upper()}")
    return "\n".join(lines)
