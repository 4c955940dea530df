"""The flags both training scripts share (contracts section 2) and the preset plumbing."""

import os
import sys
import uuid
from pathlib import Path

import torch.distributed as dist

from speedrun.checkpoint import INIT_SCHEDULES
from speedrun.data import VIRTUAL_RANKS
from speedrun.distributed import setup_distributed
from speedrun.errors import HelpWithDefaults, OneLineErrorParser, UsageError


def make_parser(description, presets):
    """The parser with the shared run and checkpoint flags; returns (parser, its "run" group) so a track adds its
    own run flags next to them."""
    p = OneLineErrorParser(description=description, formatter_class=HelpWithDefaults)
    run = p.add_argument_group("run")
    run.add_argument("--preset", choices=sorted(presets), default="full",
                     help="model size and data defaults: full = the record run; tiny = CPU-sized, demo shards")
    run.add_argument("--seed", type=int, default=0, help="seed for initialisation and warm-up tokens")
    run.add_argument("--log-dir", default="logs", help="folder of the run log")
    run.add_argument("--run-name", default=None, help="log file is <log-dir>/<run-name>.txt (default: a uuid)")
    run.add_argument("--variant", default=None, help="short name of the study arm, for the config line")
    run.add_argument("--num-iterations", type=int, default=None, help="optimiser steps of the full schedule")
    run.add_argument("--stop-after", type=int, default=None,
                     help="run only the first N steps of the schedule (validates at the stop)")
    run.add_argument("--val-every", type=int, default=None, help="validate every N steps (0: only at the end)")
    run.add_argument("--val-tokens", type=int, default=None, help="validation tokens per validation")
    run.add_argument("--train-seq-len", type=int, default=None, help="tokens per virtual rank per step")
    run.add_argument("--val-seq-len", type=int, default=None, help="validation tokens per virtual rank per step")
    run.add_argument("--train-files", default=None, help="glob of training shards")
    run.add_argument("--val-files", default=None, help="glob of validation shards")
    run.add_argument("--num-layers", type=int, default=None,
                     help="transformer layers (the layer patterns follow the rule in layer_pattern)")
    run.add_argument("--compile", choices=["auto", "on", "off"], default="auto",
                     help="torch.compile the model (auto: on CUDA only)")
    run.add_argument("--warmup-steps", type=int, default=None,
                     help="untimed kernel warm-up steps, every piece of state restored afterwards "
                          "(default: 10 when compiled, else 0)")
    run.add_argument("--low-precision", choices=["auto", "bf16", "fp32"], default="auto",
                     help="dtype of embeddings, matrices and activations (auto: bf16 on CUDA, fp32 on CPU, "
                          "where bf16 matmuls are emulated and slow)")
    ck = p.add_argument_group("checkpoints")
    ck.add_argument("--checkpoint-every", type=int, default=0,
                    help="write <log-dir>/<run-name>.pt every K steps and at the end (0: off)")
    ck.add_argument("--save-final-checkpoint", action="store_true", help="write the checkpoint at the end")
    ck.add_argument("--resume", default=None, help="continue a run from its checkpoint")
    ck.add_argument("--init-from", default=None, help="start a new run from a checkpoint's model weights")
    ck.add_argument("--init-schedule", choices=INIT_SCHEDULES, default=None,
                    help="with --init-from: restart the learning-rate and window schedules, or continue them from "
                         "the checkpoint's position in its own schedule (docs/dlo.md) (default restart)")
    return p, run


def resolve_shared_args(args, presets, script_path):
    """Fills the preset's values into the flags left unset (data globs relative to the script's folder) and checks
    the shared flags; raises UsageError on a value or combination that cannot work."""
    for key, value in presets[args.preset].items():
        if getattr(args, key, None) is None:
            if key in ("train_files", "val_files"):  # the preset's data lives next to this script
                value = os.path.relpath(Path(script_path).resolve().parent / value)
            setattr(args, key, value)
    if args.run_name is None:
        args.run_name = str(uuid.uuid4())
    if args.variant is None:
        args.variant = "baseline"
    positive = ["num_iterations", "train_seq_len", "val_seq_len", "val_tokens", "num_layers"]
    for name in positive:
        if getattr(args, name) <= 0:
            raise UsageError(f"--{name.replace('_', '-')} must be positive")
    for name in ["val_every", "checkpoint_every"] + (["warmup_steps"] if args.warmup_steps is not None else []):
        if getattr(args, name) < 0:
            raise UsageError(f"--{name.replace('_', '-')} must not be negative")
    if args.stop_after is not None and not 0 < args.stop_after <= args.num_iterations:
        raise UsageError(f"--stop-after must be in 1..{args.num_iterations}")
    bs = presets[args.preset]["block_size"]
    for name in ["train_seq_len", "val_seq_len"]:
        if getattr(args, name) % bs:
            raise UsageError(f"--{name.replace('_', '-')} must be a multiple of the attention block size {bs}")
    if args.val_tokens % (VIRTUAL_RANKS * args.val_seq_len):
        raise UsageError(f"--val-tokens must be a multiple of {VIRTUAL_RANKS} x --val-seq-len")
    if args.resume and args.init_from:
        raise UsageError("--resume and --init-from cannot be combined")
    if args.init_schedule and not args.init_from:
        raise UsageError("--init-schedule needs --init-from")
    args.init_schedule = args.init_schedule or INIT_SCHEDULES[0]
    for name in ["resume", "init_from"]:
        path = getattr(args, name)
        if path and not os.path.isfile(path):
            raise UsageError(f"--{name.replace('_', '-')}: no such file {path}")
    if "/" in args.run_name or not args.run_name.strip():
        raise UsageError("--run-name must be a plain file name")


def run_main(resolve_args, run, argv=None):
    """Parses and checks the flags, sets up the process group and runs; bad input at any point is one line on
    stderr and exit status 2."""
    try:
        args = resolve_args(argv)
        ddp = setup_distributed()
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        run(args, ddp)
    except UsageError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0
