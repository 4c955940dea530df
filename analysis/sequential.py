"""Group-sequential tests: stop adding seeds when the answer is in, without inflating false positives.

- Efficacy: Lan-DeMets alpha spending of O'Brien-Fleming type, alpha(t) = 2 - 2 Phi(z_{1-alpha/2} / sqrt(t)) at
  information fraction t (runs so far / planned maximum). Boundaries c_k on the z scale are found look by look so
  that the chance, under no effect, of first crossing at look k is alpha(t_k) - alpha(t_{k-1}); the joint law of
  the z statistics is multivariate normal with corr(Z_i, Z_j) = sqrt(t_i / t_j) (scipy.stats.multivariate_normal).
  Two-sided (two arms: |Z| >= c) or one-sided (a record: mean below the target, Z >= c).
- Small samples: each look's t-test p-value (Welch's test, or the one-sample test against the target) is turned
  into its normal z, so the decision is "p <= the look's nominal p" (the usual p-to-z mapping).
- Futility (non-binding, so it never raises alpha): stop when the conditional power to cross the final boundary,
  under the effect the design was planned for, is below `futility_power` (0.10 by default): stochastic
  curtailment (Lan, Simon and Halperin 1982). That effect is the one the fixed-n design of max_seeds / max_factor
  seeds detects with power `design_power` (0.8): drift theta = (z_{1-alpha/sides} + z_{design_power})
  sqrt(max_factor) at the last look. Plan the fixed n with `python -m analysis plan`. Ignoring the futility stop
  keeps the type I error. (Conditional power under the current trend was tried first: at the first looks its
  drift estimate z / sqrt(t) is so noisy that it stopped most true effects; benchmarks/sequential_sim.py showed
  power 0.18 for a design planned for 0.8.)
- Repeated confidence interval at look k: the t-interval at the look's nominal level (two-sided: difference arm -
  baseline; one-sided: an upper bound on the mean); it covers the truth at every look at once with 1 - alpha.
- Adjusted p-value at the look that ends the test, by stagewise ordering: alpha spent before that look plus the
  chance, under no effect, of staying inside until that look and then exceeding the observed |z|."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import numpy as np
from scipy import optimize, stats

from .stats import p_below_target, welch


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


def next_boundary(fractions, bounds, alpha: float, sides: int) -> float:
    """The boundary of the last look in `fractions`, given the boundaries already used at the earlier ones."""
    return _solve_boundary(_continuation(fractions[:-1], bounds, sides), fractions, alpha, sides)


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


def look_counts(max_seeds: int, batch: int) -> list[int]:
    """Seeds per arm at each look: every batch, the first look at two seeds at least, the last at max_seeds."""
    counts = list(range(batch, max_seeds, batch)) + [max_seeds]
    return sorted({max(2, n) for n in counts})


def sequential_max_seeds(fixed_seeds: int, max_factor: float) -> int:
    """The most seeds per arm of a sequential design allowed `max_factor` times the fixed-n design's seeds."""
    return math.ceil(max_factor * fixed_seeds - 1e-9)  # 1.1 x 10 is 11, not 12 by rounding


@dataclass
class Design:
    alpha: float
    max_seeds: int  # planned runs per arm at the last look
    batch: int  # runs per arm added between looks
    sides: int = 2  # 2: arm vs baseline; 1: a record's mean below the target
    futility_power: float = 0.10
    design_power: float = 0.8  # the fixed-n design of max_seeds / max_factor seeds has this power at the effect
    max_factor: float = 1.0  # max_seeds over the fixed-n design's seeds

    def drift(self) -> float:
        """The planned effect on the z scale at the last look: the fixed-n design's drift, times the square root
        of the information the larger maximum adds."""
        fixed = stats.norm.isf(self.alpha / self.sides) + stats.norm.isf(1 - self.design_power)
        return float(fixed * math.sqrt(self.max_factor))

    def planned_fractions(self) -> list[float]:
        return [n / self.max_seeds for n in look_counts(self.max_seeds, self.batch)]

    def final_boundary(self) -> float:
        return spending_boundaries(self.planned_fractions(), self.alpha, self.sides)[-1]


