"""Group-sequential studies (--until-decided) on the stand-in training script: an arm decided early gets no more
seeds, the looks are recorded and replayed after a kill, bad input is refused in one line."""
import json
import os
import signal
from pathlib import Path

import pytest

from runner_support import ablations, read_events, runner_env, start_ablations, wait_for, write_study

# The stand-in's final loss is 0.001 * seed plus 0.03 for backout layer 4: a clear difference, decided early.
ARMS = {"baseline": {}, "backout-L4": {"backout-layers": 4}}
FLAGS = {"num-iterations": 10, "val-every": 5}


def looks_of(tmp_path: Path, study: str = "s") -> dict:
    return json.loads((tmp_path / "runs" / study / "sequential.json").read_text())["looks"]


@pytest.mark.slow
def test_clear_difference_stops_before_the_maximum_and_reports_the_looks(tmp_path):
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    starts = tmp_path / "starts.jsonl"
    result = ablations(["run", study, "--until-decided", "--max-seeds", "8", "--report"], tmp_path,
                       runner_env(starts))
    assert result.returncode == 0, result.stdout + result.stderr
    (looks,) = looks_of(tmp_path).values()
    assert looks[-1]["decision"] == "worse" and looks[-1]["n"] < 8
    assert all(look["decision"] == "continue" for look in looks[:-1])
    assert looks[-1]["adjusted_p"] < 0.01 and looks[-1]["repeated_ci"][0] > 0
    # no seed beyond the deciding look was started, for either arm
    started = {(e["variant"], e["seed"]) for e in read_events(starts) if e["event"] == "start"}
    assert started == {(arm, seed) for arm in ARMS for seed in range(looks[-1]["n"])}
    look_lines = [line for line in result.stdout.splitlines() if " look " in line]
    assert len(look_lines) == len(looks) and "-> worse, adjusted p" in look_lines[-1]
    report = (tmp_path / "runs" / "s" / "report.md").read_text()
    assert "## Sequential looks" in report and "| backout-L4 | 2 |" in report and "| worse |" in report


@pytest.mark.slow
def test_study_file_keys_and_a_record_claim_against_the_target(tmp_path):
    extra = "until_decided = true\nmax_seeds = 4\nclaim = \"below-target\"\ntarget = 3.74"
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS, extra=extra)
    result = ablations(["run", study], tmp_path, runner_env())
    assert result.returncode == 0, result.stdout + result.stderr
    looks = looks_of(tmp_path)
    assert set(looks) == set(ARMS)  # one-sample claims: every arm, no baseline
    # baseline ends near 3.727 (below 3.74), backout-L4 near 3.757 (above): one shown, one futile
    assert looks["baseline"][-1]["decision"] == "below target"
    assert looks["backout-L4"][-1]["decision"] == "futile"


@pytest.mark.slow
def test_killed_study_resumes_with_its_looks(tmp_path):
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.15)
    runner = start_ablations(["run", study, "--until-decided", "--max-seeds", "8"], tmp_path, env,
                             tmp_path / "first.out")
    record = tmp_path / "runs" / "s" / "sequential.json"
    wait_for(lambda: record.exists(), 60, "the first look")
    first = looks_of(tmp_path)["backout-L4"]
    os.kill(runner.pid, signal.SIGKILL)
    runner.wait(30)
    assert [look["look"] for look in first] == [1] and first[0]["decision"] == "continue"
    again = ablations(["run", study, "--until-decided", "--max-seeds", "8"], tmp_path, runner_env())
    assert again.returncode == 0, again.stdout + again.stderr
    looks = looks_of(tmp_path)["backout-L4"]
    assert looks[0] == first[0]  # the look taken before the kill, unchanged
    assert [look["look"] for look in looks] == list(range(1, len(looks) + 1)) and looks[-1]["decision"] == "worse"
    assert sum(" replayed " in line for line in again.stdout.splitlines()) == 1
    # another design on the recorded looks is refused
    other = ablations(["run", study, "--until-decided", "--max-seeds", "8", "--alpha", "0.05"], tmp_path,
                      runner_env())
    assert other.returncode == 2 and len(other.stderr.strip().splitlines()) == 1 and "alpha" in other.stderr


def refused(tmp_path, study, *extra) -> str:
    result = ablations(["run", study, *extra], tmp_path, runner_env(tmp_path / "starts.jsonl"))
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in result.stderr
    assert not (tmp_path / "starts.jsonl").exists()
    return lines[0]


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(tmp_path):
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    assert "alpha" in refused(tmp_path, study, "--until-decided", "--alpha", "1.5")
    assert "alpha" in refused(tmp_path, study, "--until-decided", "--alpha", "0")
    assert "below one batch" in refused(tmp_path, study, "--until-decided", "--max-seeds", "1")
    assert "below one batch" in refused(tmp_path, study, "--until-decided", "--max-seeds", "0")
    assert "below one batch" in refused(tmp_path, study, "--until-decided", "--parallel", "8", "--max-seeds", "3")
    one_arm = write_study(tmp_path, "one", {"baseline": {}}, flags=FLAGS)
    assert "one arm" in refused(tmp_path, one_arm, "--until-decided")
    assert "--until-decided" in refused(tmp_path, study, "--max-seeds", "4")
