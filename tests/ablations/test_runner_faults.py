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
    """A 2-process torchrun run of the stand-in script, held part-way for good (its workers wait on a file that
    stays); returns (study, runner, the env of later commands (their runs are not held), agent pid, worker pids)."""
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.3)
    hold = tmp_path / "hold"
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS, launcher="torchrun", nproc=2)
    runner = start_ablations(["run", study, "--gpus", "0", "--grace", "5"],
                             tmp_path, {**env, "FAKE_TRAIN_HOLD": str(hold)}, tmp_path / "runner1.out")
    log = run_dir(tmp_path) / "seed0.txt"
    wait_for(lambda: log.exists() and "step:2/12" in log.read_text(), 60, "the run to be part-way")
    hold.touch()  # 3 s of steps were left: on a loaded machine the next process may take that long to start
    workers = wait_for(lambda: processes_of(Path("runs/s/baseline")) if len(
        processes_of(Path("runs/s/baseline"))) == 2 else None, 30, "both workers")
    agent = json.loads((run_dir(tmp_path) / "seed0.lock").read_text())["pid"]
    assert agent not in workers and pid_alive(agent)
    return study, runner, env, agent, workers


def complete_logs_counted_by_analysis(tmp_path: Path) -> list:
    runs, _ = load_runs([tmp_path / "runs" / "s"])
    return [run for run in runs if run.complete]


@pytest.mark.slow
def test_sigkill_of_the_torchrun_agent_takes_its_workers_down(tmp_path):
    """Guards: a SIGKILL of the torchrun agent takes its workers down and a rerun completes (a real process tree)."""
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


@pytest.mark.slow
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


@pytest.mark.slow
def test_edited_study_refuses_then_redoes_stale_runs_without_mixing_schedules(tmp_path):
    """Guards: an edited study is refused, then --redo-stale sets logs and checkpoints aside; no run mixes schedules."""
    starts = tmp_path / "starts.jsonl"
    arms = {"baseline": {}, "backout": {"backout-layers": [11]}}
    flags = {**FLAGS, "checkpoint-every": 2}
    study = write_study(tmp_path, "s", arms, seeds=[0], flags=flags)
    first = ablations(["run", study], tmp_path, runner_env(starts, FAKE_TRAIN_FAIL_VARIANT="backout",
                                                           FAKE_TRAIN_FAIL_AT=7))
    assert first.returncode == 1  # backout failed at step 7, leaving its step-6 checkpoint
    assert (run_dir(tmp_path, "backout") / "seed0.pt").exists()
    old_baseline = (run_dir(tmp_path) / "seed0.txt").read_bytes()

    write_study(tmp_path, "s", arms, seeds=[0], flags={**flags, "num-iterations": 16})
    refused = ablations(["run", study], tmp_path, runner_env(starts))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines() == [
        "error: 1 complete run(s) of study s differ from the study now (baseline/seed0 was made with "
        "--num-iterations 12, the study now asks 16); pass --redo-stale to set their logs aside and run them "
        "again, or undo the edit"]
    assert len(read_events(starts)) == 3  # 2 starts and 1 finish of the first round: nothing launched

    redone = ablations(["run", study, "--redo-stale"], tmp_path, runner_env(starts))
    assert redone.returncode == 0, redone.stdout + redone.stderr
    assert "checkpoint made with --num-iterations 12, the study now asks 16 set aside" in redone.stdout
    assert all(event["resume"] is None for event in read_events(starts))
    for arm in arms:
        lines = step_lines(run_dir(tmp_path, arm) / "seed0.txt")
        assert lines and all(line.split()[0].endswith("/16") for line in lines), lines
    (stale_log,) = run_dir(tmp_path).glob("seed0.stale-*.txt")
    assert stale_log.read_bytes() == old_baseline
    assert len(list(run_dir(tmp_path, "backout").glob("seed0.stale-*.pt"))) == 1
    counted = complete_logs_counted_by_analysis(tmp_path)
    assert sorted(run.total_steps for run in counted) == [16, 16]


# ----- leftovers, unwritable folders, bad input: one line each, never a traceback --------------------------------

def one_error_line(result) -> str:
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    return lines[0]


def can_mount_in_a_namespace() -> bool:
    import subprocess

    try:
        return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs tmpfs /mnt"], capture_output=True,
                              timeout=30).returncode == 0
    except OSError:
        return False


