"""Backout flags of train_gpt_medium.py (docs/backout.md): math at init, gradients, shapes, logging, bad flags."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

import speedrun.backout
import train_gpt_medium as tgm
from speedrun.data import BOS_TOKEN
from conftest import launch_script

SEQ_LEN = 64


# The tiny model is dominated by thread overhead on a shared 2-core machine.
pytestmark = pytest.mark.usefixtures("one_thread")


def build(flags, seed=0, module=tgm):
    args = module.resolve_args(["--preset", "tiny", *flags])
    torch.manual_seed(seed)
    return module.GPT(module.model_config(args), max_seq_len=128)


def tokens(seed, n=SEQ_LEN + 1):
    gen = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 2000, (n,), generator=gen)
    seq[0] = seq[n // 2] = BOS_TOKEN
    return seq[:-1], seq[1:]


WINDOW = torch.tensor(2)


def wake_up(model, seed=1):
    """Fills the zero-initialised matrices (lm head, attention out, MLP proj) with small random values, so every
    layer and the head depend on their inputs (at init the blocks are identities and the loss is log(V))."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim >= 2 and not p.any():
                p.copy_(0.05 * torch.randn(p.shape, generator=gen))


def copy_shared_weights(src, dst):
    """Copies every tensor the two models share by name and shape (the baseline part of a variant)."""
    theirs = src.state_dict()
    with torch.no_grad():
        for name, t in dst.state_dict().items():
            if name in theirs and theirs[name].shape == t.shape:
                t.copy_(theirs[name])


def loss_of(model, seed=3):
    return model(*tokens(seed), WINDOW)


def scalar(model, name):
    return model.scalar_slice(name).detach().clone()


def train_steps(model, steps, module=tgm, seed=5, num_iterations=40):
    """Real optimiser steps (Muon, Adam, Snoo) on one sequence each, with the given script module's code."""
    opt = module.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    for step in range(steps):
        module.train_step(model, [tokens(seed + step)], WINDOW, module.Dist())
        opt.step(step, num_iterations)


# --- the record and the untouched baseline ------------------------------------------------------------------

def test_record_flags_resolve_to_pr139():
    args = tgm.resolve_args(["--backout-layers", "11", "--num-iterations", "5550"])
    cfg = tgm.model_config(args)
    assert (args.num_iterations, cfg.num_layers) == (5550, 16)
    assert (cfg.backout_layers, cfg.backout_mode, cfg.backout_transform) == ((11,), "sum", "none")
    assert (cfg.backout_x_init, cfg.backout_skip_init) == (1.0, 0.0)
    assert not (cfg.backout_fixed_x or cfg.backout_freeze or cfg.backout_norm_after_sum or cfg.rolling_skip)
    # Same layer pattern at tiny width: exactly the two scalars of the record are added.
    model = build(["--num-layers", "16", "--backout-layers", "11"])
    assert model.added_params()["backout"] == 2  # ("layers" also reports the 16 vs 6 tiny layers)
    assert model.named_scalars()["backout.x"] == 1.0 and model.named_scalars()["backout.L11"] == 0.0


@pytest.mark.slow
def test_record_at_init_and_flagless_training_match_the_original_baseline(unmodified_medium):
    """Guards: backout at init and two flagless training steps equal the pre-study script's (12c2aa8) loss bitwise."""
    original = unmodified_medium
    reference = build([], module=original)
    wake_up(reference)
    reference_loss = loss_of(reference)
    for flags in (["--backout-layers", "4"], ["--backout-layers", "1,embed,new-embed"]):
        model = build(flags)
        copy_shared_weights(reference, model)
        assert torch.equal(loss_of(model), reference_loss), flags  # every skip lambda starts at 0
    # Off must be bit-identical, also after real optimiser steps (Snoo fires on the first one).
    flagless = build([])
    copy_shared_weights(reference, flagless)
    train_steps(flagless, 2)
    train_steps(reference, 2, module=original)
    assert torch.equal(loss_of(flagless), loss_of(reference))


# --- gradients ----------------------------------------------------------------------------------------------

