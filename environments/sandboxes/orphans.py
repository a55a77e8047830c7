"""Reaping what a killed run left behind: containers and workspaces whose owner is gone.

A run killed by SIGKILL (or SIGTERM without a handler) cannot remove its sandboxes. Every
container and volume carries its owner's pid as a label and every host folder (bubblewrap
workspaces, workspace disks) has it in its name, so the next process that makes a sandbox
removes those whose owner no longer runs, unmounting any disk still mounted in them. A pid
that is alive (even if reused by another process) is left alone: never a live run's sandbox.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from environments.sandboxes.disk import unmount_under

_lock = threading.Lock()
_reaped: set[str] = set()


def owner_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def reap_once(kind: str, reap: Callable[[], object]) -> None:
    """Run ``reap`` the first time this process makes a sandbox of ``kind``."""
    with _lock:
        if kind in _reaped:
            return
        _reaped.add(kind)
    reap()


def remove_orphan_workspaces(prefix: str, root: str | None = None) -> list[Path]:
    """Remove ``<tmp>/<prefix><pid>-*`` folders whose ``pid`` is not running (their mounted
    workspace disks unmounted first, so nothing is deleted through a mount)."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{prefix}*"):
        pid = folder.name[len(prefix) :].split("-", 1)[0]
        if folder.is_dir() and pid.isdigit() and not owner_alive(int(pid)):
            unmount_under(folder)
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def remove_orphan_containers(client: Any, label: str) -> list[str]:
    """Remove containers, then volumes, labelled ``label`` whose ``<label>.owner_pid`` is not
    running here; returns the names removed.

    Other runs on the daemon make and remove their containers meanwhile: the containers are
    listed as the list call returns them (``sparse``: no inspection of each, which failed with
    NotFound for one removed in between, and the first sandbox of the run with it), and one
    already gone when it is removed is skipped."""
    removed = []
    for container in client.containers.list(all=True, filters={"label": label}, sparse=True):
        if _is_orphan(container.attrs.get("Labels") or {}, label):
            name = (container.attrs.get("Names") or [container.id])[0].lstrip("/")
            if _removed(container):
                removed.append(name)
    for volume in client.volumes.list(filters={"label": label}):
        if _is_orphan(volume.attrs.get("Labels") or {}, label) and _removed(volume):
            removed.append(volume.name)
    return removed


def _removed(thing: Any) -> bool:
    """Remove a container or volume; False where another run got there first: already gone
    (404) or being removed, or a volume its container still holds (409)."""
    from docker.errors import APIError, NotFound

    try:
        thing.remove(force=True)
    except APIError as exc:
        if isinstance(exc, NotFound) or exc.status_code == 409:
            return False
        raise
    return True


def _is_orphan(labels: dict[str, str], label: str) -> bool:
    owner = labels.get(f"{label}.owner_pid", "")
    host = labels.get(f"{label}.host")
    if host not in (None, os.uname().nodename):
        return False  # another machine's run on a shared daemon
    return owner.isdigit() and not owner_alive(int(owner))
