"""The training package's shape (issue 15, STYLE.md): small modules, one file per mode, no
import circle, and no mode's name compared outside the one place that chooses the mode."""

from __future__ import annotations

import ast
from pathlib import Path

import thundersync
from thundersync.training.config import MODES

ROOT = Path(thundersync.__file__).parent
TRAINING = ROOT / "training"


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_of_training_is_over_300_lines_and_a_mode_fits_150():
    sizes = {p: len(p.read_text().splitlines()) for p in TRAINING.rglob("*.py")}
    assert {str(p): n for p, n in sizes.items() if n > 300} == {}
    modes = {p.name: n for p, n in sizes.items() if p.parent.name == "modes"}
    assert {"sync.py", "async_.py", "streaming.py"} <= set(modes)
    assert {name: n for name, n in modes.items() if n > 150} == {}


def _imports(path: Path, known: set[str]) -> set[str]:
    """The thundersync modules ``path`` imports, at any depth (a function's imports too),
    except under ``if TYPE_CHECKING``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            return
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [f"{node.module}.{a.name}" for a in node.names]
            found.update(n for n in [node.module, *names] if n in known)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in known)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return found - {_module(path)}


def test_no_import_circle_among_the_training_modules():
    paths = {_module(p): p for p in TRAINING.rglob("*.py")}
    graph = {name: _imports(path, set(paths)) for name, path in paths.items()}
    # a package imports its submodules; a submodule importing its package is not a circle
    graph = {n: {d for d in deps if not n.startswith(d + ".")} for n, deps in graph.items()}
    circles = []
    for start in graph:
        stack, seen = [(start, [start])], set()
        while stack:
            node, path = stack.pop()
            for dep in graph[node]:
                if dep == start:
                    circles.append(path)
                elif dep not in seen:
                    seen.add(dep)
                    stack.append((dep, [*path, dep]))
    assert circles == []


def test_no_mode_name_is_compared_outside_choosing_the_mode():
    chooser = TRAINING / "modes" / "__init__.py"
    compared = []
    for path in ROOT.rglob("*.py"):
        if path == chooser:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                names = [n for n in ast.walk(node) if isinstance(n, ast.Constant)]
                if any(n.value in MODES for n in names) and "mode" in ast.unparse(node):
                    compared.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert compared == []
