"""End-to-end runs of train_gpt_medium.py: torchrun with gloo, kill and resume, bad input."""
import json
import os
import re
import subprocess
import sys

import pytest
import torch

import train_gpt_medium as T
from conftest import (MEDIUM_SCRIPT, ROOT, embedded_sources, killed_run, launch_script, one_error_line,
                      write_token_shard)

VAL_LINE = re.compile(r"^step:(\d+)/(\d+) val_loss:(\d+\.\d{6}) train_time:(\d+)ms step_avg:(\d+\.\d{2})ms$")
TRAIN_LINE = re.compile(r"^step:(\d+)/(\d+) train_time:(\d+)ms step_avg:(\d+\.\d{2})ms$")
SCALARS_LINE = re.compile(r"^step:(\d+)/(\d+) scalars: (\{.*\})$")


def parse_log(path):
    """Splits a log per docs/log-format.md: code, '=' line, environment lines, '=' line, step lines."""
    lines = path.read_text().split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    separators = [i for i, l in enumerate(lines) if l == "=" * 100]
    assert len(separators) >= 2
    code = "\n".join(lines[:separators[0]])
    env = lines[separators[0] + 1:separators[1]]
    body = lines[separators[1] + 1:]
    return code, env, body


def val_lines(path):
    return [l for l in path.read_text().splitlines() if VAL_LINE.match(l) or SCALARS_LINE.match(l)]


@pytest.mark.slow
def test_killed_run_resumes_to_the_uninterrupted_trajectory(tmp_path):
    """Guards: a SIGKILLed medium run resumed from its checkpoint logs the val losses and scalars of an unbroken run."""
    common = ["--preset", "tiny", "--num-iterations", "8", "--val-every", "3", "--checkpoint-every", "3"]
    full = launch_script(common + ["--log-dir", str(tmp_path / "full"), "--run-name", "r"])
    assert full.returncode == 0, full.stderr[-2000:]

    killed_dir = tmp_path / "killed"
    log = killed_run(MEDIUM_SCRIPT, common, killed_dir, "step:4/8 train_time")
    assert not log.read_text().splitlines()[-1].startswith("peak memory")
    ckpt = torch.load(killed_dir / "r.pt", weights_only=False)
    assert ckpt["step"] in (3, 6)

    resumed = launch_script(common + ["--log-dir", str(killed_dir), "--run-name", "resumed",
                                     "--resume", str(killed_dir / "r.pt")])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got = [re.sub(r" train_time.*", "", l) for l in val_lines(killed_dir / "resumed.txt")]
    want = [re.sub(r" train_time.*", "", l) for l in val_lines(tmp_path / "full" / "r.txt")]
    assert got == want
    assert (killed_dir / "resumed.txt").read_text().splitlines()[-1].startswith("peak memory allocated:")


@pytest.mark.parametrize("argv, needle", [
    (["--stop-after", "0"], "--stop-after"),
    (["--num-iterations", "-5"], "--num-iterations"),
    (["--train-seq-len", "100"], "--train-seq-len"),
    (["--val-tokens", "1000"], "--val-tokens"),
    (["--num-layers", "1"], "--num-layers"),
    (["--resume", "/nonexistent/ckpt.pt"], "--resume"),
    (["--train-files", "/nonexistent/*.bin"], "--train-files"),
    (["--run-name", "a/b"], "--run-name"),
    (["--profile-steps", "-1"], "--profile-steps"),
])
def test_bad_input_is_one_line_and_exit_2_with_no_log(tmp_path, capsys, argv, needle):
    rc = T.main(["--preset", "tiny", "--log-dir", str(tmp_path), "--run-name", "x", *argv]
                if "--run-name" not in argv else ["--preset", "tiny", "--log-dir", str(tmp_path), *argv])
    assert rc == 2
    assert needle in one_error_line(capsys)
    assert not list(tmp_path.iterdir())


def test_malformed_shard_is_named(tmp_path, capsys):
    bad = tmp_path / "bad_train_000001.bin"
    write_token_shard(bad, [50256] * 100)
    bad.write_bytes(bad.read_bytes()[:-6])
    rc = T.main(["--preset", "tiny", "--train-files", str(bad), "--log-dir", str(tmp_path / "logs")])
    assert rc == 2
    assert str(bad) in one_error_line(capsys)
    assert not (tmp_path / "logs").exists()


