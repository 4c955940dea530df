"""Track-independent pieces of a training loop: the gradient step, the validation pass, the kernel warm-up
skeleton and the step / scalars / peak-memory log lines."""

import copy
import json

import torch
import torch.distributed as dist

from speedrun.data import VIRTUAL_RANKS, TokenStream, find_shards
from speedrun.distributed import Dist, sync_gradients


def train_step(model, batches, window, ddp: Dist, reducer=None):
    """Forward and backward of every micro-batch. With a GradientReducer the gradient averages are launched during
    the last backward and left in flight for the optimisers to wait on; without one they are done on return."""
    for i, (inputs, targets) in enumerate(batches):
        loss = model(inputs.to(ddp.device), targets.to(ddp.device), window)  # no-ops for stream batches
        if reducer is not None and i == len(batches) - 1:
            reducer.arm()
        (loss / len(batches)).backward()
    if reducer is None:
        sync_gradients(model, ddp)
    else:
        reducer.finish_backward()


@torch.no_grad()
def validate(model, args, ddp: Dist, window, **forward_kwargs):
    """Mean validation loss over args.val_tokens tokens of args.val_files, read from the start."""
    model.eval()
    stream = TokenStream(find_shards(args.val_files, "--val-files"), args.val_seq_len, "--val-files", ddp.device)
    steps = args.val_tokens // (VIRTUAL_RANKS * args.val_seq_len)
    total = torch.zeros((), device=ddp.device, dtype=torch.float32)
    for _ in range(steps):
        for inputs, targets in stream.next_batch(ddp.virtual_ranks):
            total += model(inputs, targets, window, **forward_kwargs).float()
    if ddp.world_size > 1:
        dist.all_reduce(total)
    model.train()
    return (total / (steps * VIRTUAL_RANKS)).item()


def kernel_warmup(steps, model, opt, take_step):
    """Runs take_step(i) for i < steps (untimed: compiles the kernels), then restores the model's and the
    optimisers' state exactly as it was. `opt` has state_dict(gather_muon) / load_state_dict."""
    saved_model = copy.deepcopy(model.state_dict())
    saved_opt = copy.deepcopy(opt.state_dict(lambda local_muon_state: local_muon_state))
    for i in range(steps):
        take_step(i)
    model.load_state_dict(saved_model)
    opt.load_state_dict(saved_opt)


def log_validation(log, step, num_iterations, val_loss, train_ms, scalars, decimals=6):
    log.write(f"step:{step}/{num_iterations} val_loss:{val_loss:.{decimals}f} train_time:{train_ms:.0f}ms "
              f"step_avg:{train_ms / max(step, 1):.2f}ms", keep=True)
    log.write(f"step:{step}/{num_iterations} scalars: {json.dumps(scalars)}", echo=False, keep=True)


def log_train_step(log, steps_done, num_iterations, elapsed_ms):
    log.write(f"step:{steps_done}/{num_iterations} train_time:{elapsed_ms:.0f}ms "
              f"step_avg:{elapsed_ms / steps_done:.2f}ms", echo=False, keep=True)


def peak_memory_line(ddp: Dist):
    """The log's last line (a log without it is an unfinished run)."""
    if ddp.device.type == "cuda":
        alloc = torch.cuda.max_memory_allocated() // 1024 // 1024
        reserved = torch.cuda.max_memory_reserved() // 1024 // 1024
    else:  # CPU: no allocator statistics; the process's peak resident memory stands in for both
        import resource
        alloc = reserved = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    return f"peak memory allocated: {alloc} MiB reserved: {reserved} MiB"
