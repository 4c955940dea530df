"""Simulated studies: does every claim the analysis prints hold its stated error rate, and how many runs do the
sequential studies of `--until-decided` save where most ideas fail?

    python benchmarks/sequential_sim.py [--studies 20000] [--record-studies 200000] [--door-studies 2000]
                                        [--copy-studies 20000] [--batch 1] [--seed 0]
                                        [--best-studies 5000] [--sections 123456|12345|1234|123|4|5|6]
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
4. the doors: the same null studies through the product's own functions behind each command, study by study
   (compare with --arms naming the best arm after the fact, record-check's loss test, the runner's take_look and
   study_verdicts).
5. the copies: runs of null sequential studies (vs a baseline, and record claims) copied without their record, the
   study folder gone, through each door's own functions: runs whose logs name their study (the runner writes the
   line since issue 40) make no claim; logs from before the line show the fixed-sample rate they would get.
6. the best arm copied: null fixed-sample studies of 5 and 15 arms of which only the baseline and the best arm are
   copied, the study folder gone: runs whose logs name the study's arms are adjusted over all of them at every door;
   logs without the line show the rate of a family shrunk to the arms given.
Sections 1-3 take the vectorised path, which tests/benchmarks/test_claims_simulation.py holds to the product's
functions (identical decisions on 1,000 random studies each). `+-` is two Monte Carlo standard errors. tests/benchmarks/test_claims_simulation.py runs a smaller version."""
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
from analysis.claims import arm_claims, find_study_record, record_claim  # noqa: E402
from analysis.cli import at_least_two, positive_int  # noqa: E402
from analysis.compare import compare_arms  # noqa: E402
from analysis.record_check import record_check  # noqa: E402
from analysis.sequential import (DEFAULT_MAX_FACTOR, Design, _null_p_values, calibrated_thresholds,  # noqa: E402
                                 decide, decided, look_counts, look_p_values, sequential_max_seeds, study_verdicts,
                                 take_look)
from analysis.stats import fixed_rule_claims, holm, sequential_rule_claims  # noqa: E402
from speedrun.errors import OneLineErrorParser, UsageError  # noqa: E402
from speedrun.logformat import STUDY_KEY, study_value  # noqa: E402

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
    """Every arm and the baseline at `seeds` runs; Welch t-tests, Holm over the arms; a claim by the product's rule
    (analysis.stats.fixed_rule_claims, what `compare` and the terminal summary claim with)."""
    effects = np.asarray(effects, float)
    arms = len(effects)
    baseline = rng.standard_normal((studies, seeds))
    draws = rng.standard_normal((studies, arms, seeds)) + effects[None, :, None] / STD
    claimed, sign = fixed_decisions(draws, baseline, alpha)
    return Outcome(_false_claims(claimed, sign, effects), claimed[:, effects < 0].ravel() & (sign[:, effects < 0]
                                                                                              < 0).ravel(),
                   np.full(studies, seeds * (arms + 1)))


def fixed_decisions(draws: np.ndarray, baseline: np.ndarray, alpha: float = ALPHA):
    """(claimed, sign of the difference) per study and arm of fixed-sample studies: draws (studies x arms x seeds),
    baseline (studies x seeds). The vectorised path; tests/benchmarks/test_claims_simulation.py shows it decides as
    claims.arm_claims does."""
    studies, arms, seeds = draws.shape
    p, sign = look_p_values(draws.reshape(studies * arms, seeds), np.repeat(baseline, arms, axis=0),
                            ((seeds, seeds),), 2)
    p, sign = p.reshape(studies, arms), sign.reshape(studies, arms)
    return fixed_rule_claims(holm_rows(p), alpha), sign


class _Run:
    """The two figures of a run the claim functions read (a stand-in for analysis.logs.ParsedLog), every run one
    training: this project's log (not upstream's) with no config entry that differs."""
    diverged = False
    upstream = False
    config: dict = {}

    def __init__(self, loss: float):
        self.final_val_loss, self.train_time_s = float(loss), 1.0