def decide(z, boundary: float, fraction: float, final_boundary: float, sides: int, futility_power: float,
           drift: float):
    """The rule at one look, for one z or an array of them: (crossed, futile, conditional power). Conditional
    power: the chance to end above the final boundary when the remaining runs carry the planned drift, from the
    B-value B(t) = z sqrt(t), whose increment to t = 1 is normal with mean drift (1 - t) and variance 1 - t."""
    strength = np.abs(z) if sides == 2 else np.asarray(z, dtype=float)
    crossed = strength >= boundary
    if fraction >= 1:
        return crossed, np.zeros_like(crossed), np.zeros_like(strength)
    rest = 1 - fraction
    power = stats.norm.sf((final_boundary - strength * math.sqrt(fraction) - drift * rest) / math.sqrt(rest))
    return crossed, ~crossed & (power < futility_power), power


def _effective_runs(n_arm: int, n_baseline: int | None) -> float:
    """Runs per arm carrying the information of a two-sample comparison (n per arm when equal)."""
    if n_baseline is None:
        return float(n_arm)
    return 2 * n_arm * n_baseline / (n_arm + n_baseline)


def _z_from_p(p: float, sign: float, sides: int) -> float:
    return float(sign * stats.norm.isf(p / sides))


def take_look(design: Design, previous: list[dict], losses, baseline_losses=None, target: float | None = None,
              final_boundary: float | None = None) -> dict | None:
    """One look at an arm (two-sided Welch test against `baseline_losses`) or at a record claim (one-sided test
    of mean < `target`), given the looks already taken for it (dicts as returned here). None when there is no new
    information since the last look or too few runs to test. The returned dict holds the look's number, runs,
    information fraction, boundary, z, p, nominal p, decision and, at a deciding look, the adjusted p-value."""
    losses = [v for v in losses if v is not None and math.isfinite(v)]
    n = len(losses)
    n_baseline = None if baseline_losses is None else len([v for v in baseline_losses if v is not None
                                                           and math.isfinite(v)])
    if n < 2 or (n_baseline is not None and n_baseline < 2):
        return None
    fraction = min(1.0, _effective_runs(n, n_baseline) / design.max_seeds)
    fractions = [look["fraction"] for look in previous]
    if fractions and fraction <= fractions[-1]:
        return None
    fractions.append(fraction)
    bounds = [look["boundary"] for look in previous]
    boundary = next_boundary(fractions, bounds, design.alpha, design.sides)
    nominal_p = float(design.sides * stats.norm.sf(boundary))
    if design.sides == 2:
        test = welch(losses, baseline_losses, confidence=1 - nominal_p)
        estimate, p, interval = test["diff"], test["p"], test["ci"]
        z = _z_from_p(p, -1.0 if estimate < 0 else 1.0, 2)
    else:
        estimate = float(np.mean(losses))
        p = p_below_target(losses, target)
        z = _z_from_p(p, 1.0, 1)
        upper = estimate + stats.t.isf(nominal_p, n - 1) * float(np.std(losses, ddof=1)) / math.sqrt(n)
        interval = [None, float(upper)]
    look = {"look": len(fractions), "n": n, "n_baseline": n_baseline, "fraction": fraction, "boundary": boundary,
            "nominal_p": nominal_p, "estimate": estimate, "z": z, "p": p, "repeated_ci": interval,
            "decision": "continue", "adjusted_p": None}
    strength = abs(z) if design.sides == 2 else z
    final = final_boundary if final_boundary is not None else design.final_boundary()
    crossed, futile, power = decide(z, boundary, fraction, final, design.sides, design.futility_power,
                                    design.drift())
    if crossed:
        look["decision"] = ("better" if estimate < 0 else "worse") if design.sides == 2 else "below target"
    elif fraction >= 1:
        look["decision"] = "not shown"
    else:
        look["conditional_power"] = float(power)
        if futile:
            look["decision"] = "futile"
    if look["decision"] != "continue":
        look["adjusted_p"] = adjusted_p(fractions, bounds, strength, design.sides)
    return look


