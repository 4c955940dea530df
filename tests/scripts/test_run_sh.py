"""run.sh's main-job branches and its test command with stand-ins: a fake nvidia-smi on PATH, a python3 whose
heavy commands (a study, the tests, the GPU checks) only record their arguments, and the local stand-in hub of the
downloader tests. Each test runs a copy of run.sh in a scratch checkout, so no download lands in the real data/
folder."""
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from test_data_download import StandInHub, make_remote

REPO = Path(__file__).resolve().parents[2]
RECORD_TRAIN_SHARDS = 30
HEAVY_STUB = f"""#!/usr/bin/env bash
# python3 stand-in: records every call; a study, the tests and the GPU checks stop there, the rest runs for real.
printf '%s\\n' "$*${{COMPILE_MATRIX:+ [COMPILE_MATRIX=$COMPILE_MATRIX]}}" >> "$STUB_CALLS"
if [ "$1 $2" = "-m pytest" ] && [ -n "${{SPEEDRUN_TEST_COSTS:-}}" ]; then  # one metered test, as the suite writes
    echo '{{"test": "t.py::a", "outcome": "passed", "wall_s": 50, "cpu_s": 40, "child_cpu_s": 50, "kind": "process"}}' \
        >> "$SPEEDRUN_TEST_COSTS"
    exit "${{STUB_PYTEST_STATUS:-0}}"
fi
if [ "$1 $2" = "-m ablations" ] || [ "$1 $2" = "-m pytest" ] || [ "$1" = benchmarks/gpu_check.py ]; then exit 0; fi
exec {sys.executable} "$@"
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


@pytest.fixture
def checkout(tmp_path):
    """A scratch checkout: run.sh and data/ copied, everything else linked to the real one."""
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy(REPO / "run.sh", root)
    shutil.copytree(REPO / "data", root / "data", ignore=shutil.ignore_patterns("fineweb10B", "demo", "__pycache__"))
    (root / "data" / "demo").symlink_to(REPO / "data" / "demo")
    for name in ("ablations", "analysis", "benchmarks", "speedrun", "train_gpt_medium.py", "requirements.txt"):
        (root / name).symlink_to(REPO / name)
    return root


def run_sh(checkout, tmp_path, *args, gpus=0, hub="http://127.0.0.1:9", **more_env):
    stubs = tmp_path / "stubs"
    stubs.mkdir(exist_ok=True)
    executable(stubs / "python3", HEAVY_STUB)
    if gpus:
        lines = "".join(f"GPU {i}: NVIDIA H100 80GB HBM3 (UUID: GPU-{i})\\n" for i in range(gpus))
        executable(stubs / "nvidia-smi", f"#!/usr/bin/env bash\nprintf '{lines}'\n")
    calls = tmp_path / "calls.txt"
    calls.write_text("")
    path = [str(stubs)] + [d for d in os.environ["PATH"].split(os.pathsep)
                           if d and not (Path(d) / "nvidia-smi").exists()]
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower() and k != "FORCE_VENV"}
    env.update(PATH=os.pathsep.join(path), STUB_CALLS=str(calls), HF_ENDPOINT=hub, HF_HOME=str(tmp_path / "hf"),
               HF_HUB_DISABLE_TELEMETRY="1", NO_PROXY="127.0.0.1,localhost", PYTHONPATH=str(checkout), **more_env)
    result = subprocess.run(["bash", str(checkout / "run.sh"), *args], cwd=tmp_path, env=env, capture_output=True,
                            text=True, timeout=300)
    return result, calls.read_text().splitlines()


def study_calls(calls):
    return [c for c in calls if c.startswith("-m ablations")]


@pytest.fixture
def hub(tmp_path):
    server = StandInHub(make_remote(tmp_path / "remote", RECORD_TRAIN_SHARDS))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def closed_port_endpoint():
    with socket.socket() as probe:  # a port with nothing listening
        probe.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{probe.getsockname()[1]}"


@pytest.mark.slow
def test_without_a_gpu_the_main_job_is_the_demo_one_run_per_core(checkout, tmp_path, monkeypatch):
    """Guards: run.sh (bash) with no nvidia-smi GPU starts the demo study with one run per core and its report."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # a user's thread setting does not shrink the runs at once
    result, calls = run_sh(checkout, tmp_path)
    assert result.returncode == 0, result.stderr
    assert "because no CUDA GPU here" in result.stdout
    assert study_calls(calls) == ["-m ablations run demo --gpus 0 --parallel " + str(min(len(os.sched_getaffinity(0)), 4))
                                  + " --report"]


