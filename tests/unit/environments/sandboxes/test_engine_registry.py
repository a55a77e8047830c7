"""Sandbox engines as registered objects (``environments/sandboxes/engines.py``): the names
and what each engine can do, the one-line refusal, an unknown name, a dotted path, an entry
point of an installed package, the ``--sandbox`` choices, and no engine name compared outside
``environments/sandboxes/``."""

from __future__ import annotations

import argparse
import ast
import importlib.metadata
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import environments
from environments.sandboxes import engines, make_sandbox
from environments.sandboxes.engines import (
    ANY_WORKDIR,
    BUILDS_IMAGES,
    CAPABILITIES,
    ENTRY_POINT_GROUP,
    SandboxEngine,
    UnknownEngine,
    engine_names,
    sandbox_engine,
)
from environments.sandboxes.protocol import NeedsDockerError, SandboxSpec, ServiceSpec

ROOT = Path(environments.__file__).resolve().parent.parent
TREES = ("thundersync", "environments", "harness", "leaderboard", "benchmarks")
SANDBOXES = ROOT / "environments" / "sandboxes"
BUILTIN = ("bwrap", "docker")


def _engine(name: str, *capabilities: str, title: str = "") -> SandboxEngine:
    return SandboxEngine(
        name=name,
        title=title or name.title(),
        capabilities=frozenset(capabilities),
        factory=lambda spec: ("made", name, spec),  # type: ignore[arg-type,return-value]
        prerequisites=lambda: f"--sandbox {name}: not on this machine",
    )