def product_fixed_decisions(draws: np.ndarray, baseline: np.ndarray, alpha: float = ALPHA, shown=None):
    """The same decisions through the product's own functions, study by study: compare_arms and arm_claims, as the
    `compare` command runs them (`shown`: the arms a person named with --arms; "best": the arm with the lowest mean
    loss, picked after seeing the results)."""
    studies, arms, _ = draws.shape
    claimed, sign = np.zeros((studies, arms), bool), np.zeros((studies, arms))
    names = [f"arm{a}" for a in range(arms)]
    for study in range(studies):
        groups = {"baseline": [_Run(v) for v in baseline[study]]}
        groups.update({name: [_Run(v) for v in draws[study, a]] for a, name in enumerate(names)})
        if shown == "best":  # the arm with the lowest mean, named with --arms after seeing the results
            named = {names[int(np.argmin(draws[study].mean(axis=1)))]}
        else:
            named = shown
        result = compare_arms(groups, "baseline", 1 - alpha, shown=named)
        verdicts = {arm["variant"]: arm for arm in arm_claims(result, alpha)["arms"]}
        for a, name in enumerate(names):
            if name in verdicts:
                claimed[study, a] = verdicts[name]["claim"] is not None
                sign[study, a] = -1.0 if verdicts[name]["claim"] == "lower" else 1.0
    return claimed, sign


def sequential_study(effects, design: Design, studies: int, rng, product: bool = False) -> Outcome:
    """The rule of `--until-decided` on simulated studies (sides 1, no baseline: the record claim, each arm's mean
    against the target; effect: mean - target). `product`: through take_look and study_verdicts study by study
    (slow), else the vectorised path that tests/benchmarks/test_claims_simulation.py holds to them."""
    effects = np.asarray(effects, float)
    arms, most = len(effects), design.max_seeds
    draws = rng.standard_normal((studies, arms, most)) + effects[None, :, None] / STD
    baseline = rng.standard_normal((studies, most)) if design.sides == 2 else None
    decisions = product_sequential_decisions if product else sequential_decisions
    claimed, direction, stop_n = decisions(draws, baseline, design)
    runs = stop_n.sum(axis=1) + (stop_n.max(axis=1) if design.sides == 2 else 0)
    helpful = effects < 0
    return Outcome(_false_claims(claimed, direction, effects),
                   (claimed[:, helpful] & (direction[:, helpful] < 0)).ravel(), runs)


def sequential_decisions(draws: np.ndarray, baseline, design: Design):
    """(claimed, direction, seeds at the arm's last look) per study and arm, vectorised: each look's t-test p against
    the calibrated threshold, futility by conditional power (analysis.sequential.decide), the stagewise p where the
    arm ended (1 after futility), Holm over the arms, the claim by analysis.stats.sequential_rule_claims."""
    studies, arms, most = draws.shape
    sides = design.sides
    counts, fractions = design.planned_counts(), design.planned_fractions()
    thresholds, decided_before = calibrated_thresholds(counts, fractions, design.arm_alpha, sides)
    null = _null_p_values(counts, sides)
    still_open = np.ones(null.shape[0], bool)
    open_null = []  # per look: the sorted null p-values of the simulated null studies still open there
    for k, threshold in enumerate(thresholds):
        open_null.append(np.sort(null[still_open, k]))
        still_open &= null[:, k] > threshold
    repeated = np.repeat(baseline, arms, axis=0) if sides == 2 else None
    p, sign = look_p_values(draws.reshape(studies * arms, most), repeated, counts, sides)
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
    claimed = sequential_rule_claims(family_p, design.alpha)
    if sides == 1:  # a claim "below target" is one-sided: always "lower"
        direction = np.where(claimed, -1.0, direction)
    return claimed, direction, stop_n


def product_sequential_decisions(draws: np.ndarray, baseline, design: Design):
    """The same decisions as the study runner takes them: take_look at each planned look of each open arm (as
    ablations/sequential_study.py), then study_verdicts over the record, study by study."""
    studies, arms, most = draws.shape
    names = [f"arm{a}" for a in range(arms)]
    record_design = {"alpha": design.alpha, "claim": "vs-baseline" if design.sides == 2 else "below-target",
                     "baseline": "baseline" if design.sides == 2 else None,
                     "target": 0.0 if design.sides == 1 else None, "arms": names, "family": True,
                     "family_size": design.family_size}
    final = design.final_boundary()
    claimed, direction = np.zeros((studies, arms), bool), np.zeros((studies, arms))
    stop_n = np.zeros((studies, arms), int)
    for study in range(studies):
        looks = {name: [] for name in names}
        for n in look_counts(most, design.batch):
            base = list(baseline[study, :n]) if design.sides == 2 else None
            for a, name in enumerate(names):
                if looks[name] and decided(looks[name][-1]):
                    continue
                look = take_look(design, looks[name], list(draws[study, a, :n]), base,
                                 0.0 if design.sides == 1 else None, final)
                if look is not None:
                    looks[name].append(look)
        verdicts = study_verdicts({"design": record_design, "looks": looks})
        for a, name in enumerate(names):
            last = looks[name][-1]
            claimed[study, a] = verdicts[name]["claim"] is not None
            direction[study, a] = -1.0 if verdicts[name]["claim"] in ("better", "below target") else \
                (1.0 if verdicts[name]["claim"] == "worse" else float(np.sign(last["estimate"])))
            stop_n[study, a] = last["n"]
    return claimed, direction, stop_n


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