def test_gradient_reaches_both_lambdas():
    model = build(["--backout-layers", "4"])
    wake_up(model)
    loss_of(model).backward()
    a, b = model.scalar_layout["backout.x"]
    c, d = model.scalar_layout["backout.skip"]
    assert model.scalars.grad[a:b].abs().item() > 0
    assert model.scalars.grad[c:d].abs().item() > 0  # nonzero although skip_lambda is 0


def source_layer_grad(model, layer):
    model.zero_grad(set_to_none=True)
    loss_of(model).backward()
    return model.blocks[layer].mlp.proj_w.grad.clone()


@pytest.mark.slow
def test_detach_stops_only_the_skip_path_gradient():
    """Guards: --backout-transform detach keeps the loss, cuts only the skip path's gradient (hand-built reference)."""
    layer, lam = 2, -0.3
    plain = build(["--backout-layers", str(layer), "--backout-skip-init", str(lam)])
    wake_up(plain)
    detached = build(["--backout-layers", str(layer), "--backout-skip-init", str(lam),
                      "--backout-transform", "detach"])
    copy_shared_weights(plain, detached)
    assert torch.equal(loss_of(plain), loss_of(detached))  # detach changes no value
    g_plain, g_detached = source_layer_grad(plain, layer), source_layer_grad(detached, layer)
    assert not torch.allclose(g_plain, g_detached)  # the skip path does carry gradient when not detached
    # Reference: the head path alone, built by hand on a flagless copy with the source as a constant.
    head_only = build([])
    copy_shared_weights(plain, head_only)
    x, outputs, _ = head_only.hidden_states(tokens(3)[0], WINDOW)
    mixed = norm_mix(x, lam, outputs[layer].detach())
    logits = tgm.softcap(F.linear(mixed[0], head_only.lm_head_w).float())
    F.cross_entropy(logits, tokens(3)[1]).backward()
    expected = head_only.blocks[layer].mlp.proj_w.grad
    assert expected.abs().sum() > 0  # later layers still pass gradient to the source layer
    torch.testing.assert_close(g_detached, expected, rtol=1e-5, atol=1e-8)


def norm_mix(x, skip_lambda, source):
    return tgm.norm(x) + skip_lambda * tgm.norm(source)


# --- lambdas: frozen, fixed, norm after the sum ---------------------------------------------------------------

@pytest.mark.slow
def test_frozen_lambdas_do_not_move_and_fixed_x_keeps_only_x():
    """Guards: over real optimiser steps, frozen lambdas stay put, fixed-x keeps x at 1, learned lambdas both move."""
    frozen = build(["--backout-layers", "3", "--backout-x-init", "0.8", "--backout-skip-init", "-0.28",
                    "--backout-freeze"])
    fixed_x = build(["--backout-layers", "3", "--backout-fixed-x"])
    learned = build(["--backout-layers", "3"])
    assert frozen.added_params() == {"backout": 0} and fixed_x.added_params() == {"backout": 1}
    for model in (frozen, fixed_x, learned):
        train_steps(model, 2)
    x, (skip,) = frozen.study["backout"].lambdas(frozen)
    assert (x.item(), skip.item()) == (torch.tensor(0.8).item(), torch.tensor(-0.28).item())
    assert frozen.named_scalars()["backout.x"] == pytest.approx(0.8)
    x, (skip,) = fixed_x.study["backout"].lambdas(fixed_x)
    assert x.item() == 1.0 and skip.item() != 0.0
    x, (skip,) = learned.study["backout"].lambdas(learned)
    assert x.item() != 1.0 and skip.item() != 0.0


def head_rms(flags):
    model = build(flags)
    wake_up(model)
    x, outputs, x00 = model.hidden_states(tokens(3)[0], WINDOW)
    return model.head_input(x, outputs, x00).pow(2).mean(-1).sqrt()


