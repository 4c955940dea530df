"""speedrun.r18.optim: record #18's NorMuon and odd-step Adam. Equality with upstream's maths is shown by the
harness (benchmarks/results/2026-11-25_cpu_r18-optimizer-fidelity.txt); these tests pin the behaviours."""

import json

import pytest
import torch

from conftest import ROOT, launch_script
from speedrun.r18.model import R18Config, R18GPT
from speedrun.r18.optim import (OddStepAdam, R18Optimizers, adam_update_, cautious_update_, muon_groups,
                                normalise_variance, polar_express, shape_lr_factor)
from speedrun.r18.schedule import R18Schedule

SCHEDULE = R18Schedule(num_scheduled_iterations=12, num_extension_iterations=2)  # split step 3


def tiny_model():
    torch.manual_seed(0)
    cfg = R18Config(model_dim=32, num_heads=2, head_dim=16, vocab_size=200, block_size=8, max_seq_len=64)
    return R18GPT(cfg).cast_low_precision(torch.bfloat16)


def give_gradients(model, value=1.0):
    for name, p in model.named_parameters():
        if name != "embed.weight" or model.split_embed:
            p.grad = torch.full_like(p, value) if p.grad is None else p.grad + value


def test_polar_express_gives_singular_values_near_one():
    g = torch.randn(3, 64, 32, generator=torch.Generator().manual_seed(0))
    g[0] *= 1e3  # scale does not matter
    singular = torch.linalg.svdvals(polar_express(g).float())
    assert singular.min() > 0.6 and singular.max() < 1.25
    assert polar_express(g).shape == g.shape and polar_express(g).dtype == torch.bfloat16
    # the split product/add form is the same map up to bf16 rounding
    torch.testing.assert_close(polar_express(g, split_last_product=True).float(), polar_express(g).float(),
                               atol=0.05, rtol=0)


def test_variance_normalisation_equalises_rows_and_keeps_the_norm():
    v = torch.randn(1, 8, 16) * torch.arange(1, 9).view(1, 8, 1)  # rows of very different size
    second_moment = torch.zeros(1, 8, 1)
    out = normalise_variance(v.clone(), second_moment, 0.95, -1)
    torch.testing.assert_close(out.norm(), v.norm())
    row_rms = out.square().mean(-1).sqrt()
    torch.testing.assert_close(row_rms, row_rms.mean().expand_as(row_rms))
    torch.testing.assert_close(second_moment, 0.05 * v.square().mean(-1, keepdim=True))


def test_cautious_weight_decay_only_where_update_agrees_with_parameter():
    p = torch.tensor([1.0, 1.0, -2.0])
    cautious_update_(p, torch.tensor([1.0, -1.0, -1.0]), torch.tensor(0.5), torch.tensor(0.1))
    # decayed by 0.5*0.1 and stepped: 1 - 0.05 - 0.1; not decayed: 1 + 0.1; -2 + 0.1 (v*p > 0: decayed +0.1)
    torch.testing.assert_close(p, torch.tensor([0.85, 1.1, -2.0 + 0.1 + 0.1]))


def test_shape_factor_and_record_grouping():
    model = R18GPT(R18Config(model_dim=32, num_heads=2, head_dim=16, vocab_size=200, block_size=8,
                             max_seq_len=64))
    assert shape_lr_factor(model.blocks[0].attn.qkvo_w) == 2.0  # [4*dim, dim]
    assert shape_lr_factor(model.blocks[0].attn.attn_gate.weight) == 1.0  # [heads, 16]
    assert shape_lr_factor(model.scalars) == 1.0
    matrices = [p for p in model.parameters() if p.label in ("attn_gate", "value_embed_gate", "attn", "mlp")]
    groups = muon_groups(matrices)
    # the record's 8-GPU layout: 16 attention gates, 10 value-embedding gates, 16 attention, 2 x 16 MLP
    assert [len(g) for g in groups] == [16, 10, 16, 16, 16]
    assert groups[3] == [w for b in model.blocks[:8] for w in (b.mlp.c_fc, b.mlp.c_proj)]
    with pytest.raises(ValueError, match="lm_head"):
        muon_groups(matrices + [model.lm_head.weight])


