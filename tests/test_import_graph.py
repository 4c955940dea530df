"""The project's modules import each other without a cycle: the static import graph (module-level and
function-level imports alike, read with ast) of the training scripts and the packages is acyclic."""
import ast
from pathlib import Path

from conftest import ROOT

PACKAGES = ("speedrun", "analysis", "ablations", "data", "benchmarks")
SCRIPTS = ("train_gpt.py", "train_gpt_medium.py")


def module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules(root: Path = ROOT) -> dict:
    """Module name -> source path, for the training scripts and every module of the project's packages."""
    paths = [root / name for name in SCRIPTS]
    for package in PACKAGES:
        paths += sorted((root / package).rglob("*.py"))
    return {module_name(path, root): path for path in paths}


def imported_names(path: Path, name: str, is_package: bool):
    """Every module name an import statement of the file names, anywhere in it (functions included); `from X import
    Y` names both X and X.Y, since Y may be a module."""
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names)


def import_graph(root: Path = ROOT) -> dict:
    """Module -> the set of project modules it imports."""
    modules = project_modules(root)
    graph = {}
    for name, path in modules.items():
        targets = set(imported_names(path, name, path.name == "__init__.py")) & modules.keys()
        graph[name] = targets - {name}
    return graph


def find_cycle(graph: dict):
    """One cycle as a list of modules (first == last), or None; depth-first search with colours."""
    state, stack = {}, []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if state.get(target) == "open":
                return stack[stack.index(target):] + [target]
            if target not in state and (cycle := visit(target)):
                return cycle
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def test_the_project_has_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_graph_sees_relative_function_level_and_from_imports(tmp_path):
    (tmp_path / "ablations").mkdir()
    (tmp_path / "ablations" / "__init__.py").write_text("")
    (tmp_path / "ablations" / "a.py").write_text("from . import b\n")
    (tmp_path / "ablations" / "b.py").write_text("def f():\n    from .c import g\n")
    (tmp_path / "ablations" / "c.py").write_text("import ablations.a\n")
    for script in SCRIPTS:
        (tmp_path / script).write_text("from ablations import a\n")
    graph = import_graph(tmp_path)
    assert graph["ablations.a"] == {"ablations", "ablations.b"}
    assert graph["ablations.b"] == {"ablations.c"}
    assert graph["train_gpt"] == {"ablations", "ablations.a"}
    assert find_cycle(graph) == ["ablations.a", "ablations.b", "ablations.c", "ablations.a"]
    (tmp_path / "ablations" / "c.py").write_text("import json\n")
    assert find_cycle(import_graph(tmp_path)) is None


def test_the_generic_models_import_no_study():
    """The registry is passed in (GPTConfig.studies, R18GPT's registry): neither base's model imports the studies."""
    graph = import_graph()
    for model in ("speedrun.model", "speedrun.r18.model"):
        assert "speedrun.studies" not in graph[model], model
