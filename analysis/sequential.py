"""Group-sequential tests: stop adding seeds when the answer is in, without inflating false claims.

- Family: the arms compared with one baseline (or each tested against the target) are one family; each arm's looks
  spend alpha / family size, and the claims are Holm's step-down over the arms' sequential p-values (valid p-values,
  so the family-wise error stays at alpha; an arm that crosses its boundary is always a Holm rejection). A study
  with `family = false` tests each arm at alpha, and says its claims are not family-controlled.
- Efficacy: alpha spent as alpha t^3 (Kim-DeMets power family) at information fraction t (runs so far / planned
  maximum): every look from three seeds on can decide. The boundaries are p-value thresholds for the t-tests the
  looks run (Welch two-sided, or the one-sample test of mean < target), calibrated by simulating those tests under
  no effect at the looks' run counts (calibrated_thresholds), since small-sample t p-values mapped onto normal
  boundaries gave 1.09-1.18% false record claims at alpha 1%.
- Futility (non-binding, so it never raises alpha): stop when the conditional power toward a lower loss, under the
  effect the fixed-n design of max_seeds / max_factor seeds detects with power 0.8, is below `futility_power`
  (0.2): stochastic curtailment (Lan, Simon and Halperin 1982), one-directional, so arms heading for "worse" stop
  early too (most ideas fail; benchmarks/sequential_sim.py measures the runs this saves).
- Maximum: by default 1.15 x the fixed-n design's seeds, to the nearest seed (DEFAULT_MAX_FACTOR), which buys back
  the power the looks and futility cost (>= 0.8 in every simulated design; 1 x gave 0.74-0.78).
- Repeated confidence interval at look k: the t-interval at the look's threshold level; it excludes 0 exactly when
  the look decides.
- Adjusted p-value at the look that ends the test, by stagewise ordering, from the same simulation: the chance under
  no effect of deciding earlier, or of reaching this look with a p-value at most the observed one. 1 after futility.
- The normal-theory machinery (Lan-DeMets O'Brien-Fleming spending, recursive integration) below is kept as the
  reference the calibration is checked against (published tables) and as the old rule the tests show exceeded alpha.
- A diverged run (final loss nan or inf) on either side ends the arm as "diverged": a failed claim."""
from __future__ import annotations

import functools
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from scipy import optimize, stats

from .stats import holm, p_below_target, sequential_rule_claims, welch


_GRID_POINTS = 1001  # Simpson points per look: boundaries agree with published tables to 1e-4


def obf_spending(t: float, alpha: float) -> float:
    """Cumulative alpha spent at information fraction t (Lan-DeMets, O'Brien-Fleming type), one side."""
    if t >= 1:
        return alpha
    return float(2 * stats.norm.sf(stats.norm.isf(alpha / 2) / math.sqrt(t)))


def cumulative_spending(t: float, alpha: float, sides: int) -> float:
    """Two-sided designs spend alpha/2 on each side (the convention of gsDesign and ldbounds)."""
    return sides * obf_spending(t, alpha / sides)


def _advance(continuation, previous_t: float, t: float, bound: float, sides: int):
    """One look further: grid points of the score S = Z sqrt(t) inside the look's continuation region and their
    weights (Simpson weight times the sub-density of paths that crossed no boundary so far). The recursive
    numerical integration of Armitage, McPherson and Rowe (1969), which gsDesign also uses."""
    sd = math.sqrt(t)
    upper = min(bound, 10.0) * sd
    lower = -upper if sides == 2 else -10.0 * sd
    points = np.linspace(lower, upper, _GRID_POINTS)
    simpson = np.ones(_GRID_POINTS)
    simpson[1:-1:2], simpson[2:-1:2] = 4.0, 2.0
    simpson *= (upper - lower) / (_GRID_POINTS - 1) / 3
    if continuation is None:
        density = stats.norm.pdf(points, scale=sd)
    else:
        grid, weights = continuation
        step = math.sqrt(t - previous_t)
        # the normal density by hand: scipy's pdf on this (points x grid) matrix was 3/4 of a 400-look design's time
        kernel = np.exp(-0.5 * np.square((points[:, None] - grid[None, :]) / step))
        density = kernel @ weights / (step * math.sqrt(2 * math.pi))
    return points, density * simpson


