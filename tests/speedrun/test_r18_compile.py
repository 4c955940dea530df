"""`--base r18 --compile on`: the whole model compiled for training and validation, the graphs the schedule meets
known in advance (speedrun.r18.train.compiled_graphs), warmed up before the clock and the state restored after,
and the run equal to the eager one. The compile matrix (test_compile_matrix.py) runs the r18 study arms under
AOTAutograd; here dynamo's own `eager` backend stands in for inductor (AOTAutograd costs ~20 s a graph of the
16-layer model on this CPU, dynamo alone ~3 s), which is where graph breaks and recompiles arise."""

import copy
import functools
import re
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch._dynamo.config as dynamo_config
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

import train_gpt_medium as T
import speedrun.r18.train as r18_train
import speedrun.training as training
from speedrun.distributed import Dist
from speedrun.errors import UsageError
from speedrun.r18.attention import varlen_attend
from speedrun.r18.model import R18Config, R18GPT
from speedrun.r18.optim import R18Optimizers
from speedrun.r18.data import BosAlignedStream
from speedrun.r18.train import (R18OptimizerState, Windows, compiled_graphs, r18_config, r18_schedule, training_graph,
                                training_loss, validation_graph)
from speedrun.training import check_data

VAL = re.compile(r"^step:(\d+)/\d+ val_loss:(\d+\.\d+) ")


def run_config(*flags):
    return T.resolve_args(["--preset", "tiny", "--base", "r18", *flags])


def test_compiled_graphs_are_the_first_step_of_each_shape_the_run_meets():
    # tiny preset, 4 steps: every step a new batch size / window / MTP count; split after step 1
    args = run_config("--num-iterations", "4", "--val-every", "2")
    schedule = r18_schedule(args)
    assert [schedule.batch_size(s) for s in range(4)] == [128, 512, 512, 512] and schedule.split_step == 1
    assert compiled_graphs(schedule, args, 0, 4) == {
        ("val", (1, 3), False): 0, ("train", 128, (1, 3), 3, False): 0, ("train", 512, (6, 13), 1, False): 1,
        ("val", (9, 19), True): 2, ("train", 512, (9, 19), 1, True): 2, ("train", 512, (11, 23), 1, True): 3,
        ("val", (11, 27), True): 4}  # the last validation's wider window
    # a resumed run that stops early compiles only what it still meets
    assert list(compiled_graphs(schedule, args, 3, 3)) == [("val", (11, 23), True)]


def test_the_record_schedule_compiles_every_step_it_meets_and_few_graphs():
    args = run_config("--preset", "full")
    # validation every 250 steps as #18 (r14: every 125, its record's)
    assert args.val_every == 250 and T.resolve_args(["--preset", "full"]).val_every == 125
    schedule = r18_schedule(args)
    N = args.num_iterations
    graphs = compiled_graphs(schedule, args, 0, N)
    assert {training_graph(schedule, s) for s in range(N)} | {
        validation_graph(schedule, s, N) for s in range(0, N + 1, 250)} | {validation_graph(schedule, N, N)} \
        == set(graphs)
    # training: the 9 twelfths where the batch or window grows (the MTP count changes with them) and the untying
    # step; validation: one per long window, the last one's wider
    assert sum(g[0] == "train" for g in graphs) == 10 and len(graphs) == 20


def test_compile_allows_exactly_the_run_s_graphs_and_fails_past_them(monkeypatch):
    monkeypatch.setattr(torch, "compile", lambda model, **kwargs: (model, kwargs))
    model = object()
    with dynamo_limits_kept(), dynamo_config.patch(recompile_limit=1, fail_on_recompile_limit_hit=False):
        assert r18_train.compile_r18(model, dict.fromkeys(range(23)), False, "cuda") == (
            model, dict(dynamic=False, fullgraph=True))
        assert dynamo_config.recompile_limit == 23 and dynamo_config.fail_on_recompile_limit_hit


