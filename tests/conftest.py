"""Fixtures shared by the test files: synthetic token shards, running the training script, and reading its one
line of bad input."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from cost_meter import command_text
from data.shard_format import write_shard
from speedrun.logformat import source_header

ROOT = Path(__file__).resolve().parent.parent
# PYTHONPATH of a child pytest that loads this conftest from elsewhere: it imports the project and tests/cost_meter
CHILD_PYTHONPATH = os.pathsep.join([str(ROOT), str(ROOT / "tests")])

# One compute thread per process (every xdist worker and every process a test starts), unless the caller chose: the
# suite runs a worker per core, so a second thread per process only oversubscribes the cores, and OpenMP's waiting
# threads spin. Measured under load on 2 cores: a tiny 8-step training took 37 CPU-s with 2 threads, 9 with 1, and
# logged the same losses. Set before torch is imported (it reads the variable then); xdist workers inherit it.
os.environ.setdefault("OMP_NUM_THREADS", "1")
MEDIUM_SCRIPT = ROOT / "train_gpt_medium.py"
SMALL_SCRIPT = ROOT / "train_gpt.py"
TESTS = ROOT / "tests"
FIXTURES = TESTS / "fixtures"

# Test files live in tests/<module>/, the helpers they import (runner_support, fake_train, analysis_logs, the
# drivers) in tests/; some test files import from a test file of another folder. All are importable whichever
# subset of the tests runs.
for _folder in [TESTS, *sorted(p for p in TESTS.iterdir() if p.is_dir() and any(p.glob("test_*.py")))]:
    if str(_folder) not in sys.path:
        sys.path.append(str(_folder))


write_token_shard = write_shard  # the tests' name for it


def synthetic_tokens(n, seed):
    """Documents of learnable text-like tokens: each starts with 50256, tokens follow a Zipf law."""
    rng = np.random.default_rng(seed)
    tokens = (rng.zipf(1.3, n) % 2000).astype(np.uint16)
    tokens[rng.random(n) < 0.01] = 50256
    tokens[0] = 50256
    return tokens


@pytest.fixture(scope="module")
def one_thread():
    """torch on one thread for a test module (tiny models are dominated by thread overhead)."""
    import torch
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def shard_dir(tmp_path_factory):
    """A val shard and two train shards, large enough for the tiny preset's default schedule."""
    d = tmp_path_factory.mktemp("shards")
    write_token_shard(d / "syn_val_000000.bin", synthetic_tokens(20_000, 0))
    write_token_shard(d / "syn_train_000001.bin", synthetic_tokens(30_000, 1))
    write_token_shard(d / "syn_train_000002.bin", synthetic_tokens(30_000, 2))
    return d


@pytest.fixture
def tiny_data_args(shard_dir):
    return ["--preset", "tiny", "--train-files", str(shard_dir / "syn_train_*.bin"),
            "--val-files", str(shard_dir / "syn_val_*.bin")]


def launch_script(args, nproc=1, script=MEDIUM_SCRIPT, timeout=600, cwd=ROOT, **kwargs):
    """Runs the training script (under torchrun when nproc > 1); returns the CompletedProcess."""
    # PYTHONFAULTHANDLER: a rank killed by a signal prints every thread's Python stack into the captured stderr.
    env = dict(os.environ, OMP_NUM_THREADS="1" if nproc > 1 else os.environ.get("OMP_NUM_THREADS", "1"),
               PYTHONFAULTHANDLER="1")
    if nproc > 1:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
               str(script), *args]
    else:
        cmd = [sys.executable, str(script), *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd, **kwargs)


def killed_run(script, args, log_dir, step_text, timeout=300):
    """Starts the training script (one process, run name r, logging to log_dir) and SIGKILLs it once its log holds
    step_text (or after timeout seconds); returns the log's path."""
    proc = subprocess.Popen([sys.executable, str(script), *args, "--log-dir", str(log_dir), "--run-name", "r"],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    log, deadline = log_dir / "r.txt", time.time() + timeout
    while time.time() < deadline and not (log.exists() and step_text in log.read_text()):
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return log


def one_error_line(capsys):
    """The one line that refused input printed: exactly one line on stderr, starting "error: ", and no traceback."""
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), captured.err
    assert "Traceback" not in captured.err + captured.out
    return lines[0]


