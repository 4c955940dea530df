"""Benchmark: summarising a corpus of 1,500 logs shaped like the upstream records/ corpus (goal: under 10 s on 2 cores).

Writes the logs into a temporary folder - every era and format in the proportions and sizes of the upstream
track_1_short / track_2_medium logs (about 190 KB a log: 2024 logs without or with a peak-memory line, 2025-2026 logs
with the script and its kernels embedded, logs with times in seconds, this project's logs with embedded modules,
and a few llm.c `main.log` files that are reported as unsupported) in record folders with subfolders - then times
`python -m analysis summarize DIR --target 3.28 --json` end to end in a fresh process, and prints the figures.

    python benchmarks/bench_analysis.py [--logs 1500] [--jobs N] [--keep DIR]
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

# (share of the corpus, writer of one log) per era; sizes follow the upstream logs of that era.
CODE_LINE = "    x = compile(model)  # a line of source\n"


def _code(lines: int) -> str:
    return analysis_logs.TRICKY_CODE + CODE_LINE * lines


def _curve(total: int, final: float):
    return lambda step: analysis_logs.default_curve(step, total, final)


def _upstream(era: str, code_lines: int, steps: int):
    def write(index: int) -> str:
        text = analysis_logs.upstream_log_text(total_steps=steps, val_every=125, era=era, step_ms=61.5,
                                               losses=_curve(steps, 3.2765 + 0.0002 * (index % 9)))
        return _code(code_lines) + text[len(analysis_logs.TRICKY_CODE):]
    return write


def _ours(index: int) -> str:
    return analysis_logs.our_log_text(
        variant=f"arm{index % 4}", seed=index, total_steps=5960, val_every=125, code=_code(1200), step_ms=232.0,
        modules={"speedrun/model.py": analysis_logs.TRICKY_MODULE + CODE_LINE * 600},
        losses=_curve(5960, 2.9185 + 0.0002 * (index % 7)),
        scalars=lambda step: {"backout.x": 1.0 - step / 30000, "backout.L11": -step / 20000})


ERAS = (("2024-early", 0.17, _upstream("2024-early", 600, 3000)),
        ("2024", 0.04, _upstream("2024", 600, 1750)),
        ("2025", 0.35, _upstream("2025", 1500, 2250)),
        ("2026", 0.37, _upstream("2025", 3000, 1500)),
        ("seconds", 0.02, _upstream("seconds", 300, 4875)),
        ("ours", 0.05, _ours))
RECORD_SIZE = 10  # logs per record folder; every other record splits them into baseline/ and this_pr/


def write_logs(folder: Path, count: int) -> dict:
    """`count` logs in the eras' proportions, plus 3 llm.c main.log files; returns {era: number of logs}."""
    counts, index = {}, 0
    for position, (era, share, writer) in enumerate(ERAS):
        n = count - index if position == len(ERAS) - 1 else round(share * count)
        for _ in range(n):
            record, member = divmod(index, RECORD_SIZE)
            sub = ("baseline" if member < RECORD_SIZE // 2 else "this_pr") if record % 2 else ""
            analysis_logs.write(folder / f"{era}_{record:03d}" / sub / f"{member:02d}.txt", writer(index))
            index += 1
        counts[era] = n
    for number in range(3):
        analysis_logs.write(folder / f"llmc_{number}" / "main.log", analysis_logs.llmc_log_text(total_steps=2000))
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", type=int, default=1500)
    parser.add_argument("--jobs", type=int, default=None, help="passed to summarize --jobs")
    parser.add_argument("--keep", type=Path, help="write the logs here and keep them")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench_analysis_"))
    try:
        started = time.perf_counter()
        counts = write_logs(folder, args.logs)
        sizes = [p.stat().st_size for p in folder.rglob("*.txt")]
        print(f"wrote {len(sizes)} logs ({', '.join(f'{era}: {n}' for era, n in counts.items())}) + 3 llm.c "
              f"main.log, {sum(sizes) / 2**20:.0f} MiB, mean {sum(sizes) / len(sizes) / 1024:.0f} KB, "
              f"in {time.perf_counter() - started:.1f} s")
        command = [sys.executable, "-m", "analysis", "summarize", str(folder), "--target", "3.28", "--json"]
        if args.jobs:
            command += ["--jobs", str(args.jobs)]
        started = time.perf_counter()
        done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
        elapsed = time.perf_counter() - started
        if done.returncode != 0:
            sys.exit(f"summarize failed: {done.stderr.strip()}")
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        print(f"summarize of {args.logs} logs: {elapsed:.2f} s on {cpus} CPUs (goal: < 10 s on 2 cores); "
              f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    finally:
        if args.keep is None:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