@pytest.mark.slow
def test_world_size_not_dividing_8_is_refused():
    """Guards: train_gpt_medium.py as a process with WORLD_SIZE=3 exits 2 with one stderr line naming the world size."""
    env = dict(os.environ, WORLD_SIZE="3", RANK="0", LOCAL_RANK="0")
    res = subprocess.run([sys.executable, str(MEDIUM_SCRIPT), "--preset", "tiny"], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 2
    assert res.stderr.strip().splitlines() == [
        "error: world size 3 does not divide 8: use 1, 2, 4 or 8 processes"]


def test_init_from_a_checkpoint_of_another_shape_is_refused(tmp_path, capsys):
    args = T.resolve_args(["--preset", "tiny", "--num-layers", "4"])
    model = T.GPT(T.model_config(args), 128)
    torch.save({"model": model.state_dict()}, tmp_path / "other.pt")
    rc = T.main(["--preset", "tiny", "--init-from", str(tmp_path / "other.pt"), "--log-dir", str(tmp_path / "l")])
    assert rc == 2
    line = one_error_line(capsys)
    assert "other.pt" in line and "does not match" in line


@pytest.mark.parametrize("argv", [["--bogus"], ["--backout-mode", "nope"], ["--seed", "x"]])
def test_argparse_errors_are_one_line(capsys, argv):
    with pytest.raises(SystemExit) as exit_info:
        T.resolve_args(argv)
    assert exit_info.value.code == 2
    one_error_line(capsys)


@pytest.mark.slow
def test_world_sizes_1_and_2_follow_the_same_trajectory_and_the_gloo_run_writes_a_complete_log(tmp_path):
    """Guards: 1- and 2-process runs with mixed-size Muon groups and bf16 Snoo follow the same val losses (1e-3),
    and the 2-process gloo torchrun writes one complete log (code, config, steps, scalars, peak)."""
    # relu-linear (D x D) and LAuReL's low-rank matrices put Muon parameters of different sizes in one
    # owner group, which the 2-rank run must share by broadcast; bf16 makes Snoo gather the owners' mantissas.
    # The losses may differ only by summation order. One launch per world size holds both checks (merged from a
    # separate 12-step gloo log test: its 2-rank launch trained the same tiny model again).
    flags = ["--preset", "tiny", "--low-precision", "bf16", "--num-iterations", "12", "--val-every", "6",
             "--backout-layers", "3", "--backout-transform", "relu-linear", "--laurel", "lr", "--laurel-rank", "4",
             "--seed", "3", "--variant", "demo-arm", "--log-dir", str(tmp_path)]
    losses = {}
    for nproc in (1, 2):
        res = launch_script(flags + ["--run-name", f"ws{nproc}"], nproc=nproc)
        assert res.returncode == 0, res.stderr[-2000:]
        losses[nproc] = [float(m.group(3)) for m in map(VAL_LINE.match, (tmp_path / f"ws{nproc}.txt")
                                                         .read_text().splitlines()) if m]
    assert len(losses[1]) == len(losses[2]) == 3
    assert losses[1][0] == losses[2][0]
    assert losses[1] == pytest.approx(losses[2], abs=1e-3)
    assert losses[1][-1] < losses[1][0]

    code, env, body = parse_log(tmp_path / "ws2.txt")
    assert code == embedded_sources(MEDIUM_SCRIPT)
    configs = [l for l in env if l.startswith("config: ")]
    assert len(configs) == 1
    config = json.loads(configs[0][len("config: "):])
    assert config["world_size"] == 2 and config["seed"] == 3 and config["variant"] == "demo-arm"
    assert config["track"] == "medium" and config["num_iterations"] == 12
    val = [VAL_LINE.match(l) for l in body if VAL_LINE.match(l)]
    assert [int(m.group(1)) for m in val] == [0, 6, 12]
    assert [int(m.group(1)) for m in (TRAIN_LINE.match(l) for l in body) if m] == list(range(1, 13))
    scalars = [SCALARS_LINE.match(l) for l in body if SCALARS_LINE.match(l)]
    assert len(scalars) == 3 and "block0.a" in json.loads(scalars[-1].group(3))
    assert losses[2][-1] < losses[2][0] - 1.0
    assert re.match(r"^peak memory allocated: \d+ MiB reserved: \d+ MiB$", body[-1])
