"""The CPU path's speed-ups keep the math: the hand-fused softcapped cross-entropy against the plain autograd
expression, and freed tensor memory kept mapped (fewer page faults) by the CPU process set-up."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import train_gpt_medium as medium

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("scale", [0.01, 1.0, 30.0, 300.0])
def test_fused_head_loss_and_gradient_equal_the_plain_expression(scale):
    generator = torch.Generator().manual_seed(int(scale * 100))
    logits = (torch.randn(48, 1000, generator=generator) * scale).requires_grad_()
    targets = torch.randint(0, 1000, (48,), generator=generator)
    upstream = 0.37  # a loss scale such as 1 / (tokens x accumulation steps)
    plain = F.cross_entropy(medium.softcap(logits), targets, reduction="sum")
    plain_grad, = torch.autograd.grad(plain * upstream, logits)
    fused = medium.softcapped_cross_entropy(logits, targets)
    fused_grad, = torch.autograd.grad(fused * upstream, logits)
    torch.testing.assert_close(fused, plain, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(fused_grad, plain_grad, rtol=1e-4, atol=1e-7)
    assert not torch.equal(fused_grad, torch.zeros_like(fused_grad))


def test_fused_head_repeats_a_target_and_runs_without_gradients():
    logits = torch.randn(6, 50, dtype=torch.float32)
    targets = torch.tensor([3, 3, 3, 0, 49, 3])
    with torch.no_grad():
        fused = medium.softcapped_cross_entropy(logits, targets)
    torch.testing.assert_close(fused, F.cross_entropy(medium.softcap(logits), targets, reduction="sum"))


FAULTS_SCRIPT = """
import resource, sys, torch
import torch.nn.functional as F
if sys.argv[1] == "kept":
    from speedrun.distributed import keep_freed_memory_mapped
    keep_freed_memory_mapped()
import train_gpt_medium as medium
head, x = torch.zeros(50304, 64, requires_grad=True), torch.randn(64, 64, requires_grad=True)
targets = torch.randint(0, 50257, (64,))
def micro_step():  # the tiny preset's head: 64 tokens x 50304 logits (13 MB), forward and backward
    medium.softcapped_cross_entropy(F.linear(x, head), targets).backward()
micro_step(), micro_step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    micro_step()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def page_faults(mode):
    result = subprocess.run([sys.executable, "-c", FAULTS_SCRIPT, mode], cwd=REPO, capture_output=True, text=True,
                            check=True)
    return int(result.stdout)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's allocator settings")
def test_cpu_setup_keeps_freed_blocks_mapped():
    default, kept = page_faults("default"), page_faults("kept")
    assert default > 10 * 1000, "fresh 13 MB blocks fault their ~3000 pages in at every micro-step by default"
    assert kept < default * 0.6
