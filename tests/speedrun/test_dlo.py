"""DLO (--dlo-*): expansion policies, strict identity, routers, labels, skip loss, annealing, skipping at
validation, FLOPs accounting, flag errors, and the baseline path staying bit-identical. CPU, tiny preset."""
import json
import math

import pytest
import torch
import torch.nn.functional as F

import train_gpt_medium as T
from speedrun.checkpoint import load_checkpoint, load_model_weights, save_checkpoint
from speedrun.data import BOS_TOKEN, TokenStream, find_shards
from speedrun.dlo import (GROUP_POLICIES, DLORouters, dlo_after_step, dlo_before_step, dlo_expand_from_checkpoint,
                          dlo_layer_pattern, dlo_skip_rate, forward_flops_per_token, similarity_labels, skip_loss)
from speedrun.runlog import LogWriter
from speedrun.training import validate
from conftest import launch_script

MAX_SEQ = 64
WINDOW = torch.tensor(2)


def data_flags(shard_dir):
    return ["--train-files", str(shard_dir / "syn_train_*.bin"), "--val-files", str(shard_dir / "syn_val_*.bin")]


def write_checkpoint(path, num_layers, shard_dir):
    """A checkpoint in the script's own format, of a fresh tiny model whose weights were all perturbed (a stand-in
    for a trained one: every projection non-zero, so copy, identity and strict identity differ)."""
    args = T.resolve_args(["--preset", "tiny", "--num-layers", str(num_layers)] + data_flags(shard_dir))
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=MAX_SEQ)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    stream = TokenStream(find_shards(args.train_files, "--train-files"), args.train_seq_len, "--train-files")
    save_checkpoint(path, model, opt, stream, 0, 0.0, args, LogWriter(path.with_suffix(".txt"), False), T.Dist())
    return path


@pytest.fixture(scope="module")
def ckpt(shard_dir, tmp_path_factory):
    return write_checkpoint(tmp_path_factory.mktemp("dlo") / "base6.pt", 6, shard_dir)


def base_model(path):
    args = T.resolve_args(["--preset", "tiny"])
    model = T.GPT(T.model_config(args), max_seq_len=MAX_SEQ)
    load_model_weights(model, load_checkpoint(path), path)
    return model


def expanded_model(path, *flags):
    args = T.resolve_args(["--preset", "tiny", "--init-from", str(path)] + list(flags))
    torch.manual_seed(1)
    model = T.GPT(T.model_config(args), max_seq_len=MAX_SEQ)
    dlo_expand_from_checkpoint(model, load_checkpoint(path), args, MAX_SEQ)
    return model, args


def backward_at_skip_rate(path, skip_rate, *flags):
    """The expanded model after one training forward and backward at step 0 with its skip rate pinned: its labels
    and gradients are set to read."""
    model, args = expanded_model(path, *flags)
    dlo_before_step(model, args, 0)
    model.study["dlo"].skip_rate.fill_(skip_rate)
    model(*token_batch(), WINDOW).backward()
    return model


def token_batch(seed=0, n=MAX_SEQ + 1):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 2000, (n,), generator=g)
    seq[torch.rand(n, generator=g) < 0.03] = BOS_TOKEN
    seq[0] = BOS_TOKEN
    return seq[:-1], seq[1:]


def block_state(block):
    return {k: v.clone() for k, v in block.state_dict().items()}


# ---------------------------------------------------------------------------------------------------------------
# Expansion

@pytest.mark.slow
def test_expanded_layer_pattern_follows_the_rule():
    """Guards: the medium model's DLO-expanded layer pattern (positions, new layers, ve, windows, U-net) and blocks."""
    cfg = T.ModelConfig(num_layers=8, dlo_groups=2, dlo_add=1, dlo_base_layers=6)
    pat = dlo_layer_pattern(cfg, T.layer_pattern)
    # Base (L=6): ve on 0 and 5, long windows 0 and 5, no attention at 2, U-net 1->4; groups [0,1,2], [3,4,5].
    assert pat["dlo_position"] == [0, 1, 2, 4, 5, 6]
    assert pat["dlo_new_layers"] == {3: 2, 7: 5}
    assert pat["ve_index"] == [0, None, None, None, None, None, 0, 0]
    assert pat["long_window_layers"] == [0, 6, 7]
    assert pat["no_attention_layers"] == [2, 3]
    assert pat["unet_pairs"] == [(1, 5)]
    model = T.GPT(cfg, MAX_SEQ)
    assert [b.attn is None for b in model.blocks] == [False, False, True, True, False, False, False, False]