@pytest.mark.slow
def test_demo_runs_the_demo_on_a_gpu_node_too(checkout, tmp_path):
    """Guards: `run.sh demo` on a node with 8 stand-in GPUs still runs the CPU demo, passing on its extra arguments."""
    result, calls = run_sh(checkout, tmp_path, "demo", "--seeds", "0", gpus=8)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("run.sh: the demo study on the CPU") and "because" not in result.stdout
    assert study_calls(calls)[0].startswith("-m ablations run demo --gpus 0")
    assert study_calls(calls)[0].endswith("--report --seeds 0")


@pytest.mark.slow
def test_gpu_node_without_shards_downloads_them_then_runs_the_record_study(checkout, tmp_path, hub):
    """Guards: run.sh on a GPU node states the size, fetches 31 shards from the stand-in hub, runs the record study."""
    endpoint = f"http://127.0.0.1:{hub.server_address[1]}"
    result, calls = run_sh(checkout, tmp_path, gpus=2, hub=endpoint)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    size = next(i for i, line in enumerate(lines) if "31 files of 200 MB, up to 6200 MB" in line)
    first_download = next(i for i, line in enumerate(lines) if "[1/31] downloading fineweb_val_000000.bin" in line)
    assert size < first_download, "the size is stated before anything is fetched"
    assert f"[31/31] downloading fineweb_train_{RECORD_TRAIN_SHARDS:06d}.bin" in result.stdout
    assert len(hub.downloads) == RECORD_TRAIN_SHARDS + 1
    fetched = checkout / "data" / "fineweb10B"
    assert (fetched / "fineweb_train_000030.bin").read_bytes() == (hub.folder / "fineweb_train_000030.bin").read_bytes()
    assert study_calls(calls) == ["-m ablations run record --nproc 2 --report"]


@pytest.mark.slow
def test_gpu_node_with_shards_runs_the_record_study_without_the_network(checkout, tmp_path):
    """Guards: run.sh on a GPU node holding the shards runs the record study with --nproc 8 and downloads nothing."""
    shards = checkout / "data" / "fineweb10B"
    shards.mkdir()
    for index in range(RECORD_TRAIN_SHARDS + 1):
        kind = "val" if index == 0 else "train"
        (shards / f"fineweb_{kind}_{index:06d}.bin").write_bytes(b"")
    result, calls = run_sh(checkout, tmp_path, gpus=8, hub=closed_port_endpoint())
    assert result.returncode == 0, result.stderr
    assert "downloading" not in result.stdout and not [c for c in calls if "cached_fineweb10B" in c]
    assert study_calls(calls) == ["-m ablations run record --nproc 8 --report"]


@pytest.mark.slow
def test_gpu_node_offline_says_so_in_one_line_and_runs_nothing_heavy(checkout, tmp_path):
    """Guards: run.sh on an offline GPU node without shards: one stderr line, exit 1, no download, no study."""
    result, calls = run_sh(checkout, tmp_path, gpus=1, hub=closed_port_endpoint())
    assert result.returncode == 1
    assert result.stdout == "" and len(result.stderr.strip().splitlines()) == 1
    assert "cannot reach the Hugging Face Hub" in result.stderr
    assert "'python data/cached_fineweb10B.py 30' on a machine with network" in result.stderr
    assert study_calls(calls) == [] and not [c for c in calls if "cached_fineweb10B.py" in c]
    assert not (checkout / "data" / "fineweb10B").exists()


@pytest.mark.slow
@pytest.mark.parametrize("args", [("setup", "--bogus"), ("help", "me")])
def test_commands_without_arguments_refuse_extra_ones(checkout, tmp_path, args):
    """Guards: `run.sh setup --bogus` and `run.sh help me` exit 2 with one line (issue 43: ignored, exit 0)."""
    result, calls = run_sh(checkout, tmp_path, *args)
    assert result.returncode == 2 and result.stdout == "" and calls == []
    assert result.stderr == f"run.sh: {args[0]} takes no arguments (got: {args[1]}; see ./run.sh --help)\n"


