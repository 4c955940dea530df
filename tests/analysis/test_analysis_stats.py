"""Statistics: interpolation to the target, t-tests, Welch intervals, Holm/BH, the bootstrap."""
import math

import numpy as np
import pytest
from scipy import stats as scipy_stats

from analysis.stats import (benjamini_hochberg, bootstrap_pass_chance, crossing, holm, mean_std, p_below_target,
                            runs_needed, welch)

# The backout article's 22 record runs (shared/seeds/003): final losses and times in seconds.
ARTICLE_LOSSES = [2.919485, 2.918384, 2.918878, 2.918476, 2.920099, 2.919609, 2.918705, 2.91872, 2.919772, 2.918594,
                  2.917798, 2.919295, 2.920676, 2.919743, 2.920052, 2.919843, 2.920081, 2.919675, 2.919486, 2.919177,
                  2.919529, 2.919678]
ARTICLE_TIMES = [1384.256, 1384.324, 1384.185, 1383.412, 1392.184, 1392.305, 1383.552, 1383.785, 1383.811, 1383.785,
                 1383.434, 1383.753, 1383.082, 1383.284, 1383.827, 1385.682, 1383.579, 1383.422, 1383.467, 1385.108,
                 1383.398, 1384.058]


def test_crossing_interpolates_between_last_above_and_first_at_or_below():
    steps = [0, 125, 250, 375]
    losses = [4.0, 3.0, 2.9, 2.8]
    times = [0.0, 10_000.0, 20_000.0, 30_000.0]
    # 3.0 -> 2.9 crosses 2.92 four fifths of the way: step 225, 18 s.
    time_s, step = crossing(steps, losses, times, 2.92)
    assert step == pytest.approx(125 + 0.8 * 125) and time_s == pytest.approx(18.0)


def test_crossing_uses_the_first_crossing_and_exact_hits():
    steps, times = [0, 10, 20, 30, 40], [0.0, 1000.0, 2000.0, 3500.0, 5000.0]
    assert crossing(steps, [5.0, 2.92, 2.95, 2.9, 2.8], times, 2.92) == (1.0, 10.0)
    # dips below, comes back up, goes below again: the first crossing counts
    time_s, step = crossing(steps, [5.0, 3.0, 2.9, 3.1, 2.0], times, 2.92)
    assert step == pytest.approx(10 + (3.0 - 2.92) / (3.0 - 2.9) * 10) and time_s == pytest.approx(step / 10)
    # uneven time spacing: the time interpolates on its own axis
    time_s, step = crossing(steps, [5.0, 4.0, 3.0, 2.94, 2.90], times, 2.92)
    assert step == pytest.approx(35.0) and time_s == pytest.approx(4.25)


def test_crossing_never_reached_or_already_below_at_first_validation():
    assert crossing([0, 10], [3.5, 2.921], [0.0, 1.0], 2.92) == (None, None)
    assert crossing([], [], [], 2.92) == (None, None)
    assert crossing([0, 10], [float("nan"), 2.921], [0.0, 1.0], 2.92) == (None, None)
    assert crossing([5, 10], [2.9, 2.8], [700.0, 900.0], 2.92) == (0.7, 5.0)


def test_article_losses_give_the_article_statistics():
    mean, std = mean_std(ARTICLE_LOSSES)
    p = p_below_target(ARTICLE_LOSSES, 2.92)
    # independent computation
    n = len(ARTICLE_LOSSES)
    by_hand_mean = sum(ARTICLE_LOSSES) / n
    by_hand_std = math.sqrt(sum((x - by_hand_mean) ** 2 for x in ARTICLE_LOSSES) / (n - 1))
    t = (by_hand_mean - 2.92) / (by_hand_std / math.sqrt(n))
    assert mean == pytest.approx(by_hand_mean, abs=1e-12) and std == pytest.approx(by_hand_std, rel=1e-9)
    assert p == pytest.approx(scipy_stats.t.cdf(t, n - 1), rel=1e-9)
    # the article's rounded figures: mean 2.9194, std 0.00069, p 0.0001256
    assert round(mean, 4) == 2.9194 and round(std, 5) == 0.00069 and p == pytest.approx(0.0001256, rel=1e-3)
    time_mean, time_std = mean_std(ARTICLE_TIMES)
    assert round(time_mean, 4) == 1384.6224 and round(time_std, 4) == 2.5382


def test_small_samples_give_no_std_or_p():
    assert mean_std([]) == (None, None)
    assert mean_std([2.9]) == (2.9, None)
    assert p_below_target([2.9], 2.92) is None
    assert mean_std([2.9, None, float("nan"), 3.1]) == pytest.approx((3.0, math.sqrt(0.02)))


