"""The env registry: ids ``ns/Name-vN`` in Gymnasium's registry, plus plugin discovery.

Built-in envs are registered with lazy ``"module:Class"`` entry points (nothing is imported
until ``gymnasium.make``). Other packages add envs through the entry-point group
``thundersync.envs``: each entry point is a callable taking no arguments that registers its
envs (with ``environments.register`` or ``gymnasium.register``). Gymnasium 1.x no longer
discovers plugins itself, so ``load_plugins`` (called by ``list_envs``) does it.
"""

from __future__ import annotations

import difflib
import inspect
import re
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import entry_points
from typing import Any

import gymnasium
from gymnasium.envs.registration import load_env_creator

from environments.tasks import FixedTasks, TaskSource

ENTRY_POINT_GROUP = "thundersync.envs"
NAMESPACE = "thundersync"

_ID = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+-v\d+$")
_ids: set[str] = set()
_lock = threading.Lock()
_plugins_loaded = False

BUILTIN: dict[str, tuple[str, dict[str, Any]]] = {
    "thundersync/ToySum-v0": ("environments.toy:ToySumEnv", {}),
    "thundersync/ToyChain-v0": ("environments.toy:ToyChainEnv", {}),
    "thundersync/SWEBench-v0": ("environments.suites:make_suite_env", {"suite": "swebench-mini"}),
    "thundersync/TerminalBench-v0": (
        "environments.suites:make_suite_env",
        {"suite": "harbor-mini"},
    ),
    # A generated family of Harbor tasks with train and held-out splits (file and text work).
    "thundersync/TerminalGen-v0": (
        "environments.terminal_bench.generated:GeneratedTerminalEnv",
        {},
    ),
    # A running OpenEnv server's env (env kwarg url=...); its code is interop, not the gym's.
    "openenv/Remote-v0": ("thundersync.interop.openenv_env:OpenEnvRemote", {}),
}


@dataclass(frozen=True, slots=True)
class RegisteredEnv:
    """One registered env as ``thundersync envs`` lists it."""

    id: str
    entry_point: str


def register(env_id: str, entry_point: str, **kwargs: Any) -> None:
    """Register ``env_id`` (``namespace/Name-vN``) with a lazy ``"module:Class"`` entry point.

    ``kwargs`` are the constructor's defaults; ``gymnasium.make(env_id)`` with no arguments
    must build a working env. Registering the same id with the same entry point and kwargs
    again does nothing.
    """
    if not _ID.match(env_id):
        raise ValueError(
            f"env id {env_id!r}: expected 'namespace/Name-vN', e.g. 'thundersync/Foo-v0'"
        )
    if not isinstance(entry_point, str) or ":" not in entry_point:
        raise ValueError(f"env {env_id}: entry_point {entry_point!r}: expected 'module:Class'")
    existing = gymnasium.registry.get(env_id)
    if existing is None or existing.entry_point != entry_point or existing.kwargs != kwargs:
        gymnasium.register(id=env_id, entry_point=entry_point, kwargs=kwargs)
    with _lock:
        _ids.add(env_id)


def register_builtin() -> None:
    """Register the envs that ship with ThunderSync (the ``builtin`` entry point)."""
    for env_id, (entry_point, kwargs) in BUILTIN.items():
        register(env_id, entry_point, **kwargs)


def load_plugins(*, reload: bool = False) -> None:
    """Call every ``thundersync.envs`` entry point (once, unless ``reload``); a failing
    plugin is warned about and skipped."""
    global _plugins_loaded
    with _lock:
        if _plugins_loaded and not reload:
            return
        _plugins_loaded = True
    register_builtin()
    for entry in entry_points(group=ENTRY_POINT_GROUP):
        before = set(gymnasium.registry)
        try:
            entry.load()()
        except Exception as exc:
            warnings.warn(
                f"env plugin {entry.name!r} ({entry.value}) failed to register: "
                f"{type(exc).__name__}: {exc}",
                stacklevel=2,
            )
            continue
        with _lock:
            _ids.update(set(gymnasium.registry) - before)


def episode_envs(env_id: str, **kwargs: Any) -> Callable[[], gymnasium.Env]:
    """A factory of fresh ``gymnasium.make(env_id, **kwargs)`` envs, one per episode, with
    Gymnasium's passive env checker on the first env only (where the registration or
    ``kwargs`` leave it on). The checker inspects an env's first ``reset`` and ``step``, which
    every instance of one env class answers alike, so checking each episode's fresh env again
    only costs start-up (a third of a toy episode's)."""
    checked = threading.Event()

    def make() -> gymnasium.Env:
        if checked.is_set() and "disable_env_checker" not in kwargs:
            env = gymnasium.make(env_id, disable_env_checker=True, **kwargs)
        else:
            env = gymnasium.make(env_id, **kwargs)
        checked.set()
        return env

    return make


