"""Unit tests of train_gpt_medium.py pieces against independent references (in-process, CPU)."""
import math
from dataclasses import replace

import numpy as np
import pytest
import torch

import train_gpt_medium as T
from speedrun.data import BOS_TOKEN, TokenStream, find_shards, read_shard
from speedrun.layers import attend, dense_window_mask, flex_block_masks
from speedrun.muon import NS5_COEFFS, Muon, Snoo, fp32_from_bf16_parts, newton_schulz5, split_fp32_into_bf16_parts
from speedrun.optimizers import lr_factor, muon_momentum
from speedrun.training import kernel_warmup
from conftest import synthetic_tokens, write_token_shard
from study_training import assert_each_parameter_in_one_optimizer, tiny_model_and_optimizers


# --- layer patterns and schedules ------------------------------------------------------------------------------

def test_layer_pattern_at_16_layers_is_the_spec():
    pat = T.layer_pattern(16)
    assert pat["ve_index"] == [0, 1, 2, 3, 4] + [None] * 6 + [0, 1, 2, 3, 4]
    assert pat["long_window_layers"] == [0, 4, 11, 15]
    assert pat["no_attention_layer"] == 7
    assert sorted(pat["unet_pairs"]) == [(2, 11), (4, 10), (6, 9)]


@pytest.mark.parametrize("layers", [2, 3, 6, 12, 18, 24, 28])
def test_layer_pattern_is_consistent_for_other_depths(layers):
    pat = T.layer_pattern(layers)
    used = [i for i in pat["ve_index"] if i is not None]
    assert sorted(set(used)) == list(range(pat["num_value_embeds"]))
    assert all(0 <= l < layers for l in pat["long_window_layers"])
    assert 0 <= pat["no_attention_layer"] < layers
    for src, dst in pat["unet_pairs"]:
        assert 0 <= src < dst < layers


def test_layer_pattern_rejects_too_few_layers():
    with pytest.raises(T.UsageError):
        T.layer_pattern(1)


def test_window_schedule_endpoints_and_cubic_shape():
    cfg = T.ModelConfig()
    assert T.window_blocks_at(0, 5590, cfg) == 1
    assert T.window_blocks_at(5590, 5590, cfg) == 27
    for step in (1000, 2795, 4000):
        x = step / 5590
        expected = max(128, math.ceil(3456 * (4 * x**3 - 6 * x**2 + 3 * x) / 128) * 128) // 128
        assert T.window_blocks_at(step, 5590, cfg) == expected


def test_lr_schedule_and_momentum_warmup():
    assert lr_factor(0, 1000) == 1.0
    assert lr_factor(299, 1000) == 1.0
    assert lr_factor(1000, 1000) == pytest.approx(0.01)
    assert lr_factor(650, 1000) == pytest.approx(0.5 * 0.99 + 0.01)
    assert muon_momentum(0) == pytest.approx(0.85)
    assert muon_momentum(150) == pytest.approx(0.90)
    assert muon_momentum(300) == muon_momentum(5000) == pytest.approx(0.95)


# --- token stream ----------------------------------------------------------------------------------------------

def spec_eight_rank_batches(files, seq_len, steps):
    """The spec's stream, written independently: 8 ranks, next file when pos + 8T + 1 >= len(shard)."""
    shards = [np.fromfile(f, dtype="<u2", offset=1024).astype(np.int64) for f in files]
    fi, pos, out = 0, 0, []
    for _ in range(steps):
        if pos + 8 * seq_len + 1 >= len(shards[fi]):
            fi, pos = fi + 1, 0
        out.append([shards[fi][pos + r * seq_len: pos + (r + 1) * seq_len + 1] for r in range(8)])
        pos += 8 * seq_len
    return out


@pytest.mark.parametrize("world_size", [1, 2, 4, 8])
def test_stream_gives_every_world_size_the_spec_tokens_per_step(tmp_path, world_size):
    files = []
    for i, n in enumerate([3000, 2500]):
        files.append(str(tmp_path / f"t_{i:06d}.bin"))
        write_token_shard(files[-1], synthetic_tokens(n, i))
    seq_len, steps = 64, 8  # crosses into the second file
    expected = spec_eight_rank_batches(files, seq_len, steps)
    streams = [TokenStream(files, seq_len, "test") for _ in range(world_size)]
    for step in range(steps):
        got = {}
        for rank in range(world_size):
            proc = T.Dist(rank=rank, world_size=world_size)
            for v, (inp, tgt) in zip(proc.virtual_ranks, streams[rank].next_batch(proc.virtual_ranks)):
                got[v] = (inp, tgt)
        assert sorted(got) == list(range(8))
        for v in range(8):
            ref = torch.from_numpy(expected[step][v])
            assert torch.equal(got[v][0], ref[:-1]) and torch.equal(got[v][1], ref[1:])


