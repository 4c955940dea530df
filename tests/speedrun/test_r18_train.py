"""train_gpt_medium.py --base r18 end to end on CPU (tiny preset, demo shards): world size 1 and 2 (gloo),
validation, the run log's step lines, checkpoint and resume."""

import re

import pytest

import train_gpt_medium as T
from conftest import launch_script
from speedrun.errors import UsageError

VAL = re.compile(r"^step:(\d+)/(\d+) val_loss:(\d+\.\d{6}) ")
TRAIN = re.compile(r"^step:(\d+)/(\d+) train_time:\d+ms step_avg:[\d.]+ms$")


def run(tmp_path, name, *extra, nproc=1):
    res = launch_script(["--base", "r18", "--preset", "tiny", "--num-iterations", "4", "--val-every", "2",
                        "--log-dir", str(tmp_path), "--run-name", name, *extra], nproc=nproc)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = (tmp_path / f"{name}.txt").read_text().splitlines()
    return lines, {int(m.group(1)): float(m.group(3)) for m in map(VAL.match, lines) if m}


@pytest.mark.slow
def test_r18_trains_validates_checkpoints_and_resumes_on_one_and_two_ranks(tmp_path):
    full, full_val = run(tmp_path, "full")
    assert '"base": "r18"' in next(l for l in full if l.startswith("config: "))
    assert any(l.startswith("r18 attention: sdpa") for l in full)
    assert [int(m.group(1)) for m in map(TRAIN.match, full) if m] == [1, 2, 3, 4]
    assert sorted(full_val) == [0, 2, 4] and full_val[4] < full_val[0]
    assert full[-1].startswith("peak memory allocated: ")
    assert "==> speedrun/r18/model.py <==" in full and "==> speedrun/r18/optim.py <==" in full  # the code that ran

    first, first_val = run(tmp_path, "half", "--stop-after", "2", "--checkpoint-every", "2")
    assert first_val == {0: full_val[0], 2: full_val[2]}
    resumed, resumed_val = run(tmp_path, "resumed", "--resume", str(tmp_path / "half.pt"), "--checkpoint-every", "2")
    assert resumed_val == full_val  # the saved lines, then steps 2-3 exactly as the uninterrupted run

    _, two_val = run(tmp_path, "two", nproc=2)
    # same tokens per step; the averages are summed in another order (gloo), so equal to rounding only
    assert two_val[0] == full_val[0] and two_val[2] == pytest.approx(full_val[2], abs=1e-3)
    assert two_val[4] == pytest.approx(full_val[4], abs=1e-3)
    # Adam's moments are sharded over the two ranks and saved whole: a resume at 2 ranks goes on exactly
    run(tmp_path, "two_half", "--stop-after", "2", "--checkpoint-every", "2", nproc=2)
    _, two_resumed_val = run(tmp_path, "two_resumed", "--resume", str(tmp_path / "two_half.pt"), nproc=2)
    assert two_resumed_val == two_val


@pytest.mark.slow
def test_odd_checkpoint_interval_refused(tmp_path):
    res = launch_script(["--base", "r18", "--preset", "tiny", "--num-iterations", "4", "--checkpoint-every", "3",
                        "--log-dir", str(tmp_path)])
    assert res.returncode == 2 and "must be even" in res.stderr and "Traceback" not in res.stderr


def test_attention_flag_is_declared_once_and_refuses_what_cannot_run_here(monkeypatch):
    from speedrun.r18.attention import ATTENTION_CHOICES
    flag = next(f for f in T.TRACK_FLAGS if f.name == "--attention")
    assert tuple(flag.options["choices"]) == ATTENTION_CHOICES and not flag.resume
    monkeypatch.setattr(T.torch.cuda, "is_available", lambda: False)
    assert T.resolve_args(["--preset", "tiny", "--base", "r18", "--attention", "flex"]).attention == "flex"
    with pytest.raises(UsageError, match="--attention fa3: fa3 needs a CUDA GPU"):
        T.resolve_args(["--preset", "tiny", "--base", "r18", "--attention", "fa3"])
    with pytest.raises(UsageError, match="--attention sdpa: chooses --base r18's attention"):
        T.resolve_args(["--preset", "tiny", "--attention", "sdpa"])