def task_source(env_id: str, **kwargs: Any) -> TaskSource:
    """The tasks of ``gymnasium.make(env_id, **kwargs)`` by split, without making the env
    when its entry point says how (a ``task_source(**kwargs)`` attribute, as ``ShellEnv``
    subclasses and the suite envs have). Otherwise the env is made once, never reset, and its
    tasks are read (``env.source``, else its ``tasks``); such an env has no held-out split.
    A task of a protocol this ThunderSync cannot serve is a ``TaskProtocolError`` here."""
    require_env(env_id)
    spec = gymnasium.spec(env_id)
    entry = spec.entry_point
    creator = load_env_creator(entry) if isinstance(entry, str) else entry
    problem = keyword_problem(env_id, creator, kwargs)
    if problem:
        raise ValueError(problem)
    merged = {**spec.kwargs, **kwargs}
    declared = getattr(creator, "task_source", None)
    if callable(declared):
        source = declared(**merged)
        if source is not None:
            return source
    env = gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    try:
        made = env.unwrapped
        source = getattr(made, "source", None)
        if source is not None and hasattr(source, "splits"):
            return source
        tasks = getattr(made, "tasks", None)
        if tasks is None:
            raise ValueError(f"env {env_id}: lists no tasks (neither task_source nor tasks)")
        return FixedTasks(env_id, tuple(tasks))
    finally:
        env.close()


def keyword_problem(env_id: str, creator: Any, kwargs: dict[str, Any]) -> str | None:
    """Why ``kwargs`` holds a keyword the env takes nowhere (with the closest it does take,
    and every one: the env's own and its tasks'), or None. The env's are its constructor's
    named parameters; a constructor that also takes ``**kwargs`` passes them to its tasks,
    whose names it declares in ``task_kwarg_ranges`` (ToySum's) — an env that declares none
    takes any keyword, and its own check answers. Gymnasium's ``make`` keywords are always
    taken."""
    try:
        parameters = inspect.signature(creator).parameters.values()
    except (TypeError, ValueError):  # a builtin or an object without a signature
        return None
    named = {
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self"
    }
    tasks: set[str] = set()
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        declared = getattr(creator, "task_kwarg_ranges", None)
        if not isinstance(declared, dict):
            return None
        tasks = {str(name) for name in declared}
    unknown = sorted(set(kwargs) - named - tasks - _MAKE_KEYWORDS)
    if not unknown:
        return None
    closest = [difflib.get_close_matches(name, sorted(named | tasks), n=1) for name in unknown]
    said = ", ".join(
        f"{name!r}" + (f" (did you mean {near[0]!r}?)" if near else "")
        for name, near in zip(unknown, closest, strict=True)
    )
    task_part = f"; task keywords: {sorted(tasks)}" if tasks else ""
    return f"env {env_id}: unknown keyword(s) {said}; env keywords: {sorted(named)}{task_part}"


_MAKE_KEYWORDS = frozenset(
    name for name in inspect.signature(gymnasium.make).parameters if name not in ("id", "kwargs")
)
"""What ``gymnasium.make`` takes itself (``max_episode_steps``, ``disable_env_checker``...)."""


def grading_place(env: gymnasium.Env, sandbox: str) -> str:
    """Where ``env`` (made with ``sandbox=sandbox``) plays and grades its episodes, as a
    progress line says it: ``in the bwrap sandbox``; ``in this process`` for an env that
    brings its own tools (ToySum's ``tools="python"``: ``sandbox_kind`` None); ``by the server
    at URL`` for an env that runs none of ours but a server's (OpenEnv's remote env, which
    takes ``sandbox=`` and ignores it). Any other env is taken at its ``sandbox=``."""
    made = env.unwrapped
    if hasattr(made, "sandbox_kind"):
        kind = made.sandbox_kind
        return f"in the {kind} sandbox" if kind else "in this process"
    url = getattr(made, "url", None)
    if isinstance(url, str) and url:
        return f"by the server at {url}"
    return f"in the {sandbox} sandbox"


def require_env(env_id: str, *, option: str = "--env") -> None:
    """ValueError naming ``option`` and the known ids unless ``env_id`` is registered (plugins
    are loaded first), so a typo is a one-line error before any work starts."""
    load_plugins()
    if env_id not in gymnasium.registry:
        known = ", ".join(env.id for env in list_envs())
        raise ValueError(
            f"{option} {env_id!r}: not a registered env; known: {known} "
            "(thundersync envs lists them, plugins too)"
        )


def list_envs() -> list[RegisteredEnv]:
    """Every ThunderSync env (built-in, plugins, ``environments.register``), sorted by id."""
    load_plugins()
    with _lock:
        ids = set(_ids)
    ids.update(env_id for env_id in gymnasium.registry if env_id.startswith(f"{NAMESPACE}/"))
    return [
        RegisteredEnv(env_id, _entry_point_name(gymnasium.registry[env_id].entry_point))
        for env_id in sorted(ids)
        if env_id in gymnasium.registry
    ]


def _entry_point_name(entry_point: Any) -> str:
    if isinstance(entry_point, str):
        return entry_point
    return f"{entry_point.__module__}:{entry_point.__qualname__}"
