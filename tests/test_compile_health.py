"""`--compile on` of the tiny model (inductor's CPU backend), trained as the script trains it - gradient averages
launched from parameter hooks included - has no graph break and compiles exactly twice: the training graph and,
once, validation's no-grad graph. Asserted on dynamo's counters, so a future graph break or recompile fails here."""
import pytest
import torch
import torch.distributed as dist
from torch._dynamo.utils import counters

import train_gpt_medium as T
from speedrun.data import TokenStream, find_shards
from speedrun.distributed import GradientReducer
from speedrun.training import validate

STUDY_COMBINATION = ["--backout-layers", "3", "--laurel", "rw+lr", "--laurel-rank", "4"]


@pytest.fixture
def one_rank_group():
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], STUDY_COMBINATION], ids=["baseline", "backout+laurel"])
def test_compiled_training_has_no_graph_break_and_one_recompile(flags, tiny_data_args, one_rank_group):
    args = T.resolve_args(tiny_data_args + ["--val-tokens", "1024", *flags])
    ddp = T.Dist()
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=max(args.train_seq_len, args.val_seq_len))
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    # Hooks as on 2 ranks (the one-rank group's sums are identities), so the compiled graph sees them too.
    opt.reducer = GradientReducer(model.parameters(), world_size=2)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, dynamic=False)
    stream = TokenStream(find_shards(args.train_files, "x"), args.train_seq_len, "x")
    for step in range(3):
        window = torch.tensor(T.window_blocks_at(step * 10, args.num_iterations, model.cfg))  # windows vary
        T.train_step(compiled, stream.next_batch(ddp.virtual_ranks)[:1], window, ddp, opt.reducer)
        opt.step(step, args.num_iterations)
        if step == 1:
            validate(compiled, args, ddp, window, head_chunks=T.VAL_HEAD_CHUNKS)
    assert dict(counters["graph_break"]) == {}
    assert counters["frames"]["total"] == 2 and counters["stats"]["unique_graphs"] == 2, dict(counters["frames"])


@pytest.mark.slow
def test_compiled_muon_compiles_once_per_shape_and_follows_the_eager_update():
    from speedrun.muon import Muon

    def trained(compile_update, steps=4):
        torch.manual_seed(0)
        params = [torch.nn.Parameter(torch.randn(16, 8)), torch.nn.Parameter(torch.randn(8, 16))]
        muon = Muon([(p, 1.0) for p in params], lr=0.03, weight_decay=0.01, momentum=0.85,
                    ns_dtype=torch.float32, compile_update=compile_update)
        gen = torch.Generator().manual_seed(1)
        frames = []
        for step in range(steps):  # lr and momentum change every step, as in the cooldown and the warm-up
            muon.param_groups[0].update(lr=0.03 * (1 - 0.1 * step), momentum=0.85 + 0.02 * step)
            for p in params:
                p.grad = torch.randn(p.shape, generator=gen)
            muon.step()
            frames.append(counters["frames"]["total"])
        return params, frames

    torch._dynamo.reset()
    counters.clear()
    compiled, frames = trained(True)
    assert dict(counters["graph_break"]) == {}
    assert frames == [2] * len(frames), frames  # one graph per shape; the changing lr and momentum compile nothing
    # Fused elementwise kernels round differently from eager ones: fp32 rounding, amplified at most a little by NS5.
    for c, e in zip(compiled, trained(False)[0]):
        torch.testing.assert_close(c, e, rtol=1e-4, atol=1e-5)