def _continuation(fractions, bounds, sides: int):
    """The continuation grid and weights at the last of `fractions` (None before the first look)."""
    continuation, previous_t = None, 0.0
    for t, c in zip(fractions, bounds):
        continuation, previous_t = _advance(continuation, previous_t, t, c, sides), t
    return continuation


def _stay_probability(bounds, fractions, sides: int) -> float:
    """P(no crossing at any of the looks) under no effect: every Z_k below bounds[k] (two-sided: |Z_k| below)."""
    return _stay_after(_continuation(fractions[:-1], bounds[:-1], sides), fractions, bounds[-1], sides)


def _stay_after(continuation, fractions, bound: float, sides: int) -> float:
    """P(no crossing before the last look, and none at it with boundary `bound`)."""
    t = fractions[-1]
    lower_cdf = (lambda x: stats.norm.cdf(-x)) if sides == 2 else (lambda x: 0.0)
    if len(fractions) == 1:
        return float(stats.norm.cdf(bound) - lower_cdf(bound))
    grid, weights = continuation
    step = math.sqrt(t - fractions[-2])
    edge = bound * math.sqrt(t)
    inside = stats.norm.cdf((edge - grid) / step) - (stats.norm.cdf((-edge - grid) / step) if sides == 2 else 0.0)
    return float(inside @ weights)


def _solve_boundary(continuation, fractions, alpha: float, sides: int) -> float:
    total_stay = 1 - cumulative_spending(fractions[-1], alpha, sides)
    if len(fractions) == 1:
        return float(stats.norm.isf((1 - total_stay) / sides))
    excess = lambda c: _stay_after(continuation, fractions, c, sides) - total_stay  # noqa: E731
    high = 40.0
    if excess(high) < 0:  # nothing left to spend at this look (rounding): never cross
        return math.inf
    return float(optimize.brentq(excess, 0.0 if sides == 2 else -10.0, high, xtol=1e-8))


def spending_boundaries(fractions, alpha: float, sides: int = 2) -> list[float]:
    """Lan-DeMets O'Brien-Fleming-type boundaries (z scale) at the information fractions given."""
    bounds: list[float] = []
    continuation, previous_t = None, 0.0
    for k, t in enumerate(fractions):
        bounds.append(_solve_boundary(continuation, list(fractions[:k + 1]), alpha, sides))
        continuation, previous_t = _advance(continuation, previous_t, t, bounds[-1], sides), t
    return bounds


def obrien_fleming_constants(looks: int, alpha: float, sides: int = 2) -> list[float]:
    """The original O'Brien-Fleming (1979) boundaries for equally spaced looks: c * sqrt(K / k), with the one
    constant c that gives a total type I error alpha. Not used for decisions; shows the machinery agrees with the
    classic tables."""
    fractions = [k / looks for k in range(1, looks + 1)]
    shape = np.sqrt(looks / np.arange(1, looks + 1))
    c = optimize.brentq(lambda c: 1 - _stay_probability(c * shape, fractions, sides) - alpha, 1.0, 10.0, xtol=1e-7)
    return list(c * shape)



# ----- boundaries for the t statistics the looks compute ----------------------------------------------------------
# The normal boundaries above assume a z statistic with known variance. The looks run t-tests on a few seeds (one
# sample: n - 1 degrees of freedom; Welch: about 2n - 2), whose joint law across looks is not the normal random walk:
# mapping each look's t p-value onto the normal boundaries gave 1.09-1.18% false record claims at alpha 1%. So the
# boundaries are set on the p-value scale by simulating the very tests the looks run, under no effect, at the looks'
# own run counts: the null law of a t-test's p-values depends on nothing else (Welch's, only slightly, on the ratio
# of the two variances; simulated equal).
NULL_PATHS = 400_000  # simulated null studies per design: the alpha of a 15-arm family (6.7e-4 per arm) to +-6%
_CALIBRATION_SEED = 33  # fixed: a design's boundaries never change between looks, runs or machines
SPENDING_POWER = 3  # alpha(t) = alpha t^3 (Kim-DeMets power family): every look from t ~ 0.2 on can decide


def power_spending(fraction: float, alpha: float) -> float:
    """Cumulative alpha spent at information fraction `fraction`: alpha t^3 (all of alpha at t >= 1)."""
    return alpha * min(1.0, max(0.0, fraction)) ** SPENDING_POWER


