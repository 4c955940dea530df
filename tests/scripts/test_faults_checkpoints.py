"""The training script under the faults of issue 26: damaged checkpoints refused (CRC), --resume refusing every
flag that changes what a validation line means and a --stop-after before the checkpoint, and one `error:` line (exit
2, no log) for an unwritable --log-dir, a full disk during a save, a checkpoint without its entries, an out-of-range
--seed or --num-layers, a validation shard too small for one validation and bad input under torchrun."""

import subprocess
import sys

import pytest
import torch

import train_gpt_medium as T
from conftest import ROOT, mounted_tmpfs, synthetic_tokens, write_token_shard
from test_faults_training import TINY, checkpoint_of_a_4_step_run, data_flags, one_error_line  # noqa: F401


def resume_command(folder, flags, log_dir, *extra):
    return [*TINY, *flags, "--num-iterations", "4", "--seed", "1", *extra, "--resume", str(folder / "logs" / "r.pt"),
            "--log-dir", str(log_dir), "--run-name", "again"]


@pytest.mark.slow
def test_checkpoint_with_corrupted_bytes_of_the_same_size_is_refused(checkpoint_of_a_4_step_run, tmp_path, capsys):
    """Guards: a real checkpoint with flipped tensor bytes fails the CRC check of --resume and --init-from, no log."""
    folder, flags = checkpoint_of_a_4_step_run
    damaged = tmp_path / "r.pt"
    data = bytearray((folder / "logs" / "r.pt").read_bytes())
    middle = len(data) // 2  # inside a tensor's bytes: torch.load reads them without complaint
    data[middle:middle + 64] = bytes(b ^ 0xFF for b in data[middle:middle + 64])
    damaged.write_bytes(bytes(data))
    log_dir = tmp_path / "logs"
    rc = T.main([*TINY, *flags, "--num-iterations", "4", "--seed", "1", "--resume", str(damaged),
                 "--log-dir", str(log_dir), "--run-name", "again"])
    assert rc == 2
    line = one_error_line(capsys)
    assert str(damaged) in line and "CRC" in line and "--no-resume" in line
    assert not log_dir.exists()
    # --init-from reads checkpoints through the same check
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--init-from", str(damaged), "--log-dir", str(log_dir)])
    assert rc == 2 and "CRC" in one_error_line(capsys)


@pytest.mark.slow
def test_intact_checkpoint_still_resumes(checkpoint_of_a_4_step_run, tmp_path):
    """Guards: the CRC check passes an intact checkpoint of a real run: --resume runs to a finished log."""
    folder, flags = checkpoint_of_a_4_step_run
    assert T.main(resume_command(folder, flags, tmp_path / "logs")) == 0
    assert (tmp_path / "logs" / "again.txt").read_text().rstrip().splitlines()[-1].startswith("peak memory")


@pytest.mark.slow
@pytest.mark.parametrize("changed, named", [
    (["--val-tokens", "1024"], "--val-tokens"),
    (["--val-seq-len", "64", "--val-tokens", "2048"], "--val-seq-len"),
    ("other train files", "--train-files"),
    ("other val files", "--val-files"),
    (["--low-precision", "bf16"], "--low-precision"),
])
def test_resume_refuses_flags_that_change_what_a_validation_line_means(checkpoint_of_a_4_step_run, tmp_path, capsys,
                                                                      changed, named):
    """Guards: --resume of a real checkpoint refuses other val tokens, val seq len, data files or precision, no log."""
    folder, flags = checkpoint_of_a_4_step_run
    if isinstance(changed, str):  # the same tokens in other files: still other data for the run's log
        other = data_flags(tmp_path / "other")
        flags = flags[:2] + other[2:] if "val" in changed else other[:2] + flags[2:]
        changed = []
    log_dir = tmp_path / "logs"
    rc = T.main(resume_command(folder, flags, log_dir, *changed))
    assert rc == 2
    line = one_error_line(capsys)
    assert named in line and "r.pt" in line
    assert not log_dir.exists()


@pytest.mark.slow
def test_resume_accepts_the_same_files_named_another_way(checkpoint_of_a_4_step_run, tmp_path, monkeypatch):
    """Guards: --resume of a real checkpoint accepts the same shards named by relative globs (no false refusal)."""
    folder, flags = checkpoint_of_a_4_step_run
    monkeypatch.chdir(folder)  # relative globs naming the very same files
    relative = ["--train-files", "data/d_train_*.bin", "--val-files", "data/d_val_*.bin"]
    assert T.main(resume_command(folder, relative, tmp_path / "logs")) == 0


@pytest.mark.slow
def test_resume_refuses_a_stop_after_before_the_checkpoint(checkpoint_of_a_4_step_run, tmp_path, capsys):
    """Guards: --resume of a real step-2 checkpoint refuses --stop-after 1 in one line, before the log."""
    folder, flags = checkpoint_of_a_4_step_run
    log_dir = tmp_path / "logs"
    rc = T.main(resume_command(folder, flags, log_dir, "--stop-after", "1"))
    assert rc == 2
    line = one_error_line(capsys)
    assert "--stop-after 1" in line and "step 2" in line
    assert not log_dir.exists()


