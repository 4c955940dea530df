"""Properties of compiled training the compile matrix (test_compile_matrix.py: no graph break, two graphs under
`--compile on`, nothing new after the first step and validation, eager losses, per arm) does not check, under
inductor's CPU backend: `--compile regional` computes eager's losses and gradients, still launches the gradient
averages during the backward (as the whole-model compile does), takes a new FlexAttention block mask each step
without recompiling, keeps LAuReL-PA's k inputs; compiled Muon compiles once per shape; DLO's validation routes any
token count through one graph."""
import pytest
import torch
from torch._dynamo.utils import counters

import train_gpt_medium as T
from speedrun.data import TokenStream, find_shards
from speedrun.distributed import GradientReducer
from speedrun.layers import flex_block_masks
from speedrun.training import validate

from test_compile_matrix import COMPOSED_UNDER_INDUCTOR

# Backout (a linear transform) and every LAuReL form composed in one model: the composition whose whole-model and
# regional compiles (no graph break, two graphs, nothing new in steady state, eager losses) are the compile
# matrix's cell inductor:train_gpt_medium:backout+laurel.
STUDY_COMBINATION = COMPOSED_UNDER_INDUCTOR["train_gpt_medium:backout+laurel"]


def compiled(model, regional):
    """The model as the script trains it under --compile regional (True) or on (False)."""
    if regional:
        model.compile_regions()
        return model
    return model.compile_whole()


def compiled_training(args, flags, regional, steps=3, watch=None):
    """Trains the tiny model for `steps` steps as the script does (hooks as on 2 ranks, so the compiled graphs see
    them; the one-rank group's sums are identities), validating after step 1 and at the end. regional: None eager,
    False whole-model compile, True compile_regions. Returns the model, the validation losses and the
    frame-compile count after each step. watch(model, reducer) runs before compilation."""
    args = T.resolve_args(args + ["--val-tokens", "1024", *flags])
    proc = T.Dist()
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=max(args.train_seq_len, args.val_seq_len))
    opt = T.Optimizers(model, 0, 1, fused_adam=False, ns_dtype=torch.float32)
    opt.reducer = GradientReducer.per_parameter(model.parameters(), world_size=2)
    if watch is not None:
        watch(model, opt.reducer)
    torch._dynamo.reset()
    counters.clear()
    train_model = model if regional is None else compiled(model, regional)
    stream = TokenStream(find_shards(args.train_files, "x"), args.train_seq_len, "x")
    val_losses, frames = [], []
    for step in range(steps):
        window = torch.tensor(T.window_blocks_at(step * 10, args.num_iterations, model.cfg))  # windows vary
        T.train_step(train_model, stream.next_batch(proc.virtual_ranks)[:1], window, proc, opt.reducer)
        opt.step(step, args.num_iterations)
        if step == 1 or step == steps - 1:
            val_losses.append(validate(train_model, args, proc, window, T.VAL_HEAD_CHUNKS))
        frames.append(counters["frames"]["total"])
    return model, val_losses, frames


@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.parametrize("flags", [[], STUDY_COMBINATION], ids=["baseline", "backout+laurel"])
def test_regional_compile_computes_eager_losses_and_gradients(flags, tiny_data_args, one_rank_group):
    """From the state two real training steps reach, one training forward and backward and one validation forward
    of the regions agree with eager to fp32 rounding (measured: gradients within ~1e-6 relative). A whole
    trajectory is no test of this at the real init: a 1e-7 relative nudge of the scalars moves the validation loss
    after two steps by 1e-3, because Adam turns the rounding noise of still-zero gradients (embed2 behind its
    zero-initialised lambda) into full lr steps."""
    trained, _, _ = compiled_training(tiny_data_args, flags, regional=None, steps=2)
    args = T.resolve_args(tiny_data_args + flags)
    regional = T.GPT(T.model_config(args), max_seq_len=max(args.train_seq_len, args.val_seq_len))
    regional.load_state_dict(trained.state_dict())
    trained.zero_grad(set_to_none=True)
    torch._dynamo.reset()
    regional.compile_regions()
    stream = TokenStream(find_shards(args.train_files, "x"), args.train_seq_len, "x")
    inputs, targets = stream.next_batch(T.Dist().virtual_ranks)[0]
    window = torch.tensor(T.window_blocks_at(20, args.num_iterations, trained.cfg))
    losses = []
    for model in (trained, regional):
        loss = model(inputs, targets, window)
        loss.backward()
        model.eval()
        with torch.no_grad():
            losses.append([loss.item(), model(inputs, targets, window, head_chunks=T.VAL_HEAD_CHUNKS).item()])
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-5, atol=0)
    for (name, p), q in zip(regional.named_parameters(), trained.parameters()):
        assert (p.grad - q.grad).norm() <= 1e-4 * q.grad.norm(), name