def test_norm_after_sum_gives_unit_rms():
    lambdas = ["--backout-layers", "2,embed", "--backout-x-init", "0.3", "--backout-skip-init", "2.0"]
    torch.testing.assert_close(head_rms(lambdas + ["--backout-norm-after-sum"]), torch.ones(1, SEQ_LEN),
                               rtol=1e-4, atol=1e-4)
    assert (head_rms(lambdas) - 1).abs().max() > 0.1  # without it these lambdas leave the unit sphere


def test_subtract_mode_is_norm_of_x_minus_lambda_out():
    model = build(["--backout-layers", "3", "--backout-mode", "subtract"])
    wake_up(model)
    assert model.added_params() == {"backout": 1} and model.named_scalars()["backout.L3"] == 0.5
    x, outputs, x00 = model.hidden_states(tokens(3)[0], WINDOW)
    torch.testing.assert_close(model.head_input(x, outputs, x00), tgm.norm(x - 0.5 * outputs[3]))


# --- concatenation ------------------------------------------------------------------------------------------

def test_concat_head_shapes_params_and_zero_start():
    base = build([])
    wake_up(base)
    model = build(["--backout-layers", "embed,new-embed,2", "--backout-mode", "concat-head"])
    copy_shared_weights(base, model)
    with torch.no_grad():
        model.lm_head_w[:, :64] = base.lm_head_w
    D, rows = 64, base.lm_head_w.size(0)
    assert model.lm_head_w.shape == (rows, 4 * D) and not model.lm_head_w[:, D:].any()
    x, outputs, x00 = model.hidden_states(tokens(3)[0], WINDOW)
    head_in = model.head_input(x, outputs, x00, tokens(3)[0])
    assert head_in.shape == (1, SEQ_LEN, 4 * D)
    torch.testing.assert_close(head_in[..., :D], tgm.norm(x))
    torch.testing.assert_close(head_in[..., D:2 * D], x00)
    torch.testing.assert_close(loss_of(model), loss_of(base))  # zero extra columns: the baseline's loss
    assert model.added_params() == {"backout": 3 * rows * D + 50257 * D}
    opt = tgm.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    groups = {g["name"]: g["params"] for g in opt.adam.param_groups}
    assert any(p is model.study["backout"].new_embed.weight for p in groups["embed"])
    assert groups["head"][0] is model.lm_head_w


def test_concat_mlp_shapes_and_optimiser():
    model = build(["--backout-layers", "2,embed", "--backout-mode", "concat-mlp", "--backout-concat-dim", "8",
                   "--backout-mlp-ratio", "1.5"])
    D = 64
    mlp = model.blocks[-1].mlp
    down = model.study["backout"].down_w
    assert mlp.fc_w.shape == (96, D + 2 * 8) and mlp.proj_w.shape == (D, 96) and down.shape == (2, 8, D)
    assert model.blocks[0].mlp.fc_w.shape == (4 * D, D)
    assert model.added_params() == {"backout": 96 * (D + 16) + D * 96 - 2 * 4 * D * D + 2 * 8 * D}
    wake_up(model)
    loss_of(model).backward()
    assert down.grad.abs().sum() > 0 and mlp.fc_w.grad[:, D:].abs().sum() > 0
    muon = {id(p) for p, _ in model.matrix_params()}
    assert id(down) in muon and id(mlp.fc_w) in muon


@pytest.mark.parametrize("transform", ["relu-linear", "tanh-linear"])
def test_linear_transforms_are_muon_matrices_initialised_like_the_others(transform):
    model = build(["--backout-layers", "2", "--backout-transform", transform])
    w = model.study["backout"].transform_w
    bound = math.sqrt(3) * 0.5 / math.sqrt(64)
    assert w.shape == (1, 64, 64) and w.abs().max() <= bound and w.abs().max() > 0.9 * bound
    assert id(w) in {id(p) for p, _ in model.matrix_params()}
    assert model.added_params() == {"backout": 2 + 64 * 64}


HAND_TRANSFORMS = {"none": lambda v, w: v, "detach": lambda v, w: v, "relu": lambda v, w: F.relu(v),
                   "tanh": lambda v, w: torch.tanh(v), "relu-linear": lambda v, w: F.relu(v) @ w.T,
                   "tanh-linear": lambda v, w: torch.tanh(v) @ w.T}


