"""Process-group setup and the per-step gradient average."""

import ctypes
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from speedrun.data import VIRTUAL_RANKS
from speedrun.errors import ReportedByAnotherRank, UsageError


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def grad_accum(self):
        return VIRTUAL_RANKS // self.world_size

    @property
    def virtual_ranks(self):
        return [self.rank * self.grad_accum + j for j in range(self.grad_accum)]

    def barrier(self):
        if self.world_size > 1:
            dist.barrier()

    def agree(self, problem=None):
        """A barrier that also ends every rank when any has a `problem` (one line): the lowest such rank raises it
        as a UsageError, the others end quietly, so a run under torchrun prints one line, not one per rank, and no
        rank is left waiting on a collective the failed one never joins."""
        if self.world_size == 1:
            if problem is not None:
                raise UsageError(problem)
            return
        failed = torch.zeros(self.world_size, device=self.device)
        failed[self.rank] = problem is not None
        dist.all_reduce(failed)
        if not failed.any():
            return
        if problem is not None and self.rank == int(failed.nonzero()[0]):
            raise UsageError(problem)
        raise ReportedByAnotherRank()


def setup_distributed():
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if VIRTUAL_RANKS % world_size:
        raise UsageError(f"world size {world_size} does not divide {VIRTUAL_RANKS}: use 1, 2, 4 or 8 processes")
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if torch.cuda.is_available():
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        backend = "nccl"
    else:
        device, backend = torch.device("cpu"), "gloo"
        keep_freed_memory_mapped()
    if world_size > 1:
        dist.init_process_group(backend=backend, device_id=device if backend == "nccl" else None)
    return Dist(rank, world_size, local_rank, device)


def keep_freed_memory_mapped():
    """CPU runs free and allocate blocks of tens of MB at every micro-step (logits over the 50k vocabulary, dense
    embedding gradients). glibc hands such blocks back to the kernel when freed (mmap threshold, heap trimming),
    so each new one pays page faults on every page: most of a tiny-preset step. Keep them in the heap (glibc only;
    elsewhere nothing changes)."""
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's upper limit for this setting
    libc.mallopt(m_trim_threshold, 2**30)


class GradientReducer:
    """Averages gradients across ranks with one asynchronous all-reduce per parameter, or a reduce to the one rank
    that reads it (`owners`: Muon's matrices) (NCCL: AVG inside the collective; gloo, which has no AVG: SUM, then
    divided by the world size), launched as soon as that gradient is final, i.e. from a post-accumulate-grad hook
    during the backward of the last micro-step (`arm()` before it).
    Nothing is concatenated or copied back: each reduction works in place on p.grad. `wait(params)` makes given
    averages ready; on CUDA it only makes the current stream wait for the collective (no host sync), so an
    optimiser can step a parameter as soon as its reduction is done while later ones are still in flight.

    Why hooks, and what they overlap with under torch.compile: AOTAutograd turns the backward of a compiled graph
    into one autograd node, and the autograd engine runs the parameters' AccumulateGrad nodes, and so these hooks,
    only once that node has been run (its kernels launched). On CUDA an NCCL collective waits for every kernel
    launched before it on the compute stream, so with a whole-model compile the reductions overlap the optimiser
    (Adam's steps, Muon's Newton-Schulz of earlier matrices) and each other, not the backward. Each graph break or
    separately compiled region (--compile regional) ends an autograd node: a parameter's reduction then starts
    when its region's backward has been launched and overlaps the backward of the regions before it; eager runs
    (and gloo on CPU, which reduces on its own thread) overlap from the first parameter on. Upstream's later
    records register the same per-parameter hooks on their whole-model compiled graph. The hooks are registered
    once and cost nothing while not armed (earlier micro-steps only accumulate)."""

    def __init__(self, params, world_size, hooks=True, owners=None, rank=0):
        self.params, self.world_size, self.rank = list(params), world_size, rank
        # id(p) -> the one rank that reads p's average (Muon's owner): reduced to it, not to every rank, which
        # halves the bytes an all-reduce moves. Other ranks' p.grad is left undefined until zeroed.
        self.owners = owners or {}
        self.pending = {}  # id(p) -> (p, work) of launched, not yet awaited reductions
        self.armed = False
        self.divide_after = world_size > 1 and dist.get_backend() != "nccl"
        self.op = dist.ReduceOp.SUM if self.divide_after else dist.ReduceOp.AVG
        if world_size > 1 and hooks:
            for p in self.params:
                if p.requires_grad:
                    p.register_post_accumulate_grad_hook(self._on_grad_final)

    def arm(self):
        """The next backward is the last micro-step's: launch each reduction from its hook."""
        self.armed = self.world_size > 1

    def _on_grad_final(self, p):
        if self.armed:
            self._launch(p)

    def _launch(self, p):
        if id(p) in self.pending:
            return
        owner = self.owners.get(id(p))
        work = (dist.all_reduce(p.grad, op=self.op, async_op=True) if owner is None else
                dist.reduce(p.grad, dst=owner, op=self.op, async_op=True))
        self.pending[id(p)] = (p, work)

    def finish_backward(self):
        """After the last backward: launches, in a fixed order, any reduction no hook started."""
        self.armed = False
        if self.world_size > 1:
            for p in self.params:
                if p.grad is not None:
                    self._launch(p)

    def wait(self, params):
        for p in params:
            entry = self.pending.pop(id(p), None)
            if entry is not None:
                entry[1].wait()
                if self.divide_after and self.owners.get(id(p), self.rank) == self.rank:
                    p.grad.div_(self.world_size)

    def wait_all(self):
        """Every launched reduction completes (the gradient buffers must not be freed while in flight)."""
        self.wait([p for p, _ in list(self.pending.values())])


def sync_gradients(model, ddp: Dist):
    """Averages every gradient across ranks after the backward, without overlap (for callers with no reducer)."""
    reducer = GradientReducer(model.parameters(), ddp.world_size, hooks=False)
    reducer.finish_backward()
    reducer.wait_all()


def gather_to_rank0(obj, ddp: Dist):
    if ddp.world_size == 1:
        return [obj]
    out = [None] * ddp.world_size
    dist.all_gather_object(out, obj)
    return out