@pytest.mark.slow
@pytest.mark.parametrize("policy", GROUP_POLICIES)
def test_expansion_policy_weights_match_definition(ckpt, policy):
    """Guards: each --dlo-init policy builds the new layers' weights and scalars by its definition from a checkpoint."""
    base = base_model(ckpt)
    # G=3 groups of two: [0,1] [2,3] [4,5]; layer 2 has no attention, so group 1's merge/slerp mix layer 3 only.
    model, _ = expanded_model(ckpt, "--dlo-groups", "3", "--dlo-add", "2", "--dlo-init", policy,
                              "--dlo-slerp-t", "0.3")
    pat = model.pattern
    assert model.cfg.num_layers == 12 and pat["dlo_position"] == [0, 1, 4, 5, 8, 9]
    for i, p in enumerate(pat["dlo_position"]):
        for k, v in base.blocks[i].state_dict().items():
            assert torch.equal(model.blocks[p].state_dict()[k], v)
    assert torch.equal(model.embed1.weight, base.embed1.weight)
    assert torch.equal(model.lm_head_w, base.lm_head_w)
    assert torch.equal(model.scalar_slice("unet"), base.scalar_slice("unet"))
    assert not model.study["dlo"].router_w.any()
    lam, base_lam = model.scalar_slice("block").view(-1, 3), base.scalar_slice("block").view(-1, 3)
    vlam, base_vlam = model.scalar_slice("value").view(-1, 2), base.scalar_slice("value").view(-1, 2)
    for i, p in enumerate(pat["dlo_position"]):  # the checkpoint's layers keep their own scalars
        assert torch.equal(lam[p], base_lam[i]) and torch.equal(vlam[p], base_vlam[i])
    for q, src in pat["dlo_new_layers"].items():
        new, source = model.blocks[q].state_dict(), base.blocks[src].state_dict()
        members = [base.blocks[j] for j in pat["dlo_group_members"][q]]
        assert torch.equal(lam[q], torch.tensor([1.0, 0.0, 0.0]))
        assert torch.equal(vlam[q], torch.tensor([0.5, 0.5]) if policy == "random" else base_vlam[src])
        assert set(new) == set(source)
        if policy == "copy":
            assert all(torch.equal(new[k], source[k]) for k in new)
        elif policy in ("identity", "strict-identity"):
            assert torch.equal(new["mlp.fc_w"], source["mlp.fc_w"])
            assert torch.equal(new["mlp.proj_w"], source["mlp.proj_w"] * (policy == "identity"))
            if "attn.qkvo_w" in new:
                assert torch.equal(new["attn.qkvo_w"][:3], source["attn.qkvo_w"][:3])
                assert not new["attn.qkvo_w"][3].any()
        elif policy == "merge":
            for k in new:
                parts = [m.state_dict()[k] for m in members if k in m.state_dict()]
                assert torch.allclose(new[k], sum(parts) / len(parts), atol=1e-7)
        elif policy == "slerp":
            a, b = members[0].state_dict()["mlp.fc_w"].double(), source["mlp.fc_w"].double()
            omega = math.acos((a * b).sum() / (a.norm() * b.norm()))
            expected = (math.sin(0.7 * omega) * a + math.sin(0.3 * omega) * b) / math.sin(omega)
            assert torch.allclose(new["mlp.fc_w"].double(), expected, atol=1e-6)
            assert not torch.allclose(new["mlp.fc_w"], source["mlp.fc_w"])
        elif policy == "random":
            for k, w in new.items():
                for matrix in (w if w.ndim == 3 else [w]):
                    bound = math.sqrt(6 / sum(matrix.shape))
                    assert matrix.abs().max() <= bound
                    assert abs(matrix.std().item() - bound / math.sqrt(3)) < 0.1 * bound
                    assert not torch.equal(w, source[k])
    # Two new layers of one group start alike (except random).
    if policy != "random":
        assert all(torch.equal(v, model.blocks[3].state_dict()[k]) for k, v in model.blocks[2].state_dict().items())