@pytest.mark.slow
@pytest.mark.parametrize("dropped", ["config", "optimizers"])
def test_checkpoint_without_an_entry_is_refused_before_the_log(checkpoint_of_a_4_step_run, tmp_path, capsys, dropped):
    """Guards: a real checkpoint lacking its config or optimizers entry is one line naming it, before the log."""
    folder, flags = checkpoint_of_a_4_step_run
    state = torch.load(folder / "logs" / "r.pt", weights_only=False)
    del state[dropped]
    partial = tmp_path / "partial.pt"
    torch.save(state, partial)
    log_dir = tmp_path / "logs"
    rc = T.main([*TINY, *flags, "--num-iterations", "4", "--seed", "1", "--resume", str(partial),
                 "--log-dir", str(log_dir)])
    assert rc == 2
    line = one_error_line(capsys)
    assert str(partial) in line and repr(dropped) in line
    assert not log_dir.exists()


@pytest.mark.parametrize("flag, value", [("--seed", "99999999999999999999"), ("--seed", "-1"),
                                         ("--num-layers", "100000")])
def test_out_of_range_numbers_are_one_line(tmp_path, capsys, flag, value):
    flags = data_flags(tmp_path / "data")
    rc = T.main([*TINY, *flags, flag, value, "--num-iterations", "2", "--log-dir", str(tmp_path / "logs")])
    assert rc == 2
    assert flag in one_error_line(capsys)
    assert not (tmp_path / "logs").exists()


@pytest.mark.parametrize("tokens", [1_500, 2_049])
def test_val_shard_too_small_for_one_validation_is_refused_before_the_log(tmp_path, capsys, tokens):
    # the tiny preset validates 2048 tokens in steps of 8 x 128, and its stream needs the last step's target and one
    # token more in the shard: 1,500 tokens hold one step, 2,049 (what a val shard of --val-tokens 2048 + 1 holds) two
    # steps but not that one token (issue 36)
    flags = data_flags(tmp_path / "data", val=synthetic_tokens(tokens, 0))
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--log-dir", str(tmp_path / "logs")])
    assert rc == 2
    line = one_error_line(capsys)
    assert f"--val-files {tmp_path / 'data' / 'd_val_*.bin'}: {tokens:,} tokens in 1 shard(s), too few" in line
    assert "--val-tokens 2048" in line and "needs 2,050 in one shard" in line and "fewer steps" not in line
    assert not (tmp_path / "logs").exists()


@pytest.fixture
def small_mount(tmp_path):
    """A 1 MiB tmpfs: room for a tiny run's log, not for its checkpoint."""
    yield from mounted_tmpfs(tmp_path / "mnt")


@pytest.mark.slow
def test_disk_full_during_a_checkpoint_save_is_one_line(tmp_path, capsys, small_mount):
    """Guards: a real ENOSPC (1 MiB tmpfs) in a checkpoint save is one line naming it; no half checkpoint is left."""
    flags = data_flags(tmp_path / "data")
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--checkpoint-every", "1", "--log-dir", str(small_mount),
                 "--run-name", "r"])
    assert rc == 2
    line = one_error_line(capsys)
    assert "r.pt" in line and "No space left on device" in line
    assert sorted(p.name for p in small_mount.iterdir()) == ["r.txt"]  # no half checkpoint left behind


@pytest.mark.slow
def test_read_only_log_dir_is_one_line(tmp_path, capsys, small_mount):
    """Guards: a --log-dir on a real read-only remounted tmpfs is one error line naming --log-dir."""
    subprocess.run(["mount", "-o", "remount,ro", str(small_mount)], check=True)
    flags = data_flags(tmp_path / "data")
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--log-dir", str(small_mount / "logs")])
    assert rc == 2
    assert "--log-dir" in one_error_line(capsys)


def test_log_dir_under_proc_is_one_line(tmp_path, capsys):
    flags = data_flags(tmp_path / "data")
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--log-dir", "/proc/self/logs"])
    assert rc == 2
    assert "--log-dir /proc/self/logs" in one_error_line(capsys)


@pytest.mark.slow
@pytest.mark.parametrize("bad, named", [(["--no-such-flag"], "--no-such-flag"),
                                         (["--num-iterations", "0"], "--num-iterations"),
                                         ("empty shard", "d_train_000002.bin")])
def test_bad_input_under_torchrun_is_one_line_from_one_rank(tmp_path, bad, named):
    """Guards: under a real 2-rank torchrun, a bad flag, value or empty shard is one `error:` line, not one per rank."""
    flags = data_flags(tmp_path / "data")
    if bad == "empty shard":  # found by every rank, after the process group is up
        write_token_shard(tmp_path / "data" / "d_train_000002.bin", [])
        bad = []
    result = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                             str(ROOT / "train_gpt_medium.py"), *TINY, *flags, "--num-iterations", "2", *bad,
                             "--log-dir", str(tmp_path / "logs")], capture_output=True, text=True, timeout=300,
                            cwd=ROOT)
    assert result.returncode != 0  # torchrun's own: 1, whatever its workers' status
    errors = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], result.stderr
    assert not (tmp_path / "logs").exists()
