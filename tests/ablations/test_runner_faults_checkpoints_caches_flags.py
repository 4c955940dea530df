"""The study runner under the faults of issue 36: a flag left at `auto` and logged as what it resolved to is not
an edit; checkpoints that are not checkpoints set aside like a truncated zip; a truncated kernel in inductor's
compile cache removed and its run retried once; bad --seeds, --grace, --progress-every refused as such; a full
disk named with the file it could not write."""

import pytest

import train_gpt_medium as T
from ablations import sequential_study
from ablations.cli import os_problem
from ablations.progress import Reporter
from ablations.runner import Options, StudyRunner
from ablations.runstate import run_paths
from ablations.staleness import ConfigCheck
from ablations.study import load_study
from conftest import full_tmpfs
from runner_support import ablations, is_complete, read_events, runner_env, starts_per_run, write_study
from test_runner_faults import run_dir
from test_runner_sequential import refused  # noqa: F401 (a fixture)

FLAGS = {"num-iterations": 6, "val-every": 3}


def test_an_auto_attention_logged_as_its_kernel_is_not_stale(tmp_path):
    study = load_study("r18-record")
    check = ConfigCheck(T, study, tmp_path)
    run = study.runs(tmp_path)[0]
    expected = check.expected(run)
    assert expected["attention"] == "auto"
    for logged in ("sdpa", "fa3", "flex to step 400, then fa3"):
        assert check.difference(run, dict(expected, attention=logged)) is None
    asking_sdpa = study.runs(tmp_path)[0]  # a kernel the study names is still compared
    asking_sdpa.flags = [*asking_sdpa.flags, "--attention", "sdpa"]
    assert "--attention fa3, the study now asks sdpa" in check.difference(asking_sdpa, dict(expected, attention="fa3"))


@pytest.mark.slow
def test_empty_and_non_zip_checkpoints_are_set_aside_and_their_runs_restarted(tmp_path):
    """The runner end to end on the stand-in script: the checkpoint set aside and the run started without --resume."""
    starts = tmp_path / "starts.jsonl"
    study = write_study(tmp_path, "s", {"empty": {}, "garbage": {"backout-layers": 4}}, seeds=[0], flags=FLAGS)
    written = {"empty": b"", "garbage": b"\x00\x01 not a checkpoint at all"}
    for arm, data in written.items():
        run_dir(tmp_path, arm).mkdir(parents=True)
        (run_dir(tmp_path, arm) / "seed0.pt").write_bytes(data)
    result = ablations(["run", study], tmp_path, runner_env(starts))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "checkpoint damaged (empty: 0 bytes)" in result.stdout
    assert "checkpoint damaged (not a zip file: it starts with b'\\x00\\x01'" in result.stdout
    for arm, data in written.items():
        (kept,) = run_dir(tmp_path, arm).glob("seed0.damaged-*.pt")
        assert kept.read_bytes() == data and is_complete(run_dir(tmp_path, arm) / "seed0.txt")
    assert [event["resume"] for event in read_events(starts) if event["event"] == "start"] == [None, None]


@pytest.mark.slow
def test_a_truncated_kernel_in_the_compile_cache_is_removed_and_the_run_retried_once(tmp_path):
    """The runner's retry on the stand-in script (tests/scripts/test_faults_attention_and_compile_cache.py checks
    torch's real error message)."""
    starts = tmp_path / "starts.jsonl"
    cache = tmp_path / "torchinductor_someone"
    kernel = cache / "7q" / "c7qua.main.so"
    kernel.parent.mkdir(parents=True)
    kernel.write_bytes(b"")
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0, 1], flags=FLAGS)
    result = ablations(["run", study], tmp_path, runner_env(starts, FAKE_TRAIN_KERNEL=kernel))
    assert result.returncode == 0, result.stdout + result.stderr
    (retry,) = [line for line in result.stdout.splitlines() if " retry " in line]
    assert f"baseline/seed0: {kernel}: file too short (a compile killed while writing it left it truncated in " \
           f"inductor's cache {cache}); removed it; starting it again (once)" in retry
    assert not kernel.exists()
    assert starts_per_run(starts) == {("baseline", 0): 2, ("baseline", 1): 1}


def test_bad_seeds_grace_and_progress_are_refused_as_such(tmp_path, refused, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no nvidia-smi process in the fast tier
    study = write_study(tmp_path, "s", {"baseline": {}}, seeds=[0, 1], flags=FLAGS)
    assert refused(study, "--seeds", "0,0") == "error: --seeds 0,0: seed 0 given twice; each seed runs once"
    assert "--seeds 0-3,2: seed 2 given twice" in refused(study, "--seeds", "0-3,2")
    assert refused(study, "--grace", "-1").startswith("error: --grace -1: seconds runs get to exit")
    assert refused(study, "--grace", "nan").startswith("error: --grace nan")
    assert refused(study, "--progress-every", "-5").startswith("error: --progress-every -5: seconds between")


@pytest.fixture
def full_disk(tmp_path):
    yield from full_tmpfs(tmp_path / "full")


@pytest.mark.slow
def test_a_full_disk_names_the_failure_marker_and_the_sequential_record_and_leaves_no_temp(tmp_path, full_disk):
    """Mounts a full tmpfs (the `mount` command): no faster way to get ENOSPC from a write."""
    study = load_study(str(write_study(tmp_path, "s", {"baseline": {}}, seeds=[0], flags=FLAGS)))
    runner = StudyRunner(study, study.runs(full_disk), Options(runs_dir=full_disk),
                         Reporter("s", tmp_path / "runner.log"))
    paths = run_paths(full_disk, "s", "baseline", 0)
    paths.log_dir.mkdir(parents=True, exist_ok=True)
    with pytest.raises(OSError) as failed:
        runner._record_failure(study.runs(full_disk)[0], paths, "exit status 1", 1.0)
    assert os_problem(failed.value) == f"{paths.failed_marker}: No space left on device"
    with pytest.raises(OSError) as record:
        sequential_study._save_state(full_disk / "sequential.json", {"design": {}, "looks": {}})
    assert os_problem(record.value) == f"{full_disk / 'sequential.json'}: No space left on device"
    leftovers = [path.name for path in full_disk.rglob("*") if path.is_file() and path.name != "filler"]
    assert leftovers == [], leftovers
