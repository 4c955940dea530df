"""Benchmark: summarising 1,200 logs of about 6,000 lines each (goal: under 30 s on 2 cores).

Writes the logs into a temporary folder (this project's format: ~400 lines of source, the environment section, 5,550
training step lines, 45 validation and 45 scalars lines), then times `python -m analysis summarize DIR --target 2.92
--json` end to end in a fresh process, and prints the figures.

    python benchmarks/bench_analysis.py [--logs 1200] [--jobs N] [--keep DIR]
"""
from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import analysis_logs  # noqa: E402  (the log writers shared with the tests)

STEPS, VAL_EVERY, ARMS = 5550, 125, 12


def write_logs(folder: Path, count: int) -> int:
    """`count` logs over ARMS arms; returns the number of lines of one log."""
    code = analysis_logs.TRICKY_CODE + "".join(f"x_{i} = compute({i}, 'some realistic line of source code')\n"
                                                for i in range(400))
    lines = 0
    for index in range(count):
        arm, seed = f"arm{index % ARMS}", index // ARMS
        final = 2.919 + 0.0005 * (index % 7)
        text = analysis_logs.our_log_text(
            variant=arm, seed=seed, total_steps=STEPS, val_every=VAL_EVERY, code=code, step_ms=249.5,
            losses=lambda step: analysis_logs.default_curve(step, STEPS, final),
            scalars=lambda step: {"backout.x": 1.0 - step / 30000, "backout.L11": -step / 20000})
        analysis_logs.write(folder / arm / f"seed{seed}.txt", text)
        lines = text.count("\n")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=1200)
    parser.add_argument("--jobs", type=int, default=None, help="passed to summarize --jobs")
    parser.add_argument("--keep", type=Path, help="write the logs here and keep them")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_analysis_"))
    try:
        started = time.perf_counter()
        lines = write_logs(folder, args.logs)
        size = sum(p.stat().st_size for p in folder.rglob("*.txt"))
        print(f"wrote {args.logs} logs of {lines} lines ({size / 2**20:.0f} MiB) "
              f"in {time.perf_counter() - started:.1f} s")
        command = [sys.executable, "-m", "analysis", "summarize", str(folder), "--target", "2.92", "--json"]
        if args.jobs:
            command += ["--jobs", str(args.jobs)]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"summarize failed: {done.stderr.strip()}")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(f"summarize of {args.logs} logs: {elapsed:.2f} s on {cpus} CPUs (goal: < 30 s on 2 cores)")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
