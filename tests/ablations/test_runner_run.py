"""The runner on the stand-in script: completion, failures, kept-aside logs, resume, packing, torchrun, status."""

import json
from pathlib import Path

import pytest

from runner_support import (ablations, is_complete, read_events, runner_env, starts_per_run, step_lines,
                            write_study)

ARMS = {"baseline": {}, "backout": {"backout-layers": [11, 3]}}
FLAGS = {"num-iterations": 10, "val-every": 5}


def log_of(tmp_path: Path, arm: str, seed: int, study: str = "s") -> Path:
    return tmp_path / "runs" / study / arm / f"seed{seed}.txt"


def status_of(tmp_path: Path, study: Path) -> dict:
    result = ablations(["status", study, "--json"], tmp_path, runner_env())
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_two_arm_two_seed_study_runs_to_completion(tmp_path):
    """Guards: a 2x2 study runs each run once via the CLI (logs, progress, runner.log, status); a rerun is a no-op."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    starts = tmp_path / "starts.jsonl"
    result = ablations(["run", study, "--progress-every", "0"], tmp_path, runner_env(starts))
    assert result.returncode == 0, result.stdout + result.stderr
    for arm in ARMS:
        for seed in (0, 1):
            log = log_of(tmp_path, arm, seed)
            assert is_complete(log)
            config = json.loads(next(l for l in log.read_text().splitlines() if l.startswith("config: "))[8:])
            assert (config["seed"], config["variant"], config["run_name"]) == (seed, arm, f"seed{seed}")
    backout = log_of(tmp_path, "backout", 0).read_text()
    assert '"backout_layers": "11,3"' in backout  # the list flag arrived as one comma-joined value
    assert starts_per_run(starts) == {(a, s): 1 for a in ARMS for s in (0, 1)}
    # Progress: one line per start and finish of each run, and the summary, in the terminal and in runner.log.
    runner_log = (tmp_path / "runs" / "s" / "runner.log").read_text()
    for text in (result.stdout, runner_log):
        events = [line.split()[3] for line in text.splitlines()]
        assert events.count("start") == 4 and events.count("done") == 4
        assert "backout/seed1 10/10 val_loss 3." in text and "eta" in text
        assert "4 runs: 4 done (4 by this runner), 0 failed" in text
    status = status_of(tmp_path, study)
    assert (status["done"], status["running"], status["failed"], status["todo"]) == (4, 0, 0, 0)

    # A second run of a complete study starts nothing and leaves every log as it was.
    before = {p: p.read_bytes() for p in (tmp_path / "runs").rglob("seed*.txt")}
    again = ablations(["run", study], tmp_path, runner_env(starts))
    assert again.returncode == 0 and "4 already complete, 0 to run" in again.stdout
    assert {p: p.read_bytes() for p in (tmp_path / "runs").rglob("seed*.txt")} == before
    assert len(read_events(starts)) == 8  # 4 starts + 4 finishes, nothing new


@pytest.mark.slow
def test_failed_run_does_not_stop_the_study_and_is_named(tmp_path):
    """Guards: a failing arm leaves the others done, is named with its output and marker, and is redone on rerun."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    starts = tmp_path / "starts.jsonl"
    env = runner_env(starts, FAKE_TRAIN_FAIL_VARIANT="backout", FAKE_TRAIN_FAIL_AT=3)
    result = ablations(["run", study], tmp_path, env)
    assert result.returncode == 1
    assert all(is_complete(log_of(tmp_path, "baseline", seed)) for seed in (0, 1))
    summary = result.stdout[result.stdout.index(" summary "):]
    assert "2 failed" in summary
    for seed in (0, 1):
        assert f"backout/seed{seed}: exit status 1" in summary
        assert f"backout/seed{seed}.out" in summary
        marker = json.loads((tmp_path / "runs" / "s" / "backout" / f"seed{seed}.failed").read_text())
        assert "failing at step 3 as asked" in marker["last_output"][-1]
    status = status_of(tmp_path, study)
    assert [item["seed"] for item in status["arms"]["backout"]["failed"]] == [0, 1]
    assert status["done"] == 2 and status["failed"] == 2
    table = ablations(["status", study], tmp_path, runner_env()).stdout.splitlines()
    assert table[0] == "s (runs/s): 4 runs: 2 done, 0 running, 2 failed, 0 to do"
    assert table[1].split() == ["baseline", "done:", "seed0", "seed1"]
    assert table[2].split() == ["backout", "failed:", "seed0", "seed1"]

    # Rerun once fixed: the failed runs are redone, their unfinished logs kept aside, the finished ones untouched.
    result = ablations(["run", study], tmp_path, runner_env(starts))
    assert result.returncode == 0, result.stdout
    assert starts_per_run(starts) == {("baseline", 0): 1, ("baseline", 1): 1, ("backout", 0): 2, ("backout", 1): 2}
    kept = sorted((tmp_path / "runs" / "s" / "backout").glob("seed*.unfinished-*.txt"))
    assert len(kept) == 2 and not any(is_complete(k) for k in kept)
    assert not list((tmp_path / "runs").rglob("*.failed"))


