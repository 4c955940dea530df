"""DLO ablation flags (the paper's Tables 1, 3, 4, 5) and every arm of ablations/dlo.toml at tiny size: its
added_params count and a gradient for every parameter it adds. CPU, tiny preset."""
import math
from pathlib import Path

import pytest
import torch

import train_gpt_medium as T
from ablations.study import load_study
from speedrun.checkpoint import load_checkpoint, load_model_weights
from speedrun.dlo import dlo_after_step, dlo_before_step, dlo_expand_from_checkpoint, similarity_labels
from test_dlo import (MAX_SEQ, WINDOW, backward_at_skip_rate, base_model, data_flags, expanded_model, token_batch,
                      write_checkpoint)

DLO_ARMS = list(load_study("dlo", overrides={"base_checkpoint": "unused.pt"}).arms)


@pytest.fixture(scope="module")
def ckpt(shard_dir, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("dlo_ablations") / "base6.pt", 6, shard_dir)


def param_count(model):
    return sum(p.numel() for p in model.parameters())


def arm_model(arm, ckpt, shard_dir):
    """The arm's model at its real initialisation, built from the tiny 6-layer checkpoint. The study's 4 groups do
    not divide 6 layers: the arm runs with 2 groups (its other flags unchanged)."""
    argv = load_study("dlo", overrides={"base_checkpoint": str(ckpt)}).argv(arm, 0, Path("runs"))
    args = T.resolve_args(["--preset", "tiny"] + data_flags(shard_dir) + argv +
                          (["--dlo-groups", "2"] if "--dlo-groups" in argv else []))
    torch.manual_seed(args.seed)
    model = T.GPT(T.model_config(args), max_seq_len=MAX_SEQ)
    state = load_checkpoint(ckpt)
    if args.dlo_groups:
        dlo_expand_from_checkpoint(model, state, args, MAX_SEQ)
    else:
        load_model_weights(model, state, ckpt)
    return model, args


def test_the_study_has_an_arm_per_table_row():
    rows = {"continue", "dense-identity", "base-s10", "base-s20", "base-s30", "identity-s10", "identity-s20",
            "identity-s30", "random-s10", "copy-s10", "merge-s10", "slerp-s10", "identity-s10-no-zero-init",
            "identity-s10-no-rescale", "dus-dense", "duplicate-dense", "identity-s10-uniform-skip"}
    assert rows <= set(DLO_ARMS)
    assert "identity-s10-uniform-lr" not in DLO_ARMS  # it varied the learning rate: now identity-s10-no-layer-lr


@pytest.mark.slow
@pytest.mark.parametrize("arm", DLO_ARMS)
def test_added_params_are_the_arms_extra_parameters(arm, ckpt, shard_dir):
    """Guards: each dlo.toml arm expanded from a real checkpoint reports just its extra parameters as added_params."""
    model, args = arm_model(arm, ckpt, shard_dir)
    added = model.added_params()
    assert sum(added.values()) == param_count(model) - param_count(base_model(ckpt))
    if args.dlo_groups:  # routers, the new layers' weights and their 5 per-layer scalars (block a, b, c; value 2)
        new = model.pattern["dlo_new_layers"]
        weights = sum(p.numel() for q in new for p in model.blocks[q].parameters())
        assert added == {"dlo": model.cfg.num_layers * model.cfg.model_dim + weights + 5 * len(new)}


def added_entries(model):
    """Every parameter a DLO arm adds, as (name, tensor, entry selector): each router's slice, each new layer's
    weight tensors and its block and value scalars (v_self where the layer has attention, v_embed where it also
    has a value embedding: the baseline keeps these unused scalars in every layer, and so does a new layer)."""
    routers, D = model.study["dlo"].router_w, model.cfg.model_dim
    entries = [(f"router L{i}", routers, slice(i * D, (i + 1) * D)) for i in range(model.cfg.num_layers)]
    block_start, value_start = model.scalar_layout["block"][0], model.scalar_layout["value"][0]
    for q in model.pattern["dlo_new_layers"]:
        for name, p in model.blocks[q].named_parameters():
            entries.append((f"block{q}.{name}", p, slice(None)))
        for k, letter in enumerate("abc"):
            entries.append((f"block{q}.{letter}", model.scalars, block_start + 3 * q + k))
        if model.blocks[q].attn is not None:
            entries.append((f"block{q}.v_self", model.scalars, value_start + 2 * q))
        if model.blocks[q].attn is not None and model.pattern["ve_index"][q] is not None:
            entries.append((f"block{q}.v_embed", model.scalars, value_start + 2 * q + 1))
    return entries