@pytest.mark.slow
@pytest.mark.parametrize("groups,add", [("2", "1"), ("3", "2")])
def test_strict_identity_reproduces_the_checkpoint_loss_exactly(ckpt, groups, add):
    """Guards: strict-identity expansion of a medium checkpoint keeps its exact train and val loss, identity not."""
    base = base_model(ckpt)
    model, _ = expanded_model(ckpt, "--dlo-groups", groups, "--dlo-add", add, "--dlo-init", "strict-identity",
                              "--dlo-skip-loss-weight", "0")
    inputs, targets = token_batch()
    with torch.no_grad():
        assert model(inputs, targets, WINDOW).item() == base(inputs, targets, WINDOW).item()
        model.eval(), base.eval()
        assert model(inputs, targets, WINDOW, head_chunks=4).item() == base(inputs, targets, WINDOW, head_chunks=4).item()
    # identity (attention output only) is not the checkpoint's function: the new layers' MLPs contribute.
    other, _ = expanded_model(ckpt, "--dlo-groups", groups, "--dlo-add", add, "--dlo-init", "identity")
    with torch.no_grad():
        assert other.eval()(inputs, targets, WINDOW).item() != base(inputs, targets, WINDOW).item()


# ---------------------------------------------------------------------------------------------------------------
# Routing, labels, skip loss, annealing

@pytest.mark.slow
def test_routers_start_fully_active(ckpt):
    """Guards: the expanded medium model's routers gate every token on at init; active counters reset once reported."""
    model, _ = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-init", "copy")
    routers = model.study["dlo"]
    z = F.rms_norm(torch.randn(1, 50, 64), (64,))
    for layer in range(model.cfg.num_layers):
        assert torch.equal(routers.gate(routers.router_logits(layer, z)), torch.ones(1, 50))
    with torch.no_grad():
        model.eval()(*token_batch(), WINDOW)
    scalars = model.named_scalars()
    assert [scalars[f"dlo.L{i}.active"] for i in range(8)] == [1.0] * 8
    # Counters are reset once reported.
    assert "dlo.L0.active" not in model.named_scalars()


def test_labels_select_the_least_similar_at_the_requested_rate():
    sims = torch.rand(5, 40, generator=torch.Generator().manual_seed(3))
    for rate in [0.0, 0.1, 0.33, 0.5, 0.9]:
        labels = similarity_labels(sims, rate)
        assert labels.shape == sims.shape
        assert labels.sum().item() == round((1 - rate) * sims.numel())
        if 0 < labels.sum() < labels.numel():
            assert sims[labels].max() < sims[~labels].min()


@pytest.mark.slow
def test_training_forward_labels_follow_the_skip_rate(ckpt):
    """Guards: a training forward labels (1 - skip rate) of tokens active; the skip loss's gradient reaches routers."""
    model = backward_at_skip_rate(ckpt, 0.25, "--dlo-groups", "2", "--dlo-init", "identity")
    fractions = model.study["dlo"].label_active_fractions()
    assert math.isclose(fractions.mean().item(), round(0.75 * 8 * MAX_SEQ) / (8 * MAX_SEQ), rel_tol=1e-6)
    assert model.study["dlo"].router_w.grad.abs().sum() > 0  # the skip loss reaches the routers


@pytest.mark.slow
def test_skip_loss_trains_a_router_toward_the_labels():
    """Guards: 150 Adam steps on skip_loss alone take a router from under 75% to over 95% agreement with its labels."""
    cfg = T.ModelConfig(num_layers=1, model_dim=16, dlo_threshold=1.0, dlo_score_scale=1.0)
    routers = DLORouters(None, cfg)
    g = torch.Generator().manual_seed(0)
    z = F.rms_norm(torch.randn(1, 400, 16, generator=g), (16,))
    labels = (z @ torch.randn(16, generator=g)) > 0.3

    def agreement():
        with torch.no_grad():
            return ((routers.gate(routers.router_logits(0, z)) >= cfg.dlo_threshold) == labels).float().mean()

    before = agreement()
    opt = torch.optim.Adam(routers.parameters(), lr=0.05)
    for _ in range(150):
        loss = skip_loss(routers.router_logits(0, z), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert before < 0.75 and agreement() > 0.95


def test_annealing_follows_its_schedule(ckpt):
    assert dlo_skip_rate(0, 0.05, 0.3, 100) == 0.05
    assert math.isclose(dlo_skip_rate(50, 0.05, 0.3, 100), 0.175)
    assert dlo_skip_rate(100, 0.05, 0.3, 100) == 0.3 and dlo_skip_rate(500, 0.05, 0.3, 100) == 0.3
    assert dlo_skip_rate(0, 0.05, 0.3, 0) == 0.3
    model, args = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-sparsity", "0.2", "--dlo-anneal-start", "0.1",
                                 "--dlo-anneal-steps", "10")
    for step, expected in [(0, 0.1), (5, 0.15), (10, 0.2), (20, 0.2)]:
        dlo_before_step(model, args, step)
        assert math.isclose(model.study["dlo"].skip_rate.item(), expected)


