"""Issue 12: gradient averages launched from backward hooks, asynchronous Muon gathers, multi-tensor Snoo - and
the trajectories of world sizes 1 and 2 bitwise equal to the implementation before (flat all-reduce after the
backward, blocking gathers, per-parameter Snoo loop).

Bitwise is the right bar: a 2-rank SUM is a+b whichever way the bytes travel, the division by the world size and
every optimiser formula are the same element-wise operations, and on CPU torch's multi-tensor (_foreach) ops and
per-group Adam steps run the same per-tensor kernels as before."""
import json

import pytest
import torch
import torch.distributed as dist

from conftest import ROOT, run_training
from speedrun.distributed import GradientReducer

DRIVER = ROOT / "tests" / "trajectory_driver.py"
REFERENCE = json.loads((ROOT / "tests" / "data" / "trajectory_reference.json").read_text())["configs"]
STEPS = 7


def trajectory(config, nproc):
    res = run_training([str(STEPS), *REFERENCE[config]["flags"]], nproc=nproc, script=DRIVER, timeout=300)
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("config", sorted(REFERENCE))
def test_world_size_1_trajectory_is_bitwise_the_previous_one(config):
    assert trajectory(config, 1) == REFERENCE[config]["ws1"]


@pytest.mark.slow
@pytest.mark.parametrize("config", sorted(REFERENCE))
def test_world_size_2_trajectory_is_bitwise_the_previous_one(config):
    # bf16-mixed-muon: Muon groups of mixed sizes (broadcasts) and bf16 masters (Snoo gathers the low bits).
    assert trajectory(config, 2) == REFERENCE[config]["ws2"]


@pytest.fixture
def one_rank_group():
    """A real gloo process group of one rank: collectives run (as identities), so hooks and waits can be seen."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_reductions_launch_during_the_last_backward_only(one_rank_group):
    first, last = torch.nn.Linear(4, 4), torch.nn.Linear(4, 1)
    params = list(first.parameters()) + list(last.parameters())
    reducer = GradientReducer(params, world_size=2)  # divides by 2: the group has one rank, the sum is the grad
    x = torch.randn(3, 4, requires_grad=True)
    launched_when_input_grad_computed = []
    x.register_hook(lambda g: launched_when_input_grad_computed.append(len(reducer.pending)))

    last(first(x)).sum().backward()  # an earlier micro-step: accumulate only
    assert not reducer.pending
    reducer.arm()
    last(first(x)).sum().backward()
    # the last layer's averages were in flight before the backward reached the first layer's input
    assert launched_when_input_grad_computed[-1] >= 2
    reducer.finish_backward()
    accumulated = [p.grad.clone() for p in params]
    reducer.wait([params[0]])
    assert torch.equal(params[0].grad, accumulated[0] / 2) and len(reducer.pending) == len(params) - 1
    reducer.wait_all()
    assert not reducer.pending
    assert all(torch.equal(p.grad, g / 2) for p, g in zip(params, accumulated))
    last(first(x)).sum().backward()  # finish_backward disarmed the hooks
    assert not reducer.pending


def test_muon_matrices_are_reduced_to_their_owner_only_and_the_rest_to_every_rank(one_rank_group, tiny_data_args,
                                                                                 monkeypatch):
    """Only a matrix's Muon owner reads its gradient: a reduce to that rank moves half an all-reduce's bytes."""
    import train_gpt_medium as T
    from speedrun import distributed

    class Done:
        def wait(self):
            pass

    calls = {}  # id(gradient) -> "all" (all-reduce) or the destination rank (reduce)

    def all_reduce(tensor, op, async_op):
        calls[id(tensor)] = "all"
        return Done()

    def reduce(tensor, dst, op, async_op):
        calls[id(tensor)] = dst
        return Done()

    monkeypatch.setattr(distributed.dist, "all_reduce", all_reduce)
    monkeypatch.setattr(distributed.dist, "reduce", reduce)
    args = T.resolve_args(tiny_data_args)
    model = T.GPT(T.model_config(args), max_seq_len=args.train_seq_len)
    opt = T.Optimizers(model, 0, 2, fused_adam=False, ns_dtype=torch.float32)  # rank 0 of 2
    inputs, targets = torch.randint(0, 50257, (2, args.train_seq_len))
    T.train_step(model, [(inputs, targets)], torch.tensor(2), T.Dist(), opt.reducer)
    matrices = [p for p, _ in model.matrix_params()]
    owners = {opt.muon.owner(p) for p in matrices}
    assert owners == {0, 1}  # both ranks own matrices, so both kinds of destination are exercised
    assert {calls[id(p.grad)] for p in matrices} == owners
    assert all(calls[id(p.grad)] == opt.muon.owner(p) for p in matrices)
    matrix_ids = {id(p) for p in matrices}
    assert all(calls[id(p.grad)] == "all" for p in model.parameters() if id(p) not in matrix_ids)


# --- exposed communication from profiler intervals ---------------------------------------------------------------

def test_exposed_time_counts_only_communication_no_compute_covers():
    from speedrun.profiling import exposed_time
    # comm 0-10 and 8-14 (union 0-14); compute covers 2-5 and 12-20: exposed 0-2, 5-12 = 9
    assert exposed_time([(0, 10), (8, 14)], [(2, 5), (12, 20), (3, 4)]) == 9
    assert exposed_time([(0, 10)], []) == 10
    assert exposed_time([], [(0, 10)]) == 0
    assert exposed_time([(1, 3)], [(0, 10)]) == 0
