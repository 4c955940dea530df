"""The training script under the faults of issue 17: bad shards refused before any log line, token ids bounded,
--resume refusing a checkpoint of another schedule, a damaged checkpoint naming --no-resume, and the temp files of
a killed save removed."""

import os

import numpy as np
import pytest
import torch

import train_gpt_medium as T
from conftest import one_error_line, synthetic_tokens, write_token_shard

TINY = ["--preset", "tiny", "--val-every", "0"]


def data_flags(folder, val=None, trains=None) -> list[str]:
    """Shards in `folder`: one val shard and two train shards of synthetic tokens unless given."""
    folder.mkdir(parents=True, exist_ok=True)
    write_token_shard(folder / "d_val_000000.bin", synthetic_tokens(20_000, 0) if val is None else val)
    for index, tokens in enumerate(trains or [synthetic_tokens(30_000, 1), synthetic_tokens(30_000, 2)], start=1):
        write_token_shard(folder / f"d_train_{index:06d}.bin", tokens)
    return ["--train-files", str(folder / "d_train_*.bin"), "--val-files", str(folder / "d_val_*.bin")]


def break_magic(path):
    data = bytearray(path.read_bytes())
    data[0:4] = np.array([1234], dtype="<i4").tobytes()
    path.write_bytes(bytes(data))


def truncate(path):
    path.write_bytes(path.read_bytes()[:-10])


@pytest.mark.parametrize("case, named", [
    ("val shard with a wrong magic number", "d_val_000000.bin"),
    ("second train shard truncated", "d_train_000002.bin"),
    ("second train shard with no tokens", "d_train_000002.bin"),
    ("second val shard with a wrong magic number", "d_val_000001.bin"),
])
def test_bad_shards_are_refused_before_any_log_line(tmp_path, capsys, case, named):
    flags = data_flags(tmp_path / "data")
    if case.startswith("val shard"):
        break_magic(tmp_path / "data" / named)
    elif case.endswith("truncated"):
        truncate(tmp_path / "data" / named)
    elif case.endswith("no tokens"):
        write_token_shard(tmp_path / "data" / named, [])
    else:
        write_token_shard(tmp_path / "data" / named, synthetic_tokens(20_000, 3))
        break_magic(tmp_path / "data" / named)
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--log-dir", str(tmp_path / "logs"), "--run-name", "r"])
    assert rc == 2
    assert named in one_error_line(capsys)
    assert not (tmp_path / "logs").exists(), "the log must not be started for bad data"


def test_token_id_outside_the_vocabulary_is_one_line(tmp_path, capsys):
    tokens = synthetic_tokens(30_000, 1)
    tokens[12_345] = 50_300
    flags = data_flags(tmp_path / "data", trains=[tokens])
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--log-dir", str(tmp_path / "logs"), "--run-name", "r"])
    assert rc == 2
    line = one_error_line(capsys)
    assert "d_train_000001.bin" in line and "50300" in line and "50257" in line


@pytest.fixture(scope="module")
def checkpoint_of_a_4_step_run(tmp_path_factory):
    """A checkpoint at step 2 of a 4-step tiny run (seed 1)."""
    folder = tmp_path_factory.mktemp("resume")
    flags = data_flags(folder / "data")
    rc = T.main([*TINY, *flags, "--num-iterations", "4", "--stop-after", "2", "--checkpoint-every", "2",
                 "--seed", "1", "--log-dir", str(folder / "logs"), "--run-name", "r"])
    assert rc == 0 and (folder / "logs" / "r.pt").exists()
    return folder, flags


@pytest.mark.slow
@pytest.mark.parametrize("changed, named", [
    (["--num-iterations", "6", "--seed", "1"], "--num-iterations"),
    (["--num-iterations", "4", "--seed", "2"], "--seed"),
    (["--num-iterations", "4", "--seed", "1", "--backout-layers", "2"], "--backout-layers"),
])
def test_resume_refuses_a_checkpoint_of_another_schedule(checkpoint_of_a_4_step_run, tmp_path, capsys, changed,
                                                         named):
    """Guards: --resume of a real checkpoint refuses another --num-iterations, --seed or --backout-layers, no log."""
    folder, flags = checkpoint_of_a_4_step_run
    log_dir = tmp_path / "logs"
    rc = T.main([*TINY, *flags, *changed, "--resume", str(folder / "logs" / "r.pt"), "--log-dir", str(log_dir),
                 "--run-name", "again"])
    assert rc == 2
    line = one_error_line(capsys)
    assert named in line and "r.pt" in line
    assert not log_dir.exists()


def test_damaged_checkpoint_names_no_resume(tmp_path, capsys):
    flags = data_flags(tmp_path / "data")
    damaged = tmp_path / "r.pt"
    damaged.write_bytes(b"PK\x03\x04 half a zip file")
    rc = T.main([*TINY, *flags, "--resume", str(damaged), "--log-dir", str(tmp_path / "logs")])
    assert rc == 2
    line = one_error_line(capsys)
    assert str(damaged) in line and "--no-resume" in line


@pytest.mark.slow
def test_temp_files_of_a_killed_save_are_removed(tmp_path):
    """Guards: a real run removes its own leftover checkpoint temp files, not another run's, and saves its own."""
    flags = data_flags(tmp_path / "data")
    log_dir = tmp_path / "logs"
    log_dir.mkdir()
    leftovers = [log_dir / "r.pt.tmp999999", log_dir / "r.pt.tmp1"]
    for path in leftovers:
        path.write_bytes(b"the first bytes of a checkpoint whose save was killed")
    other = log_dir / "other.pt.tmp5"
    other.write_bytes(b"another run's")
    rc = T.main([*TINY, *flags, "--num-iterations", "2", "--checkpoint-every", "2", "--log-dir", str(log_dir),
                 "--run-name", "r"])
    assert rc == 0
    assert not any(path.exists() for path in leftovers) and other.exists()
    assert torch.load(log_dir / "r.pt", weights_only=False)["step"] == 2
    assert sorted(os.listdir(log_dir)) == ["other.pt.tmp5", "r.pt", "r.txt"]
