"""The fast tier (`-m "not slow"`): a test that starts a process there fails with a line naming it, even when it
catches the refusal; processes a library starts on its own account, and every process outside the fast tier, are
left alone; own_process tests count as slow."""
import os
import subprocess
import sys
import textwrap

import pytest

from conftest import CHILD_PYTHONPATH, ROOT

CHILD_TESTS = '''
import ctypes.util
import subprocess
import sys

import pytest


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_catches_the_refusal():
    try:
        subprocess.run([sys.executable, "-c", "pass"])
    except Exception:
        pass


def test_a_library_starting_one_is_not_counted():
    ctypes.util.find_library("c")  # runs ldconfig in a process of its own


def test_starts_nothing():
    assert sum(range(4)) == 6


@pytest.mark.slow
def test_slow_may_start_one():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


@pytest.mark.own_process
def test_in_its_own_process():
    pass
'''


def run_child_suite(tmp_path, *args):
    # The project's conftest under another name, with the child's folder as the checkout whose files count.
    (tmp_path / "conftest.py").write_text(textwrap.dedent(f"""
        import importlib.util
        from pathlib import Path
        spec = importlib.util.spec_from_file_location("project_conftest", {str(ROOT / 'tests' / 'conftest.py')!r})
        project = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(project)
        project.ROOT = Path(__file__).resolve().parent
        pytest_configure = project.pytest_configure
        pytest_collection_modifyitems = project.pytest_collection_modifyitems
        pytest_runtest_call = project.pytest_runtest_call
    """))
    (tmp_path / "test_child.py").write_text(CHILD_TESTS)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTEST_ADDOPTS"}
    env["PYTHONPATH"] = CHILD_PYTHONPATH
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *args],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    return res.returncode, res.stdout + res.stderr


@pytest.mark.slow
def test_in_the_fast_tier_a_test_starting_a_process_fails_naming_itself(tmp_path):
    """Guards: in a child pytest run with -m "not slow", a test starting a process fails naming itself and the call."""
    code, out = run_child_suite(tmp_path, "-m", "not slow")
    assert code == 1, out
    assert "2 failed, 2 passed, 2 deselected" in out, out
    for name, line in (("test_starts_a_process", 10), ("test_catches_the_refusal", 15)):
        assert f"FAILED test_child.py::{name}" in out, out
        assert (f"test_child.py::{name} starts a process in the fast tier (test_child.py:{line}: {sys.executable} -c "
                "pass); mark it @pytest.mark.slow") in out, out
    assert "PASSED test_child.py::test_a_library_starting_one_is_not_counted" in out


@pytest.mark.slow
def test_outside_the_fast_tier_processes_are_allowed(tmp_path):
    """Guards: in a child pytest run without -m "not slow", the same process-starting tests all pass."""
    code, out = run_child_suite(tmp_path)
    assert code == 0, out
    assert "6 passed" in out, out