class _CopiedRun(_Run):
    """A run of a sequential study copied without its record (sequential.json), the study folder gone: what the
    doors read of it beside its loss. `mark`: the study and design digest the runner wrote into its log (None: a
    log made before the runner wrote them)."""

    def __init__(self, loss: float, variant: str, seed: int, copy: Path, mark: str | None):
        super().__init__(loss)
        self.variant, self.seed = variant, seed
        self.path = copy / variant / f"seed{seed}.txt"
        self.config = {"log_dir": str(GONE_STUDY / variant)}
        self.env = {STUDY_KEY: mark} if mark is not None else {}


# Where the copied runs' study was: gone. The copy's folder holds no record either.
GONE_STUDY = Path("/nonexistent/runs/s")
COPY = Path("/nonexistent/copy")
MARK = study_value("s", design_digest="0123456789abcdef")


def _study_record_or_refusal(runs):
    """The doors' first step, claims.find_study_record: the study's record, None, or "refused" (its one line)."""
    try:
        return find_study_record(runs)
    except UsageError:
        return "refused"


def copied_compare_claims(arms: list[list[float]], baseline: list[float], marked: bool) -> bool:
    """Whether `compare` (and report and analysis.terminal, which print the same claims) claims anything over the
    copied runs of a sequential study: find_study_record, then compare_arms and arm_claims as cmd_compare runs them."""
    mark = MARK if marked else None
    groups = {"baseline": [_CopiedRun(v, "baseline", k, COPY, mark) for k, v in enumerate(baseline)]}
    groups.update({f"arm{a}": [_CopiedRun(v, f"arm{a}", k, COPY, mark) for k, v in enumerate(losses)]
                   for a, losses in enumerate(arms)})
    state = _study_record_or_refusal([run for runs in groups.values() for run in runs])
    if state == "refused":
        return False
    result = compare_arms(groups, "baseline", 1 - ALPHA, sequential=state is not None)
    return any(arm["claim"] is not None for arm in arm_claims(result, ALPHA, True, state)["arms"])


def copied_record_claim(losses: list[float], marked: bool) -> bool:
    """Whether `record-check` (and `record`'s README, from the same functions) passes the loss test over the copied
    runs of a sequential record-claim study: find_study_record, record_claim, record_check as cmd_record_check."""
    runs = [_CopiedRun(v, "arm0", k, COPY, MARK if marked else None) for k, v in enumerate(losses)]
    state = _study_record_or_refusal(runs)
    if state == "refused":
        return False
    return record_check(runs, 0.0, alpha=ALPHA, resamples=2, max_runs=2,
                        sequential=record_claim(state, "arm0", 0.0, ALPHA))["loss_ok"]


