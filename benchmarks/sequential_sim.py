"""Simulated studies: does every claim the analysis prints hold its stated error rate, and how many runs do the
sequential studies of `--until-decided` save where most ideas fail?

    python benchmarks/sequential_sim.py [--studies 20000] [--record-studies 200000] [--batch 1] [--seed 0]
                                        [--out FILE]

Each simulated study draws final losses as normal with the seed-to-seed std (medium track, 0.0015) and applies the
project's own rules to them: the fixed-sample comparison (Welch t-tests, Holm over the arms, as `compare` and the
terminal summary claim), the group-sequential rule of analysis/sequential.py (t-calibrated alpha t^3 boundaries at
alpha / family size per arm, conditional-power futility, stagewise p-values, Holm over the arms) and the record claim
(one-sample t-test of mean < target under sequential looks). Sections:
1. family-wise false-claim rate with 1, 5 and 15 arms and no effect anywhere (fixed and sequential);
2. the record claim's false-claim rate under sequential looks at most 5, 9 and 26 seeds (a look after every seed);
3. the mix of ideas (60% of arms no effect, 20% harmful by the planned effect, 20% helpful by it): runs per study,
   the helpful arms' power and the family-wise false-claim rate, against the fixed design of power 0.8 at the same
   family-wise alpha (Bonferroni seeds per arm, Holm claims). The sequential design is the runner's default:
   at most DEFAULT_MAX_FACTOR (1.15) x the fixed design's seeds, to the nearest seed, and a look after every
   `--batch` seeds per arm (1: what the runner, max(1, slots // arms), gives 5 or 10 arms on one 8-GPU node).
`+-` is two Monte Carlo standard errors. tests/benchmarks/test_claims_simulation.py runs a smaller version."""
from __future__ import annotations

import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy import stats

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from analysis import power  # noqa: E402
from analysis.cli import at_least_two, positive_int  # noqa: E402
from analysis.sequential import (DEFAULT_MAX_FACTOR, Design, _null_p_values, calibrated_thresholds,  # noqa: E402
                                 decide, look_counts, look_p_values, sequential_max_seeds)
from analysis.stats import holm  # noqa: E402
from speedrun.errors import OneLineErrorParser  # noqa: E402

ALPHA = 0.01
STD = 0.0015  # medium track seed-to-seed std (records/published_seed_losses.csv: 0.0014-0.0016)
EFFECTS = (0.004, 0.002, 0.001)  # planned final-loss effects (d = 2.7, 1.3, 0.67)
# Seeds per arm between looks: the runner's batch is max(1, slots // arms); a medium-track run takes all 8 GPUs of a
# node (1 slot), and even single-GPU runs give an 8-GPU node's 5 or 10 arms 1 seed per look
BATCH = 1


@dataclass
class Outcome:
    false_claim: np.ndarray  # per study: any claim on a null arm, or a claim in the wrong direction
    helpful_claimed: np.ndarray  # per helpful arm: claimed better
    runs: np.ndarray  # per study: runs of all arms and the baseline

    def rate(self) -> float:
        return float(self.false_claim.mean())


def holm_rows(p: np.ndarray) -> np.ndarray:
    """Holm-adjusted p-values of every row (a study's arms)."""
    return np.array([holm(list(row)) for row in p], dtype=float) if p.shape[1] > 1 else p


def _false_claims(claimed: np.ndarray, direction: np.ndarray, effects: np.ndarray) -> np.ndarray:
    wrong = (effects[None, :] == 0) | (np.sign(effects)[None, :] * direction < 0)
    return (claimed & wrong).any(axis=1)


def fixed_study(effects, seeds: int, studies: int, rng, alpha: float = ALPHA) -> Outcome:
    """Every arm and the baseline at `seeds` runs; Welch t-tests, Holm over the arms; a claim at Holm p <= alpha."""
    effects = np.asarray(effects, float)
    arms = len(effects)
    baseline = rng.standard_normal((studies, seeds))
    draws = rng.standard_normal((studies, arms, seeds)) + effects[None, :, None] / STD
    p, sign = look_p_values(draws.reshape(studies * arms, seeds), np.repeat(baseline, arms, axis=0),
                            ((seeds, seeds),), 2)
    p, sign = p.reshape(studies, arms), sign.reshape(studies, arms)
    claimed = holm_rows(p) <= alpha
    return Outcome(_false_claims(claimed, sign, effects), claimed[:, effects < 0].ravel() & (sign[:, effects < 0]
                                                                                              < 0).ravel(),
                   np.full(studies, seeds * (arms + 1)))