@pytest.fixture(autouse=True)
def fresh_registry(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test resolves names anew and reads the entry points it sets."""
    monkeypatch.setattr(engines, "_resolved", {})
    engines._entry_points.cache_clear()
    yield
    engines._entry_points.cache_clear()


@pytest.fixture
def plugins(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Installed packages' engines: ``thundersync.sandboxes`` entry points (name → value) over
    a module of engines, ``fake_sandbox_engines``."""
    module = types.ModuleType("fake_sandbox_engines")
    module.PODMAN = _engine("podman", BUILDS_IMAGES, ANY_WORKDIR)  # type: ignore[attr-defined]
    module.ROOMY = _engine("roomy", ANY_WORKDIR)  # type: ignore[attr-defined]
    module.NOT_AN_ENGINE = object()  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    points: dict[str, str] = {}
    real = importlib.metadata.entry_points

    def entry_points(**selection: str) -> list[importlib.metadata.EntryPoint]:
        if selection.get("group") != ENTRY_POINT_GROUP:
            return list(real(**selection))
        return [importlib.metadata.EntryPoint(n, v, ENTRY_POINT_GROUP) for n, v in points.items()]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    return points


# --- the registry -----------------------------------------------------------------------------


def test_the_builtin_engines_and_what_each_can_do() -> None:
    assert engine_names() == BUILTIN
    bwrap, docker = sandbox_engine("bwrap"), sandbox_engine("docker")
    assert (bwrap.name, docker.name) == BUILTIN
    assert bwrap.capabilities == frozenset()
    assert docker.capabilities == frozenset(CAPABILITIES)
    assert docker.can(BUILDS_IMAGES) and not bwrap.can(BUILDS_IMAGES)
    assert sandbox_engine("bwrap") is bwrap  # resolved once


def test_an_engine_refuses_what_it_cannot_do_in_one_line_naming_who_can() -> None:
    needs = {ANY_WORKDIR: "its workdir is /usr/app", BUILDS_IMAGES: "RUN make"}
    bwrap, docker = sandbox_engine("bwrap"), sandbox_engine("docker")
    assert bwrap.refusal(needs) == "needs Docker: its workdir is /usr/app"
    assert docker.refusal(needs) is None and bwrap.refusal({}) is None
    with pytest.raises(NeedsDockerError) as refused:
        bwrap.refuse(needs, "task t")
    assert str(refused.value) == "task t needs Docker: its workdir is /usr/app"
    docker.refuse(needs, "task t")  # nothing raised


def test_an_engine_without_multi_container_refuses_services_before_making_anything() -> None:
    spec = SandboxSpec(services=(ServiceSpec("kv", image="redis:7"),))
    with pytest.raises(NeedsDockerError) as refused:
        make_sandbox(spec, kind="bwrap")
    assert str(refused.value) == "the sandbox needs Docker: it runs services (kv)"


def test_an_unknown_name_is_a_value_error_listing_the_known_ones() -> None:
    with pytest.raises(UnknownEngine, match=r"'podman'; expected one of \('bwrap', 'docker'\)"):
        sandbox_engine("podman")
    with pytest.raises(ValueError, match="unknown sandbox kind 'podman'"):
        make_sandbox(SandboxSpec(), "podman")


def test_a_dotted_path_names_an_engine(plugins: dict[str, str]) -> None:
    podman = sys.modules["fake_sandbox_engines"].PODMAN
    assert sandbox_engine("fake_sandbox_engines:PODMAN") is podman
    assert sandbox_engine("fake_sandbox_engines.PODMAN") is podman
    spec = SandboxSpec()
    assert make_sandbox(spec, "fake_sandbox_engines:PODMAN") == ("made", "podman", spec)
    with pytest.raises(UnknownEngine, match="is a object, not a SandboxEngine"):
        sandbox_engine("fake_sandbox_engines:NOT_AN_ENGINE")
    with pytest.raises(UnknownEngine, match="cannot load 'no_such_module:ENGINE'"):
        sandbox_engine("no_such_module:ENGINE")


def test_an_installed_package_adds_an_engine_by_entry_point(plugins: dict[str, str]) -> None:
    plugins.update(podman="fake_sandbox_engines:PODMAN", bwrap="fake_sandbox_engines:ROOMY")
    assert engine_names() == (*BUILTIN, "podman")  # a built-in name is not replaced
    assert sandbox_engine("podman") is sys.modules["fake_sandbox_engines"].PODMAN
    assert sandbox_engine("bwrap").title == "bubblewrap"
    refusal = sandbox_engine("bwrap").refusal({BUILDS_IMAGES: "RUN make"})
    assert refusal == "needs Docker or Podman: RUN make"


def test_an_entry_point_must_name_its_own_engine_and_a_broken_one_is_skipped(
    plugins: dict[str, str],
) -> None:
    plugins.update(roomier="fake_sandbox_engines:ROOMY", gone="no_such_module:ENGINE")
    with pytest.raises(UnknownEngine, match="'roomier'.* is named 'roomy'"):
        sandbox_engine("roomier")
    with pytest.warns(UserWarning) as warned:
        known = engines.known_engines()
    assert [e.name for e in known] == list(BUILTIN)
    assert sorted(str(w.message).split(":")[0] for w in warned) == [
        "sandbox engine 'gone'",
        "sandbox engine 'roomier'",
    ]


# --- who asks the registry ----------------------------------------------------------------------


def test_the_sandbox_flags_choices_come_from_the_registry(plugins: dict[str, str]) -> None:
    from harness import eval as harness_eval
    from thundersync.declared import choices, parse_flag
    from thundersync.training.config import TrainConfig
    from thundersync.training.config_files import add_config_flags

    plugins.update(podman="fake_sandbox_engines:PODMAN")
    sub = argparse.ArgumentParser().add_subparsers(dest="command")
    harness_eval.add_eval_parser(sub)
    flag = next(a for a in sub.choices["eval"]._actions if "--sandbox" in a.option_strings)
    assert tuple(flag.choices) == (*BUILTIN, "podman") and flag.default == "bwrap"

    train = argparse.ArgumentParser()
    add_config_flags(train)
    flag = next(a for a in train._actions if a.dest == "sandbox")
    assert flag.metavar == "{bwrap,docker,podman}"
    assert choices(TrainConfig, "sandbox") == (*BUILTIN, "podman")
    assert parse_flag(TrainConfig, "sandbox", "podman") == "podman"
    with pytest.raises(ValueError, match="input should be 'bwrap', 'docker' or 'podman'"):
        parse_flag(TrainConfig, "sandbox", "lxc")


def test_evals_prerequisite_check_is_the_engines(plugins: dict[str, str]) -> None:
    from harness.eval_checks import sandbox_problem

    plugins.update(podman="fake_sandbox_engines:PODMAN")
    assert sandbox_problem("podman") == "--sandbox podman: not on this machine"


def test_a_task_asks_the_engine_what_it_can_do_not_its_name(plugins: dict[str, str]) -> None:
    from environments.terminal_bench.environment import TaskEnvironment

    plugins.update(roomy="fake_sandbox_engines:ROOMY", podman="fake_sandbox_engines:PODMAN")
    env = TaskEnvironment(task_id="t", workdir="/usr/app")
    assert list(env.needs) == [ANY_WORKDIR]
    with pytest.raises(NeedsDockerError, match="^task t needs Docker, Roomy or Podman: bubble"):
        env.spec("bwrap")
    assert env.spec("roomy").workdir == "/usr/app"  # no build, but any workdir: not refused


# --- no engine name compared outside environments/sandboxes/ -----------------------------------


def engine_name_uses(source: str, names: tuple[str, ...] = BUILTIN) -> list[int]:
    """The lines of ``source`` that branch on an engine's name: a comparison (``==``, ``!=``,
    ``in``) with one of ``names`` or with an engine's ``.name``, a ``case`` of one, a
    ``Literal`` of them, a dict keyed by one, a flag's ``choices`` listing them."""

    def named(node: ast.AST | None) -> bool:
        if isinstance(node, ast.Constant):
            return isinstance(node.value, str) and node.value in names
        if isinstance(node, ast.Tuple | ast.List | ast.Set):
            return any(named(element) for element in node.elts)
        return False

    def engines_name(node: ast.AST) -> bool:
        return (
            isinstance(node, ast.Attribute)
            and node.attr == "name"
            and "engine" in ast.unparse(node.value).lower()
        )

    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            hit = any(named(o) or engines_name(o) for o in operands)
        elif isinstance(node, ast.MatchValue):
            hit = named(node.value)
        elif isinstance(node, ast.Subscript):
            hit = ast.unparse(node.value).endswith("Literal") and named(node.slice)
        elif isinstance(node, ast.Dict):
            hit = any(named(key) for key in node.keys)
        elif isinstance(node, ast.Call):
            hit = any(k.arg == "choices" and named(k.value) for k in node.keywords)
        else:
            continue
        if hit:
            lines.append(node.lineno)
    return lines


@pytest.mark.parametrize(
    "source",
    [
        'if kind == "bwrap": pass',
        'ok = kind not in (None, "docker", "bwrap")',
        'ok = "docker" != kind',
        'match kind:\n    case "bwrap":\n        pass',
        'Sandbox = Literal["bwrap", "docker"]',
        'x = {"docker": 1}[kind]',
        "ok = engine.name == kind",
        "ok = self.sandbox_engine.name in chosen",
        'parser.add_argument("--sandbox", choices=["bwrap", "docker"])',
    ],
)
def test_the_scan_finds_a_comparison_of_an_engine_name(source: str) -> None:
    assert engine_name_uses(source) != []


@pytest.mark.parametrize(
    "source",
    [
        'if kind == "vllm": pass',
        'kind = "bwrap"',
        'make(sandbox="docker")',
        'ok = task.name == "bwrap-task"',
        'ok = task.name == "x"',
        'help = \'{"sandbox": "docker"}\'',
        'parser.add_argument("--sandbox", choices=engine_names(), default="bwrap")',
    ],
)
def test_the_scan_leaves_other_code_alone(source: str) -> None:
    assert engine_name_uses(source) == []


def test_no_engine_name_is_compared_outside_the_sandboxes_package() -> None:
    compared = []
    for tree in TREES:
        for path in sorted((ROOT / tree).rglob("*.py")):
            if path.is_relative_to(SANDBOXES) or "fixtures" in path.parts:
                continue
            for line in engine_name_uses(path.read_text(encoding="utf-8")):
                compared.append(f"{path.relative_to(ROOT)}:{line}")
    assert compared == []
