import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from data import shard_format, shards
from data.shard_format import (HEADER_INTS, MAGIC, VERSION, ShardError, load_tokens, read_header, validate_shard,
                               write_shard)
from data.shards import find_shards, shard_name

REPO = Path(__file__).resolve().parents[2]


def raw_shard(path, header_values, payload_tokens, extra=b""):
    """Writes a shard by hand, so that bad headers can be made."""
    header = np.zeros(HEADER_INTS, dtype="<i4")
    header[: len(header_values)] = header_values
    path.write_bytes(header.tobytes() + np.asarray(payload_tokens, dtype="<u2").tobytes() + extra)
    return path


def assert_one_line_naming(error, path):
    message = str(error.value)
    assert "\n" not in message
    assert str(path) in message


def test_write_then_load_round_trips_with_upstream_layout(tmp_path):
    tokens = np.array([0, 1, 50256, 65535, 42], dtype=np.uint16)
    path = tmp_path / "x.bin"
    write_shard(path, tokens)
    raw = path.read_bytes()
    header = np.frombuffer(raw[: HEADER_INTS * 4], dtype="<i4")
    assert (header[0], header[1], header[2]) == (MAGIC, VERSION, 5)
    assert not header[3:].any()
    assert len(raw) == HEADER_INTS * 4 + 2 * 5
    assert np.frombuffer(raw[HEADER_INTS * 4 :], dtype="<u2").tolist() == tokens.tolist()
    loaded = load_tokens(path)
    assert loaded.dtype == np.uint16 and loaded.tolist() == tokens.tolist()
    assert read_header(path) == validate_shard(path) == 5


def test_write_accepts_python_ints_and_empty(tmp_path):
    write_shard(tmp_path / "a.bin", [3, 2, 1])
    assert load_tokens(tmp_path / "a.bin").tolist() == [3, 2, 1]
    write_shard(tmp_path / "e.bin", np.array([], dtype=np.int64))
    assert validate_shard(tmp_path / "e.bin") == 0


@pytest.mark.parametrize("bad", [[-1, 5], [65536], [[1, 2]], [0.5, 1.0]])
def test_write_rejects_tokens_that_do_not_fit(tmp_path, bad):
    path = tmp_path / "bad.bin"
    with pytest.raises(ShardError) as error:
        write_shard(path, np.array(bad))
    assert_one_line_naming(error, path)
    assert not path.exists()


def test_write_is_atomic_when_the_final_rename_fails(tmp_path, monkeypatch):
    path = tmp_path / "keep.bin"
    write_shard(path, [7, 8, 9])
    before = path.read_bytes()

    def failing_replace(src, dst):
        raise OSError("disk trouble")

    monkeypatch.setattr(shard_format.os, "replace", failing_replace)
    with pytest.raises(OSError):
        write_shard(path, list(range(1000)))
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.bin"]


def test_short_file_is_a_malformed_header(tmp_path):
    path = tmp_path / "short.bin"
    path.write_bytes(b"\x00" * 100)
    with pytest.raises(ShardError, match="malformed header") as error:
        read_header(path)
    assert_one_line_naming(error, path)


def test_wrong_magic(tmp_path):
    path = raw_shard(tmp_path / "m.bin", [12345, VERSION, 2], [1, 2])
    with pytest.raises(ShardError, match="magic") as error:
        validate_shard(path)
    assert_one_line_naming(error, path)


def test_wrong_version(tmp_path):
    path = raw_shard(tmp_path / "v.bin", [MAGIC, 7, 2], [1, 2])
    with pytest.raises(ShardError, match="version 7") as error:
        load_tokens(path)
    assert_one_line_naming(error, path)


def test_negative_count(tmp_path):
    path = raw_shard(tmp_path / "n.bin", [MAGIC, VERSION, -3], [])
    with pytest.raises(ShardError, match="negative") as error:
        read_header(path)
    assert_one_line_naming(error, path)


def test_truncated_payload(tmp_path):
    path = raw_shard(tmp_path / "t.bin", [MAGIC, VERSION, 10], list(range(9)))
    assert read_header(path) == 10  # the header alone is fine
    with pytest.raises(ShardError, match="truncated payload") as error:
        validate_shard(path)
    assert_one_line_naming(error, path)
    with pytest.raises(ShardError, match="truncated"):
        load_tokens(path)