def test_stream_runs_out_with_a_clear_error(tmp_path):
    f = tmp_path / "t_000001.bin"
    write_token_shard(f, synthetic_tokens(1000, 0))
    stream = TokenStream([str(f)], 64, "--train-files")
    stream.next_batch(range(8))
    with pytest.raises(T.UsageError, match="ran out of tokens"):
        stream.next_batch(range(8))


@pytest.mark.parametrize("corrupt, message", [
    (lambda b: b[:100], "malformed header"),
    (lambda b: (123).to_bytes(4, "little") + b[4:], "not a token shard"),
    (lambda b: b[:4] + (7).to_bytes(4, "little") + b[8:], "version 7"),
    (lambda b: b[:-10], "truncated"),
    (lambda b: b + b"\x00\x00", "2 extra bytes"),
])
def test_malformed_shards_name_the_file(tmp_path, corrupt, message):
    f = tmp_path / "bad_000000.bin"
    write_token_shard(f, synthetic_tokens(500, 0))
    f.write_bytes(corrupt(f.read_bytes()))
    with pytest.raises(T.UsageError, match=message) as err:
        read_shard(f)
    assert str(f) in str(err.value)


# --- attention -------------------------------------------------------------------------------------------------

def random_documents(T_len, seed):
    g = torch.Generator().manual_seed(seed)
    seq = torch.randint(0, 1000, (T_len,), generator=g)
    seq[torch.rand(T_len, generator=g) < 0.04] = BOS_TOKEN
    seq[0] = BOS_TOKEN
    return seq


def brute_force_mask(seq, window, block):
    n = len(seq)
    doc, current = [], 0
    for token in seq.tolist():
        current += token == BOS_TOKEN
        doc.append(current)
    m = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n):
        for k in range(q + 1):
            m[q, k] = doc[q] == doc[k] and q // block - k // block < window
    return m


@pytest.mark.parametrize("window", [1, 2, 3, 5, 100])
def test_cpu_mask_and_attention_equal_brute_force(window):
    seq, block = random_documents(96, window), 8
    mask = dense_window_mask(seq, window, block)
    assert torch.equal(mask, brute_force_mask(seq, window, block))
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 96, 16, generator=g, dtype=torch.float64) for _ in range(3))
    out = attend(q, k, v, mask, 0.12)
    scores = (q @ k.transpose(-1, -2)) * 0.12
    scores = scores.masked_fill(~mask, float("-inf"))
    assert torch.allclose(out, scores.softmax(-1) @ v, atol=1e-10)


