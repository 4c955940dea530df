"""Seeds planned by power: how many runs per arm a study needs, from the seed-to-seed std it measured.

Power is exact noncentral-t power (scipy.stats.nct), as statsmodels' TTestIndPower / TTestPower compute it:
- two arms, two-sided test of a final-loss difference `diff` (Welch's test; with equal n and equal std its df is
  2n-2, the pooled test's, which is what the plan assumes);
- a record claim, one-sided one-sample test that the mean is below `target`, given a pilot mean.
The std is the pooled within-arm sample std (n-1) of whatever runs are given: a study folder, any folder of logs,
or the track's published per-seed losses (records/published_seed_losses.csv)."""
from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

PUBLISHED_LOSSES = Path(__file__).resolve().parents[1] / "records" / "published_seed_losses.csv"
MAX_SEEDS = 1_000_000


def two_sample_power(n: int, effect_size: float, alpha: float) -> float:
    """Power of the two-sided two-sample t-test with n runs per arm at standardized effect `effect_size`."""
    df = 2 * n - 2
    noncentrality = abs(effect_size) * math.sqrt(n / 2)
    critical = stats.t.isf(alpha / 2, df)
    return float(stats.nct.sf(critical, df, noncentrality) + stats.nct.cdf(-critical, df, noncentrality))


def one_sample_power(n: int, effect_size: float, alpha: float) -> float:
    """Power of the one-sided one-sample t-test (mean below the target) with n runs; effect_size =
    (target - mean) / std, positive when the mean is below the target."""
    df = n - 1
    return float(stats.nct.sf(stats.t.isf(alpha, df), df, effect_size * math.sqrt(n)))


def smallest_n(power_of, wanted: float) -> int | None:
    """The smallest n >= 2 with power_of(n) >= wanted (power grows with n), None beyond MAX_SEEDS."""
    if power_of(MAX_SEEDS) < wanted:
        return None
    low, high = 1, 2  # power_of(low) < wanted <= power_of(high) once the doubling stops
    while power_of(high) < wanted:
        low, high = high, high * 2
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if power_of(middle) < wanted else (low, middle)
    return max(high, 2)


def seeds_for_difference(diff: float, std: float, alpha: float = 0.01, power: float = 0.8) -> int | None:
    """Runs per arm for the two-sided test to detect a final-loss difference `diff` with `power`."""
    return smallest_n(lambda n: two_sample_power(n, diff / std, alpha), power)


def seeds_for_record(pilot_mean: float, target: float, std: float, alpha: float = 0.01,
                     power: float = 0.8) -> int | None:
    """Runs for a chance `power` that the one-sided test gives mean < target at p < alpha, when the true mean is
    `pilot_mean`; None when the pilot mean is not below the target (no number of runs makes that likely)."""
    if pilot_mean >= target:
        return None
    return smallest_n(lambda n: one_sample_power(n, (target - pilot_mean) / std, alpha), power)


@dataclass
class StdEstimate:
    std: float
    runs: int  # finite final losses the estimate rests on
    groups: dict  # group name -> runs in it (groups with at least two runs)
    source: str

    def describe(self) -> str:
        parts = ", ".join(f"{name} ({n})" for name, n in self.groups.items())
        return (f"std {self.std:.6g}: pooled within-group sample std (n-1) of {self.runs} runs in "
                f"{len(self.groups)} group(s) from {self.source}: {parts}")


def pooled_std(groups: dict, source: str) -> StdEstimate:
    """Pooled within-group sample std of finite final losses ({name: [loss, ...]}); groups below two finite
    values are left out. ValueError when no group has two."""
    kept = {name: np.asarray([v for v in values if v is not None and math.isfinite(v)], dtype=float)
            for name, values in groups.items()}
    kept = {name: values for name, values in kept.items() if values.size >= 2}
    dof = sum(values.size - 1 for values in kept.values())
    if not dof:
        raise ValueError(f"no group in {source} has two finished runs to measure a seed-to-seed std from")
    squares = sum(float(np.sum((values - values.mean()) ** 2)) for values in kept.values())
    return StdEstimate(math.sqrt(squares / dof), sum(v.size for v in kept.values()),
                       {name: int(v.size) for name, v in kept.items()}, source)


def published_losses(track: str, table: Path = PUBLISHED_LOSSES) -> dict:
    """{"record #N": [final losses]} of the track's upstream records that published per-seed losses."""
    groups: dict = {}
    try:
        with open(table, newline="", encoding="utf-8") as handle:
            for row in csv.DictReader(handle):
                if row["track"] == track:
                    groups.setdefault(f"record #{row['record']}", []).append(float(row["final_val_loss"]))
    except (OSError, KeyError, ValueError) as problem:
        raise ValueError(f"{table}: {problem}") from None
    if not groups:
        raise ValueError(f"{table} holds no per-seed losses of the {track} track: give logs or --std")
    return groups
