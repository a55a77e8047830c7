"""What a killed run left behind is removed by the next run; a live run's sandboxes are not."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from environments.sandboxes.orphans import (
    owner_alive,
    remove_orphan_containers,
    remove_orphan_workspaces,
)


def dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_owner_alive():
    assert owner_alive(os.getpid())
    assert not owner_alive(dead_pid())


def test_workspaces_of_dead_owners_are_removed_and_live_ones_kept(tmp_path: Path):
    dead = tmp_path / f"thundersync-bwrap-{dead_pid()}-abc"
    live = tmp_path / f"thundersync-bwrap-{os.getpid()}-def"
    for folder in (dead, live):
        (folder / "workspace").mkdir(parents=True)
    removed = remove_orphan_workspaces("thundersync-bwrap-", str(tmp_path))
    assert removed == [dead]
    assert not dead.exists() and live.exists()


@pytest.mark.docker
def test_containers_of_dead_owners_are_removed_and_live_ones_kept():
    import docker

    from environments.sandboxes import BASE_IMAGE

    client = docker.from_env()
    made = []
    try:
        for owner in (dead_pid(), os.getpid()):
            made.append(
                client.containers.create(
                    BASE_IMAGE,
                    ["sleep", "1"],
                    network_mode="none",
                    labels={
                        "thundersync-orphan-test": "1",
                        "thundersync-orphan-test.owner_pid": str(owner),
                    },
                )
            )
        removed = remove_orphan_containers(client, "thundersync-orphan-test")
        assert removed == [made[0].name]
        names = [c.name for c in client.containers.list(all=True)]
        assert made[0].name not in names and made[1].name in names
    finally:
        for container in made:
            with contextlib.suppress(docker.errors.NotFound):
                container.remove(force=True)
        client.close()


class _Gone:
    """A listed container or volume that another run removed before this one could."""

    def __init__(self, labels: dict[str, str], name: str) -> None:
        self.attrs = {"Labels": labels, "Names": [f"/{name}"]}
        self.id = self.name = name

    @property
    def labels(self) -> dict[str, str]:  # what the list of a sparse container cannot give
        raise AssertionError("inspected a listed container")

    def remove(self, force: bool = False) -> None:
        from docker.errors import APIError, NotFound

        if self.name == "going":
            raise APIError("removal already in progress", SimpleNamespace(status_code=409))
        raise NotFound(f"No such container: {self.name}")


class _Kept(_Gone):
    def remove(self, force: bool = False) -> None:
        self.removed = force


def test_an_orphan_another_run_removed_meanwhile_is_skipped():
    """On a daemon other runs share, a container listed here may be gone before it is
    inspected or removed: the reap goes on (it failed the run's first sandbox before)."""
    owner = {"t": "1", "t.owner_pid": str(dead_pid())}
    gone, going, kept = _Gone(owner, "gone"), _Gone(owner, "going"), _Kept(owner, "kept")
    client = SimpleNamespace(
        containers=SimpleNamespace(
            list=lambda **kw: [gone, going, kept] if kw.get("sparse") else []
        ),
        volumes=SimpleNamespace(list=lambda **kw: [_Gone(owner, "volume")]),
    )
    assert remove_orphan_containers(client, "t") == ["kept"]
    assert kept.removed


def test_sigterm_to_the_cli_unwinds_so_sandboxes_are_closed():
    script = (
        "import time\n"
        "from thundersync.cli import exit_on_sigterm\n"
        "exit_on_sigterm()\n"
        "try:\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(30)\n"
        "finally:\n"
        "    print('closed', flush=True)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "closed" in out and proc.returncode == 128 + signal.SIGTERM