@pytest.mark.parametrize("window", [1, 2, 4, 7])
def test_flex_block_mask_is_the_same_function_as_the_cpu_mask(window):
    seq, block = random_documents(128, 10 + window), 16
    bm = flex_block_masks(seq, [torch.tensor(window)], block)[0]
    visible_blocks = bm.to_dense()[0, 0].bool()
    idx = torch.arange(len(seq))
    token_level = visible_blocks[idx[:, None] // block, idx[None, :] // block]
    docs = (seq == BOS_TOKEN).cumsum(0)
    token_level &= (idx[:, None] >= idx[None, :]) & (docs[:, None] == docs[None, :])
    assert torch.equal(token_level, dense_window_mask(seq, window, block))


# --- optimisers ------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("shape", [(64, 32), (32, 96), (3, 48, 48)])
def test_ns5_is_near_orthogonal_and_matches_float64(shape):
    """Guards: the medium track's NS5 (batched too) tracks a float64 run of its iteration; singular values near 1."""
    g = torch.randn(*shape, generator=torch.Generator().manual_seed(0))
    out = newton_schulz5(g).float()
    assert out.dtype == torch.float32 and out.shape == g.shape
    # float64 reference of the same iteration
    x = g.double()
    tr = x.size(-2) > x.size(-1)
    x = x.mT if tr else x
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for a, b, c in NS5_COEFFS:
        A = x @ x.mT
        x = a * x + (b * A + c * A @ A) @ x
    ref = (x.mT if tr else x).float()
    assert (out - ref).abs().max() < 0.05
    # singular values pushed into a band around 1 (NS5's fixed point region)
    sv = torch.linalg.svdvals(out)
    assert sv.min() > 0.5 and sv.max() < 1.3


def test_mantissa_buffer_update_equals_fp32_update():
    g = torch.Generator().manual_seed(0)
    master = torch.randn(32, 32, generator=g)
    high = torch.empty(32, 32, dtype=torch.bfloat16)
    low = torch.empty(32, 32, dtype=torch.int16)
    split_fp32_into_bf16_parts(master, high, low)
    assert torch.equal(fp32_from_bf16_parts(high, low), master)
    reference = master.clone()
    for _ in range(50):
        upd = torch.randn(32, 32, generator=g) * 1e-4  # far below bf16 resolution of the values
        reference.mul_(1 - 0.03 * 0.01).add_(upd, alpha=-0.03)
        value = fp32_from_bf16_parts(high, low)
        value.mul_(1 - 0.03 * 0.01).add_(upd, alpha=-0.03)
        split_fp32_into_bf16_parts(value, high, low)
    assert torch.equal(fp32_from_bf16_parts(high, low), reference)
    # the bf16 parameter is the truncation of the fp32 master
    assert torch.equal(high.view(torch.int16), (reference.view(torch.int32) >> 16).to(torch.int16))


@pytest.mark.slow
def test_muon_step_matches_the_spec_formula():
    """Guards: three Muon steps equal the spec's formula: momentum, Nesterov, NS5, smoothing, decay, shape scale."""
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(48, 16, generator=g))
    ref = p.detach().clone()
    muon = Muon([(p, 2.0)], lr=0.03, weight_decay=0.01, momentum=0.9, ns_dtype=torch.float32)
    m = torch.zeros_like(ref)
    s = torch.zeros_like(ref)
    for _ in range(3):
        grad = torch.randn(48, 16, generator=g)
        p.grad = grad.clone()
        muon.step()
        m = 0.9 * m + 0.1 * grad
        u = newton_schulz5(0.9 * m + 0.1 * grad, torch.float32)
        s = 0.2 * s + 0.8 * u
        ref = ref * (1 - 0.03 * 0.01 * 2.0) - 0.03 * math.sqrt(48 / 16) * s
    assert torch.allclose(p.detach(), ref, atol=1e-6)


def test_snoo_fires_on_the_spec_steps_with_nesterov_sgd():
    p = torch.nn.Parameter(torch.zeros(4))
    snoo = Snoo([p], lr=0.68, momentum=0.37, every=28)
    fired = []
    old, buf = torch.zeros(4), None
    for call in range(60):
        p.data += 0.01 * (call + 1)  # the inner optimiser's move
        before = p.detach().clone()
        if snoo.step():
            fired.append(call)
            grad = old - before
            buf = grad if buf is None else 0.37 * buf + grad
            old = old - 0.68 * (grad + 0.37 * buf)
            assert torch.allclose(p.detach(), old, atol=1e-7)
        else:
            assert torch.equal(p.detach(), before)
    assert fired == [0, 28, 56]


@pytest.mark.slow
def test_every_parameter_has_exactly_one_optimizer():
    """Guards: the medium model's parameters are each in Muon or Adam exactly once, with the spec's Adam lrs."""
    _, model, opt = tiny_model_and_optimizers(T)
    assert_each_parameter_in_one_optimizer(model, opt)
    names = {g["name"]: g["lr"] for g in opt.adam.param_groups}
    assert names == {"head": 1 / 320, "embed": 0.3, "scalar": 0.015}
    assert all(p.ndim >= 2 for p in opt.muon.ordered)


@pytest.mark.slow
def test_warmup_leaves_model_and_optimizer_state_bit_identical(shard_dir):
    """Guards: the kernel warm-up after 30 real steps restores model, Adam, Muon and Snoo state bitwise."""
    args, model, opt = tiny_model_and_optimizers(T)
    args = replace(args, warmup_steps=3)
    proc = T.Dist()
    stream = TokenStream(find_shards(str(shard_dir / "syn_train_*.bin"), "x"), args.train_seq_len, "x")
    window = torch.tensor(2)
    # some real training first, so every optimiser has state worth restoring
    for step in range(30):
        T.train_step(model, stream.next_batch(proc.virtual_ranks), window, proc)
        opt.step(step, args.num_iterations)
    before_model = {k: v.clone() for k, v in model.state_dict().items()}
    before_adam = {k: {n: t.clone() for n, t in v.items() if torch.is_tensor(t)} for k, v in opt.adam.state.items()}
    before_muon = opt.muon.full_state()
    before_snoo = opt.snoo.state_dict()
    kernel_warmup(args.warmup_steps, model, opt, T.random_token_steps(model, opt, args, proc, model.cfg))
    for k, v in model.state_dict().items():
        assert torch.equal(v, before_model[k]), k
    for p, st in opt.adam.state.items():
        for n, t in st.items():
            if torch.is_tensor(t):
                assert torch.equal(t, before_adam[p][n])
    after_muon = opt.muon.full_state()
    assert after_muon.keys() == before_muon.keys()
    for i in after_muon:
        for n in after_muon[i]:
            assert torch.equal(after_muon[i][n], before_muon[i][n])
    snoo = opt.snoo.state_dict()
    assert snoo["calls"] == before_snoo["calls"]
    assert all(torch.equal(a, b) for a, b in zip(snoo["old"], before_snoo["old"]))


