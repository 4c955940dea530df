"""Benchmark: r18's training gradients under CPU inductor at each C++ vector width, against eager's.

Why it exists: torch 2.13's 512-bit (AVX-512) CPU code gave wrong, partly non-finite MLP-projection gradients in
r18's bf16 model, so speedrun.training.configure_inductor holds CPU inductor to 256-bit vectors. Rerun it after a
torch upgrade: when every width agrees with eager, the pin can go.

Each width runs in a process of its own (inductor's options are process-wide). Per width it prints the training
loss of step 0's first micro-batch (tiny preset, the bundled demo data, the model at its init), how many gradient
entries are not finite, and the parameters furthest from eager's by the measure test_r18_compile applies: the
norm of the difference over (0.1 x eager's norm + 1e-3); above 1 fails that test.

    python benchmarks/cpu_inductor_gradients.py [--widths auto,512,256,scalar] [--dtype bf16|fp32]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
WIDTHS = ("auto", "512", "256", "scalar")


def gradients_at(width, dtype):
    """One line: the figures of `width` against eager, in this process."""
    sys.path.insert(0, str(ROOT))
    import torch
    import torch._inductor.config as inductor_config

    import train_gpt_medium as T
    from speedrun.distributed import Dist
    from speedrun.r18.data import BosAlignedStream
    from speedrun.r18.model import R18GPT
    from speedrun.r18.train import Windows, r18_config, r18_schedule, training_loss
    from speedrun.training import check_data

    args = T.resolve_args(["--preset", "tiny", "--base", "r18", "--num-iterations", "120"])
    schedule = r18_schedule(args)
    torch.manual_seed(args.seed)
    model = R18GPT(r18_config(args), studies=args)
    if dtype == "bf16":
        model.cast_low_precision(torch.bfloat16)
    stream = BosAlignedStream(check_data(args), "--train-files")
    batch = next(iter(stream.micro_batches(schedule.batch_size(0), 0, 1)))
    mtp, windows = torch.tensor(schedule.mtp_weights(0)), Windows(model, schedule)

    def loss_and_gradients(train_model):
        model.zero_grad(set_to_none=True)
        loss = training_loss(train_model, batch, mtp, (windows.short, windows.long), "sdpa", Dist())
        loss.backward()
        return loss.item(), {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}

    eager_loss, eager = loss_and_gradients(model)
    if width == "scalar":
        inductor_config.cpp.vec_isa_ok = False
    elif width != "auto":
        inductor_config.cpp.simdlen = int(width)
    start = time.perf_counter()
    loss, compiled = loss_and_gradients(torch.compile(model, dynamic=False, fullgraph=True))
    seconds = time.perf_counter() - start
    nonfinite = sum(int((~torch.isfinite(g)).sum()) for g in compiled.values())
    ratios = sorted((float((compiled[n] - g).norm() / (0.1 * g.norm() + 1e-3)), n) for n, g in eager.items())[::-1]
    worst = ", ".join(f"{n} {r:.3g}" for r, n in ratios[:3])
    verdict = "agrees" if nonfinite == 0 and ratios[0][0] <= 1 else "DIFFERS"
    return (f"{dtype} width {width:>6}: {verdict}; loss {loss:.4f} (eager {eager_loss:.4f}), non-finite {nonfinite}, "
            f"worst {worst}; compile + step {seconds:.0f} s")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", default=",".join(WIDTHS), help="comma-separated: auto, 512, 256, scalar")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16: the model as runs build it")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child's width
    args = parser.parse_args()
    if args.one:
        print(gradients_at(args.one, args.dtype), flush=True)
        return
    widths = args.widths.split(",")
    unknown = [w for w in widths if w not in WIDTHS]
    if unknown:
        sys.exit(f"cpu_inductor_gradients: unknown width {unknown[0]!r} (expected one of {', '.join(WIDTHS)})")
    import torch
    print(f"torch {torch.__version__}, CPU capability {torch.backends.cpu.get_cpu_capability()}", flush=True)
    for width in widths:
        child = subprocess.run([sys.executable, __file__, "--one", width, "--dtype", args.dtype],
                               capture_output=True, text=True)
        lines = child.stdout.strip().splitlines()
        print(lines[-1] if child.returncode == 0 and lines else
              f"{args.dtype} width {width:>6}: FAILED ({child.stderr.strip().splitlines()[-1:]})", flush=True)


if __name__ == "__main__":
    main()