def look_p_values(arm, baseline, counts, sides: int) -> tuple[np.ndarray, np.ndarray]:
    """(p, sign of the estimate) per study (row) and look (column) of the tests the looks run: `arm` and
    `baseline` are (studies x runs) draws in run order (baseline None for a one-sample test of mean < 0, the
    record claim after subtracting the target); `counts` the (runs of the arm, runs of the baseline) at each look.
    sides 2: two-sided Welch t-test of arm - baseline; sides 1: one-sided one-sample t-test of mean < 0."""
    arm_sums, arm_squares = np.cumsum(arm, axis=1), np.cumsum(np.square(arm), axis=1)
    if baseline is not None:
        base_sums, base_squares = np.cumsum(baseline, axis=1), np.cumsum(np.square(baseline), axis=1)
    p = np.empty((arm.shape[0], len(counts)))
    sign = np.empty_like(p)
    for k, (n, n_base) in enumerate(counts):
        mean = arm_sums[:, n - 1] / n
        var = np.maximum(arm_squares[:, n - 1] - n * mean ** 2, 0) / (n - 1)
        if sides == 1:
            t = mean / np.sqrt(var / n)
            p[:, k], sign[:, k] = stats.t.cdf(t, n - 1), np.sign(t)
            continue
        base_mean = base_sums[:, n_base - 1] / n_base
        base_var = np.maximum(base_squares[:, n_base - 1] - n_base * base_mean ** 2, 0) / (n_base - 1)
        se2 = var / n + base_var / n_base
        df = se2 ** 2 / ((var / n) ** 2 / (n - 1) + (base_var / n_base) ** 2 / (n_base - 1))
        t = (mean - base_mean) / np.sqrt(se2)
        p[:, k], sign[:, k] = 2 * stats.t.sf(np.abs(t), df), np.sign(t)
    return p, sign


