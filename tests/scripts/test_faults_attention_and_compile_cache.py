"""The training script under the faults of issue 36: a choice of attention that cannot train here refused in one
line before any log, and a truncated kernel in inductor's compile cache named in one line and removed."""

import os
import subprocess
import sys

import pytest

import train_gpt_medium as T
from conftest import ROOT
from speedrun.compile_cache import is_truncated_elf, sweep_truncated_kernels, truncated_kernel
from test_faults_training import TINY, data_flags, one_error_line


def test_flex_attention_on_cpu_is_refused_in_one_line_before_any_log(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(T.torch.cuda, "is_available", lambda: False)
    rc = T.main([*TINY, *data_flags(tmp_path / "data"), "--base", "r18", "--attention", "flex", "--num-iterations",
                 "2", "--log-dir", str(tmp_path / "logs")])
    assert rc == 2
    line = one_error_line(capsys)
    assert "--attention flex: FlexAttention has no backward on CPU" in line and "use sdpa" in line
    assert not (tmp_path / "logs").exists()


# A compiled run as the training scripts' main runs it (speedrun.cli.run_main): one small inductor kernel.
COMPILED_MAIN = """
import sys, torch
from speedrun.cli import run_main
def run(args, proc):
    print(torch.compile(lambda x: (x.sin() * 2 + 1).sum(), backend="inductor")(torch.ones(64)).item())
sys.exit(run_main(lambda argv: None, run))
"""


@pytest.mark.slow
def test_a_truncated_kernel_in_the_compile_cache_is_one_line_and_removed(tmp_path):
    """Torch's own `file too short` error from a truncated .so (one real CPU compile): no faster test loads one."""
    cache = tmp_path / "inductor-cache"
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache), PYTHONPATH=str(ROOT))

    def compiled():
        return subprocess.run([sys.executable, "-c", COMPILED_MAIN], env=env, capture_output=True, text=True,
                              timeout=600)

    first = compiled()
    assert first.returncode == 0, first.stderr[-2000:]
    (kernel,) = cache.glob("*/*.main.so")
    intact = [path for path in cache.glob("*/*.so")]
    assert not any(is_truncated_elf(path) for path in intact)
    # the conftest's sweep: a half-written copy is found and removed, the intact files are left alone
    half = kernel.with_name("chalf.so")
    half.write_bytes(kernel.read_bytes()[:kernel.stat().st_size // 2])
    assert sweep_truncated_kernels(cache, settled_s=0) == [
        f"{half}: file too short (a compile killed while writing it left it truncated in inductor's cache {cache}); "
        f"removed it"]
    assert sorted(cache.glob("*/*.so")) == sorted(intact)

    kernel.write_bytes(b"")  # a compile killed right after creating the file
    poisoned = compiled()
    assert poisoned.returncode == 1
    assert poisoned.stderr.strip().splitlines()[-1] == (
        f"error: {kernel}: file too short (a compile killed while writing it left it truncated in inductor's cache "
        f"{cache}); removed it: run again")
    assert "Traceback" not in poisoned.stderr and not kernel.exists()
    assert truncated_kernel(poisoned.stderr) == kernel  # the study runner starts such a run again
