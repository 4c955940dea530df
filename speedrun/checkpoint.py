"""Checkpoints (model, optimisers with Muon's owner-sharded state merged, stream position, RNG, log lines) and
loading model weights."""

import glob
import os
import sys
import zipfile

import torch

from speedrun.distributed import gather_to_rank0
from speedrun.errors import UsageError
from speedrun.run_config import must_match_on_resume


def merged_muon_state(local, proc):
    merged = {}
    for part in gather_to_rank0({k: {n: t.cpu() for n, t in v.items()} for k, v in local.items()}, proc):
        merged.update(part)
    return merged


def save_checkpoint(path, model, opt, stream, step, train_ms, args, log, proc, extra=None):
    """extra: further entries of a track's own (--base r18: the attention kernels its steps ran on)."""
    state = dict(extra or {}, model={k: v.cpu() for k, v in model.state_dict().items()},
                 optimizers=opt.state_dict(lambda local: merged_muon_state(local, proc)),
                 stream=stream.state(), step=step, train_ms=train_ms, config=vars(args),
                 rng=dict(cpu=torch.get_rng_state(),
                          cuda=torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None),
                 log_lines=list(log.lines))
    problem = None
    if proc.rank == 0:
        tmp = f"{path}.tmp{os.getpid()}"
        for leftover in glob.glob(glob.escape(str(path)) + ".tmp*"):
            if leftover != tmp:
                os.remove(leftover)  # a save that was killed half-way (only rank 0 of this run writes here)
        try:
            with open(tmp, "wb") as f:
                writer = _WriteErrorKeeper(f)
                try:
                    torch.save(state, writer)
                except RuntimeError:
                    # torch reports a failed write as "unexpected pos": the OSError underneath names the cause
                    raise writer.error or sys.exc_info()[1]
            os.replace(tmp, path)
        except BaseException as e:
            if os.path.exists(tmp):
                os.remove(tmp)  # never leave half a checkpoint behind, least of all on a full disk
            if not isinstance(e, OSError):
                raise
            problem = f"{path}: cannot save the checkpoint ({e.strerror or e})"
    # Every rank learns whether the save worked, so a failed save ends all of them with rank 0's one line.
    proc.agree(problem)


class _WriteErrorKeeper:
    """A file torch.save writes through, keeping the OSError of a failed write (torch replaces it by its own
    RuntimeError)."""

    def __init__(self, file):
        self.file, self.error = file, None

    def write(self, data):
        try:
            return self.file.write(data)
        except OSError as e:
            self.error = e
            raise

    def flush(self):
        self.file.flush()


# What a resumed run reads from its checkpoint: one of them missing means it is not a checkpoint of a run.
RESUME_KEYS = ("model", "optimizers", "stream", "step", "train_ms", "rng", "log_lines", "config")
NO_RESUME_HINT = "start again without --resume (with the study runner: --no-resume)"


def damaged_member(path):
    """The first member of a zip checkpoint (torch.save's format) whose bytes fail their CRC, or None when every
    member is intact. Raises zipfile.BadZipFile when the zip structure itself is broken."""
    with zipfile.ZipFile(path) as archive:
        return archive.testzip()


def holds_torch_pickle(path):
    """Whether a zip is one torch.save wrote: its object is pickled in `<folder>/data.pkl` (any other zip left
    under a checkpoint's name is no checkpoint, however whole)."""
    with zipfile.ZipFile(path) as archive:
        return any(name.rsplit("/", 1)[-1] == "data.pkl" for name in archive.namelist())


def load_checkpoint(path, flag=None):
    """The checkpoint at `path`, its bytes verified first (a flipped byte loads without complaint otherwise)."""
    hint = f"; {NO_RESUME_HINT}" if flag == "--resume" else ""
    try:
        damaged = damaged_member(path) if zipfile.is_zipfile(path) else None
    except (zipfile.BadZipFile, OSError, EOFError) as e:
        raise UsageError(f"{path}: not a readable checkpoint ({type(e).__name__}){hint}")
    if damaged is not None:
        raise UsageError(f"{path}: damaged checkpoint (the bytes of {damaged} fail their CRC check){hint}")
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # any unreadable file is bad input, named by its path
        raise UsageError(f"{path}: not a readable checkpoint ({type(e).__name__}){hint}")


def _same_files(saved_pattern, pattern):
    """Whether two shard globs name the same files (a relative glob saved from another folder may still)."""
    if saved_pattern == pattern:
        return True
    found = sorted(os.path.realpath(f) for f in glob.glob(pattern))
    return bool(found) and found == sorted(os.path.realpath(f) for f in glob.glob(str(saved_pattern)))


def _comparable(value):
    """Lists and tuples alike (a checkpoint of an older version holds lists where the config now has tuples)."""
    return list(value) if isinstance(value, tuple) else value


def load_resume_state(args):
    """The checkpoint --resume names, refused (one line naming the flag) when it lacks what a resume reads, was
    saved with other flags than this command's that matter to the schedule, the model or the validation lines, or
    is past this command's --stop-after; None without --resume."""
    if not args.resume:
        return None
    state = load_checkpoint(args.resume, "--resume")
    missing = [key for key in RESUME_KEYS if key not in state] if isinstance(state, dict) else ["model"]
    if missing:
        raise UsageError(f"--resume {args.resume}: not a run checkpoint (no {missing[0]!r} entry); {NO_RESUME_HINT}")
    saved = state["config"]
    if not isinstance(saved, dict):
        raise UsageError(f"--resume {args.resume}: its 'config' entry is not a table; {NO_RESUME_HINT}")
    for key in must_match_on_resume(args):
        if key not in saved:
            continue
        value = getattr(args, key)
        if key.endswith("_files"):
            same = _same_files(saved[key], value)
        else:
            same = _comparable(saved[key]) == _comparable(value)
        if not same:
            raise UsageError(f"--resume {args.resume}: the checkpoint was made with --{key.replace('_', '-')} "
                             f"{saved[key]}, this command has {value}; resume with the run's own flags, or "
                             f"{NO_RESUME_HINT}")
    if args.stop_after is not None and args.stop_after < state["step"]:
        raise UsageError(f"--stop-after {args.stop_after} is before the checkpoint's step {state['step']} "
                         f"({args.resume}): a resumed run can only go on from there")
    return state


def load_model_weights(model, state, path):
    own = model.state_dict()
    theirs = state.get("model", {}) if isinstance(state, dict) else {}
    mismatched = [k for k in own if k not in theirs or theirs[k].shape != own[k].shape]
    if mismatched or set(theirs) - set(own):
        raise UsageError(f"{path}: checkpoint model does not match this configuration "
                         f"(first difference: {(mismatched or sorted(set(theirs) - set(own)))[0]})")
    model.load_state_dict(theirs)
