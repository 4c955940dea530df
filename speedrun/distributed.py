"""Process-group setup and the per-step gradient average."""

import ctypes
import os
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from speedrun.data import VIRTUAL_RANKS
from speedrun.errors import UsageError


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


def sync_gradients(model, ddp: Dist):
    """Averages gradients across ranks: one flat all-reduce per dtype (SUM then divide: gloo has no AVG)."""
    if ddp.world_size == 1:
        return
    by_dtype = {}
    for p in model.parameters():
        if p.grad is not None:
            by_dtype.setdefault(p.grad.dtype, []).append(p.grad)
    pending = []
    for grads in by_dtype.values():
        flat = torch.cat([g.reshape(-1) for g in grads])
        pending.append((grads, flat, dist.all_reduce(flat, async_op=True)))
    for grads, flat, handle in pending:
        handle.wait()
        flat /= ddp.world_size
        offset = 0
        for g in grads:
            g.copy_(flat[offset:offset + g.numel()].view_as(g))
            offset += g.numel()


def gather_to_rank0(obj, ddp: Dist):
    if ddp.world_size == 1:
        return [obj]
    out = [None] * ddp.world_size
    dist.all_gather_object(out, obj)
    return out

