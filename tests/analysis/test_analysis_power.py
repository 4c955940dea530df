"""Seeds planned by power: exact noncentral-t power against textbook values and statsmodels, the std's source,
and the `plan` command's output and bad input."""
import json
import math

import numpy as np
import pytest

from analysis import power
from analysis_logs import run_cli
from test_analysis_cli import write_arm


def test_cohens_textbook_value_two_samples():
    # Cohen (1988), Table 2.4.1: d = 0.5, two-sided alpha 0.05, power 0.8 -> 64 per group
    assert power.smallest_n(lambda n: power.two_sample_power(n, 0.5, 0.05), 0.8) == 64
    # d = 0.8 (a "large" effect): 26 per group; d = 0.2: 394 per group
    assert power.smallest_n(lambda n: power.two_sample_power(n, 0.8, 0.05), 0.8) == 26
    assert power.smallest_n(lambda n: power.two_sample_power(n, 0.2, 0.05), 0.8) == 394


def test_power_grows_and_the_answer_is_the_first_n_reaching_it():
    n = power.seeds_for_difference(0.0005, 0.0008, alpha=0.01, power=0.8)
    assert power.two_sample_power(n, 0.0005 / 0.0008, 0.01) >= 0.8 > power.two_sample_power(n - 1, 0.625, 0.01)
    assert power.seeds_for_difference(0.0005, 0.0008, alpha=0.01, power=0.9) > n
    assert power.seeds_for_difference(0.001, 0.0008, alpha=0.01, power=0.8) < n


@pytest.mark.parametrize("d,alpha,wanted", [(0.5, 0.05, 0.8), (0.625, 0.01, 0.8), (1.3, 0.01, 0.9)])
def test_two_sample_n_matches_statsmodels(d, alpha, wanted):
    smp = pytest.importorskip("statsmodels.stats.power")
    exact = smp.TTestIndPower().solve_power(effect_size=d, alpha=alpha, power=wanted, alternative="two-sided")
    assert power.smallest_n(lambda n: power.two_sample_power(n, d, alpha), wanted) == int(np.ceil(exact))
    assert power.two_sample_power(20, d, alpha) == pytest.approx(
        smp.TTestIndPower().power(effect_size=d, nobs1=20, alpha=alpha, alternative="two-sided"), rel=1e-9)


@pytest.mark.parametrize("d,alpha,wanted", [(0.5, 0.01, 0.8), (1.0, 0.05, 0.9), (0.3, 0.01, 0.8)])
def test_one_sample_n_matches_statsmodels(d, alpha, wanted):
    smp = pytest.importorskip("statsmodels.stats.power")
    exact = smp.TTestPower().solve_power(effect_size=d, alpha=alpha, power=wanted, alternative="larger")
    assert power.seeds_for_record(2.92 - d, 2.92, 1.0, alpha, wanted) == int(np.ceil(exact))


def test_record_claim_needs_a_pilot_mean_below_the_target():
    assert power.seeds_for_record(2.9201, 2.92, 0.0008) is None
    assert power.seeds_for_record(2.92, 2.92, 0.0008) is None


def test_pooled_std_is_within_groups_and_skips_single_and_diverged_runs():
    estimate = power.pooled_std({"a": [1.0, 2.0, 3.0], "b": [11.0, 13.0, float("nan")], "c": [5.0]}, "x")
    # within-group squares 2 + 2 over 2 + 1 degrees of freedom; the group means' gap must not count
    assert estimate.std == pytest.approx(np.sqrt(4 / 3)) and estimate.runs == 5 and estimate.groups == {"a": 3, "b": 2}
    with pytest.raises(ValueError):
        power.pooled_std({"a": [1.0]}, "x")


