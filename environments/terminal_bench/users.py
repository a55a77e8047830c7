"""Harbor's ``user`` fields (task.toml schema 1.4): who a phase's commands run as.

Harbor 0.26 (``models/task/config.py``) lets ``[agent] user``, ``[verifier] user``, a
``[[verifier.collect]]`` hook's ``user`` and a step's ``[steps.agent]`` / ``[steps.verifier]``
``user`` name a user (a name or a uid, ``str | int``; unset: the image's default user). Its
trial runs the agent phase with the agent's as the environment's default user (a step's, else
the task's; a step's ``workdir/setup.sh`` too), the verifier's tests as the verifier's, and each
hook as its own, through ``docker exec -u``; everything else (making and emptying its folders)
as root or the image's user.

Here the same, in Docker: ``DockerSandbox.exec_user`` is the user its commands are executed as
by the daemon (``exec -u``; None: the image's), never a program in the container, so an agent
running as a user cannot leave it. The episode's sandbox runs the agent's commands as the agent
user from the end of its setup to the start of grading (``agent_phase``); grading runs the test
script as the verifier user and each hook as its own (``running_as``), and the rest as the
image's user. Bubblewrap runs every command as one user, so it refuses a task that names one
(``RUNS_AS_USER``), as it refuses a compose task: never a run as someone else than declared.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from environments.sandboxes.protocol import Sandbox, SandboxError
from environments.tasks import TaskFormatError
from thundersync.protocol.documents import excerpt

_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,63})?$")
ATTRIBUTE = "exec_user"
"""The sandbox attribute an engine that runs commands as a user has (``DockerSandbox``)."""


def read_user(path: Path, field: str, value: object) -> str | None:
    """A ``user`` field as Docker's ``exec -u`` takes it: a name or uid, optionally
    ``:group``; a malformed one raises TaskFormatError naming ``field``."""
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return str(value)
    if isinstance(value, str) and _NAME.match(value):
        return value
    raise TaskFormatError(
        path, field, f"expected a user name or uid (optionally :group), got {excerpt(value)}"
    )


def _set(sandbox: Sandbox, user: str | None) -> str | None:
    if not hasattr(sandbox, ATTRIBUTE):
        if user is None:
            return None
        kind = type(sandbox).__name__
        raise SandboxError(f"a {kind} cannot run commands as user {user!r} (Docker can)")
    previous: str | None = getattr(sandbox, ATTRIBUTE)
    setattr(sandbox, ATTRIBUTE, user)
    return previous


def agent_phase(sandbox: Sandbox, user: str | None) -> None:
    """From now on ``sandbox`` runs commands as ``user`` (None: the image's user)."""
    _set(sandbox, user)


@contextmanager
def running_as(sandbox: Sandbox, user: str | None) -> Iterator[None]:
    """``sandbox``'s commands inside the block run as ``user``; None changes nothing."""
    if user is None:
        yield
        return
    previous = _set(sandbox, user)
    try:
        yield
    finally:
        _set(sandbox, previous)


def named_users(task: Any) -> str:
    """Every user a task's fields name (its own, its hooks', its steps'), comma-separated;
    "" when none does."""
    steps = getattr(task, "steps", ())
    names = [
        task.agent_user,
        task.verifier_user,
        *(hook.user for hook in task.collect),
        *(user for step in steps for user in (step.agent_user, step.verifier_user)),
        *(hook.user for step in steps for hook in step.collect),
    ]
    return ", ".join(sorted({name for name in names if name is not None}))
