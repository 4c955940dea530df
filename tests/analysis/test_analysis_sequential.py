"""Group-sequential boundaries against published tables, and the decisions, repeated CIs and adjusted p-values
of single looks."""
import math

import numpy as np
import pytest
from scipy import stats

from analysis import sequential
from analysis.sequential import Design, spending_boundaries, take_look

FIVE_EQUAL = [0.2, 0.4, 0.6, 0.8, 1.0]


@pytest.mark.slow
def test_original_obrien_fleming_constants_five_looks():
    """Guards: the original O'Brien-Fleming constants (K=5, alpha 0.05) match Jennison and Turnbull's table 2.3."""
    # O'Brien & Fleming (1979); Jennison & Turnbull (2000) Table 2.3: K = 5, two-sided alpha 0.05
    got = sequential.obrien_fleming_constants(5, 0.05, sides=2)
    assert got == pytest.approx([4.562, 3.226, 2.634, 2.281, 2.040], abs=6e-4)


def test_lan_demets_obf_spending_five_looks_two_sided():
    # ldbounds::ldBounds(t=5, iuse=1, alpha=0.05, sides=2) and gsDesign sfLDOF (alpha 0.025 per side)
    got = spending_boundaries(FIVE_EQUAL, 0.05, sides=2)
    assert got == pytest.approx([4.8769, 3.3569, 2.6803, 2.2898, 2.0310], abs=2e-4)


def test_lan_demets_obf_spending_four_looks_one_sided():
    # SeqBounds.jl README: bounds([0.25, 0.5, 0.75, 1.0], 0.05) -> 3.74955 2.53993 2.01604 1.72014
    got = spending_boundaries([0.25, 0.5, 0.75, 1.0], 0.05, sides=1)
    assert got == pytest.approx([3.74955, 2.53993, 2.01604, 1.72014], abs=2e-4)


@pytest.mark.slow
def test_spending_adds_up_and_one_look_is_the_fixed_test():
    """Guards: the boundaries spend alpha as the spending function says at each look; one look is the fixed test."""
    bounds = spending_boundaries(FIVE_EQUAL, 0.01, sides=2)
    assert 1 - sequential._stay_probability(bounds, FIVE_EQUAL, 2) == pytest.approx(0.01, abs=1e-7)
    assert spending_boundaries([1.0], 0.01, sides=2)[0] == pytest.approx(stats.norm.isf(0.005))
    # unequal looks: the spent alpha follows the spending function at each look taken
    fractions = [0.3, 0.45, 1.0]
    bounds = spending_boundaries(fractions, 0.01, sides=1)
    for k in range(1, 4):
        spent = 1 - sequential._stay_probability(bounds[:k], fractions[:k], 1)
        assert spent == pytest.approx(sequential.cumulative_spending(fractions[k - 1], 0.01, 1), abs=1e-8)


def test_a_clear_effect_stops_early_with_a_consistent_ci_and_adjusted_p():
    design = Design(alpha=0.01, max_seeds=16, batch=8)
    rng = np.random.default_rng(1)
    baseline = 2.9200 + 0.0008 * rng.standard_normal(8)
    arm = 2.9170 + 0.0008 * rng.standard_normal(8)
    look = take_look(design, [], arm, baseline)
    assert look["look"] == 1 and look["fraction"] == pytest.approx(0.5)
    assert look["decision"] == "better" and abs(look["z"]) >= look["boundary"]
    low, high = look["repeated_ci"]
    assert high < 0 and low < look["estimate"] < high  # an interval that excludes 0 exactly when it crosses
    assert look["adjusted_p"] <= look["nominal_p"] * 1.0001 and look["adjusted_p"] < 0.01


def test_no_effect_continues_then_ends_not_shown_and_looks_are_never_repeated():
    design = Design(alpha=0.01, max_seeds=8, batch=4, futility_power=0.0)  # futility off: reach the end
    rng = np.random.default_rng(2)
    baseline, arm = 2.92 + 0.0008 * rng.standard_normal((2, 8))
    first = take_look(design, [], arm[:4], baseline[:4])
    assert first["decision"] == "continue" and first["adjusted_p"] is None
    assert take_look(design, [first], arm[:4], baseline[:4]) is None  # no new runs: no new look
    last = take_look(design, [first], arm, baseline)
    assert last["look"] == 2 and last["fraction"] == 1.0 and last["decision"] == "not shown"
    assert last["adjusted_p"] > 0.01


def test_futility_stops_an_arm_with_no_trend():
    design = Design(alpha=0.01, max_seeds=12, batch=8)  # t = 2/3: little left to turn it round
    losses = [2.9190, 2.9200, 2.9210, 2.9195, 2.9205, 2.9199, 2.9201, 2.9200]
    look = take_look(design, [], [v + 1e-6 for v in losses], losses)
    assert look["decision"] == "futile" and look["conditional_power"] < 0.1


def test_record_claim_is_one_sided_against_the_target():
    design = Design(alpha=0.01, max_seeds=20, batch=10, sides=1)
    rng = np.random.default_rng(3)
    look = take_look(design, [], 2.9170 + 0.0008 * rng.standard_normal(10), target=2.92)
    assert look["decision"] == "below target" and look["repeated_ci"][1] < 2.92
    above = take_look(design, [], 2.9203 + 0.0008 * rng.standard_normal(10), target=2.92)
    assert above["decision"] == "futile"


def test_max_factor_sets_the_maximum_and_the_planned_drift():
    assert sequential.sequential_max_seeds(10, 1.1) == 11 and sequential.sequential_max_seeds(5, 1.5) == 8
    assert sequential.sequential_max_seeds(383, 1.0) == 383
    # to the nearest seed, halves up: rounding up made 7 x 1.15 = 8.05 a 9-seed maximum, 1.29 x the fixed design's
    assert sequential.sequential_max_seeds(7, 1.15) == 8 and sequential.sequential_max_seeds(10, 1.15) == 12
    assert sequential.sequential_max_seeds(3, 1.1) == 3 and sequential.sequential_max_seeds(72, 1.15) == 83
    assert sequential.look_counts(7, 3) == [3, 6, 7] and sequential.look_counts(5, 1) == [3, 4, 5]
    assert Design(alpha=0.01, max_seeds=12, batch=2).max_factor == sequential.DEFAULT_MAX_FACTOR == 1.15
    fixed = Design(alpha=0.01, max_seeds=10, batch=2, max_factor=1.0)
    wider = Design(alpha=0.01, max_seeds=15, batch=2, max_factor=1.5)
    # the effect the 10-seed fixed design detects with power 0.8, on the z scale at the last look of each
    assert fixed.drift() == pytest.approx(stats.norm.isf(0.005) + stats.norm.isf(0.2))
    assert wider.drift() == pytest.approx(fixed.drift() * math.sqrt(1.5))
    # at the same runs and z the wider design has more runs to come, at a larger drift: more conditional power
    z, runs = 1.0, 6
    *_, power_fixed = sequential.decide(z, 10.0, runs / 10, fixed.final_boundary(), 2, 0.1, fixed.drift())
    *_, power_wider = sequential.decide(z, 10.0, runs / 15, wider.final_boundary(), 2, 0.1, wider.drift())
    assert power_wider > power_fixed