@functools.lru_cache(maxsize=8)
def _null_p_values(counts: tuple, sides: int) -> np.ndarray:
    """(NULL_PATHS x looks) p-values under no effect at the looks' run counts, simulated in chunks."""
    rng = np.random.default_rng(_CALIBRATION_SEED)
    most = max(n for n, _ in counts)
    most_base = max((b for _, b in counts if b is not None), default=0)
    chunks, chunk = [], max(1000, 4_000_000 // most)  # about 32 MB of draws at a time, whatever the design
    for start in range(0, NULL_PATHS, chunk):
        size = min(chunk, NULL_PATHS - start)
        arm = rng.standard_normal((size, most))
        baseline = rng.standard_normal((size, most_base)) if sides == 2 else None
        chunks.append(look_p_values(arm, baseline, counts, sides)[0].astype(np.float32))  # half the memory
    return np.concatenate(chunks)


@functools.lru_cache(maxsize=32)
def calibrated_thresholds(counts: tuple, fractions: tuple, alpha: float, sides: int) -> tuple:
    """Each look's p-value threshold (a look decides when its t-test p <= it) such that, under no effect, the chance
    of deciding at or before look k is the spent alpha(t_k) (power spending) of the simulated tests; and, per
    look, the share of null studies that decided before it. A threshold of 0 means the look spends nothing."""
    null = _null_p_values(counts, sides)
    still_open = np.ones(null.shape[0], bool)
    thresholds, decided_before, crossed = [], [], 0
    for k, fraction in enumerate(fractions):
        decided_before.append(crossed / null.shape[0])
        allowed = int(math.floor(power_spending(fraction, alpha) * null.shape[0] + 1e-9)) - crossed
        candidates = null[still_open, k]
        threshold = float(np.partition(candidates, allowed - 1)[allowed - 1]) if allowed > 0 else 0.0
        crossing = still_open & (null[:, k] <= threshold) if allowed > 0 else np.zeros_like(still_open)
        crossed += int(crossing.sum())
        still_open &= ~crossing
        thresholds.append(threshold)
    return tuple(thresholds), tuple(decided_before)


def stagewise_p(counts: tuple, fractions: tuple, alpha: float, sides: int, p: float, look: int = -1) -> float:
    """Stagewise-ordering adjusted p-value of a test that ended at look `look` (an index into `counts`; the last
    by default) with p-value `p`: the chance, under no effect, of deciding at an earlier look, or of reaching this
    one and seeing a p-value at most `p` (simulated; resolution 1 / NULL_PATHS)."""
    thresholds, decided_before = calibrated_thresholds(counts, fractions, alpha, sides)
    look = look % len(counts)
    null = _null_p_values(counts, sides)
    still_open = np.ones(null.shape[0], bool)
    for k, threshold in enumerate(thresholds[:look]):
        still_open &= null[:, k] > threshold
    return float(min(1.0, decided_before[look] + np.mean(still_open & (null[:, look] <= p))))


def holm_family(adjusted: dict) -> dict:
    """Holm's step-down over the arms of a family: {arm: Holm-adjusted p} from each arm's own (sequential) p-value;
    an arm with no p-value yet enters as 1 (which can only make the others' harder to reject)."""
    names = list(adjusted)
    values = holm([1.0 if adjusted[n] is None else adjusted[n] for n in names])
    return dict(zip(names, values))

def look_counts(max_seeds: int, batch: int) -> list[int]:
    """Seeds per arm at each look: every batch, the first look at three seeds at least (a t-test on two seeds has
    one degree of freedom: nothing short of a huge effect decides there), the last at max_seeds."""
    counts = list(range(batch, max_seeds, batch)) + [max_seeds]
    return sorted({min(max_seeds, max(MIN_LOOK_SEEDS, n)) for n in counts})


MIN_LOOK_SEEDS = 3


# The most seeds per arm over the fixed-n design's when nothing else is asked: looks and futility cost power, and
# benchmarks/sequential_sim.py finds 1.15 the smallest factor (of 1.05, 1.1, 1.15) whose helpful arms keep power
# >= 0.8 in every design it reports (1.0: 0.74-0.78; 1.1: 0.79 at the smallest effect, where most looks are taken).
DEFAULT_MAX_FACTOR = 1.15


def sequential_max_seeds(fixed_seeds: int, max_factor: float) -> int:
    """The most seeds per arm of a sequential design allowed `max_factor` times the fixed-n design's seeds, to the
    nearest seed (halves up), never below the fixed design's: rounding up gave a 7-seed design 9 (1.29 x), seeds
    its power did not need (8 seeds: 0.85), and cut its runs saved from 33% to 25.5% (benchmarks/sequential_sim.py)."""
    return max(fixed_seeds, math.floor(max_factor * fixed_seeds + 0.5 + 1e-9))  # 1.15 x 10 = 11.5 is 12


@dataclass
class Design:
    alpha: float  # family-wise: the chance, under no effect in any arm, of any false claim in the study
    max_seeds: int  # planned runs per arm at the last look
    batch: int  # runs per arm added between looks
    sides: int = 2  # 2: arm vs baseline; 1: a record's mean below the target
    futility_power: float = 0.20  # benchmarks/sequential_sim.py: with directional futility, >= 30% fewer runs
    design_power: float = 0.8  # the fixed-n design of max_seeds / max_factor seeds has this power at the effect
    max_factor: float = DEFAULT_MAX_FACTOR  # max_seeds over the fixed-n design's seeds
    family_size: int = 1  # arms whose claims are controlled together (Holm); each arm's looks spend alpha / size

    @property
    def arm_alpha(self) -> float:
        return self.alpha / self.family_size

    def drift(self) -> float:
        """The planned effect on the z scale at the last look: the fixed-n design's drift (at the arm's alpha),
        times the square root of the information the larger maximum adds."""
        fixed = stats.norm.isf(self.arm_alpha / self.sides) + stats.norm.isf(1 - self.design_power)
        return float(fixed * math.sqrt(self.max_factor))

    def planned_counts(self) -> tuple:
        return tuple((n, n if self.sides == 2 else None) for n in look_counts(self.max_seeds, self.batch))

    def planned_fractions(self) -> tuple:
        return tuple(n / self.max_seeds for n in look_counts(self.max_seeds, self.batch))

    def thresholds(self) -> tuple:
        """The planned looks' p-value thresholds (calibrated_thresholds)."""
        return calibrated_thresholds(self.planned_counts(), self.planned_fractions(), self.arm_alpha, self.sides)[0]

    def final_boundary(self) -> float:
        """The last planned look's threshold on the z scale (for the conditional power of the futility rule)."""
        return _z_from_p(self.thresholds()[-1], 1.0, self.sides)


def decide(z, boundary: float, fraction: float, final_boundary: float, sides: int, futility_power: float,
           drift: float):
    """The rule at one look, for one z or an array of them: (crossed, futile, conditional power). Conditional
    power: the chance to end beyond the final boundary on the side of the claim the study exists for (a lower loss:
    z < 0 two-sided, z > 0 for a record) when the remaining runs carry the planned drift, from the B-value
    B(t) = z sqrt(t), whose increment to t = 1 is normal with mean drift (1 - t) and variance 1 - t. So an arm
    heading for "worse" stops as futile instead of spending runs to prove it harmful. Non-binding: the boundaries
    are set as if no arm ever stopped for futility, so stopping never raises the false-claim rate."""
    z = np.asarray(z, dtype=float)
    crossed = (np.abs(z) if sides == 2 else z) >= boundary
    if fraction >= 1:
        return crossed, np.zeros_like(crossed), np.zeros_like(z)
    toward_claim = -z if sides == 2 else z
    rest = 1 - fraction
    power = stats.norm.sf((final_boundary - toward_claim * math.sqrt(fraction) - drift * rest) / math.sqrt(rest))
    return crossed, ~crossed & (power < futility_power), power


def _effective_runs(n_arm: int, n_baseline: int | None) -> float:
    """Runs per arm carrying the information of a two-sample comparison (n per arm when equal)."""
    if n_baseline is None:
        return float(n_arm)
    return 2 * n_arm * n_baseline / (n_arm + n_baseline)


def _z_from_p(p: float, sign: float, sides: int) -> float:
    return float(sign * stats.norm.isf(min(1.0, max(p, 1e-300)) / sides))


def _split(losses):
    """(finite losses, number of diverged runs: nan or inf) of a list of final losses (None: no finished run)."""
    values = [float(v) for v in losses if v is not None]
    finite = [v for v in values if math.isfinite(v)]
    return finite, len(values) - len(finite)


def take_look(design: Design, previous: list[dict], losses, baseline_losses=None, target: float | None = None,
              final_boundary: float | None = None) -> dict | None:
    """One look at an arm (two-sided Welch test against `baseline_losses`) or at a record claim (one-sided test
    of mean < `target`), given the looks already taken for it (dicts as returned here). None when there is no new
    information since the last look or too few runs to test. The returned dict holds the look's number, runs,
    information fraction, boundary (z) and threshold (nominal p), z, p, decision and, at a deciding look, the
    adjusted p-value. A diverged run (final loss nan or inf) on either side ends the arm: "diverged", a failure of
    the claim (adjusted p 1)."""
    losses, diverged = _split(losses)
    n = len(losses) + diverged
    base, base_diverged = _split(baseline_losses) if baseline_losses is not None else ([], 0)
    n_baseline = None if baseline_losses is None else len(base) + base_diverged
    if n < 2 or (n_baseline is not None and n_baseline < 2):
        return None
    fraction = min(1.0, _effective_runs(n, n_baseline) / design.max_seeds)
    fractions = tuple([look["fraction"] for look in previous] + [fraction])
    if previous and fraction <= previous[-1]["fraction"]:
        return None
    look = {"look": len(fractions), "n": n, "n_baseline": n_baseline, "fraction": fraction,
            "n_diverged": diverged, "n_baseline_diverged": base_diverged, "decision": "continue",
            "adjusted_p": None}
    if diverged or base_diverged:
        where = f"{diverged} of {n} runs" if diverged else f"{base_diverged} of {n_baseline} baseline runs"
        look.update(boundary=math.inf, nominal_p=0.0, estimate=math.nan, z=0.0, p=1.0, repeated_ci=None,
                    decision="diverged", adjusted_p=1.0, why=f"{where} diverged (final loss nan or inf): a failed claim")
        return look
    counts = tuple((look_["n"], look_["n_baseline"]) for look_ in previous) + ((n, n_baseline),)
    # Looks at the planned counts are calibrated on the planned design's simulation, whichever look this is: a
    # simulation of the looks so far only would draw other null paths at every look (Monte Carlo noise of ~10% in a
    # threshold), and the boundaries would not be those benchmarks/sequential_sim.py measures. Unplanned looks
    # (unequal arms) are calibrated on the looks taken.
    planned = design.planned_counts(), design.planned_fractions()
    calibration = planned if (counts, fractions) == tuple(part[:len(counts)] for part in planned) else (counts,
                                                                                                           fractions)
    index = len(counts) - 1
    thresholds, _ = calibrated_thresholds(*calibration, design.arm_alpha, design.sides)
    nominal_p = thresholds[index]
    boundary = _z_from_p(nominal_p, 1.0, design.sides) if nominal_p > 0 else math.inf
    level = 1 - max(nominal_p, 1e-12)
    if design.sides == 2:
        test = welch(losses, base, confidence=level)
        estimate, p, interval = test["diff"], test["p"], test["ci"]
        z = None if p is None else _z_from_p(p, -1.0 if estimate < 0 else 1.0, 2)
    else:
        estimate = float(np.mean(losses))
        p = p_below_target(losses, target)
        z = None if p is None else _z_from_p(p, 1.0, 1)
        upper = estimate + stats.t.isf(1 - level, n - 1) * float(np.std(losses, ddof=1)) / math.sqrt(n)
        interval = [None, float(upper)]
    if p is None:  # every run at one loss (both sides, or a record claim): no noise, no test, never a claim
        p, z, look["why"] = 1.0, 0.0, "cannot test: no variance"
    look.update(boundary=boundary, nominal_p=nominal_p, estimate=estimate, z=z, p=p, repeated_ci=interval)
    final = final_boundary if final_boundary is not None else design.final_boundary()
    _, futile, power = decide(z, boundary, fraction, final, design.sides, design.futility_power, design.drift())
    if p <= nominal_p:
        look["decision"] = ("better" if estimate < 0 else "worse") if design.sides == 2 else "below target"
    elif fraction >= 1:
        look["decision"] = "not shown"
    else:
        look["conditional_power"] = float(power)
        if futile:
            look["decision"] = "futile"
    if look["decision"] == "futile":
        look["adjusted_p"] = 1.0  # non-binding futility: never claimed, whatever the stagewise ordering says
    elif look["decision"] != "continue":
        look["adjusted_p"] = stagewise_p(*calibration, design.arm_alpha, design.sides, p, index)
    return look


def describe_look(arm: str, look: dict, design: dict) -> str:
    """One line per arm per look: runs, estimate, repeated CI, z against its boundary, decision, adjusted p."""
    if look["decision"] == "diverged":
        return f"look {look['look']} {arm}: n {look['n']}: {look['why']} -> diverged"
    low, high = look["repeated_ci"] or [None, None]
    two_arms = design["claim"] == "vs-baseline"
    interval = f"[{_number(low)}, {_number(high)}]" if two_arms else f"upper {_number(high)}"
    versus = f" vs {look['n_baseline']}" if look["n_baseline"] is not None else ""
    adjusted = f", adjusted p {look['adjusted_p']:.3g}" if look["adjusted_p"] is not None else ""
    return (f"look {look['look']} {arm}: n {look['n']}{versus} (t {look['fraction']:.2f}), "
            f"{'diff' if two_arms else 'mean'} {look['estimate']:+.5f} repeated CI {interval}, z {look['z']:+.2f} "
            f"bound {look['boundary']:.2f} (nominal p {look['nominal_p']:.2g}), p {look['p']:.3g} -> "
            f"{decision_shown(look)}{adjusted}")


def _number(value) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.5f}"


