"""The house's shape (docs/design.md §1, STYLE.md): layers that point one way (protocol ←
core ← training; environments see only the protocol), no import circle, file names unique,
small training modules and no file over 500 lines, one file per mode, and no mode's name
compared outside the one place that chooses the mode."""

from __future__ import annotations

import ast
from pathlib import Path

import thundersync
from thundersync.training.config import MODES

ROOT = Path(thundersync.__file__).parent
TRAINING = ROOT / "training"
PACKAGES = [
    ROOT.parent / name for name in ("thundersync", "environments", "harness", "leaderboard")
]


def _module(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def test_no_module_of_training_is_over_300_lines_and_a_mode_fits_150():
    sizes = {p: len(p.read_text().splitlines()) for p in TRAINING.rglob("*.py")}
    assert {str(p): n for p, n in sizes.items() if n > 300} == {}
    modes = {p.name: n for p, n in sizes.items() if p.parent.name == "modes"}
    assert {"sync.py", "async_.py", "streaming.py"} <= set(modes)
    assert {name: n for name, n in modes.items() if n > 150} == {}


MAX_MODULE_LINES = 500
"""STYLE.md: a module aims at 300 lines and is never over 500."""


def test_no_python_file_of_the_house_is_over_500_lines():
    trees = ("thundersync", "environments", "harness", "leaderboard", "benchmarks", "tests")
    sizes = {
        str(path.relative_to(ROOT.parent)): len(path.read_text().splitlines())
        for tree in trees
        for path in (ROOT.parent / tree).rglob("*.py")
    }
    offenders = {where: n for where, n in sorted(sizes.items()) if n > MAX_MODULE_LINES}
    assert offenders == {}, f"over {MAX_MODULE_LINES} lines (split along a seam): {offenders}"


def _imports(path: Path, known: set[str], *, type_checking: bool = False) -> set[str]:
    """The project's modules ``path`` imports, at any depth (a function's imports too); those
    under ``if TYPE_CHECKING`` only with ``type_checking``."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        is_guard = isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
        if is_guard and not type_checking:
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


def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in package.rglob("*.py") if "fixtures" not in p.parts]


def test_no_import_circle_in_the_project_type_checking_ones_included():
    paths = {_module(p): p for p in _sources()}
    graph = {name: _imports(path, set(paths), type_checking=True) for name, path in paths.items()}
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


def test_the_layers_point_one_way():
    """The protocol imports nothing of ThunderSync; the learner core only the protocol (and
    the config declarations); environments only the protocol, never the learner or training;
    the library (thundersync, environments) never the packages that use it (harness,
    leaderboard: the command line finds their commands as entry points); leaderboard never
    harness."""
    paths = {_module(p): p for p in _sources()}
    allowed = {  # the first layer a module's name starts with is its layer
        "thundersync.protocol": ("thundersync.protocol",),
        "thundersync.core": ("thundersync.protocol", "thundersync.core", "thundersync.declared"),
        "environments": ("environments", "thundersync.protocol"),
        "thundersync": ("thundersync", "environments"),
        "leaderboard": ("leaderboard", "thundersync", "environments"),
        "harness": ("harness", "leaderboard", "thundersync", "environments"),
    }
    crossing = []
    for name, path in paths.items():
        layer = next((layer for layer in allowed if (name + ".").startswith(layer + ".")), None)
        if layer is None:
            continue
        for dep in _imports(path, set(paths) | {"thundersync"}):
            if not any((dep + ".").startswith(a + ".") for a in allowed[layer]):
                crossing.append(f"{name} imports {dep}")
    assert crossing == []


SUITE_MODULES = {"task.py", "grading.py"}
"""Each benchmark suite under environments/ (swebench/, terminal_bench/) has its own task and
grading module: the same role in each, so the same name."""


def test_file_names_are_unique_across_the_tree():
    seen: dict[str, list[str]] = {}
    for path in _sources():
        if path.name != "__init__.py" and path.name not in SUITE_MODULES:
            seen.setdefault(path.name, []).append(str(path.relative_to(ROOT.parent)))
    assert {name: where for name, where in seen.items() if len(where) > 1} == {}


def _mode_tests(tree: ast.AST) -> list[int]:
    """Lines comparing a string to a mode name, or asking whether one starts with it."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            texts = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant)]
        elif isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "startswith":
            texts = [
                a.value.split("-")[0]
                for a in node.args
                if isinstance(a, ast.Constant) and isinstance(a.value, str)
            ]
        else:
            continue
        if any(isinstance(t, str) and t in MODES for t in texts):
            lines.append(node.lineno)
    return lines


def test_no_mode_name_is_compared_outside_the_modes():
    modes = TRAINING / "modes"
    compared = []
    for tree in ("thundersync", "environments", "harness", "leaderboard", "benchmarks"):
        for path in (ROOT.parent / tree).rglob("*.py"):
            where = str(path.relative_to(ROOT.parent))
            if path.is_relative_to(modes):
                continue
            lines = _mode_tests(ast.parse(path.read_text()))
            compared += [f"{where}:{line}" for line in lines]
    assert compared == []


def test_the_mode_check_sees_a_comparison_and_a_prefix_test():
    code = 'if mode == "sync": pass\nif label.startswith("async-k"): pass\nif x == "fast": pass'
    assert _mode_tests(ast.parse(code)) == [1, 2]
