"""The GPU benchmark harness runs end to end on CPU (tiny preset, 2 gloo ranks), so a GPU session does not find it
broken."""
import subprocess
import sys

import pytest

from conftest import ROOT


@pytest.mark.slow
def test_gpu_medium_benchmark_runs_arms_and_reports_failures(tmp_path):
    """Guards: benchmarks/gpu_medium.py end to end (2 gloo ranks): its figures file, timings, a failing arm named."""
    out = tmp_path / "figures.txt"
    res = subprocess.run([sys.executable, "benchmarks/gpu_medium.py", "--preset", "tiny", "--steps", "2",
                          "--nproc", "2", "--arm", "base=", "--arm", "bad=--backout-layers 5", "--out", str(out)],
                         cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-2000:]
    lines = out.read_text().splitlines()
    assert lines[0].startswith("date: ") and lines[1].startswith("device: ") and lines[2].startswith("command: ")
    base = next(l for l in lines if l.startswith("base "))
    step_ms, tokens_s = float(base.split()[1]), float(base.split()[2])
    assert step_ms > 0 and tokens_s == pytest.approx(8 * 64 / (step_ms / 1000), rel=0.01)
    # the profiled step: the optimiser's time, and the gloo collectives' time not hidden behind an operator
    optimizer_ms, exposed_comm_ms = float(base.split()[-2]), float(base.split()[-1])
    assert 0 < optimizer_ms < step_ms and 0 <= exposed_comm_ms < step_ms
    bad = next(l for l in lines if l.startswith("bad "))
    assert "failed: error: --backout-layers" in bad