def test_welch_difference_interval_and_df_match_the_textbook_formula():
    a = [2.9181, 2.9190, 2.9175, 2.9188, 2.9179, 2.9185]
    b = [2.9195, 2.9210, 2.9188, 2.9201]
    result = welch(a, b, confidence=0.99)
    va, vb = np.var(a, ddof=1) / len(a), np.var(b, ddof=1) / len(b)
    df = (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1))
    diff = np.mean(a) - np.mean(b)
    half = scipy_stats.t.ppf(0.995, df) * math.sqrt(va + vb)
    t = diff / math.sqrt(va + vb)
    assert result["diff"] == pytest.approx(diff) and result["df"] == pytest.approx(df)
    assert result["ci"] == pytest.approx([diff - half, diff + half])
    assert result["p"] == pytest.approx(2 * scipy_stats.t.sf(abs(t), df))
    one_sided = welch(a, b, alternative="less")
    assert one_sided["p"] == pytest.approx(scipy_stats.t.cdf(t, df))
    assert one_sided["ci"] == pytest.approx(welch(a, b)["ci"])  # the interval stays two-sided
    assert welch([1.0], b) == {"diff": pytest.approx(1.0 - np.mean(b)), "ci": None, "df": None, "p": None}


def test_holm_and_bh_on_the_benjamini_hochberg_1995_example():
    # The 15 p-values of Benjamini & Hochberg (1995), section 4: at level 0.05 the Bonferroni-type (Holm)
    # procedure rejects 3 hypotheses and the FDR procedure 4.
    p = [0.0001, 0.0004, 0.0019, 0.0095, 0.0201, 0.0278, 0.0298, 0.0344, 0.0459, 0.3240, 0.4262, 0.5719, 0.6528,
         0.7590, 1.000]
    assert sum(q < 0.05 for q in holm(p)) == 3
    assert sum(q < 0.05 for q in benjamini_hochberg(p)) == 4


def test_holm_and_bh_small_example_by_hand_and_order_kept():
    p = [0.01, 0.04, 0.03, 0.005]
    # Holm: sorted 0.005, 0.01, 0.03, 0.04 times 4, 3, 2, 1 = 0.02, 0.03, 0.06, 0.04 -> running max 0.06
    assert holm(p) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    # BH: sorted p * 4 / rank = 0.02, 0.02, 0.04, 0.04 -> running min from the top
    assert benjamini_hochberg(p) == pytest.approx([0.02, 0.04, 0.04, 0.02])
    assert holm([None, 0.02, 0.04]) == pytest.approx([None, 0.04, 0.04])
    assert benjamini_hochberg([0.02, None]) == pytest.approx([0.02, None])
    assert holm([]) == [] and benjamini_hochberg([]) == []


@pytest.mark.slow
def test_bootstrap_is_seeded_and_tracks_the_strength_of_the_evidence():
    """Guards: the bootstrap pass chance is seeded, matches a scipy recomputation, is lower for fewer runs."""
    chance = bootstrap_pass_chance(ARTICLE_LOSSES, 2.92, 22, 0.01, 2000, seed=1)
    assert chance == bootstrap_pass_chance(ARTICLE_LOSSES, 2.92, 22, 0.01, 2000, seed=1)
    # independent re-computation of the same resamples
    rng = np.random.default_rng([1, 22])
    draws = rng.choice(np.array(ARTICLE_LOSSES), size=(2000, 22), replace=True)
    p = np.array([scipy_stats.ttest_1samp(row, 2.92, alternative="less").pvalue for row in draws])
    assert chance == pytest.approx(np.mean(p < 0.01))
    assert 0.8 < chance <= 1.0
    assert bootstrap_pass_chance(ARTICLE_LOSSES, 2.92, 5, 0.01, 2000, seed=1) < chance
    assert bootstrap_pass_chance([2.95, 2.96, 2.94], 2.92, 10, 0.01, 500, seed=0) == 0.0


def test_runs_needed_is_the_smallest_batch_reaching_the_power():
    needed = runs_needed(ARTICLE_LOSSES, 2.92, 0.9, 0.01, 1000, seed=0, max_runs=60)
    assert needed is not None
    assert bootstrap_pass_chance(ARTICLE_LOSSES, 2.92, needed, 0.01, 1000, 0) >= 0.9
    assert bootstrap_pass_chance(ARTICLE_LOSSES, 2.92, needed - 1, 0.01, 1000, 0) < 0.9
    assert runs_needed([2.93, 2.94, 2.925], 2.92, 0.9, 0.01, 100, 0, 50) is None
