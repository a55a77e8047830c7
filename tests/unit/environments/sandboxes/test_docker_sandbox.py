"""DockerSandbox against the real daemon (marked ``docker``; skipped loudly without one)."""

from __future__ import annotations

import gc
import os
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from environments.sandboxes import BASE_IMAGE, DockerSandbox, SandboxError, SandboxSpec
from environments.sandboxes import docker as docker_module
from environments.sandboxes.protocol import AgentBrokeSandbox

pytestmark = pytest.mark.docker


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    from environments.sandboxes import docker_available

    if not docker_available():
        pytest.skip(
            "DOCKER TESTS SKIPPED: no Docker daemon reachable; start one with "
            "`dockerd --bridge=none --iptables=false &` (see README, Quick start)"
        )
    import docker

    client = docker.from_env(timeout=60)
    try:
        client.images.get(BASE_IMAGE)
    except docker.errors.ImageNotFound:
        client.close()
        pytest.skip(f"DOCKER TESTS SKIPPED: run images/build_base_image.sh to build {BASE_IMAGE}")
    yield client
    client.close()


def my_containers(client: Any) -> list[str]:
    label = f"thundersync.owner_pid={os.getpid()}"
    return [c.name for c in client.containers.list(all=True, filters={"label": label})]


@pytest.fixture
def sandbox(client: Any, tmp_path: Path) -> Iterator[DockerSandbox]:
    (tmp_path / "task").mkdir()
    (tmp_path / "task" / "README").write_text("hello\n")
    spec = SandboxSpec(files=tmp_path / "task", workdir="/testbed", env={"FOO": "a b"})
    sb = DockerSandbox(spec)
    try:
        yield sb
    finally:
        sb.close()
    assert my_containers(client) == []


def test_files_env_and_workdir(sandbox: DockerSandbox) -> None:
    result = sandbox.execute('pwd; cat README; echo "$FOO"; exit 4', 10)
    assert (result.output, result.exit_code) == ("/testbed\nhello\na b\n", 4)


def test_stdout_and_stderr_arrive_in_the_order_written(sandbox: DockerSandbox) -> None:
    # Docker carries the two streams separately; an agent must read them as a terminal shows them
    result = sandbox.execute("for i in $(seq 30); do echo o$i; echo e$i >&2; done", 10)
    expected = "".join(f"o{i}\ne{i}\n" for i in range(1, 31))
    assert result.output == expected


def test_container_has_no_network_and_the_limits_of_the_spec(
    sandbox: DockerSandbox, client: Any
) -> None:
    attrs = client.containers.get(sandbox.marker).attrs["HostConfig"]
    assert attrs["NetworkMode"] == "none" and attrs["Init"] is True
    assert attrs["Memory"] == 2048 * 2**20 and attrs["PidsLimit"] == 256
    assert attrs["NanoCpus"] == 10**9


def test_upload_and_download_round_trip(sandbox: DockerSandbox, tmp_path: Path) -> None:
    src = tmp_path / "in"
    (src / "deep").mkdir(parents=True)
    (src / "deep" / "x.txt").write_text("x")
    (tmp_path / "one.txt").write_text("one")
    sandbox.upload(src, "uploaded")
    sandbox.upload(tmp_path / "one.txt", "/opt/new/one.txt")
    result = sandbox.execute("cat uploaded/deep/x.txt /opt/new/one.txt; echo y >> README", 10)
    assert result.output == "xone"
    sandbox.download("uploaded", tmp_path / "back")
    sandbox.download("/testbed/README", tmp_path / "README")
    assert (tmp_path / "back" / "deep" / "x.txt").read_text() == "x"
    assert (tmp_path / "README").read_text() == "hello\ny\n"
    with pytest.raises(IsADirectoryError, match="uploaded"):
        sandbox.upload(tmp_path / "one.txt", "uploaded")
    with pytest.raises(FileNotFoundError, match="missing"):
        sandbox.download("missing", tmp_path / "missing")


def test_close_removes_the_container_and_later_calls_fail(client: Any, tmp_path: Path) -> None:
    sb = DockerSandbox(SandboxSpec())
    assert my_containers(client) == [sb.marker]
    sb.close()
    sb.close()
    assert my_containers(client) == []
    with pytest.raises(SandboxError, match="closed"):
        sb.execute("true", 5)
    with pytest.raises(SandboxError, match="closed"):
        sb.download("x", tmp_path / "x")


def test_a_dropped_sandbox_is_removed_by_garbage_collection(client: Any) -> None:
    DockerSandbox(SandboxSpec()).execute("true", 5)
    gc.collect()
    assert my_containers(client) == []


def test_a_missing_image_fails_cleanly(client: Any) -> None:
    with pytest.raises(SandboxError, match="thundersync/no-such-image:1"):
        DockerSandbox(SandboxSpec(image="thundersync/no-such-image:1"))
    assert my_containers(client) == []


