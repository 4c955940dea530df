"""Under torchrun (gloo, 2 ranks): record #18's optimisers on a tiny R18GPT with the sharded Adam against the same
model and data with every Adam parameter replicated (all-reduced, stepped whole: the Adam before the sharding),
through the untie; then resumes from a checkpoint of each after an odd step. Rank 0 prints one JSON line: the
losses as float.hex (equality is bitwise), whether the final parameters are equal, the Adam state elements held
per rank.

    python -m torch.distributed.run --standalone --nproc_per_node=2 tests/r18_adam_driver.py
"""
import json
import sys
from pathlib import Path
from unittest import mock

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent / "speedrun"))
from speedrun.checkpoint import merged_muon_state  # noqa: E402
from speedrun.distributed import exit_before_interpreter_teardown, setup_distributed  # noqa: E402
from speedrun.r18 import optim  # noqa: E402
from speedrun.r18.train import R18OptimizerState  # noqa: E402
from test_r18_optim import SCHEDULE, tiny_model  # noqa: E402

STEPS = 6  # Adam steps at 1, 3, 5; the untie after step 3
CHECKPOINT_AFTER = 3
SEQ = 64


def step_loss(model, opts, step, rank):
    tokens = torch.randint(0, 200, (SEQ + 1,), generator=torch.Generator().manual_seed(100 * step + rank))
    cu = torch.tensor([0, 20, 45, SEQ], dtype=torch.int32)
    loss = model(tokens[:-1], tokens[1:], cu, torch.tensor([1.0]), 1, 3, SEQ)
    loss.backward()
    opts.step(step)
    return loss.item().hex()


def adam_state_elements(opts):
    return sum(s[k].numel() for opt in (opts.adam, opts.scalar_adam) for s in opt.state.values()
               for k in ("exp_avg", "exp_avg_sq"))


def resumed_from(checkpoint, proc):
    """A fresh model and optimisers from rank 0's checkpoint (every rank reads the file in a real resume)."""
    weights, opt_state = checkpoint
    model = tiny_model()
    model.load_state_dict(weights)
    model.split_embed = CHECKPOINT_AFTER + 1 > SCHEDULE.split_step
    opts = optim.R18Optimizers(model, SCHEDULE)
    R18OptimizerState(opts).load_state_dict(opt_state)
    return model, opts


def main():
    torch.set_num_threads(1)
    proc = setup_distributed()
    sharded = tiny_model()
    replicated = tiny_model()  # the same seed: the same weights
    runs = {"sharded": (sharded, optim.R18Optimizers(sharded, SCHEDULE))}
    with mock.patch.object(optim, "SHARD_MIN_NUMEL", float("inf")):
        runs["replicated"] = (replicated, optim.R18Optimizers(replicated, SCHEDULE))
    losses = {name: [] for name in runs}
    for step in range(STEPS):
        for name, (model, opts) in list(runs.items()):
            losses.setdefault(name, []).append(step_loss(model, opts, step, proc.rank))
        if step == CHECKPOINT_AFTER:
            for name in ("sharded", "replicated"):
                model, opts = runs[name]
                checkpoint = [({k: v.clone() for k, v in model.state_dict().items()},
                               R18OptimizerState(opts).state_dict(lambda local: merged_muon_state(local, proc)))]
                dist.broadcast_object_list(checkpoint, src=0)
                runs[f"sharded resumed from {name}"] = resumed_from(checkpoint[0], proc)
    final = {name: [p.detach().clone() for p in model.parameters()] for name, (model, _) in runs.items()}
    if proc.rank == 0:
        print(json.dumps(dict(
            losses=losses,
            params_equal={name: all(torch.equal(a, b) for a, b in zip(final["sharded"], params))
                          for name, params in final.items()},
            adam_state_elements={name: adam_state_elements(opts) for name, (_, opts) in runs.items()})))
    dist.destroy_process_group()
    exit_before_interpreter_teardown(0)  # as the training scripts end: see its docstring


if __name__ == "__main__":
    main()
