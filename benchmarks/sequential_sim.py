"""Simulated studies: the group-sequential rule of `--until-decided` against a naive "look after every seed" rule
and against fixed-n designs, at the medium track's real seed-to-seed std, for several maxima (`--max-factor`).

    python benchmarks/sequential_sim.py [--studies 10000] [--seed 0] [--factors 1,1.1,1.25,1.5,2] [--out FILE]

The std is the pooled within-record sample std of the per-seed final losses published with upstream medium records
#14 and #15 (records/published_seed_losses.csv). The effect is the layer-11 backout's published gain: record #15's
mean final loss below record #14's (its runs, at 40 fewer steps). Each simulated study draws the final losses of
a baseline arm and one other arm as normal with that std; the rules see only the losses, as the runner does. The
sequential rule is analysis/sequential.py's (Welch p turned into z, Lan-DeMets O'Brien-Fleming-type boundaries,
conditional-power futility) with at most F times the seeds of the fixed-n design of power 0.8; the naive rule stops
at the first seed count with Welch p < alpha. Runs saved are counted against (a) the fixed-n design with the power
the sequential rule reached and (b) the fixed-n design of power 0.8."""
from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from analysis import power  # noqa: E402
from analysis.cli import at_least_one, at_least_two, positive_int  # noqa: E402
from analysis.sequential import Design, decide, look_counts, sequential_max_seeds, spending_boundaries  # noqa: E402
from speedrun.errors import OneLineErrorParser  # noqa: E402

ALPHA = 0.01
POWER = 0.8
FACTORS = (1.0, 1.1, 1.25, 1.5, 2.0)


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


def simulate(effect: float, std: float, studies: int, design: Design, bounds, rng, naive: bool = False) -> dict:
    """The sequential rule (and, with `naive`, the naive rule on the same studies): the share of studies that
    rejected and the mean seeds per arm where each stopped. `bounds`: the design's boundaries at its looks."""
    max_seeds = design.max_seeds
    # centred draws (loss - baseline mean): running sums of squares stay exact in float64
    baseline = rng.normal(0.0, std, size=(studies, max_seeds))
    arm = rng.normal(-effect, std, size=(studies, max_seeds))
    sums = [np.cumsum(x, axis=1) for x in (baseline, arm)]
    squares = [np.cumsum(x ** 2, axis=1) for x in (baseline, arm)]
    del baseline, arm
    looks = look_counts(max_seeds, design.batch)
    open_ = np.ones(studies, bool)
    stop_n = np.full(studies, max_seeds)
    rejected = np.zeros(studies, bool)
    naive_open, naive_n, naive_rejected = np.ones(studies, bool), np.full(studies, max_seeds), np.zeros(studies, bool)
    for n in (range(2, max_seeds + 1) if naive else looks):
        z, p = welch_z(sums[0][:, n - 1], squares[0][:, n - 1], sums[1][:, n - 1], squares[1][:, n - 1], n)
        if naive:
            hit = naive_open & (p < design.alpha)
            naive_rejected |= hit
            naive_n[hit] = n
            naive_open &= ~hit
        if n in looks:
            crossed, futile, _ = decide(z, bounds[looks.index(n)], n / max_seeds, bounds[-1], design.sides,
                                        design.futility_power, design.drift())
            ends = open_ & (crossed | futile | (n == max_seeds))
            rejected |= open_ & crossed
            stop_n[ends] = n
            open_ &= ~ends
    result = {"rejects": float(rejected.mean()), "mean_n": float(stop_n.mean())}
    if naive:
        result.update(naive_rejects=float(naive_rejected.mean()), naive_mean_n=float(naive_n.mean()))
    return result


def _share(rate: float, studies: int) -> str:
    """A rejection rate with twice its Monte Carlo standard error."""
    return f"{rate:.4f} +-{2 * math.sqrt(rate * (1 - rate) / studies):.4f}"