def test_build_context_builds_offline_from_the_base_image(client: Any, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN echo built > /built.txt\n")
    with DockerSandbox(SandboxSpec(build_context=tmp_path)) as sb:
        assert sb.execute("cat /built.txt", 10).output == "built\n"
        image = client.containers.get(sb.marker).image
    with DockerSandbox(SandboxSpec(build_context=tmp_path)) as again:
        assert client.containers.get(again.marker).image.id == image.id
    client.images.remove(image.id, force=True)


def test_a_failing_build_names_its_context(client: Any, tmp_path: Path) -> None:
    (tmp_path / "Dockerfile").write_text(f"FROM {BASE_IMAGE}\nRUN exit 3\n")
    with pytest.raises(SandboxError, match=str(tmp_path)):
        DockerSandbox(SandboxSpec(build_context=tmp_path))
    assert my_containers(client) == []
    (tmp_path / "Dockerfile").unlink()
    with pytest.raises(SandboxError, match="no Dockerfile"):
        DockerSandbox(SandboxSpec(build_context=tmp_path))


def test_export_folder_leaves_out_the_excluded_children(
    sandbox: DockerSandbox, tmp_path: Path
) -> None:
    """The daemon cannot leave anything out: the excluded children stream past unstored; the
    rest is the full archive's, byte for byte (a nested folder of the same name stays)."""
    made = sandbox.execute(
        "mkdir -p .git/objects sub/.git && head -c 3000000 /dev/urandom > .git/objects/big && "
        "echo x > sub/.git/keep && echo y > .gitignore && ln -s README link",
        timeout=30,
    )
    assert made.exit_code == 0, made.output
    sandbox.export_folder("/testbed", tmp_path / "full.tar")
    sandbox.export_folder("/testbed", tmp_path / "part.tar", exclude=(".git",))

    def members(path: Path) -> dict[str, tuple[str, bytes]]:
        with tarfile.open(path) as archive:
            return {
                m.name.rstrip("/"): (
                    m.linkname,
                    archive.extractfile(m).read() if m.isreg() else b"",
                )
                for m in archive
            }

    full = members(tmp_path / "full.tar")
    expected = {
        n: v for n, v in full.items() if n != "testbed/.git" and not n.startswith("testbed/.git/")
    }
    assert "testbed/.git/objects/big" in full and "testbed/sub/.git/keep" in expected
    assert members(tmp_path / "part.tar") == expected
    assert (tmp_path / "part.tar").stat().st_size < 1_000_000


class _SlowInit:
    """A container whose init forks its main program only after ``empty`` reads of its
    children (as a loaded machine showed right after a start), or never while it stops."""

    def __init__(self, empty: int, *, running: bool = True) -> None:
        self.empty, self.reads, self.status = empty, 0, "running" if running else "exited"

    def children(self, deadline: float) -> tuple[int, str]:
        self.reads += 1
        return 0, ("" if self.reads <= self.empty else "7\n")

    def reload(self) -> None:
        pass


def faked(container: _SlowInit) -> DockerSandbox:
    """A DockerSandbox over ``container``, whose init's children it reads."""
    sandbox = object.__new__(DockerSandbox)
    sandbox.marker, sandbox._container = "thundersync-test", container
    sandbox._children_of_init = container.children  # type: ignore[method-assign]
    return sandbox


def test_the_main_process_is_awaited_after_a_start_not_taken_for_missing() -> None:
    """Under load the init had not forked ``sleep`` yet when its children were read: the
    fresh grading sandbox failed as an infrastructure failure (and after a restart the agent
    would have been blamed). The children are read again until the process is there."""
    sandbox = faked(_SlowInit(empty=3))
    assert sandbox._find_main_pid() == "7" and sandbox._container.reads == 4
    sandbox = faked(_SlowInit(empty=10**6, running=False))  # stopped: no wait
    with pytest.raises(SandboxError, match="cannot find its main process"):
        sandbox._find_main_pid()
    assert sandbox._container.reads == 1


# (one printing without end is bounded alike, by the read's 4 KiB; removing its container
# then takes dockerd 20 s, so it is not run here)
REPLACED_CATS = {
    "undecodable": "#!/bin/sh\nprintf '\\377\\n'\n",
    "silent-for-ever": "#!/bin/sh\nexec sleep 1000\n",
}


@pytest.mark.parametrize("cat", list(REPLACED_CATS))
def test_a_container_whose_cat_the_agent_replaced_is_the_agents_broken_sandbox(
    sandbox: DockerSandbox, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, cat: str
) -> None:
    """Root in the container, the agent's code replaced ``cat`` (which finds the main
    process) and killed every process: the restart finds no main process, within its
    bound. That is ``AgentBrokeSandbox``, the agent's 0. Bytes of no UTF-8 failed a strict
    decode, ``execute`` wrapped the error as a SandboxError (an infrastructure failure), and
    a ``cat`` that printed without end or never ended held ``exec_run`` for ever (red team,
    2026-12-07)."""
    monkeypatch.setattr(docker_module, "MAIN_PROCESS_WAIT_S", 1.0)
    (tmp_path / "cat").write_text(REPLACED_CATS[cat])
    sandbox.upload(tmp_path / "cat", "/usr/bin/cat")
    sandbox.execute("chmod 755 /usr/bin/cat; kill -9 -1", timeout=30)
    with pytest.raises(AgentBrokeSandbox, match="does not run after a restart"):
        sandbox.execute("true", timeout=30)


def test_a_container_whose_sbin_the_agent_replaced_is_the_agents_broken_sandbox(
    sandbox: DockerSandbox,
) -> None:
    """On a merged-usr image ``/sbin`` is a link, and the runtime mounts docker-init at
    ``/sbin/docker-init`` as a container starts: a root agent that made ``/sbin`` a file made
    every restart fail, which read as the daemon failing, an infrastructure failure in any task
    run in Docker (red team, 2026-12-07). A fresh container of the image starts, so the agent
    broke its own; the probe container is removed (the fixture checks none is left)."""
    sandbox.execute("rm /sbin && echo x > /sbin; kill -9 -1", timeout=30)
    with pytest.raises(AgentBrokeSandbox, match="a fresh container of its image starts"):
        sandbox.execute("true", timeout=30)
