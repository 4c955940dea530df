"""The training script under the faults of issue 36: a choice of attention that cannot train here refused in one
line before any log, and a truncated kernel in inductor's compile cache named in one line and removed."""

import os
import subprocess
import sys
from pathlib import Path

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


def test_inductor_cache_is_the_folder_torch_compiles_into(tmp_path, monkeypatch):
    """speedrun.compile_cache resolves inductor's cache without importing inductor: it must name torch's folder."""
    from torch._inductor.runtime.cache_dir_utils import cache_dir, default_cache_dir

    from speedrun.compile_cache import CACHE_VARIABLE, inductor_cache
    monkeypatch.delenv(CACHE_VARIABLE, raising=False)
    assert inductor_cache() == Path(default_cache_dir())
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv(CACHE_VARIABLE, "relative-cache")
    assert inductor_cache() == tmp_path / "relative-cache"
    assert inductor_cache() == Path(cache_dir())  # torch's own reading of the same variable


# The controller's sweep at the suite's start (tests/conftest.py pytest_sessionstart), run as pytest would run it.
SESSION_START = """
import sys, types
sys.path[:0] = ["tests", "."]
import conftest
conftest.pytest_sessionstart(types.SimpleNamespace(config=types.SimpleNamespace()))
print(sorted(name for name in ("torch", "torch._inductor") if name in sys.modules))
"""


@pytest.mark.slow
def test_the_suites_sweep_removes_a_settled_truncated_kernel_without_importing_torch(tmp_path):
    """Guards: the sweep before xdist starts its workers finds inductor's cache and imports neither torch nor
    inductor (their import, in the controller alone, held up every worker's start)."""
    cache = tmp_path / "inductor-cache"
    (cache / "ab").mkdir(parents=True)
    truncated = cache / "ab" / "cabc.so"
    truncated.write_bytes(b"\x7fELF")  # a header cut short: a compile killed while writing it
    os.utime(truncated, (1, 1))  # settled long ago
    env = {k: v for k, v in os.environ.items() if k != "SPEEDRUN_TEST_IN_OWN_PROCESS"}
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)
    res = subprocess.run([sys.executable, "-c", SESSION_START], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip().splitlines()[-1] == "[]"
    assert not truncated.exists() and f"conftest: {truncated}: file too short" in res.stderr