@pytest.mark.slow
def test_unfinished_log_is_kept_aside_and_redone(tmp_path):
    """Guards: an unfinished log is kept aside and its run redone by the CLI; a finished log is never rerun."""
    study = write_study(tmp_path, "s", {"baseline": {}}, flags=FLAGS)
    starts = tmp_path / "starts.jsonl"
    unfinished = log_of(tmp_path, "baseline", 0)
    unfinished.parent.mkdir(parents=True)
    partial = "code\n" + "=" * 100 + "\nconfig: {}\n" + "=" * 100 + "\nstep:1/10 train_time:5ms step_avg:5.00ms\n"
    unfinished.write_text(partial)
    complete = log_of(tmp_path, "baseline", 1)
    complete.write_text(partial + "step:10/10 val_loss:3.0 train_time:50ms step_avg:5.00ms\n"
                        "peak memory allocated: 1 MiB reserved: 2 MiB\n")  # finished: final validation, peak line
    assert status_of(tmp_path, study)["todo"] == 1

    result = ablations(["run", study], tmp_path, runner_env(starts))
    assert result.returncode == 0, result.stdout
    kept = list(unfinished.parent.glob("seed0.unfinished-*.txt"))
    assert len(kept) == 1 and kept[0].read_text() == partial
    assert f"unfinished log kept aside as {kept[0].name}" in result.stdout
    assert is_complete(unfinished)
    assert complete.read_text().endswith("reserved: 2 MiB\n")  # never rerun or overwritten
    assert starts_per_run(starts) == {("baseline", 0): 1}
    assert status_of(tmp_path, study)["arms"]["baseline"]["kept_aside"] == 1


@pytest.mark.slow
def test_resume_from_checkpoint_when_present(tmp_path):
    """Guards: the next `ablations run` resumes a failed run's checkpoint, and the resumed log has each step once."""
    flags = {**FLAGS, "checkpoint-every": 3}
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=flags)
    starts = tmp_path / "starts.jsonl"
    first = ablations(["run", study], tmp_path, runner_env(starts, FAKE_TRAIN_FAIL_VARIANT="baseline",
                                                          FAKE_TRAIN_FAIL_AT=8))
    assert first.returncode == 1
    checkpoint = tmp_path / "runs" / "s" / "baseline" / "seed0.pt"
    assert json.loads(checkpoint.read_text())["step"] == 6

    second = ablations(["run", study], tmp_path, runner_env(starts))
    assert second.returncode == 0, second.stdout
    assert "resuming from runs/s/baseline/seed0.pt" in second.stdout
    assert [e["resume"] for e in read_events(starts) if e["event"] == "start"] == [None, "runs/s/baseline/seed0.pt"]
    log = log_of(tmp_path, "baseline", 0)
    assert "resumed from step 6" in log.read_text()
    train_steps = [l.split()[0] for l in step_lines(log) if "val_loss" not in l and "scalars" not in l]
    assert train_steps == [f"step:{s}/10" for s in range(1, 11)]  # the resumed log is complete, no step twice