@pytest.mark.parametrize("flags, message", [
    (["--compile", "regional"], "--compile regional: not on --base r18"),
    (["--warmup-steps", "3"], "--warmup-steps 3: --base r18 warms up one step per graph"),
])
def test_r18_refuses_what_it_cannot_do_in_one_line(flags, message):
    with pytest.raises(UsageError, match=message):
        run_config(*flags)
    assert run_config("--warmup-steps", "0", "--compile", "on").warmup_steps == 0


def test_optimizer_state_load_drops_muon_state_made_after_the_save():
    torch.manual_seed(0)
    model = R18GPT(R18Config(model_dim=32, num_heads=2, head_dim=16, vocab_size=200, block_size=8, max_seq_len=64))
    opts = R18Optimizers(model, r18_schedule(run_config("--num-iterations", "4")))
    state = R18OptimizerState(opts)
    saved = copy.deepcopy(state.state_dict())  # as kernel_warmup saves it (the state dict shares the tensors)
    for p in model.parameters():
        p.grad = torch.ones_like(p)
    opts.step(1)
    assert len(opts.muon.state) > 0
    state.load_state_dict(saved)
    assert len(opts.muon.state) == 0 and all(s["step"] == 0 for s in opts.adam.state.values())


@pytest.mark.own_process
def test_cpu_inductor_training_gradients_are_finite_and_equal_eager_s():
    """Guards: r18's bf16 training gradients through real CPU inductor code are finite and equal eager's."""
    # The bf16 model as runs build it, at its init. On an AVX-512 machine torch 2.13's 512-bit C++ code gave
    # non-finite and wrong MLP-projection gradients here; compile_r18 holds CPU inductor to 256-bit vectors.
    args = run_config("--num-iterations", "120")
    schedule = r18_schedule(args)
    torch.manual_seed(args.seed)
    model = R18GPT(r18_config(args), studies=args).cast_low_precision(torch.bfloat16)
    batch = next(iter(BosAlignedStream(check_data(args), "--train-files").micro_batches(schedule.batch_size(0), 0, 1)))
    mtp, windows = torch.tensor(schedule.mtp_weights(0)), Windows(model, schedule)

    def gradients(train_model):
        model.zero_grad(set_to_none=True)
        training_loss(train_model, batch, mtp, (windows.short, windows.long), "sdpa", Dist()).backward()
        return {name: p.grad.float() for name, p in model.named_parameters() if p.grad is not None}

    eager = gradients(model)
    with dynamo_limits_kept():
        compiled = gradients(r18_train.compile_r18(model, {}, False, "cpu"))
    assert compiled.keys() == eager.keys()
    for name, grad in eager.items():
        assert torch.isfinite(compiled[name]).all(), name
        # bf16 rounding apart (the zero-initialised gates' gradients are sums that cancel to rounding noise)
        assert (compiled[name] - grad).norm() <= 0.1 * grad.norm() + 1e-3, name


def dynamo_limits_kept():
    """A context after which the recompile limits a compiled run raises are what they were before."""
    return dynamo_config.patch({name: getattr(dynamo_config, name) for name in
                                ("recompile_limit", "accumulated_recompile_limit", "fail_on_recompile_limit_hit")})


def r18_run(args, monkeypatch):
    """`train_gpt_medium.py --base r18` with `args` in this process (run_r18, one rank); returns its validation
    losses by step, its config line, and how many graphs dynamo had compiled after the kernel warm-up (a list:
    empty when there was none) and at the end."""
    graphs_after_warmup, kernel_warmup = [], training.kernel_warmup  # the shared run loop's

    def counting_warmup(*warmup_args):
        kernel_warmup(*warmup_args)
        graphs_after_warmup.append(counters["stats"]["unique_graphs"])

    monkeypatch.setattr(training, "kernel_warmup", counting_warmup)
    torch._dynamo.reset()
    counters.clear()
    with dynamo_limits_kept():
        r18_train.run_r18(args, Dist(), T.__file__)
    lines = (Path(args.log_dir) / f"{args.run_name}.txt").read_text().splitlines()
    config = next(line for line in lines if line.startswith("config: "))
    losses = {int(m.group(1)): float(m.group(2)) for m in map(VAL.match, lines) if m}
    return losses, config, graphs_after_warmup, counters["stats"]["unique_graphs"]