# ---------------------------------------------------------------------------------------------------------------
# Skipping at validation, FLOPs

@pytest.mark.slow
def test_validation_skipping_matches_an_explicit_mask_reference(ckpt):
    """Guards: validation runs each MLP on its active rows only, equal to an explicit gate mask and to hard gating."""
    model, _ = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-init", "identity", "--dlo-skip-loss-weight", "0")
    routers = model.study["dlo"]
    with torch.no_grad():
        routers.router_w.copy_(torch.randn(routers.router_w.shape, generator=torch.Generator().manual_seed(5)))
    inputs, targets = token_batch(1)
    rows_seen = []
    hooks = [b.mlp.register_forward_hook(lambda mod, inp, out: rows_seen.append(inp[0].shape[-2]))
             for b in model.blocks]
    with torch.no_grad():
        skipped = model.eval()(inputs, targets, WINDOW)
    for h in hooks:
        h.remove()
    scalars = model.named_scalars()
    active = [scalars[f"dlo.L{i}.active"] for i in range(8)]
    assert 0.2 < sum(active) / 8 < 0.8
    assert rows_seen == [round(a * MAX_SEQ) for a in active]  # the MLPs ran on the active rows only

    # Reference: every MLP runs on every token and its output is multiplied by an explicit mask (gate >= threshold).
    def masked(layer):
        def hook(mod, inp, out):
            gate = routers.gate(routers.router_logits(layer, inp[0]))
            return out * (gate >= routers.threshold)[..., None]
        return hook
    hooks = [b.mlp.register_forward_hook(masked(i)) for i, b in enumerate(model.blocks)]
    with torch.no_grad():
        reference = model.train()(inputs, targets, WINDOW)
    for h in hooks:
        h.remove()
    assert torch.allclose(skipped, reference, rtol=1e-5, atol=0)
    routers.hard_gating = True  # --dlo-train-gating hard trains on exactly the function validation computes
    with torch.no_grad():
        assert torch.allclose(model.train()(inputs, targets, WINDOW), skipped, rtol=1e-5, atol=0)
    with torch.no_grad():  # and skipping changed the loss: the comparison is not vacuous
        assert not torch.allclose(model.eval()(inputs, targets, WINDOW), base_model(ckpt)(inputs, targets, WINDOW))


