"""data/tokenize_text.py under faults (issue 17): --overwrite never loses the old set, a killed or interrupted
tokeniser leaves the folder as it was, and the manifest written last tells a complete set from a partial one."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from data.shard_format import ShardError
from data.shards import check_manifest, manifest_path
from data import tokenize_text
from data.tokenize_text import InputError, tokenize_to_shards

REPO = Path(__file__).resolve().parents[2]


def quiet(message):
    pass


def make_set(folder: Path, prefix: str = "t", documents=("first old document", "second old document")) -> dict:
    tokenize_to_shards(list(documents) * 20, folder, prefix, shard_tokens=40, val_tokens=30, log=quiet)
    return folder_contents(folder)


def folder_contents(folder: Path) -> dict:
    """Every entry of the folder: files with their bytes, folders as None."""
    return {path.name: path.read_bytes() if path.is_file() else None for path in folder.iterdir()}


def big_input(path: Path, megabytes: int) -> Path:
    words = np.array("the quick brown fox jumps over lazy dogs while seven wizards quietly hex".split())
    rng = np.random.default_rng(0)
    with open(path, "w") as f:
        for _ in range(megabytes):
            f.write(" ".join(rng.choice(words, 190_000)) + "\n\n")
    return path


def start_tokenizer(inputs: Path, out_dir: Path, *extra) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1")
    return subprocess.Popen([sys.executable, "-m", "data.tokenize_text", str(inputs), "--out-dir", str(out_dir),
                             "--prefix", "t", "--split-blank-lines", "--shard-tokens", "20000", "--val-tokens",
                             "20000", "--workers", "2", *extra], cwd=REPO, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True,
                            # Ctrl-C's default action, even where this test process inherited SIGINT ignored.
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def wait_for_work_folder_with_shards(out_dir: Path, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(len(list(folder.glob("*.bin"))) >= 2 for folder in out_dir.glob(".t.partial-*")):
            return
        time.sleep(0.02)
    raise AssertionError("the tokeniser never got part-way")


def tokenizer_part_way(tmp_path: Path):
    """A tokeniser replacing (--overwrite) a complete set, with some new shards written; returns it, the folder
    and the folder's contents before it started."""
    inputs = big_input(tmp_path / "big.txt", 12)
    out_dir = tmp_path / "out"
    out_dir.mkdir()
    before = make_set(out_dir)
    tokenizer = start_tokenizer(inputs, out_dir, "--overwrite")
    wait_for_work_folder_with_shards(out_dir)
    return tokenizer, out_dir, before


def test_a_complete_set_has_a_manifest_listing_every_shard(tmp_path):
    make_set(tmp_path)
    shards = sorted(tmp_path.glob("t_*.bin"))
    check_manifest(shards)
    listed = {entry["name"] for entry in __import__("json").loads(manifest_path(tmp_path, "t").read_text())["shards"]}
    assert listed == {path.name for path in shards} and len(listed) > 2


def test_failed_overwrite_keeps_the_old_set(tmp_path):
    before = make_set(tmp_path)

    def documents():
        yield from ["new document"] * 50
        raise InputError("late.jsonl:9: not valid JSON")

    with pytest.raises(InputError, match="late.jsonl:9"):
        tokenize_to_shards(documents(), tmp_path, "t", shard_tokens=40, val_tokens=30, overwrite=True, log=quiet)
    assert folder_contents(tmp_path) == before


def test_successful_overwrite_replaces_the_whole_set(tmp_path):
    make_set(tmp_path)
    written = tokenize_to_shards(["brand new text"], tmp_path, "t", val_tokens=0, overwrite=True, log=quiet)
    assert sorted(path.name for path in tmp_path.iterdir()) == ["t_manifest.json", "t_train_000001.bin"]
    check_manifest(written)


@pytest.mark.slow
def test_sigkill_mid_way_leaves_the_folder_as_it_was_and_a_rerun_works(tmp_path):
    """Guards: a SIGKILL of the tokeniser process group mid --overwrite leaves the old set whole; a rerun works."""
    tokenizer, out_dir, before = tokenizer_part_way(tmp_path)
    os.killpg(tokenizer.pid, signal.SIGKILL)
    tokenizer.wait(timeout=30)
    visible = {name: data for name, data in folder_contents(out_dir).items() if not name.startswith(".")}
    assert visible == before  # the old set is whole; the partial new one is only in the work folder

    small = tmp_path / "small.txt"
    small.write_text("a short replacement text\n")
    rerun = start_tokenizer(small, out_dir, "--overwrite", "--val-tokens", "0")
    _, err = rerun.communicate(timeout=120)
    assert rerun.returncode == 0, err
    assert sorted(path.name for path in out_dir.iterdir()) == ["t_manifest.json", "t_train_000001.bin"]


@pytest.mark.slow
def test_ctrl_c_is_one_line_and_changes_nothing(tmp_path):
    """Guards: a real SIGINT to the tokeniser and its workers mid --overwrite: exit 130, one line, folder unchanged."""
    tokenizer, out_dir, before = tokenizer_part_way(tmp_path)
    os.killpg(tokenizer.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group, workers included
    _, err = tokenizer.communicate(timeout=60)
    assert tokenizer.returncode == 130
    assert err.strip().splitlines() == [f"error: interrupted; {out_dir} is as it was before this run"], err
    assert folder_contents(out_dir) == before


@pytest.mark.slow
def test_workers_never_take_ctrl_c_even_while_they_start(capfd):
    """Guards: a SIGINT reaching the pool's workers as they are spawned (still importing, as a slow worker was under
    load when the Ctrl-C test sent it) kills none and prints nothing. An initializer that ignored SIGINT left that
    window open: CI saw a worker's KeyboardInterrupt traceback before the one error line."""
    with tokenize_text._spawned_pool(2) as pool:
        workers = list(pool._pool)  # the pool's own processes, not whatever else this test process started
        for worker in workers:
            os.kill(worker.pid, signal.SIGINT)
        assert pool.map(len, ["ab", "abc", "abcd"]) == [2, 3, 4]
        assert [worker.exitcode for worker in workers] == [None, None]
    assert "KeyboardInterrupt" not in capfd.readouterr().err


def test_shards_without_their_manifest_are_named_as_possibly_unfinished(tmp_path):
    make_set(tmp_path)
    manifest_path(tmp_path, "t").unlink()  # as a tokeniser killed before this change would leave them
    with pytest.raises(InputError, match="without t_manifest.json, so possibly an unfinished set.*--overwrite"):
        tokenize_to_shards(["more"], tmp_path, "t", val_tokens=0, log=quiet)


@pytest.mark.slow
def test_readers_refuse_a_set_that_lost_a_shard(tmp_path):
    """Guards: a set missing a shard its manifest lists is refused by check_manifest and `python -m data.shards`."""
    make_set(tmp_path)
    shards = sorted(tmp_path.glob("t_train_*.bin"))
    shards[-1].unlink()
    with pytest.raises(ShardError, match=f"{shards[-1].name} is missing"):
        check_manifest(shards[:-1])
    env = dict(os.environ, PYTHONPATH=str(REPO))
    result = subprocess.run([sys.executable, "-m", "data.shards", str(tmp_path / "t_train_*.bin")], cwd=REPO,
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1
    assert "is missing (t_manifest.json lists it)" in result.stderr
