"""Killing the runner for real at a bad moment, then running it again: every run ends complete exactly once."""

import json
import os
import signal

import pytest

from runner_support import (ablations, is_complete, pid_alive, read_events, runner_env, start_ablations,
                            starts_per_run, wait_for, write_study)

ARMS = {"baseline": {}, "backout": {"backout-layers": [11]}}
FLAGS = {"num-iterations": 12, "val-every": 4}
RUNS = {(arm, seed) for arm in ARMS for seed in (0, 1)}


def logs(tmp_path):
    return sorted((tmp_path / "runs").rglob("seed*.txt"))


def mid_study(tmp_path, env, output_name="runner1.out"):
    """Starts the runner and waits until one run is complete and the next one is part-way."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    runner = start_ablations(["run", study, "--grace", "5"], tmp_path, env, tmp_path / output_name)
    first = tmp_path / "runs" / "s" / "baseline" / "seed0.txt"
    second = tmp_path / "runs" / "s" / "backout" / "seed0.txt"
    wait_for(lambda: is_complete(first), 30, "the first run to finish")
    wait_for(lambda: second.exists() and "step:2/12" in second.read_text(), 30, "the second run to be part-way")
    child = [e for e in read_events(tmp_path / "starts.jsonl") if e["variant"] == "backout"][0]["pid"]
    return study, runner, first.read_bytes(), child


def finish_and_check(tmp_path, study, env, first_log: bytes):
    result = ablations(["run", study], tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr
    return every_run_done_once(tmp_path, first_log)


def every_run_done_once(tmp_path, first_log: bytes):
    """Checks every run of the study is complete once and the first was never rerun; (starts per run, logs kept
    aside)."""
    complete = [log for log in logs(tmp_path) if ".unfinished-" not in log.name]
    kept = [log for log in logs(tmp_path) if ".unfinished-" in log.name]
    assert {(log.parent.name, int(log.stem[4:])) for log in complete} == RUNS
    assert all(is_complete(log) for log in complete) and len(complete) == len(RUNS)
    assert (tmp_path / "runs" / "s" / "baseline" / "seed0.txt").read_bytes() == first_log  # never rerun
    assert not any(is_complete(log) for log in kept)
    return starts_per_run(tmp_path / "starts.jsonl"), kept


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_signal_stops_children_and_rerun_completes(tmp_path, sig):
    """Guards: SIGTERM/SIGINT to the runner stops its live run before it exits, and a rerun finishes each run once."""
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.1)
    study, runner, first_log, child = mid_study(tmp_path, env)
    runner.send_signal(sig)
    assert runner.wait(timeout=30) == 128 + sig
    assert not pid_alive(child), "the runner must stop its runs before it exits"
    output = (tmp_path / "runner1.out").read_text()
    assert f"got {signal.Signals(sig).name}" in output and "interrupted" in output

    starts, kept = finish_and_check(tmp_path, study, env, first_log)
    assert starts == {("baseline", 0): 1, ("backout", 0): 2, ("baseline", 1): 1, ("backout", 1): 1}
    assert [k.name.split(".")[0] for k in kept] == ["seed0"] and kept[0].parent.name == "backout"


@pytest.mark.slow
def test_sigkill_of_the_runner_takes_its_runs_down_and_rerun_completes(tmp_path):
    """Guards: a SIGKILL of the runner takes its run down (parent-death signal); a rerun finishes each run once."""
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.1)
    study, runner, first_log, child = mid_study(tmp_path, env)
    runner.kill()
    runner.wait(timeout=10)
    wait_for(lambda: not pid_alive(child), 10, "the orphaned run to get its parent-death signal")

    starts, kept = finish_and_check(tmp_path, study, env, first_log)
    assert starts[("backout", 0)] == 2 and sum(starts.values()) == 5
    assert len(kept) == 1


@pytest.mark.slow
def test_run_outliving_a_killed_runner_is_not_started_twice(tmp_path):
    """A training process that survives its runner (it ignores SIGTERM) still holds its run's lock: a new runner
    watches it instead of starting a duplicate, and counts it once it finishes."""
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.4, FAKE_TRAIN_IGNORE_SIGTERM=1)
    hold = tmp_path / "hold"
    study, runner, first_log, child = mid_study(tmp_path, {**env, "FAKE_TRAIN_HOLD": str(hold)})
    hold.touch()  # the orphan stays part-way until the second runner watches it, however slowly that one starts
    runner.kill()
    runner.wait(timeout=10)
    assert pid_alive(child)

    status = json.loads(ablations(["status", study, "--json"], tmp_path, env).stdout)
    assert [item["seed"] for item in status["arms"]["backout"]["running"]] == [0]

    second = start_ablations(["run", study], tmp_path, env, tmp_path / "runner2.out")
    watching = "backout/seed0 is running in another process; watching it"
    wait_for(lambda: watching in (tmp_path / "runner2.out").read_text(), 120, "the second runner to watch the orphan")
    hold.unlink()
    assert second.wait(timeout=120) == 0, (tmp_path / "runner2.out").read_text()
    starts, kept = every_run_done_once(tmp_path, first_log)
    assert starts == {run: 1 for run in RUNS}
    assert kept == []
    assert "backout/seed0 finished in another process" in (tmp_path / "runner2.out").read_text()


@pytest.mark.slow
def test_two_runners_on_one_study_share_the_work(tmp_path):
    """Guards: two runner processes on one study start every run exactly once between them (real locks)."""
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.05)
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    runners = [start_ablations(["run", study], tmp_path, env, tmp_path / f"runner{i}.out") for i in range(2)]
    assert [r.wait(timeout=60) for r in runners] == [0, 0]
    assert starts_per_run(tmp_path / "starts.jsonl") == {run: 1 for run in RUNS}
    assert len(logs(tmp_path)) == len(RUNS) and all(is_complete(log) for log in logs(tmp_path))
    outputs = [(tmp_path / f"runner{i}.out").read_text() for i in range(2)]
    assert all("4 runs: 4 done" in text for text in outputs)
    assert sum(text.count(" start ") for text in outputs) == len(RUNS)
    for runner in runners:
        assert runner.returncode == 0
    assert os.path.exists(tmp_path / "runs" / "s" / "runner.log")
