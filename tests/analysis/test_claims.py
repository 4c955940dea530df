"""Issue 33: every printed claim holds its stated error rate. One definition of a finished log shared by the study
runner and analysis; diverged runs fail claims in every path; arms adjusted as a family; one verdict per arm."""
import json

import pytest

import analysis_logs as logs_for_tests
from ablations.runstate import log_is_complete
from analysis.logs import load_runs, log_problem
from analysis_logs import run_cli


def curve(final):
    return lambda step: logs_for_tests.default_curve(step, 100, final)


def finished_text(seed=0, final=2.919):
    return logs_for_tests.our_log_text(variant="claim", seed=seed, losses=curve(final))


DAMAGED = {
    "cut inside its peak-memory line": lambda text: text[:text.rindex(" reserved:")] + " reser\n",
    "config line not valid JSON": lambda text: text.replace('config: {"track"', 'config: {track', 1),
    "config line cut": lambda text: text.replace('config: {"track"', 'config: {"tr\nx', 1),
    "steps going back after the final validation": lambda text: text.replace(
        "\npeak memory", "\nstep:3/100 train_time:1ms step_avg:0.33ms\npeak memory"),
}


@pytest.mark.parametrize("damage", DAMAGED)
def test_runner_and_analysis_agree_a_damaged_log_is_unfinished(tmp_path, damage):
    """Case 6: the runner reruns (not done) exactly the logs analysis never counts."""
    log = logs_for_tests.write(tmp_path / "claim" / "seed0.txt", DAMAGED[damage](finished_text()))
    runs, unreadable = load_runs([tmp_path])
    assert not log_is_complete(log)
    assert log_problem(log) is not None
    assert [run.complete for run in runs] == [False] and not unreadable


def test_a_whole_log_is_finished_for_both(tmp_path):
    log = logs_for_tests.write(tmp_path / "claim" / "seed0.txt", finished_text())
    assert log_is_complete(log) and log_problem(log) is None
    assert log_problem(tmp_path / "missing.txt").startswith("cannot be read")