def copied_rows(studies: int, rng, arm_counts=(5, 15), record_maxima=(5, 9, 26), old_share: int = 10) -> list[str]:
    """Null sequential studies (the runner's rule: sequential_decisions, held to take_look and study_verdicts by
    tests/benchmarks/test_claims_simulation.py) whose runs are then copied without their record, the study folder
    gone, and read through each door's functions: runs that name their study (this project's logs now) and runs
    that do not (logs made before the runner wrote the line: what the fix closes, on 1 / `old_share` of the studies,
    since each goes through the fixed-sample tests)."""
    old = max(2, studies // old_share)
    lines = []
    for arms in arm_counts:
        design = sequential_design(EFFECTS[1], arms)
        draws = rng.standard_normal((studies, arms, design.max_seeds))
        baseline = rng.standard_normal((studies, design.max_seeds))
        _, _, stop_n = sequential_decisions(draws, baseline, design)
        for marked, count in ((True, studies), (False, old)):
            claimed = [copied_compare_claims([list(draws[s, a, :stop_n[s, a]]) for a in range(arms)],
                                             list(baseline[s, :stop_n[s].max()]), marked) for s in range(count)]
            what = "logs name their study" if marked else "logs from before"
            lines.append(f"{f'compare/report/terminal, {arms} null arms, {what}':<64} {count:>7} "
                         f"{share(float(np.mean(claimed)), count):>16}")
    for most in record_maxima:
        design = record_design(most)
        draws = rng.standard_normal((studies, 1, most))
        _, _, stop_n = sequential_decisions(draws, None, design)
        for marked, count in ((True, studies), (False, old)):
            passed = [copied_record_claim(list(draws[s, 0, :stop_n[s, 0]]), marked) for s in range(count)]
            what = "logs name their study" if marked else "logs from before"
            lines.append(f"{f'record-check/record, at most {most} seeds, {what}':<64} "
                         f"{count:>7} {share(float(np.mean(passed)), count):>16}")
    return lines


def best_arm_copied_claims(draws: np.ndarray, baseline: np.ndarray, marked: bool) -> tuple[bool, bool]:
    """(compare claims, record-check passes) over the copy of one fixed-sample study (`draws`: arms x seeds) holding
    only its baseline and the arm of lowest mean loss: find_study_record, compare_arms + arm_claims as cmd_compare runs
    them (report and analysis.terminal print the same claims), record_check at the target 0 as cmd_record_check
    (record's README, the same p). `marked`: the logs name every arm of the study, as the runner writes them."""
    names = [f"arm{a}" for a in range(len(draws))]
    mark = study_value("f", arms=["baseline", *names]) if marked else None
    best = names[int(draws.mean(axis=1).argmin())]
    runs = {"baseline": [_CopiedRun(v, "baseline", k, COPY, mark) for k, v in enumerate(baseline)],
            best: [_CopiedRun(v, best, k, COPY, mark) for k, v in enumerate(draws[names.index(best)])]}
    state = _study_record_or_refusal([run for group in runs.values() for run in group])
    result = compare_arms(runs, "baseline", 1 - ALPHA, sequential=state is not None)
    compared = any(arm["claim"] is not None for arm in arm_claims(result, ALPHA, True, state)["arms"])
    return compared, bool(record_check(runs[best], 0.0, alpha=ALPHA, resamples=2, max_runs=2)["loss_ok"])


def best_arm_copied_rows(studies: int, rng, arm_counts=(5, 15), old_share: int = 10) -> list[str]:
    """Section 6: null fixed-sample studies (the fixed design's seeds), of which only the baseline and the arm with
    the lowest mean loss are copied, the study folder gone, and read through each door's functions: compare (and
    report, analysis.terminal: compare_arms + arm_claims) on the two arms, record-check (and record: record_check) on
    the best arm at its target. Runs whose logs name the study's arms (the runner writes them since issue 40) and,
    on 1 / `old_share` of the studies, logs without the line (made before it, or by hand)."""
    old = max(2, studies // old_share)
    lines = [f"{'door (baseline and best arm copied)':<76} {'studies':>7} {'P(false claim)':>16}"]
    for arms in arm_counts:
        seeds = fixed_seeds(EFFECTS[1], arms)
        draws = rng.standard_normal((studies, arms, seeds))
        baseline = rng.standard_normal((studies, seeds))
        for marked, count in ((True, studies), (False, old)):
            compared, recorded = zip(*(best_arm_copied_claims(draws[s], baseline[s], marked) for s in range(count)))
            what = "logs name the study's arms" if marked else "logs without the line"
            for door, claimed in (("compare/report/terminal", compared), ("record-check/record", recorded)):
                lines.append(f"{f'{door}, {arms} null arms, {seeds} seeds, {what}':<76} {count:>7} "
                             f"{share(float(np.mean(claimed)), count):>16}")
    return lines


def door_rows(studies: int, rng, arm_counts=(5, 15), record_seeds=(5, 9, 26), sequential_arms: int = 5) -> list[str]:
    """Section 4: no effect anywhere, each claim through the product's function behind one door, study by study."""
    lines = [f"{'door':<58} {'studies':>7} {'P(false claim)':>16}"]
    for arms in arm_counts:
        seeds = fixed_seeds(EFFECTS[1], arms)
        draws = rng.standard_normal((studies, arms, seeds))
        claimed, _ = product_fixed_decisions(draws, rng.standard_normal((studies, seeds)), shown="best")
        lines.append(f"{f'compare --arms baseline,BEST ({arms} null arms, {seeds} seeds)':<58} {studies:>7} "
                     f"{share(claimed.any(axis=1).mean(), studies):>16}")
    for seeds in record_seeds:  # a fixed batch of runs, no looks: record_check's own loss test
        passed = [record_check([_Run(v) for v in rng.standard_normal(seeds)], 0.0, resamples=2, max_runs=2)["loss_ok"]
                  for _ in range(studies)]
        lines.append(f"{f'record-check ({seeds} runs, mean at the target)':<58} {studies:>7} "
                     f"{share(float(np.mean(passed)), studies):>16}")
    design = sequential_design(EFFECTS[0], sequential_arms)
    outcome = sequential_study(np.zeros(sequential_arms), design, studies, rng, product=True)
    lines.append(f"{f'run --until-decided ({sequential_arms} null arms, take_look + study_verdicts)':<58} "
                 f"{studies:>7} {share(outcome.rate(), studies):>16}")
    return lines


def main(argv=None) -> int:
    parser = OneLineErrorParser(description=__doc__.splitlines()[0])
    parser.add_argument("--studies", type=at_least_two, default=20_000, help="simulated studies per row (20000)")
    parser.add_argument("--record-studies", type=at_least_two, default=200_000,
                        help="simulated record claims per row of section 2 (200000: its Monte Carlo error must be "
                             "small beside the 1.09-1.18%% it once measured)")
    parser.add_argument("--door-studies", type=at_least_two, default=2000,
                        help="simulated studies per row of section 4, each through the product's functions (2000)")
    parser.add_argument("--batch", type=positive_int, default=BATCH,
                        help=f"seeds per arm between the looks of sections 1 and 3 ({BATCH})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the numpy Generator (0)")
    parser.add_argument("--copy-studies", type=at_least_two, default=20_000,
                        help="simulated studies per row of section 5, each through the doors' functions (20000)")
    parser.add_argument("--best-studies", type=at_least_two, default=5000,
                        help="simulated studies per row of section 6, each through the doors' functions (5000)")
    parser.add_argument("--sections", choices=("123456", "12345", "1234", "123", "4", "5", "6"), default="123456",
                        help="which sections to run (default all; 4: the doors only; 5: the copies without record; "
                             "6: the best arm of a fixed study copied)")
    parser.add_argument("--out", type=Path, help="also write the output to this file")
    args = parser.parse_args(argv)
    started = time.time()
    rng = np.random.default_rng(args.seed)
    lines = [f"std {STD}, family-wise alpha {ALPHA}, {args.studies} simulated studies per row, numpy Generator seed "
             f"{args.seed}; sequential: batch {args.batch} seed(s) per arm, at most {DEFAULT_MAX_FACTOR} x the "
             f"fixed design's seeds (nearest seed), futility: conditional power toward a lower loss < "
             f"{Design.futility_power:g}"]
    if "1" in args.sections:
        lines += ["", "1. No effect in any arm: the chance of any false claim (fixed: Holm over Welch p; sequential: "
                      f"Holm over the arms' stagewise p), effect planned {EFFECTS[1]}", ""]
        lines += null_rates(args.studies, rng, batch=args.batch)
    if "2" in args.sections:
        lines += ["", "2. The record claim (mean below the target) under sequential looks after every seed, no "
                      f"effect ({args.record_studies} simulated claims per row)", ""]
        lines += record_rates(args.record_studies, rng)
    if "3" in args.sections:
        lines += ["", "3. The mix: 60% of arms no effect, 20% harmful, 20% helpful by the planned effect; runs per "
                      "study (arms and baseline) against the fixed design of power 0.8 at the same family-wise "
                      "alpha", ""]
        lines += mix_rows(args.studies, rng, batch=args.batch)
    if "4" in args.sections:
        lines += ["", "4. The doors: no effect anywhere, each claim through the product's own function behind the "
                      "door (study by study, not vectorised), family-wise alpha 0.01", ""]
        lines += door_rows(args.door_studies, rng)
    if "5" in args.sections:
        lines += ["", "5. Runs of a null sequential study copied without its record (sequential.json), the study "
                      "folder gone, through each door's functions (find_study_record, then the claim), family-wise "
                      "alpha 0.01", "", f"{'door (the copied runs)':<64} {'studies':>7} {'P(false claim)':>16}"]
        lines += copied_rows(args.copy_studies, rng)
    if "6" in args.sections:
        lines += ["", "6. The baseline and the best arm of a null fixed-sample study copied (the study folder gone), "
                      "through each door's functions (compare: Holm over the study's arms against the baseline; "
                      "record-check: the best arm below its target, Holm over every arm), family-wise alpha 0.01", ""]
        lines += best_arm_copied_rows(args.best_studies, rng)
    lines += ["", f"{time.time() - started:.0f} s"]
    text = "\n".join(lines)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