def ablations_with_tmpfs(args, cwd: Path, env: dict, mount_point: Path, options: str, before: str = ":"):
    """The runner with a tmpfs (mount options `options`, e.g. "ro" or "size=64k") over mount_point, in a mount
    namespace of its own: a real read-only or full file system, without touching the machine's mounts."""
    import subprocess

    script = 'mount -t tmpfs -o "$1" tmpfs "$2" && sh -c "$3" && shift 3 && exec "$@"'
    return subprocess.run(["unshare", "-rm", "sh", "-c", script, "sh", options, str(mount_point), before,
                           sys.executable, "-m", "ablations", *map(str, args)],
                          cwd=cwd, env=env, text=True, capture_output=True, timeout=120)


needs_mounts = pytest.mark.skipif(not can_mount_in_a_namespace(), reason="needs `unshare -rm` and tmpfs mounts")


@pytest.mark.slow
@needs_mounts
def test_read_only_runs_folder_is_one_line(tmp_path):
    """Guards: a read-only runs folder (a real ro tmpfs mount) is one error line and nothing is launched."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)
    (tmp_path / "runs").mkdir()
    result = ablations_with_tmpfs(["run", study], tmp_path, runner_env(tmp_path / "starts.jsonl"),
                                  tmp_path / "runs", "ro")
    assert one_error_line(result) == "error: runs/s: Read-only file system"
    assert read_events(tmp_path / "starts.jsonl") == []


@pytest.mark.slow
@needs_mounts
def test_full_disk_is_one_line(tmp_path):
    """Guards: a full disk (a real 64k tmpfs) under the runner log is one error line and nothing is launched."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)
    (tmp_path / "runs").mkdir()
    fill = f"mkdir -p {tmp_path}/runs/s && head -c 200000 /dev/zero > {tmp_path}/runs/filler 2>/dev/null; true"
    result = ablations_with_tmpfs(["run", study], tmp_path, runner_env(tmp_path / "starts.jsonl"),
                                  tmp_path / "runs", "size=64k", before=fill)
    assert one_error_line(result) == "error: runs/s/runner.log: No space left on device"
    assert read_events(tmp_path / "starts.jsonl") == []


