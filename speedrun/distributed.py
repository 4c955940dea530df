"""Process-group setup and the per-step gradient average."""

import atexit
import ctypes
import os
import sys
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


def exit_before_interpreter_teardown(code):
    """Ends a multi-rank run once its process group is destroyed: the exit handlers run, then the process exits
    without Python's finalisation. A gloo worker thread releases a finished collective's tensors on its own
    schedule, which takes the GIL; if that falls inside finalisation the thread is unwound and libstdc++ aborts
    the finished run ("terminate called without an active exception", SIGABRT: about 1 exit in 7 of a 2-rank CPU
    run on a loaded 2-core machine, core dump in ProcessGroupGloo::AsyncWork::~AsyncWork)."""
    atexit._run_exitfuncs()  # noqa: SLF001 (the handlers os._exit would skip: compile workers, caches)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


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


class ReductionBucket:
    """Gradients reduced by one launch of the GradientReducer, in its fixed place in the order. kind:
    "all": each gradient all-reduced (every rank reads it: scalars, study vectors);
    "owner": a Muon group, params[j] read by rank j only: one reduce-scatter of the group when it holds one matrix
      per rank of one size (else one reduce per matrix to its owner);
    "shard": Adam-sharded tensors: each gradient reduce-scattered, rank r keeps its slice (`shards[i]`, a view of
      params[i]'s r-th 1/world_size) and steps only that; the caller all-gathers the parameters afterwards."""

    def __init__(self, kind, params, rank=0, world_size=1):
        self.kind, self.params, self.rank, self.world_size = kind, list(params), rank, world_size
        self.shards = [shard_of(p, rank, world_size) for p in self.params] if kind == "shard" else None
        self.works, self.outputs, self.launched = [], [], False

    def launch(self, op):
        grads = [p.grad for p in self.params]
        present = [g is not None for g in grads]
        if self.kind == "all":
            self.works = [dist.all_reduce(g, op=op, async_op=True) for g in grads if g is not None]
        elif self.kind == "shard":
            self.outputs = [None if g is None else g.new_empty(g.numel() // self.world_size) for g in grads]
            self.works = [dist.reduce_scatter_tensor(out, g.reshape(-1), op=op, async_op=True)
                          for out, g in zip(self.outputs, grads) if g is not None]
        elif all(present) and len(grads) == self.world_size and len({(g.numel(), g.dtype) for g in grads}) == 1:
            self.outputs = [grads[self.rank].new_empty(grads[self.rank].numel())]
            self.works = [dist.reduce_scatter(self.outputs[0], [g.reshape(-1) for g in grads], op=op,
                                              async_op=True)]
        else:
            self.outputs = []
            self.works = [dist.reduce(g, dst=j, op=op, async_op=True) for j, g in enumerate(grads) if g is not None]
        self.launched = True

    def complete(self, divide_by):
        """Waits for the launch (if any) and puts each average where the optimiser reads it (divided by
        `divide_by` when the collective only summed)."""
        for work in self.works:
            work.wait()
        if self.kind == "shard":
            for p, shard, out in zip(self.params, self.shards, self.outputs or [None] * len(self.params)):
                if out is not None:
                    shard.grad = out
                elif shard is not p and p.grad is not None:  # not reduced: the local gradient's own slice
                    shard.grad = p.grad.reshape(-1)[slice_of(p, self.rank, self.world_size)]
            mine = [s.grad for s in self.shards if s.grad is not None]
        elif self.kind == "owner":
            own = self.params[self.rank] if self.rank < len(self.params) else None
            if own is not None and self.outputs:
                own.grad = self.outputs[0].view_as(own)
            mine = [own.grad] if own is not None and own.grad is not None else []
        else:
            mine = [p.grad for p in self.params if p.grad is not None]
        if divide_by != 1 and self.launched and mine:
            torch._foreach_div_(mine, divide_by)
        self.works, self.outputs, self.launched = [], [], False


def slice_of(p, rank, world_size):
    n = p.numel() // world_size
    return slice(rank * n, (rank + 1) * n)


def can_shard(p, world_size):
    return p.numel() % world_size == 0


def shard_of(p, rank, world_size):
    """Rank `rank`'s slice of p as a parameter sharing p's storage (an optimiser stepping it writes into p); p
    itself on one rank."""
    if world_size == 1:
        return p
    return torch.nn.Parameter(p.data.view(-1)[slice_of(p, rank, world_size)])


class GradientReducer:
    """Averages gradients across ranks in a fixed order of buckets (ReductionBucket), the same on every rank by
    construction: bucket k is launched only after buckets 0..k-1, never in the order autograd happens to finish
    the gradients. A bucket is launched as soon as its gradients and those of every bucket before it are final
    (post-accumulate-grad hooks during the last micro-step's backward, `arm()` before it); finish_backward()
    launches whatever is left, in the same order. NCCL averages inside the collective (AVG); gloo, which has no
    AVG, sums and the average is divided out on completion. Nothing is concatenated or copied back.
    `wait(params)` completes the buckets holding params; on CUDA a wait only makes the current stream wait for
    the collective (no host sync), so an optimiser steps a bucket while later ones are in flight.

    Why hooks, and what they overlap with under torch.compile: AOTAutograd turns the backward of a compiled graph
    into one autograd node, and the autograd engine runs the parameters' AccumulateGrad nodes, and so these hooks,
    only once that node has been run (its kernels launched). On CUDA an NCCL collective waits for every kernel
    launched before it on the compute stream, so with a whole-model compile the reductions overlap the optimiser
    and each other, not the backward. Each separately compiled region (--compile regional) ends an autograd node:
    a bucket then starts when its region's backward has been launched and overlaps the backward of the regions
    before it; eager runs (and gloo on CPU, which reduces on its own thread) overlap from the first bucket on.
    The hooks are registered once and cost nothing while not armed (earlier micro-steps only accumulate)."""

    def __init__(self, buckets, world_size, hooks=True):
        self.buckets, self.world_size = list(buckets), world_size
        self.bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.final = set()  # id(p) of gradients final in this backward
        self.next_launch = 0  # index of the first bucket not yet launched in this step
        self.armed = False
        self.divide_by = world_size if world_size > 1 and dist.get_backend() != "nccl" else 1
        self.op = dist.ReduceOp.SUM if self.divide_by != 1 else dist.ReduceOp.AVG
        if world_size > 1 and hooks:
            for b in self.buckets:
                for p in b.params:
                    if p.requires_grad:
                        p.register_post_accumulate_grad_hook(self._on_grad_final)

    @classmethod
    def per_parameter(cls, params, world_size, hooks=True):
        """Every gradient all-reduced on its own, in the given order (callers without optimiser buckets)."""
        return cls([ReductionBucket("all", [p]) for p in params], world_size, hooks)

    def arm(self):
        """The next backward is the last micro-step's: launch the buckets from the hooks."""
        self.armed = self.world_size > 1

    def _on_grad_final(self, p):
        if self.armed:
            self.final.add(id(p))
            while self.next_launch < len(self.buckets) and all(
                    id(q) in self.final for q in self.buckets[self.next_launch].params if q.requires_grad):
                self._launch_next()

    def _launch_next(self):
        self.buckets[self.next_launch].launch(self.op)
        self.next_launch += 1

    def finish_backward(self):
        """After the last backward: launches, in the fixed order, every bucket no hook started."""
        self.armed = False
        if self.world_size > 1:
            while self.next_launch < len(self.buckets):
                self._launch_next()
        self.final.clear()
        self.next_launch = 0

    def wait(self, params):
        for b in dict.fromkeys(self.bucket_of[id(p)] for p in params if id(p) in self.bucket_of):
            b.complete(self.divide_by)

    def wait_all(self):
        """Every launched reduction completes (the gradient buffers must not be freed while in flight)."""
        for b in self.buckets:
            if b.launched:
                b.complete(self.divide_by)


def sync_gradients(model, proc: Dist):
    """Averages every gradient across ranks after the backward, without overlap (for callers with no reducer)."""
    reducer = GradientReducer.per_parameter(model.parameters(), proc.world_size, hooks=False)
    reducer.finish_backward()
    reducer.wait_all()


def gather_to_rank0(obj, proc: Dist):
    if proc.world_size == 1:
        return [obj]
    out = [None] * proc.world_size
    dist.all_gather_object(out, obj)
    return out

