"""A per-sandbox memory cgroup: the bound on a bubblewrap sandbox's *total* memory.

``RLIMIT_AS`` bounds each process, so without a cgroup a sandbox's processes together may use
``pids × memory_mb``. Where the cgroup v1 memory controller is mounted and writable (root on
this machine kind), each sandbox gets ``<memory>/thundersync/<marker>`` with
``memory.limit_in_bytes`` = ``memory_mb``: past it the kernel's OOM killer ends a process of
that sandbox, never of the host. Elsewhere sandboxes fall back to the per-process rlimits
(``available()`` says which).
"""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from environments.sandboxes.orphans import owner_alive

ROOT = Path(os.environ.get("THUNDERSYNC_CGROUP_MEMORY", "/sys/fs/cgroup/memory")) / "thundersync"


def available() -> bool:
    """True when per-sandbox memory cgroups can be made here."""
    base = ROOT.parent
    return (
        os.geteuid() == 0
        and (base / "memory.limit_in_bytes").is_file()
        and os.access(base, os.W_OK)
    )


def create(marker: str, memory_mb: int) -> Path | None:
    """Make the sandbox's cgroup; None where cgroups are unavailable."""
    if not available():
        return None
    try:
        ROOT.mkdir(exist_ok=True)
        group = ROOT / marker
        group.mkdir(exist_ok=True)
        (group / "memory.limit_in_bytes").write_text(str(memory_mb * 1024 * 1024))
    except OSError:
        return None
    return group


def wrap(group: Path | None, argv: list[str]) -> list[str]:
    """``argv`` run inside ``group``: a shell moves itself in, then execs, so every
    descendant is born inside (no race with the command's first fork)."""
    if group is None:
        return argv
    enter = 'echo $$ > "$0/cgroup.procs" && exec "$@"'
    return ["sh", "-c", enter, str(group), *argv]


def procs(group: Path) -> list[int]:
    """The processes in ``group`` (none once it is gone). Every process of a sandbox is born
    inside its group (``wrap``) and cannot leave it (it sees no cgroup file system, and moving
    needs root), so this lists them all without scanning ``/proc``."""
    try:
        return [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
    except OSError:
        return []


def remove(group: Path | None, *, wait_s: float = 2.0) -> None:
    """Remove the cgroup once its processes are gone (they were killed by the caller). The
    last one usually leaves within a millisecond or two (a bwrap namespace's PID 1 finishing
    its exit after bwrap is reaped, then reaped by the host's init); there is no event for an
    empty v1 cgroup, so the retries back off from 1 ms."""
    if group is None:
        return
    deadline = time.monotonic() + wait_s
    delay = 0.001
    while True:
        try:
            group.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return  # still busy: reaped by the next run (remove_orphans)
            time.sleep(delay)
            delay = min(delay * 2, 0.02)


def remove_orphans(prefix: str) -> None:
    """Remove the cgroups of sandboxes whose owner process is gone."""
    if not ROOT.is_dir():
        return
    for group in ROOT.glob(f"{prefix}*"):
        pid = group.name[len(prefix) :].split("-", 1)[0]
        if pid.isdigit() and not owner_alive(int(pid)):
            with contextlib.suppress(OSError):
                group.rmdir()