def test_odd_trailing_byte_and_extra_tokens(tmp_path):
    odd = raw_shard(tmp_path / "odd.bin", [MAGIC, VERSION, 3], [1, 2, 3], extra=b"\x01")
    with pytest.raises(ShardError, match="1 extra bytes") as error:
        validate_shard(odd)
    assert_one_line_naming(error, odd)
    more = raw_shard(tmp_path / "more.bin", [MAGIC, VERSION, 2], [1, 2, 3])
    with pytest.raises(ShardError, match="2 extra bytes"):
        load_tokens(more)


def test_missing_file_and_directory(tmp_path):
    with pytest.raises(ShardError, match="no such file") as error:
        validate_shard(tmp_path / "none.bin")
    assert_one_line_naming(error, tmp_path / "none.bin")
    with pytest.raises(ShardError, match="directory"):
        read_header(tmp_path)


def test_find_shards_sorts_by_name_and_skips_folders(tmp_path):
    for index in (10, 2, 1):
        write_shard(tmp_path / shard_name("x", index), [index])
    (tmp_path / "x_train_000099.bin").mkdir()
    found = find_shards(str(tmp_path / "x_train_*.bin"))
    assert [p.name for p in found] == ["x_train_000001.bin", "x_train_000002.bin", "x_train_000010.bin"]


def test_find_shards_empty_glob_names_the_pattern(tmp_path):
    pattern = str(tmp_path / "nothing_*.bin")
    with pytest.raises(ShardError, match="no shard files match") as error:
        find_shards(pattern)
    assert_one_line_naming(error, pattern)


def test_shard_name_follows_upstream():
    assert shard_name("fineweb", 0) == "fineweb_val_000000.bin"
    assert shard_name("fineweb", 12) == "fineweb_train_000012.bin"


def test_cli_prints_counts_and_stops_at_first_bad_file(tmp_path, capsys):
    good = tmp_path / "a.bin"
    write_shard(good, [1, 2, 3])
    bad = raw_shard(tmp_path / "b.bin", [MAGIC, VERSION, 5], [1])
    later = tmp_path / "c.bin"
    write_shard(later, [1])
    assert shards.main([str(good), str(bad), str(later)]) == 2
    out, err = capsys.readouterr()
    assert out.splitlines() == [f"{good}: 3 tokens"]
    assert len(err.splitlines()) == 1 and str(bad) in err and "truncated" in err


def test_cli_expands_patterns_and_reports_empty_ones(tmp_path, capsys):
    write_shard(tmp_path / "d_train_000002.bin", [5, 5])
    write_shard(tmp_path / "d_train_000001.bin", [5])
    assert shards.main([str(tmp_path / "d_train_*.bin")]) == 0
    assert capsys.readouterr().out.splitlines() == [
        f"{tmp_path / 'd_train_000001.bin'}: 1 tokens",
        f"{tmp_path / 'd_train_000002.bin'}: 2 tokens",
    ]
    assert shards.main([str(tmp_path / "zz_*.bin")]) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and "zz_*.bin" in err


@pytest.mark.slow
def test_module_entry_point_exit_status(tmp_path):
    """Guards: `python -m data.shards` as a process exits 2 with one stderr line naming a bad shard, no traceback."""
    bad = tmp_path / "bad.bin"
    bad.write_bytes(b"nope")
    result = subprocess.run([sys.executable, "-m", "data.shards", str(bad)], cwd=REPO, capture_output=True,
                            text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and str(bad) in result.stderr and "Traceback" not in result.stderr


@pytest.mark.parametrize("tokens, named", [([], "no tokens"), ([5, 50256, 50257, 7], "50257"),
                                           ([65535], "65535")])
def test_cli_refuses_what_training_refuses(tmp_path, capsys, tokens, named):
    # an empty shard and ids outside GPT-2's vocabulary: training stops on them, so the check does too
    bad = tmp_path / "d_train_000001.bin"
    write_shard(bad, tokens)
    assert shards.main([str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.splitlines()) == 1 and str(bad) in err and named in err
