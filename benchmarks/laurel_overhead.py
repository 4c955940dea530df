"""Step-time and memory overhead of the LAuReL variants against the baseline (train_gpt_medium.py).

Times forward + backward + optimiser step on one sequence of --train-seq-len tokens per arm, compiled on CUDA.
Prints a header (date, device, command) and one line per arm; save the output under benchmarks/results/.

    python benchmarks/laurel_overhead.py                 # full size, CUDA
    python benchmarks/laurel_overhead.py --preset tiny   # smoke test on CPU
"""
import argparse
import datetime
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
import train_gpt_medium as tgm  # noqa: E402

ARMS = {
    "baseline": [],
    "rw": ["--laurel", "rw"],
    "lr": ["--laurel", "lr"],
    "pa": ["--laurel", "pa"],
    "rw+lr": ["--laurel", "rw+lr"],
    "rw+lr+pa": ["--laurel", "rw+lr+pa"],
    "rw+lr+pa-shared-h": ["--laurel", "rw+lr+pa", "--laurel-pa-h", "lowrank-shared"],
    "rw+lr-block": ["--laurel", "rw+lr", "--laurel-where", "block"],
    "baseline-18": ["--num-layers", "18"],
}


def time_arm(flags, preset, steps, warmup, device):
    args = tgm.resolve_args(["--preset", preset] + flags)
    torch.manual_seed(0)
    model = tgm.GPT(tgm.model_config(args), max_seq_len=args.train_seq_len).to(device)
    model.cast_low_precision(torch.bfloat16 if device.type == "cuda" else torch.float32)
    opt = tgm.Optimizers(model, 0, 1, fused_adam=device.type == "cuda",
                         ns_dtype=torch.bfloat16 if device.type == "cuda" else torch.float32)
    run_model = torch.compile(model, dynamic=False) if device.type == "cuda" else model
    gen = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 50257, (args.train_seq_len + 1,), generator=gen).to(device)
    window = torch.tensor(tgm.window_blocks_at(args.num_iterations // 2, args.num_iterations,
                                               model.cfg), device=device)

    def step(i):
        run_model(seq[:-1], seq[1:], window).backward()
        opt.step(i, args.num_iterations)

    for i in range(warmup):
        step(i)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    for i in range(steps):
        step(warmup + i)
    if device.type == "cuda":
        torch.cuda.synchronize()
    ms = 1000 * (time.perf_counter() - t0) / steps
    peak = torch.cuda.max_memory_allocated() // 2 ** 20 if device.type == "cuda" else 0
    return ms, peak, sum(model.added_params().values())


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", choices=sorted(tgm.PRESETS), default="full")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--arms", default=",".join(ARMS), help="comma-separated subset of " + ",".join(ARMS))
    args = p.parse_args()
    arms = args.arms.split(",")
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        print(f"error: --arms: unknown arm {unknown[0]!r}", file=sys.stderr)
        return 2
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"date: {datetime.date.today()}  device: {name}  command: python {' '.join(sys.argv)}")
    base_ms = None
    for arm in arms:
        ms, peak, added = time_arm(ARMS[arm], args.preset, args.steps, args.warmup, device)
        base_ms = ms if arm == "baseline" else base_ms
        overhead = f"{100 * (ms / base_ms - 1):+.2f}%" if base_ms else "n/a"
        print(f"{arm:12s} step_ms:{ms:9.2f}  overhead:{overhead:>8s}  peak_MiB:{peak:7d}  added_params:{added}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
