"""No module of the project binds a top-level name twice: the second binding silently replaces the first for every
reader (a second `COMPARISONS` in speedrun/export.py, without `is`, stopped fold_ifs deciding `None is not None`
and every baseline export grew 24 lines, each still verified bit for bit)."""
import ast
import collections

from test_import_graph import project_modules


def top_level_bindings(tree):
    """Names bound by the module's own statements: functions, classes, plain and annotated assignments (not `_`,
    the name of the registered fake kernels, read by no one)."""
    for statement in tree.body:
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and statement.name != "_":
            yield statement.name
        targets = statement.targets if isinstance(statement, ast.Assign) else \
            [statement.target] if isinstance(statement, ast.AnnAssign) else []
        for target in targets:
            for node in ast.walk(target):
                if isinstance(node, ast.Name) and node.id != "_":
                    yield node.id


def test_no_module_binds_a_top_level_name_twice():
    twice = {name: sorted(n for n, count in collections.Counter(top_level_bindings(ast.parse(path.read_text())))
                          .items() if count > 1) for name, path in project_modules().items()}
    assert {name: names for name, names in twice.items() if names} == {}
    bindings = top_level_bindings(ast.parse("A = 1\ndef f(): pass\ndef _(): pass\nA, (b, _) = 2, (3, 4)\n"))
    assert list(bindings) == ["A", "f", "A", "b"]