def sequential_study(effects, design: Design, studies: int, rng) -> Outcome:
    """The rule of `--until-decided` on simulated studies: each look's t-test p against the calibrated threshold,
    futility by conditional power, the stagewise p of each arm where it ended (1 after futility), Holm over the
    arms. sides 1 (no baseline): the record claim, each arm's mean against the target (effect: mean - target)."""
    effects = np.asarray(effects, float)
    arms, sides = len(effects), design.sides
    counts, fractions = design.planned_counts(), design.planned_fractions()
    thresholds, decided_before = calibrated_thresholds(counts, fractions, design.arm_alpha, sides)
    null = _null_p_values(counts, sides)
    still_open = np.ones(null.shape[0], bool)
    open_null = []  # per look: the sorted null p-values of the simulated null studies still open there
    for k, threshold in enumerate(thresholds):
        open_null.append(np.sort(null[still_open, k]))
        still_open &= null[:, k] > threshold
    most = design.max_seeds
    draws = rng.standard_normal((studies, arms, most)) + effects[None, :, None] / STD
    baseline = np.repeat(rng.standard_normal((studies, most)), arms, axis=0) if sides == 2 else None
    p, sign = look_p_values(draws.reshape(studies * arms, most), baseline, counts, sides)
    p, sign = p.reshape(studies, arms, -1), sign.reshape(studies, arms, -1)
    final, drift = design.final_boundary(), design.drift()
    active = np.ones((studies, arms), bool)
    stop_n = np.full((studies, arms), most)
    adjusted = np.ones((studies, arms))
    direction = np.zeros((studies, arms))
    for k, ((n, _), fraction, threshold) in enumerate(zip(counts, fractions, thresholds)):
        z = stats.norm.isf(p[:, :, k] / sides) * (sign[:, :, k] if sides == 2 else 1.0)
        crossed = p[:, :, k] <= threshold
        _, futile, _ = decide(z, math.inf, fraction, final, sides, design.futility_power, drift)
        ends = active & (crossed | futile | (k == len(counts) - 1))
        tested = ends & ~(futile & ~crossed)  # an arm that crossed or reached the end: its stagewise p
        stagewise = decided_before[k] + np.searchsorted(open_null[k], p[:, :, k], side="right") / null.shape[0]
        adjusted[tested] = np.minimum(1.0, stagewise[tested])
        stop_n[ends], direction[ends] = n, sign[:, :, k][ends]
        active &= ~ends
    family_p = holm_rows(adjusted) if design.family_size > 1 else adjusted
    claimed = family_p <= design.alpha
    if sides == 1:  # a claim "below target" is one-sided: always "lower"
        direction = np.where(claimed, -1.0, direction)
    runs = stop_n.sum(axis=1) + (stop_n.max(axis=1) if sides == 2 else 0)
    helpful = effects < 0
    return Outcome(_false_claims(claimed, direction, effects),
                   (claimed[:, helpful] & (direction[:, helpful] < 0)).ravel(), runs)


def fixed_seeds(effect: float, arms: int, alpha: float = ALPHA, wanted: float = 0.8) -> int:
    """Seeds per arm of the fixed design with power `wanted` at the family-wise alpha (Bonferroni per arm)."""
    return power.seeds_for_difference(effect, STD, alpha / arms, wanted)


def sequential_design(effect: float, arms: int, alpha: float = ALPHA, batch: int = BATCH,
                      max_factor: float = DEFAULT_MAX_FACTOR) -> Design:
    """The sequential design whose fixed counterpart has power 0.8 at `effect`, at most max_factor its seeds."""
    fixed = fixed_seeds(effect, arms, alpha)
    return Design(alpha=alpha, max_seeds=sequential_max_seeds(fixed, max_factor), batch=batch,
                  max_factor=max_factor, family_size=arms)


def record_design(max_seeds: int, alpha: float = ALPHA) -> Design:
    """A record claim (one-sided, mean below the target) with a look after every seed up to `max_seeds`."""
    return Design(alpha=alpha, max_seeds=max_seeds, batch=1, sides=1)


def mix_effects(arms: int, effect: float) -> np.ndarray:
    """60% of the arms no effect, 20% harmful by `effect`, 20% helpful by it (at least one helpful arm)."""
    helpful = max(1, round(0.2 * arms))
    harmful = round(0.2 * arms)
    return np.array([-effect] * helpful + [effect] * harmful + [0.0] * (arms - helpful - harmful))


def share(rate: float, studies: int) -> str:
    """A rate with twice its Monte Carlo standard error."""
    return f"{rate:.4f} +-{2 * math.sqrt(max(rate * (1 - rate), 1e-12) / studies):.4f}"