@pytest.mark.slow
def test_adam_steps_on_odd_steps_on_the_sum_of_both_steps_gradients():
    """Guards: r18's Adams step on odd steps only, on the sum of both steps' gradients; NorMuon steps every step."""
    model = tiny_model()
    opts = R18Optimizers(model, SCHEDULE)
    scalars, head, attn = model.scalars, model.lm_head.weight, model.blocks[0].attn.qkvo_w
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    give_gradients(model, 3.0)
    opts.step(0)
    assert torch.equal(scalars, before["scalars"]) and torch.equal(head, before["lm_head.weight"])
    assert not torch.equal(attn, before["blocks.0.attn.qkvo_w"])  # NorMuon steps every step
    assert attn.grad is None and scalars.grad is not None  # Adam's gradients are kept for the odd step
    give_gradients(model, -1.0)  # alone it would push the scalars up; the sum (+2) pushes them down
    opts.step(1)
    # first Adam step with bias correction moves by lr * sign(g) (bf16 rounding of the update)
    lr = 0.008 * SCHEDULE.lr(1) * scalars.lr_mul
    torch.testing.assert_close(scalars, before["scalars"] - lr, rtol=0, atol=lr * 0.01)
    assert scalars.grad is None and opts.scalar_adam.state[scalars]["step"] == 1
    assert opts.adam.state[model.embed.weight]["step"] == 0  # no gradient before the untie: not stepped


@pytest.mark.slow
def test_embedding_untied_after_the_split_step_with_the_heads_state():
    """Guards: at the split step r18 unties the embedding from the head with a copy of its Adam state; they diverge."""
    model = tiny_model()
    opts = R18Optimizers(model, SCHEDULE)
    assert SCHEDULE.split_step == 3
    for step in range(SCHEDULE.split_step + 1):
        assert not model.split_embed
        give_gradients(model, 1.0 + step)
        opts.step(step)
    assert model.split_embed
    assert torch.equal(model.embed.weight, model.lm_head.weight)
    head_state, embed_state = opts.adam.state[model.lm_head.weight], opts.adam.state[model.embed.weight]
    assert embed_state["step"] == head_state["step"] == 2
    assert torch.equal(embed_state["exp_avg"], head_state["exp_avg"])
    assert embed_state["exp_avg"] is not head_state["exp_avg"]  # a copy: the two tables now diverge
    give_gradients(model, 1.0)
    opts.step(4)
    give_gradients(model, 1.0)
    model.embed.weight.grad.neg_()  # opposite summed gradients for the two tables
    opts.step(5)
    assert not torch.equal(model.embed.weight, model.lm_head.weight)


def test_unlabelled_parameter_refused():
    model = tiny_model()
    model.extra = torch.nn.Parameter(torch.zeros(3))
    with pytest.raises(ValueError, match="without an r18 optimiser label"):
        R18Optimizers(model, SCHEDULE)


def test_adam_state_reloads_with_bf16_moments_and_steps_identically():
    def scalar_param(values):
        p = torch.nn.Parameter(values.clone())
        p.label, p.lr_mul, p.wd_mul = "scalars", 1.0, 0.0
        return p

    g = torch.Generator().manual_seed(0)
    p = scalar_param(torch.randn(7, generator=g))
    opt = OddStepAdam([p], ("scalars",), lr=0.01, betas=(0.9, 0.99))
    p.grad = torch.randn(7, generator=g)
    opt.step()
    q = scalar_param(p.detach())
    resumed = OddStepAdam([q], ("scalars",), lr=0.01, betas=(0.9, 0.99))
    resumed.load_state_dict(opt.state_dict())  # torch would cast the moments to the fp32 parameter's dtype
    assert resumed.state[q]["exp_avg"].dtype == torch.bfloat16
    p.grad = torch.randn(7, generator=g)
    q.grad = p.grad.clone()
    opt.step()
    resumed.step()
    assert torch.equal(p, q)