@pytest.mark.slow
@pytest.mark.parametrize("arm", [a for a in DLO_ARMS if a != "continue"])
def test_every_parameter_an_arm_adds_gets_a_gradient(arm, ckpt, shard_dir):
    """From the arm's real initialisation, over its first two optimiser steps (two, not one: where an init zeroes
    an output projection - identity's attention output, strict identity's MLP output - the weights before it get
    their first gradient once that projection has moved)."""
    model, args = arm_model(arm, ckpt, shard_dir)
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    entries = added_entries(model)
    got = [False] * len(entries)
    for step in range(2):
        dlo_before_step(model, args, step)
        model(*token_batch(step), WINDOW).backward()
        for i, (_, p, where) in enumerate(entries):
            got[i] = got[i] or bool(p.grad is not None and p.grad[where].abs().sum() > 0)
        dlo_after_step(model, opt, args, T.Dist())
        opt.step(step, args.num_iterations)
    assert [name for (name, _, _), ok in zip(entries, got) if not ok] == []


# ---------------------------------------------------------------------------------------------------------------
# Table 1: skipping on the unexpanded model

@pytest.mark.slow
def test_dlo_add_zero_routes_the_unexpanded_model(ckpt):
    """Guards: --dlo-add 0 adds only routers and, at zero routers, keeps the checkpoint's exact train and val loss."""
    base = base_model(ckpt)
    model, _ = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-add", "0", "--dlo-sparsity", "0.2",
                              "--dlo-skip-loss-weight", "0")
    assert model.cfg.num_layers == 6 and model.pattern["dlo_new_layers"] == {}
    assert model.added_params() == {"dlo": 6 * 64}
    inputs, targets = token_batch()
    with torch.no_grad():  # zero routers: every gate is exactly 1, the checkpoint's function
        assert model(inputs, targets, WINDOW).item() == base(inputs, targets, WINDOW).item()
        assert model.eval()(inputs, targets, WINDOW).item() == base.eval()(inputs, targets, WINDOW).item()


# ---------------------------------------------------------------------------------------------------------------
# Table 3: without zero router initialisation, without score rescaling

@pytest.mark.slow
def test_uniform_router_init_is_a_default_linear_layer(ckpt):
    """Guards: --dlo-router-init uniform draws Linear's default init and skips tokens before any training."""
    model, _ = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-router-init", "uniform")
    w = model.study["dlo"].router_w
    # router_w / sqrt(D) is the effective weight: U(-1/sqrt(D), 1/sqrt(D)), PyTorch's Linear default.
    assert w.abs().max() <= 1 and abs(w.std().item() - 1 / math.sqrt(3)) < 0.05
    with torch.no_grad():
        model.eval()(*token_batch(), WINDOW)
    active = [v for k, v in model.named_scalars().items() if k.endswith(".active")]
    assert 0.2 < sum(active) / len(active) < 0.8  # tokens are skipped before any training


@pytest.mark.slow
def test_sigmoid_score_halves_the_mlps_at_the_start(ckpt):
    """Guards: --dlo-score sigmoid gates 0.5 at init, threshold 0.5, no rescaling, and another loss than rescaled."""
    model, args = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-score", "sigmoid")
    routers = model.study["dlo"]
    assert args.dlo_threshold == 0.5
    z = torch.randn(1, 10, 64)
    assert torch.equal(routers.gate(routers.router_logits(0, z)), torch.full((1, 10), 0.5))
    assert torch.allclose(routers.gate(torch.tensor([-50.0, 50.0])), torch.tensor([0.0, 1.0]))  # no rescaling
    rescaled, _ = expanded_model(ckpt, "--dlo-groups", "2")
    inputs, targets = token_batch()
    with torch.no_grad():
        model.eval()(inputs, targets, WINDOW)
        assert all(v == 1.0 for k, v in model.named_scalars().items() if k.endswith(".active"))
        assert model(inputs, targets, WINDOW).item() != rescaled.eval()(inputs, targets, WINDOW).item()


# ---------------------------------------------------------------------------------------------------------------
# Table 4: the expansion baselines

@pytest.mark.slow
def test_dus_repeats_the_middle_block_exactly(ckpt):
    """Guards: --dlo-init dus repeats the middle block's layers exactly (weights, scalars) in the expanded pattern."""
    base = base_model(ckpt)
    model, _ = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-add", "1", "--dlo-init", "dus")
    # L=6, 2 added: layers [0, 4) then [2, 6) - layers 2 and 3 run twice in a row.
    assert model.pattern["dlo_position"] == [0, 1, 2, 3, 6, 7]
    assert model.pattern["dlo_new_layers"] == {4: 2, 5: 3}
    assert [b.attn is None for b in model.blocks] == [False, False, True, False, True, False, False, False]
    assert model.pattern["unet_pairs"] == [(1, 6)]
    assert_exact_duplicates(model, base)


