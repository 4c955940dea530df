"""Qualify a CUDA node in minutes: the first checks of shared/spec/gpu-protocol.md (call 1) as a pass/fail table.

    python benchmarks/gpu_check.py [--steps 10] [--out FILE]      (./run.sh gpu-check)

- Each training script (train_gpt_medium.py, and train_gpt.py when it exists) runs its first --steps steps of the
  full-size schedule on synthetic shards on one GPU: the compiled model, FlexAttention, bf16 and the NCCL group at
  world size 1. Pass: exit status 0, a complete log, finite validation losses, the last below the first.
  The record flags of the medium track (--backout-layers 11 --num-iterations 5550) and its baseline under
  --compile regional run the same way.
  Graph breaks and recompiles (TORCH_LOGS) are counted for the record, not judged.
- FlexAttention (bf16) against SDPA on the dense mask (fp32), forward and the gradients of q, k, v.
Exit status: 0 all passed, 1 a check failed, 2 no CUDA here.
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from analysis.logs import parse_log  # noqa: E402

# (name, script, flags): the training runs of the check; scripts not in the checkout are left out.
TRAINING_RUNS = (
    ("medium baseline", "train_gpt_medium.py", []),
    ("medium record (backout L11)", "train_gpt_medium.py", ["--backout-layers", "11", "--num-iterations", "5550"]),
    ("small baseline", "train_gpt.py", []),
    ("medium baseline, regional compile", "train_gpt_medium.py", ["--compile", "regional"]),
)
# bf16 FlexAttention against fp32 SDPA: bf16 keeps 8 bits of mantissa, so differences of a few 1e-3 relative to
# the largest value are rounding; a wrong mask gives differences of the order of the values themselves.
FLEX_TOLERANCE = 2e-2
SYNTHETIC_TRAIN_TOKENS = 24 * 2**20  # enough for the medium (and small) track's first 40 steps at 8 x 64K tokens
SYNTHETIC_VAL_TOKENS = 11 * 2**20  # the medium track's 10,485,760 validation tokens, and a little more


@dataclass
class Check:
    name: str
    passed: bool
    detail: str


def training_check(name, script: Path, flags, steps, train_glob, val_glob, log_dir: Path, timeout_s,
                   launcher=("-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1")) -> Check:
    """One training run of `steps` steps; pass when it ends cleanly with finite, falling validation losses."""
    run_name = re.sub(r"\W+", "-", name).strip("-")
    command = [sys.executable, *launcher, str(script), *flags, "--stop-after", str(steps),
               "--train-files", train_glob, "--val-files", val_glob, "--log-dir", str(log_dir),
               "--run-name", run_name]
    env = dict(os.environ, TORCH_LOGS="graph_breaks,recompiles")
    try:
        result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return Check(name, False, f"no end after {timeout_s} s")
    log_path = log_dir / f"{run_name}.txt"
    if result.returncode != 0 or not log_path.exists():
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        why = next((line for line in lines if line.startswith("error:")), lines[-1] if lines else "no output")
        return Check(name, False, f"exit status {result.returncode}: {why.strip()[:160]}")
    run = parse_log(log_path)
    losses = run.val_losses
    breaks = result.stderr.count("Graph break")
    recompiles = result.stderr.lower().count("recompiling function")
    facts = (f"val loss {losses[0]:.3f} -> {losses[-1]:.3f} at step {run.val_steps[-1]}, "
             f"{run.step_time_ms or float('nan'):.0f} ms/step, peak {run.peak_allocated_mib or 0:.0f} MiB, "
             f"{breaks} graph breaks, {recompiles} recompiles" if len(losses) >= 1 else "no validation line")
    falling = (run.complete and len(losses) >= 2 and all(math.isfinite(x) for x in losses)
               and losses[-1] < losses[0])
    return Check(name, falling, facts if falling else f"{facts}; not a complete log with falling finite losses")


def flex_check() -> Check:
    """FlexAttention with this project's block masks against SDPA on the dense mask, forward and backward."""
    import torch
    from torch.nn.attention.flex_attention import flex_attention

    from speedrun.data import BOS_TOKEN
    from speedrun.layers import attend, dense_window_mask, flex_block_masks

    seq_len, block, window_blocks = 8192, 128, 7
    g = torch.Generator(device="cuda").manual_seed(0)
    seq = torch.randint(0, 50257, (seq_len,), device="cuda", generator=g)
    seq[torch.rand(seq_len, device="cuda", generator=g) < 2e-3] = BOS_TOKEN
    seq[0] = BOS_TOKEN
    q, k, v = (torch.randn(1, 8, seq_len, 128, device="cuda", generator=g) for _ in range(3))
    upstream_grad = torch.randn(1, 8, seq_len, 128, device="cuda", generator=g)
    window = torch.tensor(window_blocks, device="cuda")

    def outputs_and_grads(attention, dtype):
        inputs = [t.to(dtype).requires_grad_() for t in (q, k, v)]
        out = attention(*inputs)
        out.backward(upstream_grad.to(dtype))
        return [out.float()] + [t.grad.float() for t in inputs]

    block_mask = flex_block_masks(seq, [window], block)[0]
    flex = outputs_and_grads(lambda *x: torch.compile(flex_attention)(*x, block_mask=block_mask, scale=0.12),
                             torch.bfloat16)
    dense_mask = dense_window_mask(seq, window, block)
    dense = outputs_and_grads(lambda *x: attend(*x, dense_mask, 0.12), torch.float32)
    errors = [((a - b).abs().max() / b.abs().max()).item() for a, b in zip(flex, dense)]
    detail = ", ".join(f"{what} {err:.1e}" for what, err in zip(("out", "dq", "dk", "dv"), errors))
    return Check("FlexAttention = dense mask", all(e < FLEX_TOLERANCE for e in errors),
                 f"max |diff| / max |dense|: {detail} (tolerance {FLEX_TOLERANCE:g})")