@pytest.mark.slow
def test_sharded_adam_on_two_ranks_steps_and_resumes_bitwise_as_the_replicated_adam():
    """tests/r18_adam_driver.py: a 2-rank SUM is a+b whichever collective carries it and Adam is element-wise, so
    slicing the rows changes no bit."""
    res = launch_script([], nproc=2, script=ROOT / "tests" / "r18_adam_driver.py", timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    losses = out["losses"]
    assert len(set(losses["sharded"])) > 1  # it trains: the comparison is not of untouched weights
    assert losses["sharded"] == losses["replicated"]
    # resumed after step 3 from each one's checkpoint (the replicated one: a checkpoint from before the sharding)
    assert losses["sharded resumed from sharded"] == losses["sharded resumed from replicated"] == losses["sharded"][4:]
    assert all(out["params_equal"].values())
    elements = out["adam_state_elements"]
    # the head and embeddings hold half their moments per rank; the small vectors and gates whole ones
    assert elements["replicated"] // 2 < elements["sharded"] < elements["replicated"] * 0.6
    assert elements["sharded resumed from replicated"] == elements["sharded"]


def random_gradients(model, step):
    """The same gradients for every model built by tiny_model(), added to those kept from an even step."""
    g = torch.Generator().manual_seed(step)
    for name, p in model.named_parameters():
        if name != "embed.weight" or model.split_embed:
            grad = torch.randn(p.shape, generator=g).to(p.dtype)
            p.grad = grad if p.grad is None else p.grad + grad


def test_compiled_steps_follow_the_eager_ones_and_compile_nothing_after_the_first_even_and_odd_step():
    """#18 compiles its optimiser arithmetic; across the schedule (lr, momentum, Adam's bias correction and the
    untying all change) the compiled steps reuse the first two steps' graphs: recompile_limit 1 with failure on
    the limit proves R18Optimizers raises the limit to what the run needs, no more graphs prove no step
    recompiles (a per-step number reaching a graph as a constant would)."""
    import torch._dynamo.config as dynamo_config
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    with dynamo_config.patch(recompile_limit=1, fail_on_recompile_limit_hit=True):
        eager_model, compiled_model = tiny_model(), tiny_model()
        eager = R18Optimizers(eager_model, SCHEDULE)
        compiled = R18Optimizers(compiled_model, SCHEDULE, compiled=True, backend="aot_eager")
        graphs = []
        for step in range(SCHEDULE.num_iterations):
            for model, opts in ((eager_model, eager), (compiled_model, compiled)):
                random_gradients(model, step)
                opts.step(step)
            graphs.append(counters["stats"]["unique_graphs"])
            for (name, a), b in zip(eager_model.named_parameters(), compiled_model.parameters()):
                # bf16 parameters: a few units in the last place of the largest entry (1/128 each)
                scale = a.float().abs().max().clamp_min(1e-3)
                assert (a.float() - b.float()).abs().max() <= 4 * scale / 128, (step, name)
    assert graphs[0] > 0 and graphs[1] > graphs[0]  # NorMuon's functions at step 0, Adam's at step 1
    assert graphs[-1] == graphs[1], graphs
    assert SCHEDULE.split_step < SCHEDULE.num_iterations - 1 and compiled_model.split_embed


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_adam_update_with_0d_tensors_rounds_as_with_numbers(dtype):
    """The compiled path's form (0-d tensors: no addcmul value=) run eager gives the record's numbers bitwise."""
    g = torch.Generator().manual_seed(0)
    p, grad = (torch.randn(64, 32, generator=g).to(dtype) for _ in range(2))
    moments = [torch.randn(64, 32, generator=g).abs().bfloat16() for _ in range(2)]
    step_size, decay = 0.004 * 1.52 * (0.05 ** 0.5 / 0.2), 3e-3  # a decay large enough to show in bf16
    with_numbers = [t.clone() for t in (p, grad, *moments)]
    with_tensors = [t.clone() for t in (p, grad, *moments)]
    adam_update_(*with_numbers, 0.8, 0.95, 1e-8, step_size, decay)
    adam_update_(*with_tensors, 0.8, 0.95, 1e-8, torch.tensor(step_size), torch.tensor(decay))
    for a, b in zip(with_numbers, with_tensors):
        assert torch.equal(a, b)
    assert not torch.equal(with_numbers[0], p)
