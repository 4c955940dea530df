"""The terminal summary a study prints when it ends: its figures against scipy computed here, its verdicts, the
report and plot paths, and bad input."""
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from scipy import stats

import analysis_logs as logs_for_tests
from analysis.logs import load_runs
from analysis.terminal import main, terminal_summary

REPO = Path(__file__).resolve().parents[2]
TARGET = 6.5
BASELINE_FINALS = [6.31, 6.33, 6.30, 6.32]
BACKOUT_FINALS = [6.21, 6.24, 6.22, 6.20]


def curve(final, total=100):
    return lambda step: logs_for_tests.default_curve(step, total, final)


def write_arm(root, arm, finals, step_ms=250.0):
    for seed, final in enumerate(finals):
        logs_for_tests.write(root / arm / f"seed{seed}.txt",
                             logs_for_tests.our_log_text(variant=arm, seed=seed, losses=curve(final), val_every=5,
                                                         step_ms=step_ms))


@pytest.fixture
def study(tmp_path):
    root = tmp_path / "demo"
    write_arm(root, "baseline", BASELINE_FINALS)
    write_arm(root, "backout-L4", BACKOUT_FINALS, step_ms=200.0)
    logs_for_tests.write(root / "baseline" / "seed9.txt",  # a killed run: counted as a log, not in the figures
                         logs_for_tests.our_log_text(variant="baseline", seed=9, complete=False, stop_at=30))
    return root


def row_of(text, arm):
    return next(line for line in text.splitlines() if line.startswith(arm + " "))


def test_figures_match_an_independent_welch_test(study):
    text = terminal_summary(study, load_runs([study])[0], TARGET)
    test = stats.ttest_ind(BACKOUT_FINALS, BASELINE_FINALS, equal_var=False)
    low, high = test.confidence_interval(0.99)
    diff = np.mean(BACKOUT_FINALS) - np.mean(BASELINE_FINALS)
    row = row_of(text, "backout-L4")
    assert f"{np.mean(BACKOUT_FINALS):.4f} +- {np.std(BACKOUT_FINALS, ddof=1):.4f}" in row
    assert f"{diff:+.4f}" in row and f"[{low:+.4f}, {high:+.4f}]" in row
    assert f"{test.pvalue:.4g}" in row or f"{test.pvalue:.3e}" in row
    baseline = row_of(text, "baseline")
    assert f"{np.mean(BASELINE_FINALS):.4f} +- {np.std(BASELINE_FINALS, ddof=1):.4f}" in baseline
    assert re.search(r"baseline\s+4\s", baseline), "the unfinished run is not counted"
    assert "8 complete runs of 9 logs" in text
    assert text.splitlines().index(baseline) < text.splitlines().index(row), "the baseline comes first"


def test_step_and_time_to_target_are_the_mean_crossing(study):
    text = terminal_summary(study, load_runs([study])[0], TARGET)
    # Each run's loss falls through 6.5 between two validations 5 steps apart: interpolate as a reader would.
    steps = []
    for final in BACKOUT_FINALS:
        loss = curve(final)
        above = max(s for s in range(0, 101, 5) if loss(s) > TARGET)
        below = above + 5
        steps.append(above + 5 * (loss(above) - TARGET) / (loss(above) - loss(below)))
    mean_step = np.mean(steps)
    assert f"4/4 reached, step {mean_step:.1f}, {mean_step * 0.2:.1f} s" in row_of(text, "backout-L4")


def test_verdict_says_whether_the_ci_excludes_zero(study, tmp_path):
    text = terminal_summary(study, load_runs([study])[0], TARGET)
    assert re.search(r"backout-L4: final loss 0\.\d{4} lower than baseline .*a real difference at the 0.01 level", text)
    noisy = tmp_path / "noisy"
    write_arm(noisy, "baseline", [6.3, 6.5, 6.1])
    write_arm(noisy, "wider", [6.35, 6.45, 6.2])
    text = terminal_summary(noisy, load_runs([noisy])[0], TARGET)
    assert "wider: final loss" in text and "higher than baseline" in text and "not distinguishable from seed noise" in text


def test_one_run_per_arm_gives_no_test_and_an_unreached_target_is_shown(tmp_path):
    root = tmp_path / "single"
    write_arm(root, "baseline", [7.0])
    write_arm(root, "other", [6.9])
    text = terminal_summary(root, load_runs([root])[0], TARGET)
    assert "other: too few complete runs for a test" in text
    assert "0/1 reached" in row_of(text, "baseline")


def test_report_and_plot_paths_are_named_when_written(study):
    runs = load_runs([study])[0]
    assert "report: not written (python -m analysis report" in terminal_summary(study, runs, TARGET)
    (study / "report.md").write_text("# report\n")
    (study / "report_val_loss_step.png").write_bytes(b"png")
    text = terminal_summary(study, runs, TARGET)
    assert f"report: {study / 'report.md'}" in text
    assert f"plots:  {study / 'report_val_loss_step.png'}" in text


def test_without_a_baseline_arm_it_says_so(tmp_path):
    root = tmp_path / "nobase"
    write_arm(root, "a", [6.0, 6.1])
    text = terminal_summary(root, load_runs([root])[0], TARGET, baseline="baseline")
    assert "no complete runs of a baseline arm 'baseline'" in text


@pytest.mark.slow
def test_command_line_prints_the_summary_and_refuses_bad_input(study, capsys, tmp_path):
    """Guards: `python -m analysis.terminal` as a process refuses a bad or missing --target in one line, exit 2."""
    assert main([str(study), "--target", "6.5"]) == 0
    assert "backout-L4" in capsys.readouterr().out
    assert main([str(tmp_path / "missing"), "--target", "6.5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: not a folder") and len(err.strip().splitlines()) == 1
    for bad in (["--target", "nan"], ["--target", "x"], []):
        result = subprocess.run([sys.executable, "-m", "analysis.terminal", str(study), *bad], cwd=REPO,
                                capture_output=True, text=True)
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, bad
        assert "error:" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_study_run_with_report_ends_with_the_summary(tmp_path):
    """Guards: `ablations run --report` ends its output with the terminal summary, claims line, report and plots."""
    from runner_support import ablations, runner_env, write_study
    study = write_study(tmp_path, "s", {"baseline": {}, "other": {"backout-layers": 3}},
                        flags={"num-iterations": 10, "val-every": 5}, extra="target = 9.0")
    result = ablations(["run", study, "--progress-every", "0", "--report"], tmp_path, runner_env())
    assert result.returncode == 0, result.stdout + result.stderr
    folder = Path("runs") / "s"
    tail = result.stdout.splitlines()[-9:]
    assert tail[0].startswith(f"result of {folder} (target val loss 9;"), tail
    assert re.match(r"other\s+2\s", row_of(result.stdout, "other")) and "other: " in tail[-3]
    assert tail[-4] == "claims: 1 arm(s) against baseline at alpha 0.01"
    assert tail[-2] == f"report: {folder / 'report.md'}" and tail[-1].startswith("plots:  ")
