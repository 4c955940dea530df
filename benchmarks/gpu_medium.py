"""Step time, throughput, model-FLOPs utilisation and peak memory of train_gpt_medium.py arms, on synthetic shards
(GPU machines often cannot download FineWeb), plus a check that FlexAttention computes the same function as the
CPU attention on the same document-causal windowed mask.

    python benchmarks/gpu_medium.py --steps 30 --arms baseline backout-L11 'laurel-*' --out benchmarks/results/X.txt
    python benchmarks/gpu_medium.py --preset tiny --steps 4 --arm base= --arm bo='--backout-layers 4'   # CPU

Arms come from ablations/speed.toml (--arms, names or patterns) and/or --arm NAME=FLAGS. Every arm runs the first
--steps steps of the full 5590-step schedule (--stop-after), so step times are comparable within one call only.
MFU counts matmul FLOPs only (6 x matmul parameters per token, attention scores left out), against --peak-tflops.
The last half of each arm's steps is profiled (--profile-steps): "opt ms" is the optimiser step on the compute
stream (waits for gradient averages still in flight included), "exposed comm" the time per step in collectives
not overlapped by any compute kernel (CPU: operator), both rank 0's.
"""
import json
import argparse
import datetime
import platform
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ablations.study import load_script, load_study, select_arms  # noqa: E402
from analysis.logs import parse_log  # noqa: E402
from benchmarks.synthetic_shards import make_shards  # noqa: E402
from speedrun.data import VIRTUAL_RANKS  # noqa: E402

SCRIPT = ROOT / "train_gpt_medium.py"


def matmul_flops_per_token(module, argv):
    """6 x the parameters used in matmuls (blocks' matrices and the lm head; embeddings are lookups)."""
    args = module.resolve_args(argv)
    with torch.device("meta"):
        model = module.GPT(module.model_config(args), max_seq_len=1)
    lookups = {id(p) for p in model.embedding_params()}
    return 6 * sum(p.numel() for p in model.parameters() if p.ndim >= 2 and id(p) not in lookups)


def parse_arm(text):
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise SystemExit(f"error: --arm wants NAME=FLAGS, got {text!r}")
    return name, shlex.split(flags)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=30, help="training steps per arm (--stop-after)")
    p.add_argument("--nproc", type=int, default=1, help="processes (GPUs) per run")
    p.add_argument("--preset", default="full", choices=["full", "tiny"])
    p.add_argument("--arms", nargs="*", default=[], help="arms of ablations/speed.toml (names or patterns)")
    p.add_argument("--arm", action="append", default=[], type=parse_arm, help="extra arm NAME=FLAGS")
    p.add_argument("--peak-tflops", type=float, default=989.0, help="dense bf16 peak per GPU (H100/H200: 989)")
    p.add_argument("--out", help="also write the figures to this file (with date, device and command)")
    args = p.parse_args()
    if args.steps < 2:
        raise SystemExit("error: --steps must be at least 2")

    arms = {}
    if args.arms:
        study = load_study("speed")
        for name in select_arms(study, args.arms):
            flags = study.argv(name, 0, Path("runs"))
            arms[name] = [f for f in flags if f not in ("--stop-after", "--num-iterations")]
    arms.update(dict(args.arm))
    if not arms:
        raise SystemExit("error: name arms with --arms and/or --arm")

    module = load_script(SCRIPT)
    preset = module.PRESETS[args.preset]
    tokens_per_step = VIRTUAL_RANKS * preset["train_seq_len"]
    cuda = torch.cuda.is_available()
    device = torch.cuda.get_device_name(0) if cuda else f"CPU {platform.processor() or platform.machine()}"
    lines = [f"date: {datetime.date.today().isoformat()}", f"device: {device}",
             f"command: {' '.join(shlex.quote(a) for a in sys.argv)}", ""]
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_glob, val_glob = make_shards(tmp, (args.steps + 3) * tokens_per_step,
                                           VIRTUAL_RANKS * preset["val_seq_len"] + 2)
        header = (f"{'arm':28} {'step ms':>9} {'tokens/s':>11} {'MFU':>6} {'peak MiB':>9} {'vs first':>8} "
                  f"{'opt ms':>8} {'exposed comm ms':>15}")
        lines.append(header)
        first_ms = None
        for name, flags in arms.items():
            argv = ["--preset", args.preset, "--train-files", train_glob, "--val-files", val_glob,
                    "--val-tokens", str(VIRTUAL_RANKS * preset["val_seq_len"]), "--val-every", "0",
                    "--num-iterations", str(preset["num_iterations"]), "--stop-after", str(args.steps),
                    "--log-dir", str(tmp / "logs"), "--run-name", name, "--variant", name,
                    "--profile-steps", str(args.steps // 2), *flags]
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                   f"--nproc_per_node={args.nproc}", str(SCRIPT), *argv]
            res = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
            log_path = tmp / "logs" / f"{name}.txt"
            run = parse_log(log_path) if log_path.exists() else None
            if res.returncode != 0 or run is None or not run.complete:
                err = [l for l in res.stderr.splitlines() if l.startswith("error:")] or res.stderr.splitlines()[-1:]
                lines.append(f"{name:28} failed: {err[0] if err else 'no output'}")
                continue
            step_ms = run.step_time_ms
            first_ms = first_ms or step_ms
            tokens_s = tokens_per_step / (step_ms / 1000)
            mfu = matmul_flops_per_token(module, ["--preset", args.preset, *flags]) * tokens_s / (
                args.peak_tflops * 1e12 * args.nproc)
            profile = json.loads((tmp / "logs" / f"{name}.profile.json").read_text())
            lines.append(f"{name:28} {step_ms:9.2f} {tokens_s:11.0f} {mfu:6.1%} {run.peak_allocated_mib or 0:9.0f} "
                         f"{step_ms / first_ms - 1:+8.2%} {profile['optimizer_ms']:8.2f} "
                         f"{profile['exposed_comm_ms']:15.2f}")
    if cuda:
        from benchmarks.gpu_check import flex_check
        flex = flex_check()
        lines += ["", f"FlexAttention (bf16) vs SDPA on the dense mask (fp32): {'PASS' if flex['passed'] else 'FAIL'}, "
                      f"{flex['detail']}"]
    else:
        lines += ["", "FlexAttention check: needs CUDA (skipped)"]
    print("\n".join(lines))
    if args.out:
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
