"""The statistics: time-to-target, one-sided one-sample t-tests, Welch comparisons, multiple-comparison
corrections and the bootstrap reliability of a record verdict. Distributions and tests come from scipy.stats."""
from __future__ import annotations

import math
import warnings

import numpy as np
from scipy import stats


def _quiet(function, *args, **kwargs):
    # scipy warns about precision loss on nearly identical samples; the numbers it returns are what we report.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return function(*args, **kwargs)


def crossing(steps, losses, times_ms, target: float):
    """(time_s, step) at which the validation loss first reaches `target`, by linear interpolation between the
    last validation above the target and the first at or below it; (None, None) when it never does. When the
    very first validation is already at or below the target, its own time and step are returned."""
    for i, loss in enumerate(losses):
        if not (math.isfinite(loss) and loss <= target):  # a diverged validation (nan, inf, -inf) never reaches it
            continue
        if i == 0:
            return times_ms[0] / 1000.0, float(steps[0])
        above_loss = losses[i - 1]
        fraction = (above_loss - target) / (above_loss - loss)
        time_ms = times_ms[i - 1] + fraction * (times_ms[i] - times_ms[i - 1])
        step = steps[i - 1] + fraction * (steps[i] - steps[i - 1])
        return time_ms / 1000.0, float(step)
    return None, None


def _finite(values) -> np.ndarray:
    array = np.asarray([v for v in values if v is not None], dtype=float)
    return array[np.isfinite(array)]


def mean_std(values) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (n-1) of the finite values; std is None below two values."""
    array = _finite(values)
    if array.size == 0:
        return None, None
    std = float(np.std(array, ddof=1)) if array.size > 1 else None
    return float(np.mean(array)), std


def p_below_target(losses, target: float) -> float | None:
    """One-sided one-sample t-test that the mean final loss is below `target`; None below two values or when they
    are all equal (the test would divide by a zero std and print p 0 or 1)."""
    array = _finite(losses)
    if array.size < 2 or np.ptp(array) == 0:  # one value repeated: no noise to test against (issue 40, case 7)
        return None
    return _none_if_nan(_quiet(stats.ttest_1samp, array, target, alternative="less").pvalue)


def loss_time_stats(losses, times, target: float | None = None) -> dict:
    """Mean and sample std of final losses and train times; with a target, also the one-sided one-sample t-test
    p-value that the mean loss is below it. Keys as in summarize's JSON (analysis/README.md), with `n_diverged`:
    runs whose final loss is nan or inf. Means and stds are over the finite losses; with any diverged run the p-value is None, as
    a diverged run fails a claim that the mean loss is below a target."""
    n_diverged = sum(1 for loss in losses if loss is not None and not math.isfinite(loss))
    mean_loss, std_loss = mean_std(losses)
    mean_time, std_time = mean_std(times)
    out = {"mean_val_loss": mean_loss, "std_val_loss": std_loss, "n_diverged": n_diverged}
    if target is not None:
        out["p_value"] = None if n_diverged else p_below_target(losses, target)
    out.update({"mean_time_s": mean_time, "std_time_s": std_time})
    return out


def _none_if_nan(value) -> float | None:
    value = float(value)
    return None if math.isnan(value) else value


def welch(sample, reference, confidence: float = 0.99, alternative: str = "two-sided") -> dict:
    """Welch's t-test of mean(sample) - mean(reference): the difference, its confidence interval (two-sided, at
    `confidence`, with the Welch-Satterthwaite degrees of freedom), df and p-value. Values are None when either
    side has fewer than two values, or both hold one value each (no variance)."""
    a, b = _finite(sample), _finite(reference)
    result = {"diff": None, "ci": None, "df": None, "p": None}
    if a.size == 0 or b.size == 0:
        return result
    result["diff"] = float(np.mean(a) - np.mean(b))
    if a.size < 2 or b.size < 2 or (np.ptp(a) == 0 and np.ptp(b) == 0):  # both constant: no noise to test against
        return result
    test = _quiet(stats.ttest_ind, a, b, equal_var=False, alternative=alternative)
    two_sided = test if alternative == "two-sided" else _quiet(stats.ttest_ind, a, b, equal_var=False)
    interval = two_sided.confidence_interval(confidence_level=confidence)
    result["df"] = _none_if_nan(test.df)
    result["p"] = _none_if_nan(test.pvalue)
    if result["df"] is not None:
        result["ci"] = [_none_if_nan(interval.low), _none_if_nan(interval.high)]
    return result


def fixed_rule_claims(p, alpha: float):
    """The claim rule of a fixed-sample test (compare, record-check, the simulation), for a p-value or an array of
    them: p strictly below alpha."""
    return p < alpha


def sequential_rule_claims(family_p, alpha: float):
    """The claim rule of a sequential study (study_verdicts, the simulation), for a family p or an array of them:
    at most alpha (a look crosses its threshold at a p at or below it)."""
    return family_p <= alpha


def holm(p_values) -> list[float | None]:
    """Holm's step-down adjusted p-values (family-wise error), in the input order; None entries stay None and
    do not count in the family."""
    indexed = [(p, i) for i, p in enumerate(p_values) if p is not None]
    adjusted: list[float | None] = [None] * len(p_values)
    m = len(indexed)
    running = 0.0
    for rank, (p, i) in enumerate(sorted(indexed)):
        running = max(running, min(1.0, (m - rank) * p))
        adjusted[i] = running
    return adjusted


def benjamini_hochberg(p_values) -> list[float | None]:
    """Benjamini-Hochberg adjusted p-values (false discovery rate), in the input order; None entries stay None."""
    positions = [i for i, p in enumerate(p_values) if p is not None]
    adjusted: list[float | None] = [None] * len(p_values)
    if positions:
        values = stats.false_discovery_control([p_values[i] for i in positions], method="bh")
        for i, value in zip(positions, np.atleast_1d(values)):
            adjusted[i] = float(value)
    return adjusted


def bootstrap_pass_chance(losses, target: float, runs: int, alpha: float, resamples: int, seed: int) -> float:
    """Estimated chance that a fresh batch of `runs` runs passes the one-sided t-test (p < alpha) against
    `target`: resample `runs` losses with replacement from the observed ones, `resamples` times. A resample
    whose losses are all equal has no variance and counts as failing (conservative)."""
    observed = _finite(losses)
    if observed.size == 0 or runs < 2:
        return 0.0
    rng = np.random.default_rng([seed, runs])  # one stream per batch size: results do not depend on call order
    draws = rng.choice(observed, size=(resamples, runs), replace=True)
    p = _quiet(stats.ttest_1samp, draws, target, axis=1, alternative="less").pvalue
    p = np.where(np.ptp(draws, axis=1) > 0, p, 1.0)
    return float(np.mean(p < alpha))


def runs_needed(losses, target: float, power: float, alpha: float, resamples: int, seed: int,
                max_runs: int) -> int | None:
    """The smallest batch size n (2..max_runs) whose bootstrap pass chance reaches `power`; None if none does."""
    observed = _finite(losses)
    if observed.size == 0 or float(np.mean(observed)) >= target:
        return None  # resampling a mean at or above the target cannot pass more often than by chance
    for runs in range(2, max_runs + 1):
        if bootstrap_pass_chance(losses, target, runs, alpha, resamples, seed) >= power:
            return runs
    return None
