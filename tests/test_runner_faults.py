"""Faults from issue 17, reproduced with real signals and real files: orphaned torchrun workers, edited studies,
leftovers of killed saves, unwritable folders and bad study input."""

import json
import os
import signal
import sys
from pathlib import Path

import pytest

from runner_support import (FAKE_TRAIN, REPO, ablations, is_complete, pid_alive, read_events, runner_env,
                            start_ablations, starts_per_run, step_lines, wait_for, write_study)

sys.path.insert(0, str(REPO))
from analysis.logs import load_runs  # noqa: E402

FLAGS = {"num-iterations": 12, "val-every": 4}


def run_dir(tmp_path: Path, arm: str = "baseline") -> Path:
    return tmp_path / "runs" / "s" / arm


def processes_of(log_dir: Path) -> list[int]:
    """Live stand-in training processes (agent excluded) writing under log_dir."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(FAKE_TRAIN).encode() in cmdline and str(log_dir).encode() in b" ".join(cmdline) \
                and b"torch.distributed.run" not in cmdline and pid_alive(int(entry.name)):
            found.append(int(entry.name))
    return found


def start_torchrun_study(tmp_path: Path):
    """A 2-process torchrun run of the stand-in script, part-way; returns (study, runner, agent pid, worker pids)."""
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.3)
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS, launcher="torchrun", nproc=2)
    runner = start_ablations(["run", study, "--gpus", "0", "--grace", "5"],
                             tmp_path, env, tmp_path / "runner1.out")
    log = run_dir(tmp_path) / "seed0.txt"
    wait_for(lambda: log.exists() and "step:2/12" in log.read_text(), 60, "the run to be part-way")
    workers = wait_for(lambda: processes_of(Path("runs/s/baseline")) if len(
        processes_of(Path("runs/s/baseline"))) == 2 else None, 30, "both workers")
    agent = json.loads((run_dir(tmp_path) / "seed0.lock").read_text())["pid"]
    assert agent not in workers and pid_alive(agent)
    return study, runner, env, agent, workers


def complete_logs_counted_by_analysis(tmp_path: Path) -> list:
    runs, _ = load_runs([tmp_path / "runs" / "s"])
    return [run for run in runs if run.complete]


def test_sigkill_of_the_torchrun_agent_takes_its_workers_down(tmp_path):
    study, runner, env, agent, workers = start_torchrun_study(tmp_path)
    os.kill(agent, signal.SIGKILL)
    wait_for(lambda: not any(pid_alive(pid) for pid in workers), 15, "the workers to die with their agent")
    assert runner.wait(timeout=30) == 1
    assert "baseline/seed0 exit status -9; killed 2 of its processes left running" in \
        (tmp_path / "runner1.out").read_text()

    result = ablations(["run", study, "--gpus", "0"], tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert starts_per_run(tmp_path / "starts.jsonl") == {("baseline", 0): 2}
    assert len(complete_logs_counted_by_analysis(tmp_path)) == 1


def test_workers_orphaned_with_their_runner_gone_are_killed_before_the_run_starts_again(tmp_path):
    """Agent and runner both killed: nothing is left to stop the workers. The next runner finds them through the
    token in their environment and kills them instead of running the same run a second time beside them."""
    study, runner, env, agent, workers = start_torchrun_study(tmp_path)
    runner.send_signal(signal.SIGSTOP)  # the runner must not see its agent die
    os.kill(agent, signal.SIGKILL)
    runner.kill()
    runner.wait(timeout=10)
    assert all(pid_alive(pid) for pid in workers), "the workers should have outlived their agent"

    status = json.loads(ablations(["status", study, "--json"], tmp_path, env).stdout)
    assert status["running"] == 1

    result = ablations(["run", study, "--gpus", "0"], tmp_path, env)
    assert result.returncode == 0, result.stdout + result.stderr
    assert not any(pid_alive(pid) for pid in workers)
    events = read_events(tmp_path / "starts.jsonl")
    assert [e["event"] for e in events] == ["start", "start", "finish"]  # the orphan never finished
    kept = list(run_dir(tmp_path).glob("seed0.unfinished-*.txt"))
    assert len(kept) == 1 and not is_complete(kept[0])
    assert len(complete_logs_counted_by_analysis(tmp_path)) == 1


def test_analysis_never_counts_a_set_aside_log(tmp_path):
    folder = tmp_path / "runs" / "s" / "baseline"
    folder.mkdir(parents=True)
    complete = "\n".join(["source", "=" * 100, 'config: {"variant": "baseline", "seed": 0}', "=" * 100,
                          "step:1/1 val_loss:3.5 train_time:10ms step_avg:10.00ms",
                          "peak memory allocated: 1 MiB reserved: 1 MiB"]) + "\n"
    (folder / "seed0.txt").write_text(complete)
    (folder / "seed0.unfinished-20261122-101010.txt").write_text(complete)
    (folder / "seed0.stale-20261122-101010.txt").write_text(complete)
    assert [run.path.name for run in complete_logs_counted_by_analysis(tmp_path)] == ["seed0.txt"]