def null_rates(studies: int, rng, arm_counts=(1, 5, 15), effect: float = EFFECTS[1],
               batch: int = BATCH) -> list[str]:
    lines = [f"{'arms':>4} {'fixed seeds':>11} {'fixed: P(any false claim)':>26} {'max seeds':>9} "
             f"{'sequential: P(any false claim)':>31}"]
    for arms in arm_counts:
        seeds, design = fixed_seeds(effect, arms), sequential_design(effect, arms, batch=batch)
        fixed = fixed_study(np.zeros(arms), seeds, studies, rng).rate()
        sequential = sequential_study(np.zeros(arms), design, studies, rng).rate()
        lines.append(f"{arms:>4} {seeds:>11} {share(fixed, studies):>26} {design.max_seeds:>9} "
                     f"{share(sequential, studies):>31}")
    return lines


def record_rates(studies: int, rng, maxima=(5, 9, 26)) -> list[str]:
    lines = [f"{'max seeds':>9} {'looks':>28} {'P(false record claim)':>22}"]
    for most in maxima:
        rate = sequential_study(np.zeros(1), record_design(most), studies, rng).rate()
        looks = look_counts(most, 1)
        lines.append(f"{most:>9} {f'{looks[0]}..{looks[-1]} ({len(looks)})':>28} {share(rate, studies):>22}")
    return lines


def mix_rows(studies: int, rng, arm_counts=(5, 10), effects=EFFECTS, batch: int = BATCH) -> list[str]:
    lines = [f"{'arms':>4} {'effect':>7} {'fixed n':>7} {'fixed runs':>10} {'fixed power':>16} {'max n':>5} "
             f"{'seq runs':>8} {'saved':>6} {'seq power':>16} {'seq P(any false claim)':>23}"]
    for arms in arm_counts:
        for effect in effects:
            mix = mix_effects(arms, effect)
            seeds, design = fixed_seeds(effect, arms), sequential_design(effect, arms, batch=batch)
            fixed = fixed_study(mix, seeds, studies, rng)
            sequential = sequential_study(mix, design, studies, rng)
            helpful = sequential.helpful_claimed.size
            saved = 1 - sequential.runs.mean() / fixed.runs.mean()
            lines.append(f"{arms:>4} {effect:>7g} {seeds:>7} {fixed.runs.mean():>10.1f} "
                         f"{share(fixed.helpful_claimed.mean(), helpful):>16} {design.max_seeds:>5} "
                         f"{sequential.runs.mean():>8.1f} {saved:>+6.1%} "
                         f"{share(sequential.helpful_claimed.mean(), helpful):>16} "
                         f"{share(sequential.rate(), studies):>23}")
    return lines


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=at_least_two, default=20_000, help="simulated studies per row (20000)")
    parser.add_argument("--record-studies", type=at_least_two, default=200_000,
                        help="simulated record claims per row of section 2 (200000: its Monte Carlo error must be "
                             "small beside the 1.09-1.18%% it once measured)")
    parser.add_argument("--batch", type=positive_int, default=BATCH,
                        help=f"seeds per arm between the looks of sections 1 and 3 ({BATCH})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the numpy Generator (0)")
    parser.add_argument("--out", type=Path, help="also write the output to this file")
    args = parser.parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    lines = [f"std {STD}, family-wise alpha {ALPHA}, {args.studies} simulated studies per row, numpy Generator seed "
             f"{args.seed}; sequential: batch {args.batch} seed(s) per arm, at most {DEFAULT_MAX_FACTOR} x the "
             f"fixed design's seeds (nearest seed), futility: conditional power toward a lower loss < "
             f"{Design.futility_power:g}", "",
             "1. No effect in any arm: the chance of any false claim (fixed: Holm over Welch p; sequential: Holm "
             f"over the arms' stagewise p), effect planned {EFFECTS[1]}", ""]
    lines += null_rates(args.studies, rng, batch=args.batch)
    lines += ["", "2. The record claim (mean below the target) under sequential looks after every seed, no effect "
                  f"({args.record_studies} simulated claims per row)", ""]
    lines += record_rates(args.record_studies, rng)
    lines += ["", "3. The mix: 60% of arms no effect, 20% harmful, 20% helpful by the planned effect; runs per study "
                  "(arms and baseline) against the fixed design of power 0.8 at the same family-wise alpha", ""]
    lines += mix_rows(args.studies, rng, batch=args.batch)
    lines += ["", f"{time.time() - started:.0f} s"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
