"""The `own_process` marker of conftest.py: a marked test runs in a child interpreter and its outcome - pass,
failure, skip - is reported as the test's own (a child failure must not read as a pass)."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import CHILD_PYTHONPATH, OWN_PROCESS_ENV, ROOT

CHILD_TESTS = '''
import logging
import os
import pytest

RUNNER = int(os.environ["RUNNER_PID"])

@pytest.mark.own_process
def test_passes_in_a_child():
    assert os.getpid() != RUNNER

@pytest.mark.own_process
def test_fails_in_a_child():
    assert False, "child failure text"

@pytest.mark.own_process
def test_fails_after_many_debug_records_in_a_child():  # as a compile's trace logger writes them
    chatty = logging.getLogger("chatty")
    chatty.setLevel(logging.DEBUG)
    for i in range(5000):
        chatty.debug("trace record %d", i)
    assert False, "failure after the records"

@pytest.mark.own_process
def test_skips_in_a_child():
    pytest.skip("child skip reason")

def test_unmarked_runs_in_the_runner():
    assert os.getpid() == RUNNER
'''


@pytest.mark.slow
def test_marked_tests_run_in_a_child_and_report_pass_fail_and_skip(tmp_path):
    """Guards: in a child pytest run, own_process tests run in a child interpreter and report pass, fail and skip."""
    # The project's conftest, loaded under another name (a conftest importing `conftest` would import itself).
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util, os
        os.environ.setdefault("RUNNER_PID", str(os.getpid()))  # the child inherits the runner's
        spec = importlib.util.spec_from_file_location("project_conftest", {str(ROOT / 'tests' / 'conftest.py')!r})
        project = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(project)
        pytest_configure = project.pytest_configure
        pytest_runtest_protocol = project.pytest_runtest_protocol
        pytest_runtest_makereport = project.pytest_runtest_makereport
    """))
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    env = {k: v for k, v in os.environ.items() if k not in ("RUNNER_PID", OWN_PROCESS_ENV)}
    env["PYTHONPATH"] = CHILD_PYTHONPATH
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    assert "2 failed, 2 passed, 1 skipped" in out, out
    assert "FAILED test_child.py::test_fails_in_a_child" in out and "child failure text" in out
    assert "failure after the records" in out  # the error, not only the records, reaches the report
    assert "child skip reason" in out