@pytest.mark.slow
def test_effective_flops_match_a_hand_count(ckpt):
    """Guards: DLO's FLOPs per token match a hand count, and the logged flops_rel matches the measured active shares."""
    cfg = T.ModelConfig(num_layers=8, model_dim=64, num_heads=2, head_dim=32, block_size=16,
                        dlo_groups=2, dlo_add=1, dlo_base_layers=6)
    pat = dlo_layer_pattern(cfg, T.layer_pattern)
    active = [1, 0.5, 0.25, 0, 1, 0.75, 0.5, 1]
    # Hand count, window 2 blocks of 16 (long 32 keys, short 16), 128 tokens: attention on 0,1,4,5,6,7 (long: 0,6,7).
    head = 2 * 64 * 50304
    attention = 6 * (2 * 4 * 64 * 64) + 3 * (2 * 2 * 64 * 32) + 3 * (2 * 2 * 64 * 16)
    mlp = 2 * 2 * 64 * 256
    effective = head + attention + sum(active) * mlp + 8 * 2 * 64
    dense = head + attention + 8 * mlp
    assert forward_flops_per_token(cfg, pat, 2, 128, active, routers=True) == effective
    assert forward_flops_per_token(cfg, pat, 2, 128) == dense
    # The window is capped at the sequence: 8 blocks of 16 > 64 tokens.
    assert forward_flops_per_token(cfg, pat, 8, 64) == head + 6 * (2 * 4 * 64 * 64 + 2 * 2 * 64 * 64) + 8 * mlp

    model, _ = expanded_model(ckpt, "--dlo-groups", "2")
    with torch.no_grad():
        model.study["dlo"].router_w.normal_(generator=torch.Generator().manual_seed(2))
        model.eval()(*token_batch(), WINDOW)
    s = model.named_scalars()
    measured = [s[f"dlo.L{i}.active"] for i in range(8)]
    expected = (forward_flops_per_token(model.cfg, model.pattern, 2, MAX_SEQ, measured, routers=True)
                / forward_flops_per_token(model.cfg, model.pattern, 2, MAX_SEQ))
    assert math.isclose(s["dlo.flops_rel"], expected)
    assert sum(measured) < 0.8 * 8 and s["dlo.flops_rel"] < 1  # (the tiny model's lm head dominates its FLOPs)


def test_layer_lr_multipliers_scale_each_layer_by_its_active_share(ckpt):
    model, args = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-layer-lr")
    routers = model.study["dlo"]
    routers.label_active_sum.copy_(torch.tensor([1.0, 0.5, 0.25, 0.0, 1.0, 0.75, 0.5, 1.0]) * 2)
    routers.label_count.fill_(2)
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    dlo_after_step(model, opt, args, T.Dist())
    assert math.isclose(opt.muon.lr_mul[model.blocks[1].mlp.fc_w], 0.5 / 0.625, rel_tol=1e-6)
    assert opt.muon.lr_mul[model.blocks[3].mlp.proj_w] == 0.0
    assert math.isclose(opt.muon.lr_mul[model.blocks[0].attn.qkvo_w], 1 / 0.625, rel_tol=1e-6)