def test_published_medium_losses_are_records_14_and_15():
    groups = power.published_losses("medium")
    assert {k: len(v) for k, v in groups.items()} == {"record #14": 160, "record #15": 22}
    # each README's own figures: #14 mean 2.919547 std 0.000798 (160 runs); #15 std 0.00069
    assert np.mean(groups["record #14"]) == pytest.approx(2.919547, abs=5e-7)
    assert np.std(groups["record #14"], ddof=1) == pytest.approx(0.000798, abs=5e-7)
    assert round(float(np.std(groups["record #15"], ddof=1)), 5) == 0.00069


def test_plan_without_logs_uses_the_published_runs(capsys):
    status, out, _ = run_cli(capsys, "plan", "--diff", "0.0005", "--pilot-mean", "2.9195", "--json")
    assert status == 0
    assert "182 runs" in out and "record #14 (160)" in out and "published_seed_losses.csv" in out
    result = json.loads(out[out.index("{"):])
    assert result["std_runs"] == 182
    assert result["seeds_per_arm"] == power.seeds_for_difference(0.0005, result["std"], 0.01, 0.8)
    assert result["record_seeds"] == power.seeds_for_record(2.9195, 2.92, result["std"], 0.01, 0.8)


def test_plan_measures_the_std_of_a_study_folder(capsys, tmp_path):
    write_arm(tmp_path, "baseline", [2.9190, 2.9200, 2.9210], [100.0] * 3)
    write_arm(tmp_path, "backout", [2.9180, 2.9184], [100.0] * 2)
    status, out, _ = run_cli(capsys, "plan", tmp_path, "--diff", "0.001", "--target", "2.92", "--json")
    assert status == 0 and "5 runs in 2 group(s)" in out
    result = json.loads(out[out.index("{"):])
    squares = np.sum((np.array([2.9190, 2.9200, 2.9210]) - 2.92) ** 2) + 2 * 0.0002 ** 2
    assert result["std"] == pytest.approx(np.sqrt(squares / 3), rel=1e-6)


def test_plan_with_a_max_factor_gives_the_sequential_maximum(capsys):
    status, out, _ = run_cli(capsys, "plan", "--diff", "0.0005", "--pilot-mean", "2.9195", "--max-factor", "1.5",
                             "--json")
    assert status == 0
    result = json.loads(out[out.index("{"):])
    fixed, record = result["seeds_per_arm"], result["record_seeds"]
    assert result["sequential_max_seeds_per_arm"] == math.ceil(1.5 * fixed)
    assert result["sequential_max_record_seeds"] == math.ceil(1.5 * record)
    assert (f"--until-decided --max-factor 1.5 on a study of {fixed} seeds): at most {math.ceil(1.5 * fixed)} seeds"
            in out)
    status, out, _ = run_cli(capsys, "plan", "--diff", "0.0005", "--json")
    assert "sequential_max_seeds_per_arm" not in json.loads(out[out.index("{"):])  # only when asked


@pytest.mark.parametrize("argv,needle", [
    (["--diff", "0.001", "--alpha", "1.5"], "--alpha"), (["--diff", "0.001", "--alpha", "0"], "--alpha"),
    (["--diff", "0.001", "--alpha", "x"], "'x' is not a number"), (["--diff", "0.001", "--power", "0"], "--power"),
    ([], "--diff"), (["--diff", "-1"], "--diff"), (["--diff", "abc"], "'abc' is not a number"),
    (["--pilot-mean", "3.2", "--track", "small"], "published"),
    (["{tmp}/missing", "--diff", "0.001"], "not found"),
    (["--diff", "0.001", "--published", "{tmp}/none.csv"], "none.csv"),
    (["--diff", "0.001", "--max-factor", "0.5"], "--max-factor"),
    (["--diff", "0.001", "--max-factor", "nan"], "--max-factor"), (["--bogus"], "--bogus")])
def test_plan_bad_input_is_one_line_and_exit_2(capsys, tmp_path, argv, needle):
    status, out, err = run_cli(capsys, "plan", *[a.replace("{tmp}", str(tmp_path)) for a in argv])
    assert status == 2 and len(err.strip().splitlines()) == 1 and err.startswith("error: ") and needle in err, err
    assert "Traceback" not in err + out