def factor_table(effects: dict, std: float, studies: int, factors, batches, rng) -> list[str]:
    """One row per (batch, effect, max factor): both hypotheses, and the runs saved against both fixed designs."""
    header = (f"{'batch':>5} {'effect':>9} {'F':>5} {'max n':>5} | {'no effect: P(reject)':>20} {'E[n]/arm':>8} | "
              f"{'effect: P(reject)':>17} {'E[n]/arm':>8} | {'(a) fixed n same power':>22} {'saved':>6} | "
              f"{'(b) fixed n power 0.8':>21} {'saved':>6}")
    lines = [header, "-" * len(header)]
    for batch in batches:
        for name, effect in effects.items():
            fixed_n = power.seeds_for_difference(effect, std, ALPHA, POWER)
            for factor in factors:
                design = Design(alpha=ALPHA, max_seeds=sequential_max_seeds(fixed_n, factor), batch=batch,
                                max_factor=factor)
                bounds = spending_boundaries(design.planned_fractions(), ALPHA, 2)
                null = simulate(0.0, std, studies, design, bounds, rng)
                alternative = simulate(effect, std, studies, design, bounds, rng)
                equal = power.seeds_for_difference(effect, std, ALPHA, alternative["rejects"])
                lines.append(
                    f"{batch:>5} {name:>9} {factor:>5g} {design.max_seeds:>5} | "
                    f"{_share(null['rejects'], studies):>20} {null['mean_n']:>8.1f} | "
                    f"{_share(alternative['rejects'], studies):>17} {alternative['mean_n']:>8.1f} | "
                    f"{equal:>22} {1 - alternative['mean_n'] / equal:>+6.1%} | "
                    f"{fixed_n:>21} {1 - alternative['mean_n'] / fixed_n:>+6.1%}")
    return lines


def naive_table(effects: dict, std: float, studies: int, rng) -> list[str]:
    """The naive rule next to the sequential one (F = 1, a look after every seed), on the same studies."""
    header = (f"{'effect':>9} {'true':>9} {'max n':>5} {'rule':<36} {'P(reject)':>16} {'E[n]/arm':>8}")
    lines = [header, "-" * len(header)]
    for name, effect in effects.items():
        design = Design(alpha=ALPHA, max_seeds=power.seeds_for_difference(effect, std, ALPHA, POWER), batch=1)
        bounds = spending_boundaries(design.planned_fractions(), ALPHA, 2)
        for label, true_effect in (("none", 0.0), (name, effect)):
            result = simulate(true_effect, std, studies, design, bounds, rng, naive=True)
            for rule, key in (("Lan-DeMets OBF + CP<0.1 futility", ""), ("naive: every seed, stop at p<0.01",
                                                                        "naive_")):
                lines.append(f"{name:>9} {label:>9} {design.max_seeds:>5} {rule:<36} "
                             f"{_share(result[key + 'rejects'], studies):>16} {result[key + 'mean_n']:>8.1f}")
    return lines


def _list_of(parse):
    """An argument type: a comma-separated list, each item read by `parse`."""
    return lambda text: [parse(item) for item in text.split(",")]


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=at_least_two, default=10_000, help="simulated studies per row (10000)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the numpy Generator (0)")
    parser.add_argument("--factors", type=_list_of(at_least_one), default=list(FACTORS),
                        help="most seeds per arm as these multiples of the fixed-n design's (1,1.1,1.25,1.5,2)")
    parser.add_argument("--batches", type=_list_of(positive_int), default=[1, 4],
                        help="seeds per arm added between looks (1,4)")
    parser.add_argument("--out", type=Path, help="also write the output to this file")
    args = parser.parse_args(argv)
    started = time.time()
    groups = power.published_losses("medium")
    estimate = power.pooled_std(groups, "records/published_seed_losses.csv")
    gain = float(np.mean(groups["record #14"]) - np.mean(groups["record #15"]))
    effects = {"published": gain, "2x": 2 * gain}
    fixed = {name: power.seeds_for_difference(effect, estimate.std, ALPHA, POWER) for name, effect in effects.items()}
    lines = [f"seed-to-seed {estimate.describe()}",
             f"effect: layer-11 backout's published gain = mean(record #14, 160 runs) - mean(record #15, 22 runs) = "
             f"{gain:.6f} (d = {gain / estimate.std:.3f}); fixed-n design of power {POWER}: "
             f"{fixed['published']} seeds per arm ({fixed['2x']} at 2x the gain)",
             f"alpha {ALPHA} two-sided; {args.studies} simulated studies per row (+- is 2 Monte Carlo standard "
             f"errors); numpy Generator seed {args.seed}", ""]
    rng = np.random.default_rng(args.seed)
    lines += ["1. Sequential rule vs naive rule (a look after every seed, at most the fixed-n design's seeds)", ""]
    lines += naive_table(effects, estimate.std, args.studies, rng)
    lines += ["", "2. Sequential rule with at most F x the fixed-n design's seeds per arm (--max-factor F); futility "
                  "under the effect the fixed-n design detects with power 0.8", ""]
    lines += factor_table(effects, estimate.std, args.studies, args.factors, args.batches, rng)
    lines += ["", f"{time.time() - started:.0f} s"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