@pytest.mark.parametrize("transform", HAND_TRANSFORMS)
def test_each_transform_mixes_norm_of_t_of_the_source(transform):
    """sum mode: x_lambda norm(x) + lambda norm(T(out[L])), T written out by hand."""
    assert set(HAND_TRANSFORMS) == set(speedrun.backout.BACKOUT_TRANSFORMS)
    model = build(["--backout-layers", "3", "--backout-transform", transform, "--backout-skip-init", "0.7"])
    wake_up(model)
    x, outputs, x00 = model.hidden_states(tokens(3)[0], WINDOW)
    w = model.study["backout"].transform_w[0] if transform.endswith("-linear") else None
    want = tgm.norm(x) + 0.7 * tgm.norm(HAND_TRANSFORMS[transform](outputs[3], w))
    torch.testing.assert_close(model.head_input(x, outputs, x00), want)


# --- rolling skip -------------------------------------------------------------------------------------------

def test_rolling_skip_starts_as_the_baseline_and_learns():
    base = build([])
    wake_up(base)
    model = build(["--rolling-skip"])
    copy_shared_weights(base, model)
    assert model.added_params() == {"rolling": 2 * 3}
    loss = loss_of(model)
    assert torch.equal(loss, loss_of(base))
    loss.backward()
    grads = model.scalars.grad[slice(*model.scalar_layout["rolling"])].view(-1, 2)
    assert (grads[:, 0] != 0).all()  # the a-lambdas (init 0) receive gradient
    names = model.named_scalars()
    assert (names["rolling.L3.a"], names["rolling.L5.b"]) == (0.0, 1.0) and "rolling.L2.a" not in names


# --- observability: similarity record and a real log ----------------------------------------------------------

def test_similarity_is_recorded_in_eval_only(monkeypatch):
    monkeypatch.setattr(speedrun.backout, "SIMILARITY_TOKENS", 16)  # measured on the first tokens only
    model = build(["--backout-layers", "2", "--backout-transform", "tanh"])
    wake_up(model)
    loss_of(model)
    assert not model.study["backout"].similarity.any()  # training forwards record nothing
    model.eval()
    with torch.no_grad():
        loss_of(model)
    x, outputs, _ = model.hidden_states(tokens(3)[0], WINDOW)
    first = outputs[2][:, :16]
    a, b = tgm.norm(first), tgm.norm(torch.tanh(first))
    cos, rel = model.study["backout"].similarity[0].tolist()
    assert cos == pytest.approx(F.cosine_similarity(a, b, dim=-1).mean().item(), abs=1e-5)
    assert rel == pytest.approx(((a - b).norm() / a.norm()).item(), abs=1e-5)


@pytest.mark.slow
def test_real_log_names_values_and_added_params(tiny_data_args, tmp_path):
    """Guards: a real backout + rolling-skip run (a process) logs its added_params, scalars and similarity values."""
    result = launch_script(tiny_data_args + ["--backout-layers", "2,embed", "--backout-transform", "relu-linear",
                                            "--rolling-skip", "--stop-after", "2", "--val-every", "2",
                                            "--log-dir", str(tmp_path), "--run-name", "bo"])
    assert result.returncode == 0, result.stderr
    lines = (tmp_path / "bo.txt").read_text().splitlines()
    added = [line for line in lines if line.startswith("added_params: ")]
    assert added == [f'added_params: {{"backout": {3 + 2 * 64 * 64}, "rolling": 6}} total {9 + 2 * 64 * 64}']
    scalars = [json.loads(line.split(" scalars: ", 1)[1]) for line in lines
               if line.startswith("step:") and " scalars: " in line]
    assert len(scalars) == 2
    first, last = scalars  # steps 0 and 2: the first step moves only the (zero-initialised) head
    assert (first["backout.x"], first["backout.L2"], first["backout.embed"]) == (1.0, 0.0, 0.0)
    assert last["backout.L2"] != 0.0 and last["rolling.L3.a"] != 0.0 and "rolling.L5.b" in last
    for label in ("L2", "embed"):
        cos, rel = last[f"backout.{label}.cos"], last[f"backout.{label}.rel_l2"]
        assert -1 <= cos <= 1 and rel > 0
        # Both vectors have unit RMS per token, so |a-b|^2/|a|^2 = 2 - 2 cos.
        assert rel ** 2 == pytest.approx(2 - 2 * cos, abs=1e-3)