@pytest.mark.slow
def test_duplicate_repeats_each_groups_last_layers(ckpt):
    """Guards: --dlo-init duplicate repeats each group's last layers exactly, weights and scalars."""
    base = base_model(ckpt)
    model, _ = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-add", "2", "--dlo-init", "duplicate")
    assert model.pattern["dlo_position"] == [0, 1, 2, 5, 6, 7]
    assert model.pattern["dlo_new_layers"] == {3: 1, 4: 2, 8: 4, 9: 5}
    assert_exact_duplicates(model, base)


def assert_exact_duplicates(model, base):
    """Every new layer is its source: weights, block scalars, value scalars."""
    lam, base_lam = model.scalar_slice("block").view(-1, 3), base.scalar_slice("block").view(-1, 3)
    vlam, base_vlam = model.scalar_slice("value").view(-1, 2), base.scalar_slice("value").view(-1, 2)
    for q, src in model.pattern["dlo_new_layers"].items():
        new, source = model.blocks[q].state_dict(), base.blocks[src].state_dict()
        assert set(new) == set(source) and all(torch.equal(new[k], source[k]) for k in new)
        assert torch.equal(lam[q], base_lam[src]) and torch.equal(vlam[q], base_vlam[src])
        assert not torch.equal(lam[q], torch.tensor([1.0, 0.0, 0.0]))  # the checkpoint's, not the reset (1, 0, 0)


# ---------------------------------------------------------------------------------------------------------------
# Table 5: uniform vs layer-wise skip rates

def test_uniform_allocation_skips_the_same_share_of_every_layer():
    sims = torch.rand(4, 30, generator=torch.Generator().manual_seed(0))
    sims[0] += 1  # layer 0 changes the stream least: ranked globally, it takes every skip
    layer_wise, uniform = similarity_labels(sims, 0.2), similarity_labels(sims, 0.2, per_layer=True)
    assert layer_wise.sum() == uniform.sum() == 96
    assert layer_wise.sum(1).tolist() == [6, 30, 30, 30]
    assert uniform.sum(1).tolist() == [24] * 4
    for row, labels in zip(sims, uniform):
        assert row[labels].max() < row[~labels].min()


@pytest.mark.slow
def test_uniform_allocation_in_training(ckpt):
    """Guards: --dlo-skip-allocation uniform labels 75% of tokens active in every layer alike in a training forward."""
    model = backward_at_skip_rate(ckpt, 0.25, "--dlo-groups", "2", "--dlo-skip-allocation", "uniform")
    assert model.study["dlo"].label_active_fractions().tolist() == [0.75] * 8


# ---------------------------------------------------------------------------------------------------------------
# Flags

@pytest.mark.parametrize("flags,needle", [
    (["--dlo-add", "0", "--dlo-init", "copy"], "--dlo-init and --dlo-slerp-t need --dlo-add of at least 1"),
    (["--dlo-add", "-1"], "--dlo-add must not be negative (got -1)"),
    (["--dlo-groups", "3", "--dlo-add", "1", "--dlo-init", "dus"], "--dlo-init dus repeats a middle block"),
    (["--dlo-add", "4", "--dlo-init", "duplicate"], "--dlo-add must be at most 3"),
    (["--dlo-score", "sigmoid", "--dlo-score-scale", "1"], "--dlo-score-scale applies to --dlo-score rescaled only"),
    (["--dlo-score", "sigmoid", "--dlo-threshold", "0.8"], "--dlo-threshold must be in (0, 0.5]"),
    (["--dlo-score", "tanh"], "--dlo-score: unknown value 'tanh' (choose from rescaled, sigmoid)"),
    (["--dlo-router-init", "normal"], "--dlo-router-init: unknown value 'normal'"),
    (["--dlo-skip-allocation", "per-layer"], "--dlo-skip-allocation: unknown value 'per-layer'"),
])
def test_bad_ablation_values_are_one_line_errors(ckpt, tiny_data_args, capsys, flags, needle):
    groups = [] if "--dlo-groups" in flags else ["--dlo-groups", "2"]
    assert T.main(tiny_data_args + ["--init-from", str(ckpt)] + groups + flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: ") and needle in err
