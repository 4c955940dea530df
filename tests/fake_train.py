"""A stand-in training script for the runner's tests: the training scripts' flags the runner uses and their log
format (docs/log-format.md, written with speedrun/logformat.py's builders), no model, no torch.

It writes a run log line by line (source, separator, environment and config lines, separator, step and scalars
lines, the final peak-memory line) and a checkpoint when asked. Environment knobs for tests:
  FAKE_TRAIN_STEP_SECONDS   sleep this long per step (to have time to kill things)
  FAKE_TRAIN_HOLD           a path: while that file exists, the run waits between steps (a run kept part-way for
                            as long as a test needs, however slowly a loaded machine starts its next process)
  FAKE_TRAIN_FAIL_VARIANT   fail (exit 1, message on stderr) in runs of this variant ...
  FAKE_TRAIN_FAIL_AT        ... at this step (default 1)
  FAKE_TRAIN_IGNORE_SIGTERM ignore SIGTERM (a process that outlives its runner)
  FAKE_TRAIN_STARTS         append a JSON line per start and per finish of a run to this file
  FAKE_TRAIN_KERNEL         a compiled kernel's path: while it is an empty file, fail as inductor loading a
                            truncated one does (`ImportError: <path>: file too short`)
"""

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository, for the log format
from speedrun.logformat import (SEPARATOR, STUDY_VARIABLE, config_line, peak_line, scalars_line,  # noqa: E402
                                study_line, train_step_line, validation_line)

TRACK = "fake"  # the config line's `track`, as the real scripts write theirs


def make_arg_parser():
    parser = argparse.ArgumentParser(description="stand-in training script")
    parser.add_argument("--preset", choices=("full", "tiny"), default="full")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--log-dir", default="logs")
    parser.add_argument("--run-name", default="run")
    parser.add_argument("--variant", default="baseline")
    parser.add_argument("--num-iterations", type=int, default=20)
    parser.add_argument("--stop-after", type=int)
    parser.add_argument("--val-every", type=int, default=5)
    parser.add_argument("--train-files")
    parser.add_argument("--val-files")
    parser.add_argument("--checkpoint-every", type=int, default=0)
    parser.add_argument("--resume")
    parser.add_argument("--init-from")
    parser.add_argument("--backout-layers")
    return parser


def val_loss(args, step):
    layers = [int(x) for x in args.backout_layers.split(",")] if args.backout_layers else []
    # A deterministic curve whose end depends on seed and layers, so rankings can be checked.
    return 3.0 + 8.0 / (1 + step) + 0.001 * args.seed + sum(0.01 * ((7 * layer) % 5) for layer in layers)


def save_checkpoint(path, state):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(state, f)
    os.replace(tmp, path)


def main():
    args = make_arg_parser().parse_args()
    if args.num_iterations < 1 or (args.stop_after is not None and args.stop_after < 1):
        print("fake_train.py: --num-iterations and --stop-after must be positive", file=sys.stderr)
        sys.exit(2)
    if os.environ.get("FAKE_TRAIN_IGNORE_SIGTERM"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    rank, world_size = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    starts = os.environ.get("FAKE_TRAIN_STARTS") if rank == 0 else None

    def record(event):
        if starts:
            with open(starts, "a") as f:
                f.write(json.dumps({"event": event, "variant": args.variant, "seed": args.seed, "time": time.time(),
                                    "resume": args.resume, "pid": os.getpid(),
                                    "gpus": os.environ.get("CUDA_VISIBLE_DEVICES")}) + "\n")

    record("start")
    step_seconds = float(os.environ.get("FAKE_TRAIN_STEP_SECONDS", "0"))
    fail_at = int(os.environ.get("FAKE_TRAIN_FAIL_AT", "1")) if os.environ.get("FAKE_TRAIN_FAIL_VARIANT") == \
        args.variant else None

    total = args.num_iterations
    last = min(total, args.stop_after or total)
    checkpoint_path = os.path.join(args.log_dir, f"{args.run_name}.pt")
    state = {"step": 0, "lines": []}
    if args.resume:
        with open(args.resume) as f:
            state = json.load(f)
    hold = os.environ.get("FAKE_TRAIN_HOLD")

    def next_step_after_a_pause():
        while hold and os.path.exists(hold):
            time.sleep(0.05)
        time.sleep(step_seconds)

    if rank != 0:
        for _ in range(last - state["step"]):
            next_step_after_a_pause()
        return
    os.makedirs(args.log_dir, exist_ok=True)
    log = open(os.path.join(args.log_dir, f"{args.run_name}.txt"), "w")

    def emit(line, keep=True):
        log.write(line + "\n")
        log.flush()
        if keep:
            state["lines"].append(line)

    with open(__file__) as f:
        emit(f.read().rstrip("\n"), keep=False)
    emit(SEPARATOR, keep=False)
    emit(f"Running Python {sys.version.split()[0]} (stand-in, no torch)", keep=False)
    if args.resume:
        emit(f"resumed from step {state['step']} of {args.resume}", keep=False)
    config = {**vars(args), "track": TRACK, "world_size": world_size}
    state["config"] = config  # as the real script's checkpoints do: what the run was made with
    emit(config_line(config), keep=False)
    if os.environ.get(STUDY_VARIABLE):  # as speedrun/runlog.py writes it
        emit(study_line(os.environ[STUDY_VARIABLE]), keep=False)
    emit(SEPARATOR, keep=False)
    for line in state["lines"]:
        emit(line, keep=False)

    kernel = os.environ.get("FAKE_TRAIN_KERNEL")
    if kernel and os.path.exists(kernel) and os.path.getsize(kernel) == 0:
        print(f"ImportError: {kernel}: file too short", file=sys.stderr)
        sys.exit(1)
    start = time.time()
    for step in range(state["step"], last + 1):
        ms = (time.time() - start) * 1000
        if step > state["step"] or step == 0:
            if step > 0:
                emit(train_step_line(step, total, ms))
            if step % args.val_every == 0 or step == last:
                emit(validation_line(step, total, val_loss(args, step), ms))
                emit(scalars_line(step, total, {"backout.x": 1.0 - step / 100}))
        state["step"] = step
        if args.checkpoint_every and step > 0 and step % args.checkpoint_every == 0:
            save_checkpoint(checkpoint_path, state)
        if step == last:
            break
        if fail_at is not None and step + 1 >= fail_at:
            print(f"fake_train.py: failing at step {step + 1} as asked", file=sys.stderr)
            sys.exit(1)
        next_step_after_a_pause()
    if args.checkpoint_every:
        save_checkpoint(checkpoint_path, state)
    emit(peak_line(0, 0), keep=False)
    log.close()
    record("finish")


if __name__ == "__main__":
    main()
