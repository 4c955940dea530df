"""train_gpt_medium.py --base r18 end to end on CPU (tiny preset, demo shards): world size 1 and 2 (gloo),
validation, the run log's step lines, checkpoint and resume."""

import re

import pytest
import torch

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
    """Guards: real r18 runs on 1 and 2 gloo ranks train, validate, resume exactly, cross world sizes, label kernels."""
    full, full_val = run(tmp_path, "full")
    assert '"base": "r18"' in next(l for l in full if l.startswith("config: "))
    assert any(l.startswith("r18 attention: sdpa") for l in full)
    assert [int(m.group(1)) for m in map(TRAIN.match, full) if m] == [1, 2, 3, 4]
    assert sorted(full_val) == [0, 2, 4] and full_val[4] < full_val[0]
    assert full[-1].startswith("peak memory allocated: ")
    assert "==> speedrun/r18/model.py <==" in full and "==> speedrun/r18/optim.py <==" in full  # the code that ran

    first, first_val = run(tmp_path, "half", "--stop-after", "2", "--checkpoint-every", "2")
    assert first_val == {0: full_val[0], 2: full_val[2]}
    checkpoint = torch.load(tmp_path / "half.pt", weights_only=False)
    assert checkpoint["attention"] == "sdpa"
    checkpoint["attention"] = "flex"  # as if its steps ran on a GPU node under flex
    torch.save(checkpoint, tmp_path / "half_on_flex.pt")
    resumed, resumed_val = run(tmp_path, "resumed", "--resume", str(tmp_path / "half_on_flex.pt"),
                               "--checkpoint-every", "2")
    assert resumed_val == full_val  # the saved lines, then steps 2-3 exactly as the uninterrupted run
    # a run timed on two kernels is labelled with both, in its log and its next checkpoint
    assert '"attention": "flex to step 2, then sdpa"' in next(l for l in resumed if l.startswith("config: "))
    assert any(l.startswith("r18 attention: flex to step 2, then sdpa") for l in resumed)
    assert torch.load(tmp_path / "resumed.pt", weights_only=False)["attention"] == "flex to step 2, then sdpa"

    _, two_val = run(tmp_path, "two", nproc=2)
    # same tokens per step; the averages are summed in another order (gloo), so equal to rounding only
    assert two_val[0] == full_val[0] and two_val[2] == pytest.approx(full_val[2], abs=1e-3)
    assert two_val[4] == pytest.approx(full_val[4], abs=1e-3)
    # Adam's moments are sharded over the two ranks and NorMuon's slices stacked per rank, both saved whole per
    # parameter: a resume at 2 ranks goes on exactly, and a checkpoint loads at the other world size
    run(tmp_path, "two_half", "--stop-after", "2", "--checkpoint-every", "2", nproc=2)
    _, two_resumed_val = run(tmp_path, "two_resumed", "--resume", str(tmp_path / "two_half.pt"), nproc=2)
    assert two_resumed_val == two_val
    _, one_from_two_val = run(tmp_path, "one_from_two", "--resume", str(tmp_path / "two_half.pt"))
    _, two_from_one_val = run(tmp_path, "two_from_one", "--resume", str(tmp_path / "half.pt"), nproc=2)
    assert one_from_two_val[4] == pytest.approx(two_val[4], abs=1e-3)
    assert two_from_one_val[4] == pytest.approx(full_val[4], abs=1e-3)


@pytest.mark.slow
def test_odd_checkpoint_interval_refused(tmp_path):
    """Guards: the script as a process refuses an odd --checkpoint-every on --base r18: exit 2, no traceback."""
    res = launch_script(["--base", "r18", "--preset", "tiny", "--num-iterations", "4", "--checkpoint-every", "3",
                        "--log-dir", str(tmp_path)])
    assert res.returncode == 2 and "must be even" in res.stderr and "Traceback" not in res.stderr


def test_attention_flag_is_declared_once_and_refuses_what_cannot_run_here(monkeypatch):
    from speedrun.r18.attention import ATTENTION_CHOICES
    flag = next(f for f in T.TRACK_FLAGS if f.name == "--attention")
    assert tuple(flag.options["choices"]) == ATTENTION_CHOICES and not flag.resume
    monkeypatch.setattr(T.torch.cuda, "is_available", lambda: False)
    with pytest.raises(UsageError, match="--attention flex: FlexAttention has no backward on CPU"):
        T.resolve_args(["--preset", "tiny", "--base", "r18", "--attention", "flex"])
    with pytest.raises(UsageError, match="--attention fa3: fa3 needs a CUDA GPU"):
        T.resolve_args(["--preset", "tiny", "--base", "r18", "--attention", "fa3"])
    with pytest.raises(UsageError, match="--attention sdpa: chooses --base r18's attention"):
        T.resolve_args(["--preset", "tiny", "--attention", "sdpa"])


@pytest.mark.usefixtures("one_thread")  # a tiny model: thread overhead dominates
def test_optimizer_state_saves_per_parameter_and_loads_the_stacked_slices_of_older_checkpoints():
    from test_r18_optim import SCHEDULE, give_gradients, tiny_model
    from speedrun.r18.optim import R18Optimizers
    from speedrun.r18.train import R18OptimizerState

    model = tiny_model()
    opts = R18Optimizers(model, SCHEDULE)
    give_gradients(model)
    opts.step(0)
    saved = R18OptimizerState(opts).state_dict()
    attn = next(g for g in opts.muon.param_groups if g["params"][0].label == "attn")["params"]
    first, second = (saved["muon_by_param"][R18OptimizerState(opts).muon_index[id(p)]] for p in attn[:2])
    # one parameter's rows each: its momentum, and the second moments of its four square q, k, v, o matrices
    assert first["momentum"].shape == (1, *attn[0].shape) and first["second_moment"].shape[0] == 4
    assert torch.equal(torch.cat([first["momentum"], second["momentum"]]), opts.muon.state[attn[0]]["momentum"][:2])

    def reloaded(muon_entry):
        fresh = R18Optimizers(tiny_model(), SCHEDULE)
        state = {k: v for k, v in saved.items() if k != "muon_by_param" or "muon" not in muon_entry}
        R18OptimizerState(fresh).load_state_dict(dict(state, **muon_entry))
        return fresh

    fresh = reloaded({})
    older = {"muon": {R18OptimizerState(opts).muon_index[id(g["params"][0])]: opts.muon.state[g["params"][0]]
                      for g in opts.muon.param_groups}}  # what a checkpoint held before: one stack per slice
    for loaded in (fresh, reloaded(older)):
        for g, h in zip(opts.muon.param_groups, loaded.muon.param_groups):
            want, got = opts.muon.state[g["params"][0]], loaded.muon.state[h["params"][0]]
            assert torch.equal(want["momentum"], got["momentum"])
            assert torch.equal(want["second_moment"], got["second_moment"])
    two_ranks = {"muon": {"0": {}, "8": {}}}  # attention gates in two slices of 8: a 2-rank checkpoint
    with pytest.raises(UsageError, match="at another world size; resume it with the number of processes"):
        reloaded(two_ranks)
