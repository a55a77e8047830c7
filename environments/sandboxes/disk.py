"""A per-sandbox workspace disk: a sparse ext4 image, loop-mounted, that bounds the workspace.

Without it a sandbox's workspace is a folder on the host's disk: one agent that fills it fills
the host, and every concurrent episode (and the run's own files) fails with ENOSPC. With it, the
workspace is ``<mountpoint>/workspace`` on a fresh ext4 file system of ``SandboxSpec.disk_mb``
MiB: the agent that fills it gets ENOSPC in its own commands (its own doing, scored like any
failed command) and nothing else is touched.

- The image is a sparse file: only what is written takes host disk (an empty 4 GiB disk
  takes ~2 MiB), and making and mounting one takes ~0.1 s. No journal (the workspace does not
  outlive the run), no blocks reserved for root, one inode per 8 KiB.
- ``lost+found`` stays at the file system's root, outside the workspace folder the sandbox
  sees.
- Mounted ``nosuid,nodev``. Unmounted lazily (``umount --lazy``): a process that is still
  dying cannot make the unmount fail, and the loop device is freed (``autoclear``) when the
  last user is gone.
- A small disk (``disk_mb`` <= ``TMPFS_MAX_MB``) is a size-limited tmpfs instead: ~0.01 s to
  mount against ~0.1 s for an ext4 image, which matters when a training step starts dozens of
  sandboxes. Its pages are memory, charged to the memory cgroup of the sandbox that writes them,
  so the sandbox's memory limit bounds them too.
- Needs root, ``mkfs.ext4``, ``mount`` and loop devices (``available()``); elsewhere sandboxes
  run without a workspace bound (each file is still bounded by ``RLIMIT_FSIZE``) and a warning
  says so once per process.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
import warnings
from pathlib import Path

from environments.sandboxes.protocol import SandboxError

MIN_DISK_MB = 8
BYTES_PER_INODE = 8192
MOUNT_OPTIONS = "loop,nosuid,nodev,noatime,noinit_itable"
TMPFS_MAX_MB = 256
"""Disks up to this size are a tmpfs (memory) rather than an ext4 image."""
COMMAND_TIMEOUT_S = 60

_warned = threading.Event()


def available() -> bool:
    """True when workspace disks can be made here (root, mkfs.ext4, mount, loop devices)."""
    tools = all(shutil.which(tool) for tool in ("mkfs.ext4", "mount", "umount"))
    return os.geteuid() == 0 and tools and os.path.exists("/dev/loop-control")


def create(folder: Path, disk_mb: int | None) -> Path | None:
    """Mount a fresh disk of ``disk_mb`` MiB at ``folder/disk``; returns the empty, root-owned
    workspace folder on it. None (and a warning, once) when ``disk_mb`` is None or disks cannot
    be made here; SandboxError when making one fails where they can."""
    disk_mb = validate_disk_mb(disk_mb)
    if disk_mb is None:
        return None
    if not available():
        warn_unbounded("workspace disks need root, mkfs.ext4 and loop devices")
        return None
    image, mountpoint = folder / "disk.img", folder / "disk"
    mountpoint.mkdir()
    if disk_mb <= TMPFS_MAX_MB:
        options = f"size={disk_mb}m,nosuid,nodev,noatime,mode=0755"
        what = f"cannot mount the {disk_mb} MiB workspace tmpfs {mountpoint}"
        _run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mountpoint)], what)
    else:
        with open(image, "wb") as fh:
            fh.truncate(disk_mb * 2**20)
        mkfs = ["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal"]
        mkfs += ["-i", str(BYTES_PER_INODE), "-E", "lazy_itable_init=1,nodiscard", str(image)]
        _run(mkfs, f"cannot make the {disk_mb} MiB workspace disk {image}")
        _run(["mount", "-o", MOUNT_OPTIONS, str(image), str(mountpoint)], f"cannot mount {image}")
    workspace = mountpoint / "workspace"
    try:
        workspace.mkdir()
    except OSError as exc:
        remove(workspace)
        raise SandboxError(f"cannot make the workspace on the disk {mountpoint}: {exc}") from exc
    return workspace


def remove(workspace: Path | None) -> None:
    """Unmount the disk that holds ``workspace`` (made by ``create``); the caller removes the
    folder. SandboxError when it stays mounted."""
    if workspace is None:
        return
    mountpoint = workspace.parent
    if os.path.ismount(mountpoint):
        what = f"cannot unmount the workspace disk {mountpoint}"
        _run(["umount", "--lazy", str(mountpoint)], what)


def unmount_under(folder: Path) -> list[str]:
    """Lazily unmount every mount at or below ``folder`` (what a killed run left mounted);
    returns the mountpoints. Failures are left for the caller's removal to report."""
    prefix = os.path.realpath(folder)
    found = []
    try:
        with open("/proc/self/mounts") as fh:
            for line in fh:
                point = _unescape(line.split()[1])
                if point == prefix or point.startswith(prefix + "/"):
                    found.append(point)
    except OSError:
        return []
    for point in sorted(found, key=len, reverse=True):
        subprocess.run(["umount", "--lazy", point], capture_output=True, timeout=COMMAND_TIMEOUT_S)
    return found


def validate_disk_mb(disk_mb: int | None) -> int | None:
    """``disk_mb`` itself; a ValueError names it unless it is None or an int >= MIN_DISK_MB."""
    if disk_mb is not None and (
        isinstance(disk_mb, bool) or not isinstance(disk_mb, int) or disk_mb < MIN_DISK_MB
    ):
        raise ValueError(
            f"SandboxSpec.disk_mb must be an int >= {MIN_DISK_MB} or None, got {disk_mb!r}"
        )
    return disk_mb


def warn_unbounded(reason: str) -> None:
    """Say once per process that workspaces are not size-bounded here, and why."""
    if not _warned.is_set():
        _warned.set()
        warnings.warn(
            f"sandbox workspaces are not size-bounded here ({reason}): SandboxSpec.disk_mb is "
            "not enforced; each file is still bounded by the file size limit",
            RuntimeWarning,
            stacklevel=3,
        )


def _unescape(field: str) -> str:
    """A /proc/mounts field with its octal escapes (``\\040`` for a space) decoded."""
    return field.encode().decode("unicode_escape")


def _run(argv: list[str], what: str) -> None:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{what}: {exc}") from exc
    if proc.returncode != 0:
        raise SandboxError(
            f"{what}: {' '.join(argv[:2])} exited {proc.returncode}: "
            f"{(proc.stderr or proc.stdout).strip()[-500:]}"
        )
