"""Simulated studies: the group-sequential rule of `--until-decided` against a naive "look after every seed" rule
and against the fixed-n design of equal power, at the medium track's real seed-to-seed std.

    python benchmarks/sequential_sim.py [--studies 10000] [--seed 0]

The std is the pooled within-record sample std of the per-seed final losses published with upstream medium records
#14 and #15 (records/published_seed_losses.csv). The effect is the layer-11 backout's published gain: record #15's
mean final loss below record #14's (its runs, at 40 fewer steps). Each simulated study draws the final losses of
a baseline arm and one other arm as normal with that std; the rules see only the losses, as the runner does. The
sequential rule is analysis/sequential.py's (Welch p turned into z, Lan-DeMets O'Brien-Fleming-type boundaries,
conditional-power futility); the naive rule stops at the first seed count with Welch p < alpha."""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from analysis import power  # noqa: E402
from analysis.sequential import Design, decide, spending_boundaries  # noqa: E402

ALPHA = 0.01
POWER = 0.8


def welch_z(baseline_sum, baseline_squares, arm_sum, arm_squares, n):
    """Welch t-test of the first n seeds of every study from running sums, as a signed z (p-to-z) and its p."""
    mean_a, mean_b = arm_sum / n, baseline_sum / n
    var_a = np.maximum(arm_squares - n * mean_a ** 2, 0) / (n - 1)
    var_b = np.maximum(baseline_squares - n * mean_b ** 2, 0) / (n - 1)
    se2 = (var_a + var_b) / n
    df = se2 ** 2 / ((var_a / n) ** 2 / (n - 1) + (var_b / n) ** 2 / (n - 1))
    t = (mean_a - mean_b) / np.sqrt(se2)
    p = 2 * stats.t.sf(np.abs(t), df)
    return np.sign(t) * stats.norm.isf(p / 2), p


def simulate(effect: float, std: float, studies: int, max_seeds: int, batch: int, rng) -> dict:
    """Sequential and naive rules on the same simulated studies; seeds per arm where each stopped."""
    # centred draws (loss - baseline mean): running sums of squares stay exact in float64
    baseline = rng.normal(0.0, std, size=(studies, max_seeds))
    arm = rng.normal(-effect, std, size=(studies, max_seeds))
    sums = [np.cumsum(x, axis=1) for x in (baseline, arm)]
    squares = [np.cumsum(x ** 2, axis=1) for x in (baseline, arm)]
    design = Design(alpha=ALPHA, max_seeds=max_seeds, batch=batch)
    looks = sorted({max(2, n) for n in list(range(batch, max_seeds, batch)) + [max_seeds]})
    bounds = spending_boundaries([n / max_seeds for n in looks], ALPHA, 2)
    open_ = np.ones(studies, bool)
    stop_n = np.full(studies, max_seeds)
    rejected = np.zeros(studies, bool)
    naive_open, naive_n, naive_rejected = np.ones(studies, bool), np.full(studies, max_seeds), np.zeros(studies, bool)
    for n in range(2, max_seeds + 1):
        z, p = welch_z(sums[0][:, n - 1], squares[0][:, n - 1], sums[1][:, n - 1], squares[1][:, n - 1], n)
        hit = naive_open & (p < ALPHA)
        naive_rejected |= hit
        naive_n[hit] = n
        naive_open &= ~hit
        if n in looks:
            k = looks.index(n)
            crossed, futile, _ = decide(z, bounds[k], n / max_seeds, bounds[-1], 2, design.futility_power,
                                        design.drift())
            ends = open_ & (crossed | futile | (n == max_seeds))
            rejected |= open_ & crossed
            stop_n[ends] = n
            open_ &= ~ends
    return {"sequential_rejects": float(rejected.mean()), "sequential_mean_n": float(stop_n.mean()),
            "naive_rejects": float(naive_rejected.mean()), "naive_mean_n": float(naive_n.mean()),
            "bounds": bounds, "looks": looks}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    started = time.time()
    groups = power.published_losses("medium")
    estimate = power.pooled_std(groups, "records/published_seed_losses.csv")
    gain = float(np.mean(groups["record #14"]) - np.mean(groups["record #15"]))
    lines = [f"seed-to-seed {estimate.describe()}",
             f"effect: layer-11 backout's published gain = mean(record #14, 160 runs) - mean(record #15, 22 runs) = "
             f"{gain:.6f} (d = {gain / estimate.std:.3f})",
             f"alpha {ALPHA} two-sided; {args.studies} simulated studies per row; numpy Generator seed {args.seed}",
             ""]
    header = (f"{'effect':>9} {'batch':>5} {'max n':>5} {'rule':<34} {'P(reject)':>9} {'+-MC 2se':>8} "
              f"{'E[n]/arm':>8} {'fixed n same power':>18} {'runs saved':>10}")
    lines += [header, "-" * len(header)]
    rng = np.random.default_rng(args.seed)
    for batch in (1, 4):
        for effect_name, effect in (("published", gain), ("2x", 2 * gain)):
            fixed_n = power.seeds_for_difference(effect, estimate.std, ALPHA, POWER)
            max_seeds = math.ceil(1.1 * fixed_n / batch) * batch
            for label, true_effect in (("none", 0.0), (effect_name, effect)):
                result = simulate(true_effect, estimate.std, args.studies, max_seeds, batch, rng)
                for rule in ("sequential", "naive"):
                    rate = result[f"{rule}_rejects"]
                    se2 = 2 * math.sqrt(rate * (1 - rate) / args.studies)
                    mean_n = result[f"{rule}_mean_n"]
                    name = ("Lan-DeMets OBF + CP<0.1 futility" if rule == "sequential"
                            else "naive: every seed, stop at p<0.01")
                    same_power = saved = "-"
                    if true_effect and rule == "sequential":
                        equal = power.seeds_for_difference(effect, estimate.std, ALPHA, rate)
                        same_power = str(equal)
                        saved = f"{1 - mean_n / equal:+.0%}"
                    lines.append(f"{label:>9} {batch:>5} {max_seeds:>5} {name:<34} {rate:>9.4f} {se2:>8.4f} "
                                 f"{mean_n:>8.1f} {same_power:>18} {saved:>10}")
            lines.append(f"{'':>9} fixed-n design for power {POWER} at the {effect_name} effect: {fixed_n} seeds per arm;"
                         f" sequential boundaries first {result['bounds'][0]:.2f} last {result['bounds'][-1]:.3f}")
    lines += ["", f"{time.time() - started:.0f} s"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
