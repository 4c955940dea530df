"""The study runner under the faults of issue 26, with real files, signals and mounts: an edited study is compared
with everything a run recorded (every flag, named or not, and the script's track), `status` agrees with `run` on
such runs, a renamed arm's logs stay out of the report, a deleted .lock never lets a run start twice, bad input is
refused before any launch, and a full disk is reported as such."""

import json
import shutil

import pytest

from conftest import mounted_tmpfs, synthetic_tokens, write_token_shard
from runner_support import (FAKE_TRAIN, REPO, ablations, is_complete, read_events, runner_env, start_ablations,
                            starts_per_run, wait_for, write_study)
from test_runner_faults import one_error_line, run_dir

FLAGS = {"num-iterations": 6, "val-every": 3}


def status_of(tmp_path, study) -> dict:
    result = ablations(["status", study, "--json"], tmp_path, runner_env())
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.mark.slow
def test_removing_an_arms_only_flag_makes_its_runs_stale(tmp_path):
    """Guards: deleting an arm's flag makes its runs stale in run and status, and --redo-stale reruns that run only."""
    starts = tmp_path / "starts.jsonl"
    arms = {"baseline": {}, "backout": {"backout-layers": 4}}
    study = write_study(tmp_path, "s", arms, seeds=[0], flags=FLAGS)
    assert ablations(["run", study], tmp_path, runner_env(starts)).returncode == 0
    write_study(tmp_path, "s", {"baseline": {}, "backout": {}}, seeds=[0], flags=FLAGS)  # the flag deleted

    refused = ablations(["run", study], tmp_path, runner_env(starts))
    assert "backout/seed0 was made with --backout-layers 4, the study now asks (unset)" in one_error_line(refused)
    status = status_of(tmp_path, study)
    assert (status["done"], status["stale"]) == (1, 1) and status["arms"]["backout"]["stale"] == [{"seed": 0}]
    text = ablations(["status", study], tmp_path, runner_env()).stdout
    assert "1 stale" in text and "stale: seed0" in text

    redone = ablations(["run", study, "--redo-stale"], tmp_path, runner_env(starts))
    assert redone.returncode == 0, redone.stdout + redone.stderr
    assert starts_per_run(starts) == {("baseline", 0): 1, ("backout", 0): 2}
    assert status_of(tmp_path, study)["done"] == 2


@pytest.mark.slow
def test_changing_the_script_makes_every_run_stale(tmp_path):
    """Guards: pointing a study at a script of another track makes every complete run stale (the runner CLI)."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0, 1], flags=FLAGS)
    assert ablations(["run", study], tmp_path, runner_env()).returncode == 0
    other = tmp_path / "other_track.py"  # the same flags, another track (as train_gpt.py is to train_gpt_medium.py)
    other.write_text(FAKE_TRAIN.read_text().replace('TRACK = "fake"', 'TRACK = "fake-small"'))
    write_study(tmp_path, "s", {"baseline": {}}, seeds=[0, 1], flags=FLAGS, script=other)
    line = one_error_line(ablations(["run", study], tmp_path, runner_env()))
    assert "2 complete run(s)" in line and "track fake, the study's script other_track.py now writes fake-small" in line
    assert status_of(tmp_path, study)["stale"] == 2


@pytest.mark.slow
def test_a_renamed_arms_logs_stay_out_of_the_report(tmp_path):
    """Guards: `run --report` after an arm's rename leaves its old logs out of the arms table and terminal summary."""
    study = write_study(tmp_path, "s", {"baseline": {}, "old": {"backout-layers": 4}}, seeds=[0, 1], flags=FLAGS)
    assert ablations(["run", study], tmp_path, runner_env()).returncode == 0
    write_study(tmp_path, "s", {"baseline": {}, "new": {"backout-layers": 4, "num-iterations": 9}}, seeds=[0, 1],
                flags=FLAGS)
    result = ablations(["run", study, "--report"], tmp_path, runner_env(), timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    report = (tmp_path / "runs" / "s" / "report.md").read_text()
    arms = report.split("## Arms")[1].split("##")[0]
    assert "| new |" in arms and "| old |" not in arms
    assert "old/seed0.txt" in report.split("## Logs of arms the study no longer has")[1]
    assert "| old |" not in result.stdout  # nor in the terminal summary


@pytest.mark.slow
def test_a_script_that_is_not_python_is_one_line(tmp_path):
    """Guards: a study whose script is not Python is one error line from run and status, writing no runs folder."""
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], script=REPO / "README.md")
    for command in (["run", study], ["status", study]):
        assert "README.md is not a Python file" in one_error_line(ablations(command, tmp_path, runner_env()))
    assert not (tmp_path / "runs").exists()