@pytest.mark.slow
def test_layer_lr_multipliers_stay_on_the_device_and_step_as_the_number_would(ckpt, monkeypatch):
    """No host sync in a step: the multipliers are never read on the host (no .tolist(), item() or bool()), and
    Muon's step with a tensor multiplier equals the step with the same number, to rounding."""
    model, args = expanded_model(ckpt, "--dlo-groups", "2", "--dlo-layer-lr")
    routers = model.study["dlo"]
    routers.label_active_sum.copy_(torch.tensor([1.0, 0.5, 0.25, 0.0, 1.0, 0.75, 0.5, 1.0]))
    routers.label_count.fill_(1)
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    for host_read in ("tolist", "item", "__bool__", "__float__"):
        monkeypatch.setattr(torch.Tensor, host_read, lambda *a: pytest.fail(f"host read ({host_read})"))
    dlo_after_step(model, opt, args, T.Dist())
    monkeypatch.undo()
    assert all(torch.is_tensor(m) and m.ndim == 0 for m in opt.muon.lr_mul.values())
    gen = torch.Generator().manual_seed(0)
    matrices = list(opt.muon.ordered)
    for p in matrices:
        p.grad = torch.randn(p.shape, generator=gen)
    as_number = {p: float(m) for p, m in opt.muon.lr_mul.items()}
    before = [p.detach().clone() for p in matrices]
    opt.muon.step()
    with_tensor = [p.detach().clone() for p in matrices]
    for p, b in zip(matrices, before):
        p.data.copy_(b)
    opt.muon.state.clear()
    opt.muon.lr_mul = as_number
    opt.muon.step()
    fc = model.blocks[1].mlp.fc_w
    k = [id(p) for p in matrices].index(id(fc))
    assert not torch.equal(with_tensor[k], before[k])
    for p, t in zip(matrices, with_tensor):
        torch.testing.assert_close(t, p.detach(), rtol=1e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------------------------
# Flags

@pytest.mark.parametrize("flags,needle", [
    (["--dlo-groups", "4"], "--dlo-groups 4 must be a positive divisor of --num-layers 6"),
    (["--dlo-groups", "2", "--dlo-sparsity", "1.0"], "--dlo-sparsity must be in [0, 1)"),
    (["--dlo-groups", "2", "--dlo-sparsity", "-0.1"], "--dlo-sparsity must be in [0, 1)"),
    (["--dlo-groups", "2", "--dlo-init", "zeros"], "--dlo-init: unknown value 'zeros'"),
    (["--dlo-groups", "6", "--dlo-init", "slerp"], "--dlo-init slerp needs at least 2 layers per group"),
    (["--dlo-groups", "2", "--dlo-threshold", "1.2"], "--dlo-threshold must be in"),
    (["--dlo-sparsity", "0.2"], "--dlo-sparsity needs --dlo-groups"),
])
def test_bad_dlo_values_are_one_line_errors(ckpt, tiny_data_args, capsys, flags, needle):
    assert T.main(tiny_data_args + ["--init-from", str(ckpt)] + flags) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


@pytest.mark.slow
def test_init_from_problems_are_one_line_errors(shard_dir, tiny_data_args, tmp_path, capsys):
    """Guards: DLO without --init-from, a missing file or a checkpoint of another depth: one line each, no log."""
    assert T.main(tiny_data_args + ["--dlo-groups", "2"]) == 2
    assert "--dlo-groups needs --init-from" in capsys.readouterr().err
    assert T.main(tiny_data_args + ["--dlo-groups", "2", "--init-from", str(tmp_path / "none.pt")]) == 2
    assert "--init-from: no such file" in capsys.readouterr().err
    four = write_checkpoint(tmp_path / "base4.pt", 4, shard_dir)
    assert T.main(tiny_data_args + ["--dlo-groups", "2", "--init-from", str(four), "--log-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "checkpoint model does not match" in err and str(four) in err
    assert not list(tmp_path.glob("*.txt"))  # no log was started


# ---------------------------------------------------------------------------------------------------------------
# End to end (the two subprocess runs of this file)

def scalars_lines(log):
    return [json.loads(l.split("scalars: ", 1)[1]) for l in log.splitlines()
            if l.startswith("step:") and " scalars: " in l]


def val_losses(log):
    return [l.split("val_loss:")[1].split()[0] for l in log.splitlines() if l.startswith("step:") and "val_loss:" in l]


@pytest.mark.slow
def test_dlo_run_end_to_end(ckpt, tiny_data_args, tmp_path):
    """Guards: a real DLO run from a checkpoint (a process): step-0 val is the checkpoint's; scalars, added_params."""
    common = tiny_data_args + ["--num-iterations", "2", "--train-seq-len", "32", "--val-seq-len", "64",
                               "--val-tokens", "512"]
    run = launch_script(common + ["--init-from", str(ckpt), "--log-dir", str(tmp_path), "--run-name", "dlo",
                                 "--dlo-groups", "3", "--dlo-init", "strict-identity", "--dlo-sparsity", "0.3",
                                 "--dlo-anneal-steps", "1", "--dlo-layer-lr", "--val-every", "2"])
    assert run.returncode == 0, run.stderr
    log = (tmp_path / "dlo.txt").read_text()
    assert log.splitlines()[-1].startswith("peak memory allocated:")
    # Strict identity: the step-0 validation is the checkpoint's own validation loss.
    args = T.resolve_args(common)
    window = torch.tensor(T.window_blocks_at(0, 2, T.model_config(args)))
    expected = validate(base_model(ckpt), args, T.Dist(), window, T.VAL_HEAD_CHUNKS)
    assert val_losses(log)[0] == f"{expected:.6f}"
    scalars = scalars_lines(log)
    assert len(scalars) == 2
    assert [scalars[0][f"dlo.L{i}.active"] for i in range(9)] == [1.0] * 9  # routers start fully active
    for s in scalars:
        assert all(0 <= s[f"dlo.L{i}.active"] <= 1 for i in range(9)) and 0 < s["dlo.flops_rel"] < 1.01
    assert scalars[-1]["dlo.skip_rate"] == 0.3
    assert math.isclose(sum(scalars[-1][f"dlo.L{i}.label_active"] for i in range(9)) / 9, 0.7, abs_tol=0.01)
    added = [l for l in log.splitlines() if l.startswith("added_params: ")]
    assert len(added) == 1 and '"dlo": ' in added[0]
