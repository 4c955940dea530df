"""Every slow test says in its docstring what it guards that no faster test does: CI's 30 minutes go to slow tests,
so each has to name the reason it costs them (issue 32)."""
import ast
import re

from conftest import ROOT

SLOW_MARK = re.compile(r"\bmark\.(slow|own_process)\b")  # own_process tests run in the slow tier too


def marked_slow(node):
    return SLOW_MARK.search(ast.unparse(node)) is not None


def slow_tests_without_docstring():
    missing = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        tree = ast.parse(path.read_text())
        module_slow = any(isinstance(n, ast.Assign) and any(getattr(t, "id", "") == "pytestmark" for t in n.targets)
                          and marked_slow(n.value) for n in tree.body)
        for node in ast.walk(tree):
            if (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
                    and (module_slow or any(marked_slow(d) for d in node.decorator_list))
                    and not (ast.get_docstring(node) or "").strip()):
                missing.append(f"{path.relative_to(ROOT)}::{node.name}")
    return missing


def test_every_slow_test_has_a_docstring_saying_what_it_guards():
    assert slow_tests_without_docstring() == []