@pytest.mark.slow
def test_bad_shards_are_refused_before_any_torchrun_launch(tmp_path, shard_dir):
    """Guards: an empty shard of train_gpt_medium.py's data is refused by the runner before any torchrun launch."""
    data = tmp_path / "data"
    data.mkdir()
    shutil.copy(shard_dir / "syn_val_000000.bin", data / "d_val_000000.bin")
    write_token_shard(data / "d_train_000001.bin", synthetic_tokens(30_000, 1))
    write_token_shard(data / "d_train_000002.bin", [])
    flags = {"preset": "tiny", "num-iterations": 2, "train-files": str(data / "d_train_*.bin"),
             "val-files": str(data / "d_val_*.bin")}
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=flags, script=REPO / "train_gpt_medium.py",
                        launcher="torchrun", nproc=2)
    line = one_error_line(ablations(["run", study, "--gpus", "0"], tmp_path, runner_env(), timeout=300))
    assert "arm 'baseline': its data:" in line and "d_train_000002.bin: the shard holds no tokens" in line
    assert not (tmp_path / "runs" / "s" / "baseline").exists()


@pytest.mark.slow
def test_a_deleted_lock_never_lets_a_second_runner_start_the_run(tmp_path):
    """Guards: a second runner watches a live run whose .lock was deleted instead of starting it twice (2 processes)."""
    starts, hold = tmp_path / "starts.jsonl", tmp_path / "hold"
    env = runner_env(starts, FAKE_TRAIN_STEP_SECONDS=0.2, FAKE_TRAIN_HOLD=str(hold))
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags={"num-iterations": 20, "val-every": 5,
                                                                           "checkpoint-every": 2})
    first = start_ablations(["run", study], tmp_path, env, tmp_path / "first.out")
    log = run_dir(tmp_path) / "seed0.txt"
    wait_for(lambda: log.exists() and "step:3/20" in log.read_text(), 60, "the run to be part-way")
    hold.touch()  # the run stays part-way until the second runner watches it, however slowly that one starts
    (run_dir(tmp_path) / "seed0.lock").unlink()
    assert status_of(tmp_path, study)["running"] == 1
    second = start_ablations(["run", study], tmp_path, env, tmp_path / "second.out")
    watching = "running in another process; watching it"
    wait_for(lambda: watching in (tmp_path / "second.out").read_text(), 120, "the second runner to watch the run")
    hold.unlink()
    assert first.wait(timeout=120) == 0, (tmp_path / "first.out").read_text()
    assert second.wait(timeout=120) == 0, (tmp_path / "second.out").read_text()
    assert "finished in another process" in (tmp_path / "second.out").read_text()
    assert starts_per_run(starts) == {("baseline", 0): 1}
    assert is_complete(log)


@pytest.fixture
def small_mount(tmp_path):
    """A 1 MiB tmpfs for the runs folder: room for a tiny run's log and output, not for its checkpoint."""
    yield from mounted_tmpfs(tmp_path / "runs")


@pytest.mark.slow
def test_a_full_disk_during_a_checkpoint_save_is_reported_as_such(tmp_path, shard_dir, small_mount):
    """Guards: a real ENOSPC (1 MiB tmpfs) in train_gpt_medium.py's checkpoint save is reported as such, no .pt left."""
    flags = {"preset": "tiny", "num-iterations": 2, "val-every": 0, "checkpoint-every": 1,
             "train-files": str(shard_dir / "syn_train_*.bin"), "val-files": str(shard_dir / "syn_val_*.bin")}
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=flags, script=REPO / "train_gpt_medium.py")
    result = ablations(["run", study, "--gpus", "0"], tmp_path, runner_env(), timeout=300)
    assert result.returncode == 1
    failed = [line for line in result.stdout.splitlines() if " failed " in line and "baseline/seed0" in line]
    assert failed and "No space left on device" in failed[-1] and "damaged" not in failed[-1], result.stdout
    assert not list((small_mount / "s" / "baseline").glob("seed0.pt*"))


@pytest.mark.slow
def test_a_damaged_checkpoint_is_set_aside_and_the_run_redone(tmp_path):
    """Guards: a checkpoint failing its zip CRC is set aside by the runner and the run redone without --resume."""
    import torch

    starts = tmp_path / "starts.jsonl"
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)
    folder = run_dir(tmp_path)
    folder.mkdir(parents=True)
    torch.save({"step": 3, "weights": torch.arange(4096.0)}, folder / "seed0.pt")
    data = bytearray((folder / "seed0.pt").read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the tensor's data: the zip's CRC says so
    (folder / "seed0.pt").write_bytes(bytes(data))
    result = ablations(["run", study], tmp_path, runner_env(starts), timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checkpoint damaged (the bytes of" in result.stdout and "fail their CRC check" in result.stdout
    (kept,) = folder.glob("seed0.damaged-*.pt")
    assert kept.read_bytes() == bytes(data)
    assert [event["resume"] for event in read_events(starts) if event["event"] == "start"] == [None]
    assert is_complete(folder / "seed0.txt")
