"""DLO on --base r18 (speedrun/r18/studies.py states the rule; docs/dlo.md "On --base r18"): a checkpoint of the
tiny r18 model expands into DLO's layer pattern of the record's, strict identity keeps the checkpoint's loss, the
routers train in the stated group, a run resumes, and bad checkpoints are one line. CPU, tiny preset."""

import json

import pytest
import torch

import train_gpt_medium as T
from conftest import launch_script
from speedrun.checkpoint import load_checkpoint, load_model_weights, save_checkpoint
from speedrun.data import find_shards
from speedrun.r18.data import BosAlignedStream
from speedrun.r18.model import R18GPT, scalar_layout
from speedrun.r18.optim import R18Optimizers
from speedrun.r18.train import R18OptimizerState, r18_config, r18_schedule
from speedrun.runlog import LogWriter

SEQ = 64
pytestmark = pytest.mark.usefixtures("one_thread")  # tiny models: thread overhead dominates


def run_config(*flags):
    return T.resolve_args(["--preset", "tiny", "--base", "r18", *flags])


def loss_of(model, seed=0, training=True):
    """The summed training loss, or in eval mode the mean validation loss, of one packed sequence."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, model.cfg.vocab_size, (SEQ + 1,), generator=g)
    cu = torch.tensor([0, 20, 45, SEQ], dtype=torch.int32)
    model.train(training)
    return model(tokens[:-1], tokens[1:], cu, torch.tensor([1.0]), 1, 3, SEQ)


def write_r18_checkpoint(path, shard_dir):
    """The tiny r18 model at its real init after two optimiser steps (NorMuon twice, the Adams once: every
    projection non-zero), saved as the script saves it."""
    args = run_config("--train-files", str(shard_dir / "syn_train_*.bin"))
    torch.manual_seed(args.seed)
    model = R18GPT(r18_config(args), studies=args)
    opts = R18Optimizers(model, r18_schedule(args))
    for step in range(2):
        loss_of(model, step).backward()
        opts.step(step)
    stream = BosAlignedStream(find_shards(args.train_files, "--train-files"), "--train-files")
    save_checkpoint(path, model, R18OptimizerState(opts), stream, 2, 0.0, args,
                    LogWriter(path.with_suffix(".txt"), False), T.Dist())
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, shard_dir):
    return write_r18_checkpoint(tmp_path_factory.mktemp("r18dlo") / "base.pt", shard_dir)


def checkpoint_model(path):
    args = run_config()
    model = R18GPT(r18_config(args), studies=args)
    load_model_weights(model, load_checkpoint(path), path)
    return model


def expanded_model(path, *flags):
    """The model of --init-from path and the DLO flags, expanded as the script does (the routers' init_from)."""
    args = run_config("--init-from", str(path), *flags)
    torch.manual_seed(1)
    model = R18GPT(r18_config(args), studies=args)
    assert model.study["dlo"].load_init_state(model, load_checkpoint(path), args)
    return model


@pytest.mark.parametrize("groups,add", [("2", "1"), ("4", "1"), ("1", "3")])
def test_strict_identity_expansion_keeps_the_checkpoint_loss(checkpoint, groups, add):
    base = checkpoint_model(checkpoint)
    model = expanded_model(checkpoint, "--dlo-groups", groups, "--dlo-add", add, "--dlo-init", "strict-identity",
                           "--dlo-skip-loss-weight", "0")
    assert len(model.blocks) == 16 + int(groups) * int(add)
    assert torch.equal(loss_of(model, training=False), loss_of(base, training=False))  # every token routed
    assert torch.equal(loss_of(model), loss_of(base))  # gates exactly 1 at zero router weights
    copied = expanded_model(checkpoint, "--dlo-groups", groups, "--dlo-add", add, "--dlo-init", "copy")
    assert not torch.equal(loss_of(copied, training=False), loss_of(base, training=False))


def test_expanded_layers_follow_the_rule(checkpoint):
    base = checkpoint_model(checkpoint)
    model = expanded_model(checkpoint, "--dlo-groups", "2", "--dlo-init", "strict-identity")
    pat = model.pattern
    # Groups 0-7 and 8-15, one new layer after each: 8 (from 7) and 17 (from 15).
    assert pat["dlo_position"] == list(range(8)) + list(range(9, 17)) and pat["dlo_new_layers"] == {8: 7, 17: 15}
    assert pat["ve_index"] == [0, 1, 2, 3, 4] + [None] * 7 + [0, 1, 2, 3, 4, 4]
    assert [b.attn.value_embed_gate is not None for b in model.blocks] == [k is not None for k in pat["ve_index"]]
    assert pat["long_window_layers"] == [0, 4, 12, 16, 17]  # windows and key offsets: 0, 4, 11, 15 moved, 17 new
    assert model.window_tokens(1, 3) == [48 if i in (0, 4, 12, 16, 17) else 16 for i in range(18)]
    assert pat["unet_pairs"] == [(6, 10), (4, 11), (2, 12)] and pat["backout_layer"] == 12
    # Per-layer scalars: the checkpoint's layers keep theirs; a new one passes the residual (decay 1, no
    # re-injection) with its source's sa_lambdas; the shared smear, backout and skip weights are the checkpoint's.
    L, layout, base_layout = 18, scalar_layout(18), scalar_layout(16)
    resid, base_resid = model.scalars[layout["resid"]], base.scalars[base_layout["resid"]]
    sa, base_sa = model.scalars[layout["sa"]].view(L, 2), base.scalars[base_layout["sa"]].view(16, 2)
    x0, base_x0 = model.x0_lambdas.view(L, 2), base.x0_lambdas.view(16, 2)
    for i, p in enumerate(pat["dlo_position"]):
        assert resid[p] == base_resid[i] and torch.equal(sa[p], base_sa[i]) and torch.equal(x0[p], base_x0[i])
        assert all(torch.equal(a, b) for a, b in zip(model.blocks[p].parameters(), base.blocks[i].parameters()))
    for q, src in pat["dlo_new_layers"].items():
        assert resid[q] == 1 and not x0[q].any() and torch.equal(sa[q], base_sa[src])
        assert not model.blocks[q].mlp.c_proj.any() and not model.blocks[q].attn.qkvo_w[3 * 64:].any()
        assert model.blocks[q].mlp.c_fc.equal(base.blocks[src].mlp.c_fc)
    assert torch.equal(model.scalars[3 * L:3 * L + 5], base.scalars[3 * 16:3 * 16 + 5])
    assert model.lm_head.weight.equal(base.lm_head.weight) and model.embed2.weight.equal(base.embed2.weight)


def test_routers_train_in_the_scalar_group_and_new_layers_in_their_record_groups(checkpoint):
    model = expanded_model(checkpoint, "--dlo-groups", "2", "--dlo-init", "identity")
    routers = model.study["dlo"]
    opts = R18Optimizers(model, r18_schedule(run_config()))
    scalar_group = [p for g in opts.scalar_adam.param_groups for p in g["params"]]
    assert any(p is routers.router_w for p in scalar_group)
    assert (routers.router_w.lr_mul, routers.router_w.wd_mul) == (5.0, 0.0)
    muon = {id(p) for g in opts.muon.param_groups for p in g["params"]}
    assert all(id(p) in muon for q in (8, 17) for p in model.blocks[q].parameters())
    # The routers, the two new blocks, their x0 lambdas, and the scalar vector's growth (3 per layer, padded to 8).
    new_blocks = sum(p.numel() for q in (8, 17) for p in model.blocks[q].parameters())
    assert model.added_params() == {"dlo": routers.router_w.numel() + new_blocks + 2 * 2 + (64 - 56)}
    routers.skip_rate.fill_(0.3)  # labels with skipped tokens: the skip loss pulls the routers
    loss_of(model).backward()
    assert routers.router_w.grad is not None and routers.router_w.grad.abs().sum() > 0
    before = routers.router_w.detach().clone()
    opts.step(1)  # an odd step: the Adams step
    assert not torch.equal(before, routers.router_w)


def test_layer_lr_scales_each_layers_normuon_step(checkpoint):
    """--dlo-layer-lr as on #14: layer l's matrices step as with NorMuon's lr x a_l / mean(a), a_l its label active
    share (decay included); a layer without active labels stays; the gates keep their rate."""
    flags = ("--init-from", str(checkpoint), "--dlo-groups", "2", "--dlo-layer-lr")
    args = run_config(*flags)
    active = torch.ones(18)
    active[3] = 0.0
    steps = []
    for layer_lr in (True, False):
        model = expanded_model(checkpoint, *flags[2:])
        opts = R18Optimizers(model, r18_schedule(args))
        before = [p.detach().clone() for p in model.parameters()]
        loss_of(model).backward()
        routers = model.study["dlo"]
        routers.label_active_sum.copy_(active)
        routers.label_count.fill_(1)
        if layer_lr:
            routers.after_step(model, opts, args, T.Dist())
            assert {id(p) for p in opts.muon.lr_mul} == {id(p) for b in model.blocks for p in (
                b.attn.qkvo_w, b.mlp.c_fc, b.mlp.c_proj)}  # the gates keep their rate
        else:  # the reference: every parameter at the rate of the layers whose labels are all active
            for group in opts.muon.param_groups:
                group["initial_lr"] *= 18 / 17
        opts.step(0)  # NorMuon only
        steps.append({name: p.detach() - b for (name, p), b in zip(model.named_parameters(), before)})
    scaled, faster = steps
    assert not scaled["blocks.3.mlp.c_fc"].any() and not scaled["blocks.3.attn.qkvo_w"].any()
    assert faster["blocks.3.mlp.c_fc"].any()
    for name in ("blocks.5.mlp.c_fc", "blocks.17.mlp.c_proj", "blocks.0.attn.qkvo_w"):
        assert torch.allclose(scaled[name], faster[name], rtol=1e-5, atol=1e-7), name



def test_bad_checkpoint_is_one_line(checkpoint, tiny_data_args, tmp_path, capsys):
    state = load_checkpoint(checkpoint)
    state["model"]["x0_lambdas"] = torch.zeros(4)
    bad = tmp_path / "bad.pt"
    torch.save(state, bad)
    flags = tiny_data_args + ["--base", "r18", "--dlo-groups", "2", "--log-dir", str(tmp_path)]
    assert T.main(flags + ["--init-from", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint model does not match" in err and "x0_lambdas" in err
    assert not list(tmp_path.glob("*.txt"))  # no log was started


def test_continued_schedule_is_refused_on_r18_in_one_line(checkpoint, tiny_data_args, tmp_path, capsys):
    """r18 restarts its schedules from --init-from; a flag asking otherwise must not be silently ignored."""
    flags = tiny_data_args + ["--base", "r18", "--init-from", str(checkpoint), "--log-dir", str(tmp_path)]
    assert T.main(flags + ["--init-schedule", "continue"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--init-schedule continue" in err
    assert not list(tmp_path.glob("*.txt"))


def scalars_lines(lines):
    return {int(l.split("/")[0].removeprefix("step:")): json.loads(l.split("scalars: ", 1)[1]) for l in lines
            if l.startswith("step:") and " scalars: " in l}


@pytest.mark.slow
def test_dlo_run_logs_its_fields_and_resumes(checkpoint, tiny_data_args, tmp_path):
    """Guards: a real r18 DLO run from a checkpoint (a process) resumes from its own checkpoint, logs DLO's fields."""
    flags = tiny_data_args + ["--base", "r18", "--num-iterations", "4", "--train-seq-len", "32", "--val-seq-len",
                              "64", "--val-tokens", "512", "--val-every", "2", "--log-dir", str(tmp_path),
                              "--dlo-groups", "2", "--dlo-sparsity", "0.3", "--dlo-anneal-steps", "2", "--dlo-layer-lr"]
    first = launch_script(flags + ["--init-from", str(checkpoint), "--run-name", "first", "--stop-after", "2",
                                   "--checkpoint-every", "2"])
    assert first.returncode == 0, first.stderr[-2000:]
    resumed = launch_script(flags + ["--resume", str(tmp_path / "first.pt"), "--run-name", "resumed"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    lines = (tmp_path / "resumed.txt").read_text().splitlines()
    scalars = scalars_lines(lines)
    assert sorted(scalars) == [0, 2, 4]
    assert [scalars[0][f"dlo.L{i}.active"] for i in range(18)] == [1.0] * 18  # the routers start fully active
    for s in scalars.values():
        assert all(0 <= s[f"dlo.L{i}.active"] <= 1 for i in range(18)) and 0 < s["dlo.flops_rel"] < 1.01
    assert scalars[4]["dlo.skip_rate"] == 0.3 and "dlo.L17.label_active" in scalars[4]
    assert any(l.startswith('added_params: {"dlo": ') for l in lines)
