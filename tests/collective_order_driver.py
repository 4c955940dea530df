"""Records, on every rank, the sequence of collectives (name, process group, tensor sizes, dtype; for a gradient
bucket also the names of its parameters) that a short real training run issues - kernel warm-up, training steps
with Snoo firing (medium), validations, checkpoint saves - for each flag set given, and prints one JSON line
(rank 0): per flag set, the number of entries and the first position where the ranks' sequences differ (None:
identical). Run under torchrun (gloo):

    python -m torch.distributed.run --nproc_per_node=2 tests/collective_order_driver.py CASES.json

CASES.json: a list of {"id", "script" (train_gpt.py or train_gpt_medium.py), "argv", optionally "keep_checkpoint"};
runs go through each track's run_training with one process group for all of them. A DLO case's --init-from names a
checkpoint written by an earlier case (its --save-final-checkpoint, with "keep_checkpoint": true). Every other case's
checkpoint is saved as ever - gathered, serialised - but its bytes go nowhere (an empty file is left): ~0.5 GB a
case that nothing reads, whose writing alone was ~14% of rank 0's time (measured)."""
import io
import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt as small  # noqa: E402
import train_gpt_medium as medium  # noqa: E402
from speedrun.distributed import ReductionBucket, exit_before_interpreter_teardown, setup_distributed  # noqa: E402
from speedrun.optimizers import TrackOptimizers  # noqa: E402
from speedrun.training import run_training  # noqa: E402

TRACKS = {"train_gpt.py": (small, small.SMALL), "train_gpt_medium.py": (medium, medium.MEDIUM)}
COLLECTIVES = ("all_reduce", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_gather",
               "all_gather_into_tensor", "broadcast", "barrier", "all_gather_object", "gather", "scatter",
               "all_to_all", "send", "recv", "isend", "irecv")


def describe(value):
    """A tensor as (numel, dtype), a list of them element by element, anything else by its type."""
    if torch.is_tensor(value):
        return [value.numel(), str(value.dtype).replace("torch.", "")]
    if isinstance(value, (list, tuple)):
        return [describe(v) for v in value]
    return type(value).__name__


def recording(log):
    """Wraps torch.distributed's collectives so each call appends (name, group, operands) to log."""
    groups = {}

    def wrap(name, real):
        def collective(*args, **kwargs):
            group = kwargs.get("group")
            tag = "default" if group is None else groups.setdefault(id(group), f"group{len(groups)}")
            operands = [describe(a) for a in args if torch.is_tensor(a) or isinstance(a, (list, tuple))]
            log.append([name, tag, operands])
            return real(*args, **kwargs)
        return collective
    return {name: wrap(name, getattr(dist, name)) for name in COLLECTIVES}


def naming_buckets(log):
    """Also logs which parameters each gradient bucket reduces (by name): two same-size buckets swapped on one
    rank have the same collective signature but would mix up gradients."""
    names = {}
    real_init, real_launch = TrackOptimizers.__init__, ReductionBucket.launch

    def init(self, model, *args, **kwargs):
        names.update({id(p): n for n, p in model.named_parameters()})
        real_init(self, model, *args, **kwargs)

    def launch(self, op):
        log.append(["bucket", self.kind, [names.get(id(p), "?") for p in self.params]])
        return real_launch(self, op)
    TrackOptimizers.__init__, ReductionBucket.launch = init, launch
    return lambda: (setattr(TrackOptimizers, "__init__", real_init), setattr(ReductionBucket, "launch", real_launch))


class DiscardedBytes:
    """A file that takes every write and keeps nothing."""

    def write(self, data):
        return memoryview(data).nbytes

    def flush(self):
        pass


def discarding_writes(real_save):
    """torch.save serialising into DiscardedBytes what it would write to a file; into an in-memory buffer (how
    torch.distributed's object collectives pickle tensors) as before."""
    def save(obj, f, *args, **kwargs):
        return real_save(obj, f if isinstance(f, io.BytesIO) else DiscardedBytes(), *args, **kwargs)
    return save


def first_difference(sequences):
    reference = sequences[0]
    for seq in sequences[1:]:
        for i, (a, b) in enumerate(zip(reference, seq)):
            if a != b:
                return i
        if len(seq) != len(reference):
            return min(len(seq), len(reference))
    return None


def main():
    cases = json.loads(Path(sys.argv[1]).read_text())
    proc = setup_distributed()
    real = {name: getattr(dist, name) for name in COLLECTIVES}
    results = []
    for case in cases:
        module, track = TRACKS[case["script"]]
        args = module.resolve_args(case["argv"])
        log = []
        for name, fn in recording(log).items():
            setattr(dist, name, fn)
        unname = naming_buckets(log)
        real_save = torch.save
        if not case.get("keep_checkpoint"):
            torch.save = discarding_writes(real_save)
        try:
            run_training(track, args, proc)
        finally:
            torch.save = real_save
            unname()
            for name, fn in real.items():
                setattr(dist, name, fn)
        gathered = [None] * proc.world_size
        dist.all_gather_object(gathered, log)
        kinds = sorted({entry[0] for entry in log if entry[0] != "bucket"})
        results.append(dict(id=case["id"], count=len(log), kinds=kinds, differs_at=first_difference(gathered),
                            example=None if first_difference(gathered) is None else
                            [seq[first_difference(gathered)] if first_difference(gathered) < len(seq) else None
                             for seq in gathered]))
    if proc.rank == 0:
        print(json.dumps(results))
    dist.destroy_process_group()
    exit_before_interpreter_teardown(0)  # as the training scripts end: see its docstring


if __name__ == "__main__":
    main()