CLAIMS = ("better", "worse", "below target")


def study_verdicts(state: dict) -> dict:
    """One verdict per arm of a sequential study (runs/<study>/sequential.json): {arm: {decision, n, p (the
    last look's fixed-sample p, not valid after looking), adjusted_p (the arm's sequential p), family_p (Holm over
    the family; the arm's own when the study's arms are exploratory), claim (a claim made at the study's alpha:
    "better", "worse", "below target", else None)}}."""
    design = state["design"]
    last = {arm: (state["looks"][arm][-1] if state["looks"][arm] else None) for arm in design["arms"]}
    adjusted = {arm: (look["adjusted_p"] if look else None) for arm, look in last.items()}
    family = design.get("family", True) and design.get("family_size", 1) > 1
    family_p = holm_family(adjusted) if family else adjusted
    verdicts = {}
    for arm, look in last.items():
        decision = look["decision"] if look else "no look"
        claimed = (family_p[arm] is not None and sequential_rule_claims(family_p[arm], design["alpha"])
                   and look["decision"] != "diverged")
        if claimed and decision not in CLAIMS:  # Holm recycles alpha to an arm that ended without crossing
            decision = ("better" if look["estimate"] < 0 else "worse") if design["claim"] == "vs-baseline" \
                else "below target"
        verdicts[arm] = {"decision": decision, "n": look["n"] if look else 0, "p": look["p"] if look else None,
                         "adjusted_p": adjusted[arm], "family_p": family_p[arm],
                         "claim": decision if claimed else None,
                         "why": look.get("why") if look and not claimed else None}
    return verdicts