def render(checks) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"{'check':{width}}  result  detail", f"{'-' * width}  ------  ------"]
    lines += [f"{c.name:{width}}  {'PASS' if c.passed else 'FAIL':6}  {c.detail}" for c in checks]
    failed = sum(not c.passed for c in checks)
    lines.append(f"{len(checks) - failed} of {len(checks)} checks passed" + ("" if not failed else
                 f"; {failed} failed: see shared/spec/gpu-protocol.md and record the failure in benchmarks/results/"))
    return "\n".join(lines)


def make_parser():
    parser = argparse.ArgumentParser(prog="python benchmarks/gpu_check.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps per run (--stop-after)")
    parser.add_argument("--timeout", type=int, default=600, help="seconds allowed per training run")
    parser.add_argument("--out", type=Path, help="also write the table (with date, device, command) to this file")
    return parser


def main(argv=None) -> int:
    args = make_parser().parse_args(argv)
    if args.steps < 1 or args.timeout < 1:
        print("error: --steps and --timeout must be at least 1", file=sys.stderr)
        return 2
    import torch
    if not torch.cuda.is_available():
        print(f"error: gpu-check needs CUDA and this torch {torch.__version__} sees no CUDA device", file=sys.stderr)
        return 2
    from benchmarks.synthetic_shards import make_shards

    checks = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_glob, val_glob = make_shards(tmp, SYNTHETIC_TRAIN_TOKENS, SYNTHETIC_VAL_TOKENS)
        for name, script, flags in TRAINING_RUNS:
            if (ROOT / script).exists():
                print(f"gpu-check: {name} ({script} {' '.join(flags)}, {args.steps} steps) ...", flush=True)
                checks.append(training_check(name, ROOT / script, flags, args.steps, train_glob, val_glob,
                                             tmp / "logs", args.timeout))
    print("gpu-check: FlexAttention against the dense mask ...", flush=True)
    try:
        checks.append(flex_check())
    except Exception as problem:  # a failing kernel is a result of the check, not a crash of the checker
        checks.append(Check("FlexAttention = dense mask", False, f"{type(problem).__name__}: {problem}"[:200]))
    table = render(checks)
    print(table)
    if args.out:
        head = [f"date: {datetime.datetime.now().isoformat(timespec='seconds')}",
                f"device: {torch.cuda.get_device_name(0)}, torch {torch.__version__}",
                f"command: {' '.join(shlex.quote(a) for a in sys.argv)}", ""]
        args.out.write_text("\n".join(head + [table]) + "\n")
    return 0 if all(c.passed for c in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
