"""Workspace disks: a sandbox that fills its workspace gets ENOSPC, its neighbours do not, and
what tasks stage (files, an image's WORKDIR) is still there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from environments.sandboxes import (
    BwrapSandbox,
    DockerSandbox,
    SandboxError,
    SandboxSpec,
    make_sandbox,
)
from environments.sandboxes import disk as disk_module
from environments.sandboxes.orphans import remove_orphan_workspaces
from tests.conftest import SANDBOX_KINDS
from tests.unit.environments.sandboxes.test_orphans import dead_pid

needs_disks = pytest.mark.skipif(
    not disk_module.available(), reason="workspace disks need root, mkfs.ext4 and loop devices"
)
pytestmark = needs_disks
DISK_MB = 32


def mounted(path: Path) -> bool:
    return any(line.split()[1].startswith(str(path)) for line in Path("/proc/self/mounts").open())


@pytest.mark.parametrize("kind", SANDBOX_KINDS)
@pytest.mark.parametrize("disk_mb", [DISK_MB, disk_module.TMPFS_MAX_MB + 16], ids=["tmpfs", "ext4"])
def test_filling_the_workspace_fails_with_enospc_and_leaves_a_neighbour_alone(
    kind: str, disk_mb: int
) -> None:
    with (
        make_sandbox(SandboxSpec(disk_mb=disk_mb), kind) as full,
        make_sandbox(SandboxSpec(disk_mb=DISK_MB), kind) as neighbour,
    ):
        half = disk_mb // 2 + 16  # two files: each stays under the per-file limit
        fill = (
            f"head -c {half}M /dev/zero > junk; head -c {half}M /dev/zero > junk2; "
            "echo rc=$?; cat junk junk2 | wc -c"
        )
        filled = full.execute(fill, 60)
        assert "No space left on device" in filled.output and "rc=1" in filled.output
        assert int(filled.output.split()[-1]) <= disk_mb * 2**20
        kind_of_disk = full.execute("stat -f -c %T .", 10).output.strip()
        assert kind_of_disk == ("tmpfs" if disk_mb <= disk_module.TMPFS_MAX_MB else "ext2/ext3")
        avail = full.execute("df -k --output=avail . | tail -1", 10).output
        assert int(avail) < 1024, f"{avail} KiB still free after the fill"
        wrote = neighbour.execute("head -c 16M /dev/zero > data && stat -c %s data", 30)
        assert (wrote.exit_code, wrote.output) == (0, f"{16 * 2**20}\n")
        freed = full.execute("rm junk junk2 && echo again > more.txt && cat more.txt", 10)
        assert (freed.exit_code, freed.output) == (0, "again\n")


def test_bwrap_workspace_lies_on_its_disk_and_close_unmounts_it(tmp_path: Path) -> None:
    (tmp_path / "task.txt").write_text("staged\n")
    sb = BwrapSandbox(SandboxSpec(files=tmp_path, disk_mb=DISK_MB))
    try:
        assert sb.execute("cat task.txt; ls -a", 10).output == "staged\n.\n..\ntask.txt\n"
        assert os.path.ismount(sb.workspace.parent)
    finally:
        sb.close()
    assert not mounted(sb.root) and not sb.root.exists()


def test_task_files_larger_than_the_disk_are_an_infra_failure_naming_disk_mb(
    tmp_path: Path,
) -> None:
    (tmp_path / "big.bin").write_bytes(b"\0" * (DISK_MB + 8) * 2**20)
    with pytest.raises(SandboxError, match=f"disk_mb={DISK_MB}"):
        BwrapSandbox(SandboxSpec(files=tmp_path, disk_mb=DISK_MB))


@pytest.mark.parametrize("bad", [0, 4, -1, 2.5, True])
def test_a_bad_disk_mb_is_rejected_by_name(bad: object) -> None:
    with pytest.raises(ValueError, match="SandboxSpec.disk_mb"):
        BwrapSandbox(SandboxSpec(disk_mb=bad))  # type: ignore[arg-type]


def test_disk_mb_none_leaves_the_workspace_on_the_host_disk() -> None:
    with BwrapSandbox(SandboxSpec(disk_mb=None)) as sb:
        assert not os.path.ismount(sb.workspace.parent) and sb.workspace.parent == sb.root


def test_a_dead_runs_mounted_disk_is_unmounted_and_removed(tmp_path: Path) -> None:
    folder = tmp_path / f"thundersync-bwrap-{dead_pid()}-abc"
    folder.mkdir()
    workspace = disk_module.create(folder, DISK_MB)
    assert workspace is not None and mounted(folder)
    (workspace / "left.txt").write_text("left behind")
    assert remove_orphan_workspaces("thundersync-bwrap-", str(tmp_path)) == [folder]
    assert not mounted(folder) and not folder.exists()


@pytest.mark.docker
def test_docker_keeps_the_images_workdir_and_task_files_on_the_disk(tmp_path: Path) -> None:
    from environments.sandboxes import BASE_IMAGE

    context, files = tmp_path / "context", tmp_path / "files"
    context.mkdir(), files.mkdir()
    (context / "Dockerfile").write_text(
        f"FROM {BASE_IMAGE}\nWORKDIR /app\nRUN echo from-image > image.txt\n"
    )
    (files / "task.txt").write_text("staged\n")
    spec = SandboxSpec(build_context=context, files=files, workdir="/app", disk_mb=DISK_MB)
    with DockerSandbox(spec) as sb:
        listed = sb.execute("cat image.txt task.txt; df -k . | tail -1", 10).output.split("\n")
        assert listed[:2] == ["from-image", "staged"]
        assert int(listed[2].split()[1]) <= DISK_MB * 1024, "the workdir is not on its disk"
        sb.execute("echo kept > kept.txt; kill -9 1", 10)  # restarts the container
        assert sb.execute("cat kept.txt image.txt", 10).output == "kept\nfrom-image\n"
        host, client = sb._disk.root, sb._client
        image = client.containers.get(sb.marker).image
    assert host is not None and not mounted(host) and not host.exists()
    client.images.remove(image.id, force=True)