# What a fixed-sample p-value is once a study has looked at its runs sequentially: its level is no longer alpha
AFTER_LOOKING = "fixed-sample, not valid after the sequential looks"


def decision_shown(verdict: dict) -> str:
    """A verdict's decision as every door prints it, with the look's reason when it gave one (e.g. "futile: cannot
    test: no variance")."""
    return f"{verdict['decision']}: {verdict['why']}" if verdict.get("why") else verdict["decision"]


def verdict_text(arm: str, verdict: dict) -> str:
    """One arm's sequential verdict in a few words: its claim (or why none), runs, sequential and family p."""
    text = f"{arm}: {verdict['claim'] or 'no claim (' + decision_shown(verdict) + ')'} after {verdict['n']} seeds"
    if verdict["adjusted_p"] is not None:
        text += f", sequential p {verdict['adjusted_p']:.3g}, family p {verdict['family_p']:.3g}"
    return text


def family_phrase(design: dict) -> str:
    """What the study's claims are controlled as, in a few words."""
    size = design.get("family_size", 1)
    if not design.get("family", True):
        return (f"arms exploratory (study key family = false): each tested at alpha {design['alpha']:g}, claims NOT "
                f"family-controlled")
    against = design["baseline"] or f"the target {design['target']:g}"  # which target: a claim holds for it alone
    return (f"family of {size} arm(s) against {against}, family-wise alpha "
            f"{design['alpha']:g} (Holm over the arms' sequential p-values)")