def adjusted_p(fractions, earlier_bounds, strength: float, sides: int) -> float:
    """Stagewise-ordering p-value of a test that ended at the last of `fractions` with statistic `strength`
    (|z| two-sided, z one-sided): 1 - P(no crossing before, then a statistic below the observed one)."""
    if sides == 1 and strength <= -10:
        return 1.0
    return float(min(1.0, max(0.0, 1 - _stay_probability(list(earlier_bounds) + [strength], fractions, sides))))


def describe_look(arm: str, look: dict, design: dict) -> str:
    """One line per arm per look: runs, estimate, repeated CI, z against its boundary, decision, adjusted p."""
    low, high = look["repeated_ci"] or [None, None]
    two_arms = design["claim"] == "vs-baseline"
    interval = f"[{_number(low)}, {_number(high)}]" if two_arms else f"upper {_number(high)}"
    versus = f" vs {look['n_baseline']}" if look["n_baseline"] is not None else ""
    adjusted = f", adjusted p {look['adjusted_p']:.3g}" if look["adjusted_p"] is not None else ""
    return (f"look {look['look']} {arm}: n {look['n']}{versus} (t {look['fraction']:.2f}), "
            f"{'diff' if two_arms else 'mean'} {look['estimate']:+.5f} repeated CI {interval}, z {look['z']:+.2f} "
            f"bound {look['boundary']:.2f} (nominal p {look['nominal_p']:.2g}), p {look['p']:.3g} -> "
            f"{look['decision']}{adjusted}")


def _number(value) -> str:
    return "-" if value is None or not math.isfinite(value) else f"{value:.5f}"


def render_markdown(state: dict) -> str:
    """The report section of a sequential study (runs/<study>/sequential.json): design, looks, decisions."""
    design = state["design"]
    factor = design.get("max_factor", 1.0)
    factor = f" ({factor:g} x the fixed-n design's)" if factor != 1 else ""
    claim = (f"each arm against `{design['baseline']}`, two-sided Welch t-test" if design["claim"] == "vs-baseline"
             else f"each arm's mean final loss below {design['target']:g}, one-sided t-test")
    lines = [f"Group-sequential design: {claim}; Lan-DeMets O'Brien-Fleming-type alpha spending, alpha "
             f"{design['alpha']:g}, at most {design['max_seeds']} seeds per arm{factor}, {design['batch']} more per "
             f"look; non-binding futility: conditional power under the effect the fixed-n design detects with "
             f"power 0.8 below 0.1. Repeated CIs hold at every look at once; the adjusted p (stagewise ordering) is "
             f"given at the look that decided.", "",
             "| arm | look | n | t | estimate | repeated CI | z | bound | p | decision | adjusted p |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for arm, looks in state["looks"].items():
        for look in looks:
            low, high = look["repeated_ci"] or [None, None]
            n = f"{look['n']}" + (f" vs {look['n_baseline']}" if look["n_baseline"] is not None else "")
            adjusted = "" if look["adjusted_p"] is None else f"{look['adjusted_p']:.3g}"
            lines.append(f"| {arm} | {look['look']} | {n} | {look['fraction']:.2f} | {look['estimate']:+.5f} | "
                         f"[{_number(low)}, {_number(high)}] | {look['z']:+.2f} | {look['boundary']:.2f} | "
                         f"{look['p']:.3g} | {look['decision']} | {adjusted} |")
    return "\n".join(lines)


# Every decision take_look writes: "continue" leaves the arm open, the others end it.
DECISIONS = ("continue", "better", "worse", "below target", "not shown", "futile")


def decided(look: dict | None) -> bool:
    return look is not None and look["decision"] != "continue"


def design_dict(design: Design) -> dict:
    return asdict(design)