@pytest.mark.slow
def test_loss_at_init_is_uniform_over_the_vocabulary():
    """Guards: the medium model at init gives ln(50304), the zero-initialised head's uniform loss."""
    # zero-initialised lm head: every logit 0, loss = ln(vocab) over the padded head
    _, model, _ = tiny_model_and_optimizers(T)
    seq = random_documents(64, 0)
    loss = model(seq, seq.roll(-1), torch.tensor(2))
    assert loss.item() == pytest.approx(math.log(50304), rel=1e-5)


@pytest.mark.slow
def test_named_scalars_cover_the_scalar_vector():
    """Guards: the medium model's named scalars cover skips, every block and value lambda, with their init values."""
    _, model, _ = tiny_model_and_optimizers(T)
    names = model.named_scalars()
    L = model.cfg.num_layers
    assert len([n for n in names if n.startswith("skip.")]) == len(model.pattern["unet_pairs"])
    assert all(f"block{i}.a" in names for i in range(L))
    no_attn = model.pattern["no_attention_layer"]
    assert f"block{no_attn}.v_self" not in names and "block0.v_embed" in names
    assert names["block0.a"] == 1.0 and names["block0.v_self"] == 0.5


def snoo_trajectory(dtype, firings):
    """Muon + Snoo on one matrix: two firings with real movement, then inner lr 0 for `firings` more."""
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.randn(32, 16, generator=g).to(dtype))
    muon = Muon([(p, 1.0)], lr=0.01, weight_decay=0.0, momentum=0.9)
    snoo = Snoo([p], write=muon.write_master, stored=lambda p, v: v,
                  read_all=lambda: [muon.master_values()[id(p)]])
    for call in range((2 + firings) * snoo.every):
        if call == 2 * snoo.every:
            muon.param_groups[0]["lr"] = 0.0
        p.grad = torch.randn(32, 16, generator=g).to(dtype)
        muon.step()
        snoo.step()
    return muon.master_value(p)


@pytest.mark.slow
def test_snoo_on_bf16_muon_weights_follows_the_fp32_trajectory():
    """Guards: Snoo over bf16 Muon weights follows the fp32 trajectory for 20 firings (no shrink from truncation)."""
    # The bf16 parameter is the truncated top half of the fp32 master: comparing the outer copy with it would read
    # the truncation as a pseudo-gradient and shrink every matrix a little at every firing.
    bf16, fp32 = snoo_trajectory(torch.bfloat16, 20), snoo_trajectory(torch.float32, 20)
    assert bf16.norm() / fp32.norm() == pytest.approx(1.0, abs=5e-4)
    assert (bf16 - fp32).norm() / fp32.norm() < 5e-3


@pytest.mark.slow
def test_snoo_reads_the_full_precision_masters_of_bf16_muon_matrices():
    """Guards: after real bf16 training steps, Snoo reads Muon's fp32 masters, not the bf16 parameters."""
    args, model, _ = tiny_model_and_optimizers(T)
    model.cast_low_precision(torch.bfloat16)
    opt = T.Optimizers(model, 0, 1, fused_adam=False)
    seq = random_documents(64 * 8 + 1, 3)
    batches = [(seq[v * 64:(v + 1) * 64], seq[v * 64 + 1:(v + 1) * 64 + 1]) for v in range(8)]
    for step in range(2):
        T.train_step(model, batches, torch.tensor(2), T.Dist())
        opt.step(step, args.num_iterations)
    current = dict(zip(map(id, opt.snoo.params), opt.snoo.read_all()))
    differs = False
    for p in opt.muon.ordered:
        assert torch.equal(current[id(p)], opt.muon.master_value(p))
        differs |= not torch.equal(current[id(p)], p.float())
    assert differs  # the masters really carry bits the bf16 parameters do not