def backward_nodes_of_compiled_graphs(loss):
    """The autograd nodes in loss's graph that run a compiled graph's backward (the graph walked from the loss)."""
    found, seen, frontier = [], set(), [loss.grad_fn]
    while frontier:
        node = frontier.pop(0)
        if node is None or node in seen:
            continue
        seen.add(node)
        if "CompiledFunction" in type(node).__name__:
            found.append(node)
        frontier += [next_node for next_node, _ in node.next_functions]
    return found


@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.parametrize("regional", [True, False], ids=["regional", "whole-model"])
def test_regional_compile_launches_averages_while_the_backward_still_runs(regional, tiny_data_args,
                                                                         one_rank_group):
    """The point of regional compilation: the head's and each block's gradient averages start while the backward
    of the blocks below is still to run. A whole-model graph is one backward node: every average starts after it
    (asserted too, so this test tells the two apart)."""
    args = T.resolve_args(tiny_data_args)
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=args.train_seq_len)
    opt = T.Optimizers(model, 0, 2, fused_adam=False, ns_dtype=torch.float32)  # rank 0 of 2: hooks armed
    reducer = opt.reducer
    names = {id(p): n for n, p in model.named_parameters()}
    events = []

    def record_launch():  # the launch order and time only: no collective (the group has one rank)
        events.extend(names[id(p)] for p in reducer.buckets[reducer.next_launch].params)
        reducer.next_launch += 1
    reducer._launch_next = record_launch
    torch._dynamo.reset()
    train_model = compiled(model, regional)
    stream = TokenStream(find_shards(args.train_files, "x"), args.train_seq_len, "x")
    inputs, targets = stream.next_batch(T.Dist().virtual_ranks)[0]
    loss = train_model(inputs, targets, torch.tensor(T.window_blocks_at(0, args.num_iterations, model.cfg)))
    nodes = backward_nodes_of_compiled_graphs(loss)
    for k, node in enumerate(nodes):
        node.register_prehook(lambda grads, k=k: events.append(f"compiled backward {k}"))
    reducer.arm()
    loss.backward()
    reducer.finish_backward()
    reducer.wait_all()
    region_events = {f"compiled backward {k}" for k in range(len(nodes))}
    last_region = max(i for i, event in enumerate(events) if event in region_events)  # the first block's, if regional
    launched_before = set(events[:last_region]) - region_events
    if regional:  # the head and every block are regions: all but the first block's average start before it
        assert len(nodes) == len(model.blocks) + 1, events
        assert "lm_head_w" in launched_before
        # a Muon group (one collective) goes when all its matrices are final: those grouped with block 0's wait
        first_block = {id(p) for p in model.blocks[0].parameters()}
        early = [q for group in opt.muon.groups if not any(id(q) in first_block for q in group) for q in group]
        assert len(early) >= len(opt.muon.groups) - 2
        assert {names[id(q)] for q in early} <= launched_before, events
    else:
        assert len(nodes) == 1 and launched_before == set(), events


