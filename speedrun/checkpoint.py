"""Checkpoints (model, optimisers with Muon's owner-sharded state merged, stream position, RNG, log lines) and
loading model weights."""

import os

import torch

from speedrun.distributed import gather_to_rank0
from speedrun.errors import UsageError


def merged_muon_state(local, ddp):
    merged = {}
    for part in gather_to_rank0({k: {n: t.cpu() for n, t in v.items()} for k, v in local.items()}, ddp):
        merged.update(part)
    return merged


def save_checkpoint(path, model, opt, stream, step, train_ms, args, log, ddp):
    state = dict(model={k: v.cpu() for k, v in model.state_dict().items()},
                 optimizers=opt.state_dict(lambda local: merged_muon_state(local, ddp)),
                 stream=stream.state(), step=step, train_ms=train_ms, config=vars(args),
                 rng=dict(cpu=torch.get_rng_state(),
                          cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None),
                 log_lines=list(log.lines))
    if ddp.rank == 0:
        tmp = f"{path}.tmp{os.getpid()}"
        torch.save(state, tmp)
        os.replace(tmp, path)
    ddp.barrier()


def load_checkpoint(path):
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # any unreadable file is bad input, named by its path
        raise UsageError(f"{path}: not a readable checkpoint ({type(e).__name__})")


def load_model_weights(model, state, path):
    own = model.state_dict()
    theirs = state.get("model", {}) if isinstance(state, dict) else {}
    mismatched = [k for k in own if k not in theirs or theirs[k].shape != own[k].shape]
    if mismatched or set(theirs) - set(own):
        raise UsageError(f"{path}: checkpoint model does not match this configuration "
                         f"(first difference: {(mismatched or sorted(set(theirs) - set(own)))[0]})")
    model.load_state_dict(theirs)


def cast_model(model, dtype):
    """Embeddings and hidden matrices in the low-precision dtype; the lm head and scalars stay fp32."""
    for p in model.parameters():
        if p is not model.lm_head_w and p.ndim >= 2:
            p.data = p.data.to(dtype)


