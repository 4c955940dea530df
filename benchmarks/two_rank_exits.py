"""Benchmark: how often a finished 2-rank CPU run (gloo) still exits with a signal.

Launches the same short run N times under torchrun and counts exit statuses. Before
speedrun.distributed.exit_before_interpreter_teardown, about 1 exit in 7 of this run was SIGABRT on a loaded
2-core machine ("terminate called without an active exception": a gloo worker thread releasing a finished
collective during Python's finalisation); one such exit failed a CI run.

    python benchmarks/two_rank_exits.py --runs 30
"""
from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# --stop-after with a checkpoint: the run ends right after the checkpoint's collectives, as the failing CI run did
RUN = ["--base", "r18", "--preset", "tiny", "--num-iterations", "4", "--val-every", "2", "--stop-after", "2",
       "--checkpoint-every", "2"]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args(argv)
    statuses = collections.Counter()
    env = dict(os.environ, OMP_NUM_THREADS="1")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.runs):
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                   str(ROOT / "train_gpt_medium.py"), *RUN, "--log-dir", tmp, "--run-name", f"run{i}"]
            res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT)
            aborted = "SIGABRT" in res.stderr or "terminate called" in res.stderr
            outcome = "SIGABRT" if aborted else f"exit {res.returncode}"
            statuses[outcome] += 1
            print(f"run {i + 1}/{args.runs}: {outcome}", flush=True)
    print(f"{args.runs} runs in {time.perf_counter() - start:.0f} s: "
          + ", ".join(f"{k}: {v}" for k, v in sorted(statuses.items())))
    return 0 if set(statuses) == {"exit 0"} else 1


if __name__ == "__main__":
    sys.exit(main())