@pytest.mark.slow
def test_no_resume_restarts_from_scratch(tmp_path):
    """Guards: `ablations run --no-resume` starts a run afresh though its checkpoint exists."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags={**FLAGS, "checkpoint-every": 3})
    starts = tmp_path / "starts.jsonl"
    ablations(["run", study], tmp_path, runner_env(starts, FAKE_TRAIN_FAIL_VARIANT="baseline", FAKE_TRAIN_FAIL_AT=8))
    result = ablations(["run", study, "--no-resume"], tmp_path, runner_env(starts))
    assert result.returncode == 0
    assert [e["resume"] for e in read_events(starts) if e["event"] == "start"] == [None, None]


@pytest.mark.slow
def test_gpu_slices_for_packed_runs(tmp_path):
    """Four 1-GPU runs on the two GPUs Slurm would hand out: side by side, never two on one GPU."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS)
    starts = tmp_path / "starts.jsonl"
    # 3 s runs: two must overlap even when a loaded machine takes seconds to start each
    env = runner_env(starts, CUDA_VISIBLE_DEVICES="5,7", FAKE_TRAIN_STEP_SECONDS=0.25)
    result = ablations(["run", study], tmp_path, env)
    assert result.returncode == 0, result.stdout
    assert "GPUs 5,7" in result.stdout
    events = read_events(starts)
    spans = {}
    for event in events:
        spans.setdefault((event["variant"], event["seed"]), {})[event["event"]] = event
    assert {span["start"]["gpus"] for span in spans.values()} == {"5", "7"}
    intervals = [(s["start"]["time"], s["finish"]["time"], s["start"]["gpus"]) for s in spans.values()]
    overlapping = [(a, b) for i, a in enumerate(intervals) for b in intervals[i + 1:]
                   if a[0] < b[1] and b[0] < a[1]]
    assert overlapping, "two GPUs should run two runs at once"
    assert all(a[2] != b[2] for a, b in overlapping)


@pytest.mark.slow
def test_study_under_torchrun_with_two_processes(tmp_path):
    """Guards: a study with launcher torchrun and nproc 2 really launches torch.distributed.run with 2 processes."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS, launcher="torchrun", nproc=2)
    result = ablations(["run", study, "--gpus", "0"], tmp_path, runner_env())
    assert result.returncode == 0, result.stdout + result.stderr
    log = log_of(tmp_path, "baseline", 0).read_text()
    assert '"world_size": 2' in log and is_complete(log_of(tmp_path, "baseline", 0))
    out = (tmp_path / "runs" / "s" / "baseline" / "seed0.out").read_text()
    assert "torch.distributed.run --standalone --nproc_per_node=2" in out.splitlines()[0]


@pytest.mark.slow
def test_dry_run_prints_commands_and_runs_nothing(tmp_path):
    """Guards: `run --dry-run` with --arms glob and --seeds prints the one torchrun command line and writes nothing."""
    study = write_study(tmp_path, "s", ARMS, flags=FLAGS, nproc=1, launcher="torchrun")
    result = ablations(["run", study, "--dry-run", "--arms", "back*", "--seeds", "3"], tmp_path, runner_env())
    assert result.returncode == 0, result.stderr
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("todo ")
    assert ("--nproc_per_node=1" in lines[0] and lines[0].endswith(
        "--backout-layers 11,3 --seed 3 --variant backout --log-dir runs/s/backout --run-name seed3"))
    assert not (tmp_path / "runs").exists()
