"""benchmarks/kernel_profile.py on the CPU: the window counted in steps of the marker optimiser, from outside a
script it does not edit; the per-step summary and the side-by-side table vs_upstream prints. The CUDA kernels
themselves wait for a GPU call; on the CPU the window's top-level operators stand in."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu_check import steady_step_ms
from benchmarks.kernel_profile import OTHER_KIND, kernel_kind, render, summarise
from benchmarks.vs_upstream import profile_lines

REPO = Path(__file__).resolve().parents[2]

# Two optimisers, as a medium base has: Adam stepped twice per training step, the marker once.
SCRIPT = '''import sys
import torch
class Muon(torch.optim.SGD):
    pass
w = torch.nn.Parameter(torch.ones(8, 8))
adam, muon = torch.optim.Adam([w]), Muon([w], lr=0.01)
for step in range(int(sys.argv[1])):
    (w @ w).sum().backward()
    adam.step()
    muon.step()
    adam.step()
print("trained", sys.argv[1])
'''


def profile(tmp_path, *flags, steps=6):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "p.json"
    run = subprocess.run([sys.executable, str(REPO / "benchmarks" / "kernel_profile.py"), *flags, "--out", str(out),
                          "--", str(script), str(steps)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    return run, out


def test_the_window_is_counted_in_marker_steps_of_a_script_it_does_not_edit(tmp_path):
    run, out = profile(tmp_path, "--from-step", "2", "--steps", "3")
    assert run.returncode == 0, run.stderr
    assert "trained 6" in run.stdout  # the script's own arguments reached it
    summary = json.loads(out.read_text())
    assert summary["steps"] == 3 and summary["source"].startswith("CPU top-level operators")
    assert summary["wall_ms"] > 0 and summary["launches"] > 0
    calls = {k["name"]: k["calls"] for k in summary["top"]}
    # Adam's two steps of each of the 3 training steps in the window, per step: a window of other length gives
    # another count, since the window opens and closes inside the marker's steps
    assert calls["Optimizer.step#Adam.step"] == 2.0


def test_a_window_the_script_never_reaches_writes_nothing_and_says_so(tmp_path):
    run, out = profile(tmp_path, "--from-step", "5", "--steps", "2", steps=6)
    assert run.returncode == 1 and not out.exists()
    # the last line (torch's profiler logs its start and stop on stderr before it)
    assert run.stderr.splitlines()[-1] == "error: the script stepped Muon 6 times, the window needs 7: no profile written"
    run, out = profile(tmp_path, "--from-step", "0", "--steps", "2")
    assert run.returncode == 2 and run.stderr.startswith("error: --from-step 0 --steps 2: both at least 1")


def test_kernels_are_grouped_by_kind_and_given_per_step():
    assert [kernel_kind(name) for name in ("nvjet_tst_128x256_64x4_2x1_v_bz_coopA_TNT", "sm90_xmma_gemm_bf16",
                                           "triton_tem_fused_flex_attention_0", "ncclDevKernel_AllGather_RING_LL",
                                           "triton_poi_fused__to_copy_add_0", "Memcpy DtoD (Device -> Device)",
                                           "void at::native::vectorized_elementwise_kernel")] == [
        "matmul (cuBLAS/CUTLASS)", "matmul (cuBLAS/CUTLASS)", "attention (flex/varlen/sdpa)", "NCCL",
        "Triton fused (inductor)", "copy/fill", OTHER_KIND]
    kernels = [("nvjet_a", 600.0), ("nvjet_a", 600.0), ("triton_poi_fused_0", 200.0), ("ncclDevKernel_x", 400.0)]
    summary = summarise(kernels, wall_s=0.004, steps=2, top=2)
    assert summary["wall_ms"] == 2.0 and summary["kernel_ms"] == 0.9 and summary["launches"] == 2
    assert summary["kinds"] == {"matmul (cuBLAS/CUTLASS)": 0.6, "NCCL": 0.2, "Triton fused (inductor)": 0.1}
    assert summary["top"] == [dict(name="nvjet_a", calls=1.0, ms=0.6), dict(name="ncclDevKernel_x", calls=0.5, ms=0.2)]
    table = render([("ours", summary), ("upstream", summarise(kernels[:2], 0.004, 2))])
    assert "  idle ms (wall - kernels)" in table and table.count("top kernels of") == 2
    idle = next(line for line in table.splitlines() if line.startswith("  idle ms")).split()[-2:]
    assert idle == ["1.1", "1.4"]


def test_vs_upstream_reads_both_profiles_or_names_the_missing_one(tmp_path):
    (tmp_path / "ours.profile.json").write_text(json.dumps(summarise([("nvjet_a", 1000.0)], 0.002, 1)))
    text = profile_lines(tmp_path, 12, 4)
    assert text.startswith("torch.profiler over 4 steps, from within step 13 to within step 17")
    assert "top kernels of ours" in text and text.endswith(f"no profile from upstream (its console: "
                                                           f"{tmp_path / 'consoles'})")


def test_the_step_time_leaves_out_the_profiled_steps_after_the_timed_ones():
    lines = "\n".join(f"step:{s}/50 train_time:{t}ms step_avg:0.00ms"
                      for s, t in ((1, 5000), (2, 5100), (3, 5200), (4, 5300), (5, 9300)))
    assert steady_step_ms(lines, skip=2) == 1400.0
    assert steady_step_ms(lines, skip=2, last=4) == 100.0
