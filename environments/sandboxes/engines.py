"""Sandbox engines as registered objects (docs/design.md §6, Sandboxes).

An engine (``SandboxEngine``) is a name (what ``--sandbox`` takes and reports record), what
it can do (``CAPABILITIES``), a check that it runs on this machine (``check``: why not, with
the fix) and ``make(spec)``. The registry (``ENGINES``) maps each built-in name to the dotted
path of its engine, an ``ENGINE`` beside its sandbox class, resolved when first asked for; a
name not there is looked up among the ``thundersync.sandboxes`` entry points (a package's own
engine, ``podman = "mypkg.podman:ENGINE"``, imported only when used), and last taken as a
dotted path itself. A new engine is one module and one line here (or an entry point). A task
says what it needs (capability → why) and the engine refuses what it cannot do in one line
(``refuse``), naming the engines that can. Nothing outside this package compares an engine's
name: code asks the engine (``can``, ``refuse``, ``check``) or the registry (``engine_names``).
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from environments.sandboxes.protocol import NeedsDockerError, Sandbox, SandboxSpec

BUILDS_IMAGES = "builds_images"
"""Builds a task's Dockerfile (a build context, its RUN steps) into the image it runs in."""
RUNS_ANY_IMAGE = "runs_any_image"
"""Runs a task in the image it names. Without it the host's files stand for ``BASE_IMAGE``, so
only tasks on that image (or an image alias of it) run."""
ANY_WORKDIR = "any_workdir"
"""Puts the workspace at any absolute path, a system or interpreter folder included (bubblewrap
mounts those read-only from the host)."""
ENFORCES_MEMORY = "enforces_memory"
"""Bounds each sandbox's total memory to ``SandboxSpec.memory_mb`` on every host (bubblewrap
does only where it can make a memory cgroup, else per process)."""
RUNS_MULTI_CONTAINER = "runs_multi_container"
"""Runs ``SandboxSpec.services`` beside the sandbox: a compose file's other containers on a
network of their own with no route out."""
RUNS_AS_USER = "runs_as_user"
"""Runs a command as a user a task names (Harbor's ``user`` fields), through the engine."""
CAPABILITIES = (
    BUILDS_IMAGES,
    RUNS_ANY_IMAGE,
    ANY_WORKDIR,
    ENFORCES_MEMORY,
    RUNS_MULTI_CONTAINER,
    RUNS_AS_USER,
)

ENGINES: dict[str, str] = {
    "bwrap": "environments.sandboxes.bwrap:ENGINE",
    "docker": "environments.sandboxes.docker:ENGINE",
}
"""The built-in engines: name → ``module:attribute`` of the ``SandboxEngine``."""
DEFAULT_ENGINE = "bwrap"
ENTRY_POINT_GROUP = "thundersync.sandboxes"
PREREQUISITE_TIMEOUT_S = 30.0
"""Seconds a trial sandbox (``check``) may take before the engine counts as broken here."""


class UnknownEngine(ValueError):  # noqa: N818 (a ValueError, as make_sandbox raised before)
    """No engine of that name is registered (the message lists the known names)."""


@dataclass(frozen=True, slots=True)
class SandboxEngine:
    """One sandbox engine: ``factory(spec)`` makes its sandboxes, ``prerequisites()`` says why
    it cannot run here (with the fix; None when it can), ``title`` names it in refusals."""

    name: str
    title: str
    capabilities: frozenset[str]
    factory: Callable[[SandboxSpec], Sandbox]
    prerequisites: Callable[[], str | None]

    def make(self, spec: SandboxSpec) -> Sandbox:
        """A new sandbox for ``spec``; the caller closes it. Services (``spec.services``) only
        from an engine that runs them: another refuses, rather than drop them silently."""
        if spec.services or spec.network:
            names = ", ".join(s.name for s in spec.services) or spec.network
            self.refuse({RUNS_MULTI_CONTAINER: f"it runs services ({names})"}, "the sandbox")
        return self.factory(spec)

    def check(self) -> str | None:
        """Why sandboxes of this engine cannot run on this machine (with the fix), or None."""
        return self.prerequisites()

    def can(self, capability: str) -> bool:
        return capability in self.capabilities

    def refusal(self, needs: Mapping[str, str]) -> str | None:
        """The first of ``needs`` (capability → why the task needs it) this engine cannot do,
        as one line naming the engines that can (``needs Docker: its Dockerfile has a build
        step: RUN make``); None when it can do them all."""
        for capability, why in needs.items():
            if not self.can(capability):
                able = [e.title for e in known_engines() if e.can(capability)]
                return f"needs {_either(able) or f'an engine that has {capability}'}: {why}"
        return None

    def refuse(self, needs: Mapping[str, str], what: str) -> None:
        """Raise NeedsDockerError (``what`` and the refusal) when this engine cannot do what
        ``needs`` asks; before any sandbox is made, so the agent never starts."""
        line = self.refusal(needs)
        if line is not None:
            raise NeedsDockerError(f"{what} {line}")


_resolved: dict[str, SandboxEngine] = {}


def sandbox_engine(name: str) -> SandboxEngine:
    """The engine called ``name``: a built-in, else a ``thundersync.sandboxes`` entry point,
    else ``name`` as a dotted path (``pkg.module:ENGINE`` or ``pkg.module.ENGINE``);
    UnknownEngine (a ValueError) listing the known names when none is found."""
    found = _resolved.get(name)
    if found is not None:
        return found
    registered = ENGINES.get(name) or _entry_points().get(name)
    if registered is None and not ("." in name or ":" in name):
        raise UnknownEngine(f"unknown sandbox kind {name!r}; expected one of {engine_names()}")
    found = _load(registered or name, name)
    if registered is not None and found.name != name:
        raise UnknownEngine(f"sandbox engine {name!r}: {registered} is named {found.name!r}")
    _resolved[name] = found
    return found


def engine_names() -> tuple[str, ...]:
    """The registered engines' names, built-ins first (the ``--sandbox`` choices)."""
    return (*ENGINES, *(n for n in _entry_points() if n not in ENGINES))


def known_engines() -> list[SandboxEngine]:
    """Every registered engine that loads (one that does not is warned about and skipped)."""
    engines = []
    for name in engine_names():
        try:
            engines.append(sandbox_engine(name))
        except Exception as exc:
            warnings.warn(f"{exc} (skipped)", stacklevel=2)
    return engines


def _either(words: list[str]) -> str:
    """``A``, ``A or B``, ``A, B or C`` ("" for none)."""
    return f"{', '.join(words[:-1])} or {words[-1]}" if len(words) > 1 else "".join(words)


@functools.cache
def _entry_points() -> dict[str, str]:
    """The ``thundersync.sandboxes`` entry points, name → value (read once per process)."""
    return {e.name: e.value for e in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}


def _load(path: str, name: str) -> SandboxEngine:
    module_name, _, attribute = path.partition(":")
    if not attribute:
        module_name, _, attribute = path.rpartition(".")
    try:
        found = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError, ValueError) as exc:
        raise UnknownEngine(
            f"sandbox engine {name!r}: cannot load {path!r}: {type(exc).__name__}: {exc}"
        ) from exc
    if not isinstance(found, SandboxEngine):
        raise UnknownEngine(
            f"sandbox engine {name!r}: {path} is a {type(found).__name__}, not a SandboxEngine"
        )
    return found