def embedded_sources(script):
    """The code section a run of `script` writes: its source, then the data package's shard format and every
    speedrun/*.py module a run imports (all but the exporter) under one `==> PATH <==` header each, in path
    order."""
    parts = [Path(script).read_text().rstrip("\n")]
    # speedrun/export.py is imported by --export-script alone, never by a training run
    modules = [ROOT / "data" / "__init__.py", ROOT / "data" / "shard_format.py",
               *sorted(p for p in (ROOT / "speedrun").glob("*.py") if p.name != "export.py")]
    for module in modules:
        parts += [source_header(module.relative_to(ROOT).as_posix()), module.read_text().rstrip("\n")]
    return "\n".join(parts)


HISTORY = FIXTURES / "history"


def file_as_module(path, monkeypatch):
    """A script imported as a module (an exported file, a benchmark: importing it runs nothing), registered as Python
    registers a script it runs (its dataclasses read their string annotations through sys.modules)."""
    import importlib.util
    spec = importlib.util.spec_from_file_location(f"exported_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def file_logged_config(exported, argv):
    """The config line an exported file (file_as_module) writes for argv, as a dict: its config and the fields it
    logs from LEFT_OUT_FIELDS (the studies off or fixed in it)."""
    return {**exported.LEFT_OUT_FIELDS, **exported.resolve_args(exported.with_fixed_flags(argv)).as_dict()}


def flags_named(text):
    """The `--flag`s a text (a --help) names."""
    import re
    return set(re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", text))


def flags_named_but_not_offered(help_text, parser_options):
    """The `--flag`s a --help text names that are none of its parser's options."""
    return sorted(flags_named(help_text) - set(parser_options))


def script_from_history(stored_name):
    """A file (or part of one) of an earlier commit, stored in tests/fixtures/history/ with a header naming the
    commit and why it is kept, imported as a module under its stored name. Fails the test, never skips it, when the
    file cannot be read: a missing reference must not silently turn a bit-identity check off."""
    import types
    path = HISTORY / stored_name
    try:
        source = path.read_text()
    except OSError as e:
        pytest.fail(f"the reference {path.relative_to(ROOT)} cannot be read ({e.strerror or e}); it is tracked in "
                    "git: restore it with `git checkout -- tests/fixtures/history`", pytrace=False)
    module = types.ModuleType(path.name.split(".")[0].replace("-", "_at_"))
    module.__file__ = str(path)
    exec(compile(source, str(path), "exec"), module.__dict__)
    return module


@pytest.fixture(scope="session")
def unmodified_medium():
    """The medium script as it was before the study flags, so tests can check that the flagless path still
    computes exactly the same thing."""
    return script_from_history("train_gpt_medium-12c2aa8.py.txt")


def bundled_medium_studies():
    """The ablations/*.toml studies of train_gpt_medium.py, loaded; those whose arms are generated from another
    study's results (the backout multi-skip orders) are left out, they cannot expand without them."""
    import tomllib
    from ablations.study import available_studies, load_study
    out = []
    for path in available_studies():
        if "requires_results" in tomllib.loads(path.read_text()):
            continue
        study = load_study(str(path))
        if study.script.name == "train_gpt_medium.py":
            out.append(study)
    return out


def mounted_tmpfs(where, size="1m"):
    """Mounts a small tmpfs at `where` (a folder) for a full-disk or read-only test, yields it, unmounts it; skips
    the test where mounting is not allowed (it needs root)."""
    Path(where).mkdir(parents=True, exist_ok=True)
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    yield Path(where)
    subprocess.run(["umount", "-l", str(where)], check=False)


def full_tmpfs(where):
    """mounted_tmpfs, filled up to its last block: every write there fails with ENOSPC."""
    for mount in mounted_tmpfs(where, size="64k"):
        filler = os.open(mount / "filler", os.O_WRONLY | os.O_CREAT)
        try:
            while os.write(filler, b"\0" * 4096):
                pass
        except OSError:
            pass
        os.close(filler)
        yield mount


# ------------------------------------------------------------------------------------------------------------------
# Tests marked `own_process` run in a fresh interpreter each: inductor keeps every kernel it has compiled loaded for
# the life of the process (~0.2-0.3 GB per compile test, measured), so in one pytest process the compile tests
# alone grew it past 7 GB and the whole suite was killed for memory on a 24 GiB machine.
OWN_PROCESS_ENV = "SPEEDRUN_TEST_IN_OWN_PROCESS"


def pytest_configure(config):
    config.addinivalue_line("markers", "own_process: runs in a fresh python process of its own (memory; and slow)")
    # The suite's cost table: with SPEEDRUN_TEST_COSTS=PATH each test appends what it cost and what it started
    # (cost_meter.py; benchmarks/suite_costs.py groups the lines). Measured in the process that runs the tests (an
    # xdist worker, not its controller); taken out of the environment there, so a pytest that a test starts (an
    # own_process child, a test of the test machinery) is measured as part of that test and writes no lines.
    from cost_meter import COSTS_ENV, CostPlugin
    runs_tests = hasattr(config, "workerinput") or not getattr(config.option, "numprocesses", None)
    if os.environ.get(COSTS_ENV) and runs_tests:
        config.pluginmanager.register(CostPlugin(os.environ.pop(COSTS_ENV)), "cost_meter")


def pytest_sessionstart(session):
    """A compile killed while writing a kernel (a timed-out test, a killed run) leaves a truncated .so in inductor's
    shared cache, failing every later compile that needs it: such files are removed before any test compiles.
    Once per suite: the controller sweeps before xdist starts its workers (xdist's own start-up hook runs last), and a
    worker or an own-process child would only repeat it. The folder is found without importing torch (the
    controller imports it for nothing else: inductor's import held up the workers' start by ~3 s of wall)."""
    if hasattr(session.config, "workerinput") or os.environ.get(OWN_PROCESS_ENV):
        return
    from speedrun.compile_cache import inductor_cache, sweep_truncated_kernels

    for removed in sweep_truncated_kernels(inductor_cache()):
        print(f"conftest: {removed}", file=sys.stderr)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """An own_process test starts a python and pytest of its own: slow by construction, so it is marked here (before
    -m deselects) rather than trusted to carry both marks."""
    for item in items:
        if item.get_closest_marker("own_process") is not None:
            item.add_marker(pytest.mark.slow)


def own_process_outcome(item):
    """Runs the one test in a child pytest; returns (outcome, text) with outcome passed / failed / skipped."""
    import json
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "outcome.json"
        # no:logging: a compile's DEBUG trace records filled the captured-log section and pushed the error out of
        # the text kept below (no test here uses caplog)
        cmd = [sys.executable, "-m", "pytest", item.nodeid, "-q", "-p", "no:cacheprovider", "-p", "no:logging",
               "-rs", "-o", "addopts=", "--basetemp", str(Path(tmp) / "t")]
        env = dict(os.environ, **{OWN_PROCESS_ENV: str(report)})
        # One inductor compile thread: with a test process per core, a compile pool only adds its start-up and
        # transfers (a compile-matrix cell measured 37 CPU-s with one thread, 49 with two).
        env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        res = subprocess.run(cmd, cwd=str(item.config.rootpath), env=env, capture_output=True, text=True)
        outcome = json.loads(report.read_text())["outcome"] if report.exists() else "failed"
    text = res.stdout[-20000:] + res.stderr[-5000:]
    if outcome == "passed" and res.returncode != 0:
        outcome = "failed"  # e.g. a teardown error after the call passed
    return outcome, text


def pytest_runtest_protocol(item, nextitem):
    if item.get_closest_marker("own_process") is None or os.environ.get(OWN_PROCESS_ENV):
        return None
    import time
    item.ihook.pytest_runtest_logstart(nodeid=item.nodeid, location=item.location)
    start = time.time()
    outcome, text = own_process_outcome(item)
    longrepr = None
    if outcome == "failed":
        longrepr = f"in its own process:\n{text}"
    elif outcome == "skipped":
        reason = next((line for line in text.splitlines() if line.startswith("SKIPPED")), "SKIPPED")
        longrepr = (str(item.path), item.location[1] or 0, reason)
    report = pytest.TestReport(item.nodeid, item.location, {k: 1 for k in item.keywords}, outcome, longrepr,
                               "call", duration=time.time() - start)
    item.ihook.pytest_runtest_logreport(report=report)
    # What pytest's own protocol does after an item: tear down the fixtures (a module's, a session's) that the next
    # item does not share. Skipping it left an earlier test's module set up, and under pytest-xdist the next item
    # can come from another module: "previous item was not torn down properly".
    item.session._setupstate.teardown_exact(nextitem)
    item.ihook.pytest_runtest_logfinish(nodeid=item.nodeid, location=item.location)
    return True


def pytest_runtest_makereport(item, call):
    """In the child: records the test's outcome for the parent (a failure in setup, call or teardown counts)."""
    path = os.environ.get(OWN_PROCESS_ENV)
    if not path or item.get_closest_marker("own_process") is None:
        return
    import json
    outcome = "skipped" if call.excinfo is not None and call.excinfo.errisinstance(pytest.skip.Exception) else (
        "failed" if call.excinfo is not None else "passed")
    previous = json.loads(Path(path).read_text())["outcome"] if Path(path).exists() else "passed"
    if previous != "passed" and call.when != "setup":
        outcome = previous  # the first non-pass (a skip in setup, a failure in the call) decides
    Path(path).write_text(json.dumps({"outcome": outcome}))


def _heap_trimmer():
    """libc's malloc_trim where there is one (glibc), else a no-op; looked up once (find_library runs ldconfig)."""
    import ctypes
    import ctypes.util
    libc = ctypes.util.find_library("c")
    trim = getattr(ctypes.CDLL(libc), "malloc_trim", None) if libc else None
    return (lambda: trim(0)) if trim is not None else (lambda: None)


TRIM_HEAP = _heap_trimmer()


@pytest.hookimpl(trylast=True)  # after pytest's own teardown: the fixtures the next test does not share are gone
def pytest_runtest_teardown(item, nextitem):
    """Hands freed memory back to the system after each test. Tiny-model tensors are below glibc's mmap threshold,
    so freed ones stay in the heap's arenas: without this the test process grew by ~0.5 GB per training test (to
    8.7 GB over tests/speedrun/test_added_params_train.py, measured) and its peak is what CI's memory limit sees.

    The collection scans only what was made since the last test's: what outlived a test (modules imported on the
    way, caches, fixtures still in use) is frozen out of later ones. A whole collection of a process with torch,
    dynamo and inductor loaded took 0.1-0.2 CPU-s, after every one of the suite's ~1,300 tests. Everything is
    scanned again where a test module ends, when its module-scoped fixtures are freed."""
    import gc
    if nextitem is None or getattr(nextitem, "module", None) is not getattr(item, "module", None):
        gc.unfreeze()
    gc.collect()
    gc.freeze()
    TRIM_HEAP()


# ------------------------------------------------------------------------------------------------------------------
# The fast tier (`-m "not slow"`, what `./run.sh test --fast` runs) holds no test that starts a process: there, a
# test whose body - or the project code it calls - starts one fails with a line naming it. Processes that libraries
# start on their own account (platform.processor(), ctypes.util.find_library, compiler workers) are not counted.
class ProcessInFastTier(RuntimeError):
    pass


def in_fast_tier(config):
    return "not slow" in (config.getoption("markexpr", "") or "")


def is_project_file(filename):
    """True for a source file of this checkout (tests included), False for libraries, a venv inside it included."""
    if filename.startswith("<"):
        return False  # <string>, <frozen ...>: no file
    path = Path(filename).resolve()
    return path.is_relative_to(ROOT) and ".venv" not in path.parts and "site-packages" not in path.parts


def process_starter(frame):
    """The first frame outside the subprocess module: whoever asked for the process."""
    while frame is not None and frame.f_code.co_filename == subprocess.__file__:
        frame = frame.f_back
    return frame


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    if not in_fast_tier(item.config):
        return (yield)
    started = []
    spawn = subprocess.Popen._execute_child

    def guarded_spawn(popen, args, *rest, **kwargs):
        starter = process_starter(sys._getframe(1))
        if starter is not None and is_project_file(starter.f_code.co_filename):
            command = command_text(args)
            where = f"{Path(starter.f_code.co_filename).relative_to(ROOT)}:{starter.f_lineno}"
            started.append(f"{item.nodeid} starts a process in the fast tier ({where}: {command[:120]}); "
                           "mark it @pytest.mark.slow")
            raise ProcessInFastTier(started[-1])
        return spawn(popen, args, *rest, **kwargs)

    subprocess.Popen._execute_child = guarded_spawn
    try:
        result = yield
    except Exception:
        if not started:
            raise
        result = None
    finally:
        subprocess.Popen._execute_child = spawn
    if started:
        pytest.fail(started[0], pytrace=False)
    return result


@pytest.fixture
def one_rank_group():
    """A real gloo process group of one rank: collectives run (as identities), so hooks and waits can be seen."""
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()