@pytest.mark.slow
@pytest.mark.own_process
def test_regional_compile_takes_a_new_flex_block_mask_each_step_without_recompiling(tiny_data_args, monkeypatch):
    """On CUDA the regions receive FlexAttention BlockMasks built eagerly each step (new tensors, a new mask_mod
    closure); a guard on either would recompile every step. CPU FlexAttention has no backward, so this runs the
    no-grad forward, with the CUDA masks, against the dense-mask eager model."""
    args = T.resolve_args(tiny_data_args)
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=args.train_seq_len).eval()
    stream = TokenStream(find_shards(args.train_files, "x"), args.train_seq_len, "x")
    batches = [stream.next_batch(T.Dist().virtual_ranks)[0] for _ in range(3)]
    window = torch.tensor(T.window_blocks_at(0, args.num_iterations, model.cfg))
    with torch.no_grad():
        dense = [model(inputs, targets, window).item() for inputs, targets in batches]
        torch._dynamo.reset()
        counters.clear()
        model.compile_regions()
        bs = model.cfg.block_size
        monkeypatch.setattr(model, "masks", lambda seq, w: tuple(flex_block_masks(seq, [w, (w // 2).clamp_min(1)],
                                                                                  bs)))
        flex, frames = [], []
        for inputs, targets in batches:
            flex.append(model(inputs, targets, window).item())
            frames.append(counters["frames"]["total"])
    assert frames[0] == frames[-1], frames
    assert dict(counters["graph_break"]) == {}
    torch.testing.assert_close(flex, dense, rtol=1e-5, atol=0)  # fp32 attention either way: rounding only


@pytest.mark.slow
@pytest.mark.own_process
def test_compiled_muon_compiles_once_per_shape_and_follows_the_eager_update():
    """Guards: Muon's compiled update compiles one graph per shape whatever lr and momentum do, and tracks eager's."""
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


@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.parametrize("flags", [["--laurel", "rw+pa", "--laurel-where", "both", "--laurel-k", "3"],
                                   ["--laurel", "rw+lr+pa", "--laurel-rank", "4", "--laurel-k", "2"]],
                         ids=["rw+pa-both-k3", "rw+lr+pa-k2"])
def test_regional_compile_of_laurel_pa_keeps_k_inputs_and_computes_the_eager_loss(flags, tiny_data_args):
    """The PA history travels through every compiled block: the sites after the k-th must see exactly k inputs
    (a bounded deque mutated inside a trace outgrew its bound: IndexError on gamma, or wrong sums)."""
    args = T.resolve_args(tiny_data_args + flags)
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=args.train_seq_len)
    with torch.no_grad():  # away from the init, where every gamma term and product is zero
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    stream = TokenStream(find_shards(args.train_files, "x"), args.train_seq_len, "x")
    inputs, targets = stream.next_batch(T.Dist().virtual_ranks)[0]
    window = torch.tensor(2)
    eager = model(inputs, targets, window)
    eager_grads = torch.autograd.grad(eager, list(model.parameters()))
    torch._dynamo.reset()
    counters.clear()
    model.compile_regions()
    regional = model(inputs, targets, window)
    regional_grads = torch.autograd.grad(regional, list(model.parameters()))
    assert dict(counters["graph_break"]) == {}
    torch.testing.assert_close(regional.item(), eager.item(), rtol=1e-5, atol=0)
    for (name, _), g, e in zip(model.named_parameters(), regional_grads, eager_grads):
        assert (g - e).norm() <= 1e-4 * e.norm() + 1e-12, name


@pytest.mark.slow
@pytest.mark.own_process
@pytest.mark.parametrize("regional", [True, False], ids=["regional", "whole-model"])
def test_dlo_validation_routes_any_token_count_through_one_compiled_graph(regional, shard_dir, tmp_path):
    """DLO's validation sends a data-dependent number of tokens through each MLP. Compiled, every count must reuse
    one graph (regional: a fixed-shape MLP recompiled per count until the recompile limit ended the run; whole
    model: a graph break at the nonzero), and the losses and per-layer counts must be eager's."""
    from test_dlo import data_flags, write_checkpoint
    from speedrun.checkpoint import load_checkpoint
    from speedrun.dlo import dlo_expand_from_checkpoint

    ckpt = write_checkpoint(tmp_path / "base.pt", 6, shard_dir)
    args = T.resolve_args(["--preset", "tiny", *data_flags(shard_dir), "--init-from", str(ckpt), "--dlo-groups", "2",
                           "--dlo-sparsity", "0.3", "--dlo-router-init", "uniform"])  # uniform: gates vary
    torch.manual_seed(0)
    model = T.GPT(T.model_config(args), max_seq_len=args.val_seq_len)
    dlo_expand_from_checkpoint(model, load_checkpoint(ckpt), args, args.val_seq_len)
    model.eval()
    stream = TokenStream(find_shards(args.val_files, "x"), args.val_seq_len, "x")
    batches = [stream.next_batch(T.Dist().virtual_ranks)[0] for _ in range(6)]
    routers = model.study["dlo"]

    def losses_and_counts(run_model, batches):
        out = []
        with torch.no_grad():
            for inputs, targets in batches:
                routers.val_active.zero_()
                out.append((run_model(inputs, targets, torch.tensor(2)).item(), routers.val_active.tolist()))
        return out

    eager = losses_and_counts(model, batches)
    assert len({tuple(counts) for _, counts in eager}) == len(batches)  # the counts do vary
    torch._dynamo.reset()
    counters.clear()
    compiled_model = compiled(model, regional)
    first = losses_and_counts(compiled_model, batches[:1])
    frames = counters["frames"]["total"]
    rest = losses_and_counts(compiled_model, batches[1:])
    assert counters["frames"]["total"] == frames and dict(counters["graph_break"]) == {}
    assert [counts for _, counts in first + rest] == [counts for _, counts in eager]
    torch.testing.assert_close([loss for loss, _ in first + rest], [loss for loss, _ in eager], rtol=1e-5, atol=0)