# --- bad flag combinations ------------------------------------------------------------------------------------

INVALID = [
    (["--backout-transform", "tanh"], "--backout-transform needs --backout-layers"),
    (["--backout-mode", "subtract"], "--backout-mode needs --backout-layers"),
    (["--backout-freeze"], "--backout-freeze needs --backout-layers"),
    (["--backout-layers", "-1"], "layer -1 is outside the model"),
    (["--backout-layers", "6"], "layer 6 is outside the model"),
    (["--backout-layers", "five"], "'five' is not a layer index"),
    (["--backout-layers", "2,2"], "2 is listed twice"),
    (["--backout-layers", "embed", "embed"], "embed is listed twice"),
    (["--backout-layers", "5"], "layer 5 is the last layer"),
    (["--backout-layers", "5", "--backout-mode", "subtract"], "layer 5 is the last layer"),
    (["--backout-layers", "5", "--backout-mode", "concat-mlp"], "not computed yet"),
    (["--backout-layers", "new-embed", "--backout-transform", "detach"], "never receive a gradient"),
    (["--backout-layers", "2", "--backout-mode", "subtract", "--backout-fixed-x"],
     "--backout-fixed-x does not apply to --backout-mode subtract"),
    (["--backout-layers", "2", "--backout-mode", "subtract", "--backout-x-init", "1"], "--backout-x-init does not"),
    (["--backout-layers", "2", "--backout-mode", "subtract", "--backout-norm-after-sum"], "--backout-norm-after-sum"),
    (["--backout-layers", "2", "--backout-mode", "concat-head", "--backout-skip-init", "0"], "--backout-skip-init"),
    (["--backout-layers", "2", "--backout-mode", "concat-head", "--backout-norm-after-sum"], "concat-head"),
    (["--backout-layers", "2", "--backout-mode", "concat-mlp", "--backout-freeze"], "--backout-freeze does not"),
    (["--backout-layers", "2", "--backout-concat-dim", "8"], "--backout-concat-dim does not apply"),
    (["--backout-layers", "2", "--backout-mlp-ratio", "2"], "--backout-mlp-ratio does not apply"),
    (["--backout-layers", "2", "--backout-mode", "concat-mlp", "--backout-concat-dim", "0"],
     "--backout-concat-dim must be positive"),
    (["--backout-layers", "2", "--backout-mode", "concat-mlp", "--backout-mlp-ratio", "-1"],
     "--backout-mlp-ratio must be positive"),
    (["--backout-layers", "2", "--backout-skip-init", "nan"], "--backout-skip-init must be finite"),
    (["--rolling-skip", "--num-layers", "3"], "--rolling-skip needs at least 4 layers"),
]


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", INVALID, ids=[" ".join(f) for f, _ in INVALID])
def test_invalid_combination_is_a_usage_error(flags, message):
    """Guards: each invalid backout or rolling-skip flag combination is a one-line UsageError from resolve_args."""
    with pytest.raises(tgm.UsageError) as err:
        tgm.resolve_args(["--preset", "tiny", *flags])
    assert message in str(err.value) and "\n" not in str(err.value)


@pytest.mark.slow
def test_invalid_combination_exits_2_with_one_line(tiny_data_args, tmp_path):
    """Guards: the medium script as a process exits 2 on an invalid backout combination, one stderr line, no file."""
    result = launch_script(tiny_data_args + ["--backout-layers", "2", "--backout-mode", "subtract",
                                            "--backout-fixed-x", "--log-dir", str(tmp_path)])
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0 and "--backout-fixed-x" in result.stderr
    assert not list(tmp_path.iterdir())  # nothing written before the error
