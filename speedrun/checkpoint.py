"""Checkpoints (model, optimisers with Muon's owner-sharded state merged, stream position, RNG, log lines) and
loading model weights."""

import glob
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
        for leftover in glob.glob(glob.escape(str(path)) + ".tmp*"):
            if leftover != tmp:
                os.remove(leftover)  # a save that was killed half-way (only rank 0 of this run writes here)
        try:
            torch.save(state, tmp)
            os.replace(tmp, path)
        except BaseException as e:
            if os.path.exists(tmp):
                os.remove(tmp)  # never leave half a checkpoint behind, least of all on a full disk
            if isinstance(e, OSError):
                raise UsageError(f"{path}: cannot save the checkpoint ({e.strerror or e})")
            raise
    ddp.barrier()


# Flags a resumed run must share with the run that saved the checkpoint: otherwise it would continue another
# schedule, model or study arm into this run's log (step lines of two lengths, a model of another shape).
RESUME_MUST_MATCH = ("num_iterations", "seed", "preset", "num_layers", "train_seq_len")
STUDY_FLAG_PREFIXES = ("backout_", "laurel", "dlo_", "rolling_skip")
NO_RESUME_HINT = "start again without --resume (with the study runner: --no-resume)"


def load_checkpoint(path, flag=None):
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # any unreadable file is bad input, named by its path
        hint = f"; {NO_RESUME_HINT}" if flag == "--resume" else ""
        raise UsageError(f"{path}: not a readable checkpoint ({type(e).__name__}){hint}")


def load_resume_state(args):
    """The checkpoint --resume names, refused (one line naming the flag) when it was saved with other
    schedule-relevant flags than this command's; None without --resume."""
    if not args.resume:
        return None
    state = load_checkpoint(args.resume, "--resume")
    saved = state.get("config") if isinstance(state, dict) else None
    if not isinstance(saved, dict):
        return state  # nothing recorded to compare with
    for key, value in vars(args).items():
        relevant = key in RESUME_MUST_MATCH or key.startswith(STUDY_FLAG_PREFIXES)
        if relevant and key in saved and saved[key] != value:
            raise UsageError(f"--resume {args.resume}: the checkpoint was made with --{key.replace('_', '-')} "
                             f"{saved[key]}, this command has {value}; resume with the run's own flags, or "
                             f"{NO_RESUME_HINT}")
    return state


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