@pytest.mark.slow
def test_gpu_check_needs_a_gpu_and_runs_the_checks_where_there_is_one(checkout, tmp_path):
    """Guards: `run.sh gpu-check` refuses without a GPU (exit 2), runs gpu_check.py with one, --plan without one."""
    result, calls = run_sh(checkout, tmp_path, "gpu-check")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "run.sh: gpu-check needs a CUDA GPU and nvidia-smi -L finds none here\n"
    assert not [c for c in calls if "gpu_check" in c]
    result, calls = run_sh(checkout, tmp_path, "gpu-check", "--budget", "300", gpus=1)
    assert result.returncode == 0, result.stderr
    assert "benchmarks/gpu_check.py --budget 300" in calls
    # the plan alone needs no GPU
    result, calls = run_sh(checkout, tmp_path, "gpu-check", "--plan", "--free-gib", "80")
    assert result.returncode == 0, result.stderr
    assert "benchmarks/gpu_check.py --plan --free-gib 80" in calls


@pytest.mark.slow
@pytest.mark.parametrize("args, pytest_call", [
    (["test"], "-m pytest -q -n {workers} --dist worksteal --durations=15"),
    (["test", "-x"], "-m pytest -q -n {workers} --dist worksteal --durations=15 -x"),
    (["test", "--fast"], "-m pytest -q -n {workers} --dist worksteal --durations=15 -m not slow"),
    (["test", "--fast", "-x", "tests/data"],
     "-m pytest -q -n {workers} --dist worksteal --durations=15 -m not slow -x tests/data"),
    (["test", "--full"], "-m pytest -q -n {workers} --dist worksteal --durations=15 [COMPILE_MATRIX=inductor]"),
])
def test_test_runs_everything_and_fast_only_the_tests_not_marked_slow(checkout, tmp_path, args, pytest_call):
    """Guards: `run.sh test` and its --fast, --full, -x and path forms call pytest with the right workers and marks."""
    result, calls = run_sh(checkout, tmp_path, *args)
    assert result.returncode == 0, result.stderr
    workers = min(len(os.sched_getaffinity(0)), 4)  # a worker per core, whatever OMP_NUM_THREADS says
    assert [c for c in calls if c.startswith("-m pytest")] == [pytest_call.format(workers=workers)]


@pytest.mark.slow
def test_python_runs_the_set_up_interpreter_with_the_arguments_given(checkout, tmp_path):
    """Guards: `run.sh python ARGS` runs ARGS with the interpreter set-up picked (the study guide's commands)."""
    result, calls = run_sh(checkout, tmp_path, "python", "-c", "import sys; print('args:', sys.argv[1:])", "a b")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "args: ['a b']\n"
    assert calls[-1] == "-c import sys; print('args:', sys.argv[1:]) a b"


@pytest.mark.slow
def test_test_ends_with_the_suites_cpu_minutes_and_keeps_pytests_status(checkout, tmp_path):
    """Guards: `run.sh test` meters the run (a temporary file, or SPEEDRUN_TEST_COSTS emptied first), prints its
    CPU-minutes, wall time and machine last, and exits with pytest's status."""
    result, _ = run_sh(checkout, tmp_path, "test", STUB_PYTEST_STATUS="3")
    assert result.returncode == 3
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("Suite cost: 1 tests, 1.5 CPU-minutes (user+sys), 0 min "), last
    assert f"nproc {len(os.sched_getaffinity(0))}, " in last
    costs = tmp_path / "costs.jsonl"
    costs.write_text("an earlier run's lines\n")
    result, _ = run_sh(checkout, tmp_path, "test", "--fast", SPEEDRUN_TEST_COSTS=str(costs))
    assert result.returncode == 0 and "Suite cost: 1 tests, 1.5 CPU-minutes" in result.stdout
    assert costs.read_text().count("\n") == 1 and '"t.py::a"' in costs.read_text()