@pytest.mark.slow
def test_runner_log_that_cannot_be_appended_to_is_one_line(tmp_path):
    """Guards: a runner.log that cannot be opened for append is one error line from the CLI; nothing is launched."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)
    (tmp_path / "runs" / "s" / "runner.log").mkdir(parents=True)  # not openable for append, even by root
    result = ablations(["run", study], tmp_path, runner_env(tmp_path / "starts.jsonl"))
    assert one_error_line(result) == "error: runs/s/runner.log: Is a directory"
    assert read_events(tmp_path / "starts.jsonl") == []


@pytest.mark.slow
def test_study_folder_deleted_mid_run_fails_that_run_only(tmp_path):
    """Guards: deleting the study folder under a live run fails that run only, no traceback; a rerun completes."""
    env = runner_env(tmp_path / "starts.jsonl", FAKE_TRAIN_STEP_SECONDS=0.1)
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0, 1], flags=FLAGS)
    runner = start_ablations(["run", study], tmp_path, env, tmp_path / "runner1.out")
    log = run_dir(tmp_path) / "seed0.txt"
    wait_for(lambda: log.exists() and "step:2/12" in log.read_text(), 30, "the first run to be part-way")
    import shutil

    shutil.rmtree(tmp_path / "runs" / "s")
    assert runner.wait(timeout=60) == 1
    output = (tmp_path / "runner1.out").read_text()
    assert "Traceback" not in output
    assert "baseline/seed0 exited without finishing its log" in output
    assert is_complete(run_dir(tmp_path) / "seed1.txt")
    rerun = ablations(["run", study], tmp_path, env)
    assert rerun.returncode == 0 and is_complete(log)


@pytest.mark.slow
def test_leftover_checkpoint_temp_files_are_removed(tmp_path):
    """Guards: `ablations run` removes the run's leftover checkpoint temp files of both scripts and no other run's."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)
    folder = run_dir(tmp_path)
    folder.mkdir(parents=True)
    leftovers = [folder / "seed0.pt.tmp", folder / "seed0.pt.tmp4242"]  # the stand-in's and the real script's
    for path in leftovers:
        path.write_bytes(b"half a checkpoint")
    other_run = folder / "seed1.pt.tmp99"
    other_run.write_bytes(b"not this run's")
    result = ablations(["run", study], tmp_path, runner_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert not any(path.exists() for path in leftovers) and other_run.exists()


@pytest.mark.slow
def test_corrupted_checkpoint_failure_names_no_resume(tmp_path):
    """Guards: a run failing on a cut checkpoint names --no-resume, and running again with it completes."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)
    folder = run_dir(tmp_path)
    folder.mkdir(parents=True)
    # a checkpoint the runner cannot judge (the stand-in's JSON, cut short) fails in the script; one that is no zip
    # at all is set aside by the runner (test_runner_faults_checkpoints_caches_flags.py)
    (folder / "seed0.pt").write_bytes(b'{"step": 3, "lines"')
    result = ablations(["run", study], tmp_path, runner_env())
    assert result.returncode == 1
    assert ("(it resumed from seed0.pt: if that checkpoint is damaged, run again with --no-resume)"
            in result.stdout)
    again = ablations(["run", study, "--no-resume"], tmp_path, runner_env())
    assert again.returncode == 0 and is_complete(folder / "seed0.txt")


@pytest.mark.slow
@pytest.mark.parametrize("case, expected", [
    ("utf8", "not UTF-8 text (byte"),
    ("brace", "arm 'baseline', flag --train-files: '{seed' is not a valid placeholder text"),
    ("self", "requires_results forms a cycle (s -> s)"),
    ("nproc", "s.toml: nproc 3 does not divide 8: the training scripts need 1, 2, 4 or 8 processes per run"),
])
def test_bad_study_files_are_one_line(tmp_path, case, expected):
    """Guards: bad study files (not UTF-8, bad placeholder, self-cycle, nproc 3): one line, exit 2, nothing written."""
    if case == "utf8":
        study = write_study(tmp_path, "s", {"baseline": {}}, extra="# caf\xe9")
        study.write_bytes(study.read_bytes().replace("caf\xe9".encode(), b"caf\xe9"))
    elif case == "brace":
        study = write_study(tmp_path, "s", {"baseline": {}}, flags={"train-files": "{seed"})
    elif case == "self":
        study = write_study(tmp_path, "s", {"baseline": {}}, extra=f'requires_results = "{tmp_path / "s.toml"}"')
    else:
        study = write_study(tmp_path, "s", {"baseline": {}}, launcher="torchrun", nproc=3)
    assert expected in one_error_line(ablations(["run", study], tmp_path, runner_env()))
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
@pytest.mark.parametrize("args, expected", [
    (["--seeds", "0-1000000000000"], "--seeds 0-1000000000000: more than 1000 seeds"),
    (["--nproc", "3"], "--nproc 3 does not divide 8"),
])
def test_bad_command_lines_are_one_line(tmp_path, args, expected):
    """Guards: `ablations run` refuses a huge --seeds range and --nproc 3 in one line with exit status 2."""
    study = write_study(tmp_path, "s", {"baseline": {}})
    assert expected in one_error_line(ablations(["run", study, *args], tmp_path, runner_env(), timeout=30))


@pytest.mark.slow
def test_real_script_runs_are_current_until_the_study_changes(tmp_path, shard_dir, monkeypatch):
    """The comparison on the training script's own config and checkpoint: no false alarm on an unchanged study
    (which would refuse every rerun), and the edited flag named for log and checkpoint alike."""
    from ablations.runstate import checkpoint_config, log_config
    from ablations.staleness import ConfigCheck
    from ablations.study import check_flags, load_study

    flags = {"preset": "tiny", "num-iterations": 2, "val-every": 0, "checkpoint-every": 1,
             "train-files": str(shard_dir / "syn_train_*.bin"), "val-files": str(shard_dir / "syn_val_*.bin")}
    path = write_study(tmp_path, "s", {"baseline": {"backout-layers": [4]}}, seeds=[0], flags=flags,
                       script=REPO / "train_gpt_medium.py")
    first = ablations(["run", path, "--gpus", "0"], tmp_path, runner_env(), timeout=400)
    assert first.returncode == 0, first.stdout + first.stderr
    again = ablations(["run", path, "--gpus", "0"], tmp_path, runner_env(), timeout=400)
    assert again.returncode == 0 and "1 already complete, 0 to run" in again.stdout, again.stdout + again.stderr

    folder = run_dir(tmp_path)
    for edit, named in ((None, None), ({"num-iterations": 3}, "--num-iterations 2, the study now asks 3")):
        write_study(tmp_path, "s", {"baseline": {"backout-layers": [4]}}, seeds=[0], flags={**flags, **(edit or {})},
                    script=REPO / "train_gpt_medium.py")
        study = load_study(str(path), runs_dir=tmp_path / "runs")
        runs = study.runs(Path("runs"))
        monkeypatch.chdir(tmp_path)  # the runs folder is relative, as the command line has it
        check = ConfigCheck(check_flags(study, runs, Path("runs")), study, Path("runs"))
        assert check.difference(runs[0], log_config(folder / "seed0.txt")) == named
        assert check.difference(runs[0], checkpoint_config(folder / "seed0.pt")) == named
