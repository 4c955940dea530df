"""benchmarks/gpu_check.py on the CPU: the training-run check on the tiny preset (pass and fail), the table, and
the one-line refusal on a machine without CUDA. The CUDA-only parts (full-size runs, FlexAttention) need a GPU."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from benchmarks.gpu_check import Check, render, training_check

REPO = Path(__file__).resolve().parents[2]
DEMO_TRAIN, DEMO_VAL = str(REPO / "data/demo/demo_train_*.bin"), str(REPO / "data/demo/demo_val_*.bin")
PLAIN_PYTHON = ()  # run the script itself: no torchrun on the CPU, one process


def tiny_check(tmp_path, name, flags, steps=3):
    return training_check(name, REPO / "train_gpt_medium.py", ["--preset", "tiny", *flags],
                          steps, DEMO_TRAIN, DEMO_VAL, tmp_path / "logs", timeout_s=300, launcher=PLAIN_PYTHON)


@pytest.mark.slow
def test_a_run_whose_loss_falls_passes_with_its_figures(tmp_path):
    check = tiny_check(tmp_path, "tiny baseline", ["--num-iterations", "20"])
    assert check.passed, check.detail
    assert check.detail.startswith("val loss 10.826 -> ") and "at step 3" in check.detail
    assert "graph breaks" in check.detail and (tmp_path / "logs" / "tiny-baseline.txt").exists()


@pytest.mark.slow
def test_a_refused_run_fails_with_its_error_line(tmp_path):
    check = tiny_check(tmp_path, "bad layer", ["--backout-layers", "99"])
    assert not check.passed
    assert check.detail.startswith("exit status 2: error:") and "backout" in check.detail


@pytest.mark.slow
def test_a_run_past_its_time_fails(tmp_path):
    check = training_check("slow", REPO / "train_gpt_medium.py", ["--preset", "tiny"], 40, DEMO_TRAIN, DEMO_VAL,
                           tmp_path, timeout_s=1, launcher=PLAIN_PYTHON)
    assert (check.passed, check.detail) == (False, "no end after 1 s")


def test_table_counts_passes_and_failures():
    text = render([Check("a", True, "fine"), Check("longer name", False, "broke")])
    lines = text.splitlines()
    assert lines[2].split()[:3] == ["a", "PASS", "fine"] and lines[3].split()[-2:] == ["FAIL", "broke"]
    assert lines[-1].startswith("1 of 2 checks passed; 1 failed")


@pytest.mark.slow
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA")
def test_without_cuda_it_says_so_in_one_line():
    result = subprocess.run([sys.executable, "benchmarks/gpu_check.py"], cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("error: gpu-check needs CUDA") and len(result.stderr.splitlines()) == 1