@pytest.mark.slow
@pytest.mark.usefixtures("one_thread")
def test_compiled_study_run_warms_every_graph_up_then_equals_the_eager_run(tmp_path, monkeypatch):
    """Guards: an r18 LAuReL+backout run compiled (dynamo) makes every graph in its warm-up and matches eager."""
    # Both studies' parts in the graph (the matrix compiles the baseline and the LAuReL arms alone, no backout)
    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    args = run_config("--laurel", "rw+lr+pa", "--backout-layers", "10,embed", "--num-iterations", "4",
                      "--stop-after", "2", "--val-every", "0", "--log-dir", str(tmp_path))
    eager, eager_config, _, _ = r18_run(replace(args, compile="off", run_name="eager"), monkeypatch)
    compiled, config, graphs_after_warmup, graphs = r18_run(replace(args, compile="on", run_name="on"), monkeypatch)
    assert '"warmup_steps": 0' in eager_config and '"warmup_steps": 3' in config
    # steps 0 and 1 train at different batch sizes, windows and MTP counts (YaRN applied at step 1); the
    # validation at 2 runs with the embedding untied: three graphs of the model; they and the optimiser steps'
    # graphs (compiled as #18 compiles them) all compiled by the warm-up
    assert len(_debug_get_cache_entry_list(R18GPT.forward.__code__)) == 3
    assert graphs_after_warmup == [graphs] and graphs > 3
    assert dict(counters["graph_break"]) == {}
    assert sorted(compiled) == [2]
    # the warm-up's steps left no trace in the run; the compiled optimiser arithmetic rounds a little differently
    # (under dynamo, Adam's bf16 `exp_avg_sq.mul_(b2).addcmul_(g, g, value=1 - b2)` differs from eager by an ulp:
    # 2.8e-6 relative in this loss; a trace of the warm-up would be of the order of the steps' change, 1e-2)
    assert compiled == pytest.approx(eager, rel=1e-5)


@pytest.mark.slow
def test_flex_attention_traces_into_one_graph_and_equals_sdpa():
    """Guards: r18's flex document attention traces into one full graph and equals the SDPA path's output."""
    # The GPU's fallback attention, block mask and all, in a full graph (forward only: CPU flex has no backward)
    q, k, v = torch.randn(3, 64, 2, 16, generator=torch.Generator().manual_seed(0))
    cu_seqlens = torch.tensor([0, 10, 40, 64, 64], dtype=torch.int32)

    def attend(name):
        return varlen_attend(name, q, k, v, cu_seqlens, 64, 12, 0.3)

    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(attend, fullgraph=True, dynamic=False, backend="eager")("flex")
    assert counters["stats"]["unique_graphs"] == 1
    torch.testing.assert_close(compiled, attend("sdpa"))


@pytest.mark.parametrize("base, given, expected", [("r14", [], "on"), ("r18", [], "off"),
                                                   ("r18", ["--coordinate-descent-tuning", "on"], "on"),
                                                   ("r14", ["--coordinate-descent-tuning", "off"], "off")])
def test_coordinate_descent_tuning_defaults_to_each_base_s_record(base, given, expected, monkeypatch):
    """#14 was timed with it; #18 without (upstream banned it for new records: compiling takes ~30 min)."""
    import torch._inductor.config as inductor_config
    config = T.resolve_args(["--preset", "tiny", "--base", base, *given])
    assert config.coordinate_descent_tuning == expected
    if base == "r18":  # and compile_r18 sets inductor's flag from it
        monkeypatch.setattr(r18_train.torch, "compile", lambda model, **kw: model)
        before = inductor_config.coordinate_descent_tuning
        try:
            with dynamo_config.patch(fail_on_recompile_limit_hit=dynamo_config.fail_on_recompile_limit_hit):
                inductor_config.coordinate_descent_tuning = expected != "on"
                r18_train.compile_r18(torch.nn.Linear(1, 1), {}, config.coordinate_descent_tuning == "on", "cuda")
                assert inductor_config.coordinate_descent_tuning is (expected == "on")
        finally:
            inductor_config.coordinate_descent_tuning = before