def render_markdown(state: dict) -> str:
    """The report section of a sequential study (runs/<study>/sequential.json): design, looks, verdicts."""
    design = state["design"]
    factor = design.get("max_factor", 1.0)  # records from before the key had the fixed-n design's maximum
    factor = f" ({factor:g} x the fixed-n design's)" if factor != 1 else ""
    claim = (f"each arm against `{design['baseline']}`, two-sided Welch t-test" if design["claim"] == "vs-baseline"
             else f"each arm's mean final loss below {design['target']:g}, one-sided t-test")
    lines = [f"Group-sequential design: {claim}; {family_phrase(design)}. Each arm's looks spend alpha / "
             f"{design.get('family_size', 1)} by alpha t^3, with p-value thresholds calibrated by simulating the "
             f"t-tests at the looks' run counts; at most {design['max_seeds']} seeds per arm{factor}, "
             f"{design['batch']} more per look; non-binding futility: conditional power toward a lower loss under the "
             f"effect the fixed-n design detects with power 0.8 below {Design.futility_power:g}. The adjusted p (stagewise ordering) is given at the look that "
             f"decided; a look's p is its fixed-sample p, not valid after looking.", "",
             "| arm | verdict | n | sequential p | family p (Holm) |", "| --- | --- | --- | --- | --- |"]
    for arm, verdict in study_verdicts(state).items():
        lines.append(f"| {arm} | {verdict['claim'] or 'no claim: ' + decision_shown(verdict)} | {verdict['n']} | "
                     f"{_p(verdict['adjusted_p'])} | {_p(verdict['family_p'])} |")
    lines += ["", "| arm | look | n | t | estimate | repeated CI | z | bound | p (fixed-sample) | decision | "
                  "adjusted p |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, looks in state["looks"].items():
        for look in looks:
            low, high = look["repeated_ci"] or [None, None]
            n = f"{look['n']}" + (f" vs {look['n_baseline']}" if look["n_baseline"] is not None else "")
            lines.append(f"| {arm} | {look['look']} | {n} | {look['fraction']:.2f} | {look['estimate']:+.5f} | "
                         f"[{_number(low)}, {_number(high)}] | {look['z']:+.2f} | {look['boundary']:.2f} | "
                         f"{look['p']:.3g} | {look['decision']} | {_p(look['adjusted_p'])} |")
    return "\n".join(lines)


# Every decision take_look writes: "continue" leaves the arm open, the others end it.
DECISIONS = ("continue", "better", "worse", "below target", "not shown", "futile", "diverged")


def record_look_problem(arm: str, looks) -> str | None:
    """What makes an arm's recorded looks ones take_look never writes (a hand-edited or damaged record), or None."""
    if not isinstance(looks, list):
        return f"the looks of {arm} are not a list"
    for index, look in enumerate(looks, start=1):
        if not isinstance(look, dict):
            return f"look {index} of {arm}: not a table"
        if look.get("decision") not in DECISIONS:
            return f"look {index} of {arm}: decision {look.get('decision')!r} is not one of {', '.join(DECISIONS)}"
        for key in ("n", "fraction", "boundary", "z", "p", "estimate"):
            if isinstance(look.get(key), bool) or not isinstance(look.get(key), (int, float)):
                return f"look {index} of {arm}: {key} {look.get(key)!r} is not a number"
    return None


def _p(value) -> str:
    return "-" if value is None else f"{value:.3g}"


RECORD_FILE = "sequential.json"
STUDY_CLAIMS = ("vs-baseline", "below-target")


def design_digest(design: dict) -> str:
    """A digest of a record's design, written beside it by the runner: a design edited by hand no longer matches it,
    so every reader refuses what the runner (which compares the design with the study file's) refuses."""
    import hashlib  # noqa: PLC0415

    return hashlib.sha256(json.dumps(design, sort_keys=True).encode()).hexdigest()[:16]


def record_problem(state) -> str | None:
    """What makes a sequential record one the study runner never writes (damaged, hand-edited, implausible), or
    None. The one check every reader applies: the runner refuses to resume such a record and every command refuses
    to print a claim from it."""
    if not isinstance(state, dict) or not isinstance(state.get("design"), dict) or not isinstance(
            state.get("looks"), dict):
        return "no design and looks tables"
    design = state["design"]
    if "design_digest" in state and state["design_digest"] != design_digest(design):
        return "its design was edited after the runner wrote it (design_digest differs)"
    if design.get("claim") not in STUDY_CLAIMS:
        return f"claim {design.get('claim')!r} is not one of {', '.join(STUDY_CLAIMS)}"
    alpha, most = design.get("alpha"), design.get("max_seeds")
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        return f"alpha {alpha!r} is not a number strictly between 0 and 1"
    if isinstance(most, bool) or not isinstance(most, int) or most < 2:
        return f"max_seeds {most!r} is not a whole number of at least 2"
    arms = design.get("arms")
    if not isinstance(arms, list) or not all(isinstance(arm, str) for arm in arms):
        return "its arms are not a list of names"
    if design["claim"] == "below-target" and (isinstance(design.get("target"), bool)
                                              or not isinstance(design.get("target"), (int, float))):
        return f"target {design.get('target')!r} of a below-target study is not a number"
    for arm in arms:
        if arm not in state["looks"]:
            return f"no looks entry for {arm}"
        problem = record_look_problem(arm, state["looks"][arm])
        if problem is not None:
            return problem
        for index, look in enumerate(state["looks"][arm], start=1):
            counts = [look["n"]] + ([look["n_baseline"]] if look.get("n_baseline") is not None else [])
            if any(isinstance(n, bool) or not isinstance(n, int) or not 2 <= n <= most for n in counts):
                return f"look {index} of {arm}: n {look['n']} is beyond the design's 2..{most} seeds per arm"
            if not 0 <= look["p"] <= 1:  # also nan
                return f"look {index} of {arm}: p {look['p']!r} is not a probability"
    return None


def read_record(path) -> dict | None:
    """The sequential record at `path` (a study's sequential.json), or None when there is none; UsageError (one
    line) when it is not one the study runner wrote (record_problem), whatever is wrong with it: a cut or binary
    file, a folder, JSON of another shape, an implausible look."""
    from speedrun.errors import UsageError  # noqa: PLC0415 (speedrun.errors holds no torch)

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return None
    try:
        state = json.loads(path.read_text("utf-8"))
        problem = record_problem(state)
    except (OSError, ValueError) as error:
        problem = (error.strerror if isinstance(error, OSError) and error.strerror else
                   "not JSON" if isinstance(error, ValueError) else str(error))
        if path.is_dir():
            problem = "a folder, not a file"
    if problem is not None:
        raise UsageError(f"{path}: not a sequential record the study runner wrote ({problem}); move it aside")
    return state


def decided(look: dict | None) -> bool:
    return look is not None and look["decision"] != "continue"


def design_dict(design: Design) -> dict:
    return asdict(design)
