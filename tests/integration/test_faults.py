"""Faults end cleanly: Ctrl-C and SIGTERM to a real ``thundersync eval``, a Docker daemon lost
in the middle of a run, and an agent that fills its workspace next to a concurrent episode.

The interrupted runs play a task of our own whose reference solution ignores SIGTERM and sleeps
for a minute: before cancellation closed live sandboxes, the command ran to its end. The lost
daemon is a second ``dockerd`` of our own (its own socket, data and exec roots), stopped by
its pid; the shared daemon is never touched.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tarfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from environments.agents import OracleAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.sandboxes import DockerSandbox, SandboxError, SandboxSpec, disk
from environments.tasks import Grade, GradingContext
from tests.conftest import SANDBOX_KINDS, leftover_containers, leftover_sandbox_processes

ROOT = Path(__file__).resolve().parents[2]
EXIT_WITHIN_S = 10.0  # the old code waited out the 60 s command
TINY_IMAGE_TOOLS = (
    "bash",
    "sh",
    "dash",
    "timeout",
    "sleep",
    "cat",
    "mktemp",
    "base64",
    "tar",
    "gzip",
    "rm",
    "mkdir",
    "ls",
)


def write_slow_task(root: Path, token: str) -> Path:
    """A Harbor task folder whose reference solution ignores SIGTERM and sleeps 60 s."""
    task = root / "suite" / "slow-task"
    for folder in ("environment", "solution", "tests"):
        (task / folder).mkdir(parents=True)
    (task / "task.toml").write_text(
        'version = "1.0"\n[verifier]\ntimeout_sec = 30.0\n[agent]\ntimeout_sec = 120.0\n'
        '[environment]\nbuild_timeout_sec = 60.0\ncpus = 1\nmemory = "1G"\n'
    )
    (task / "instruction.md").write_text("Wait a minute.\n")
    (task / "environment" / "Dockerfile").write_text(
        "FROM thundersync/base:bookworm\nWORKDIR /app\n"
    )
    (task / "solution" / "solve.sh").write_text(
        f"#!/bin/bash\ntrap '' TERM INT HUP\nsleep 60.{token}\n"
    )
    (task / "tests" / "test.sh").write_text('#!/bin/bash\necho 1 > "$VERIFIER_DIR/reward.txt"\n')
    return task.parent


def processes_with(text: str) -> list[int]:
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                if name.isdigit() and text.encode() in fh.read().replace(b"\0", b" "):
                    found.append(int(name))
        except OSError:
            continue
    return found


def start_eval(suite: Path, out: Path, kind: str, env: dict[str, str]) -> subprocess.Popen:
    argv = [
        sys.executable,
        "-m",
        "thundersync.cli",
        "eval",
        "--suite",
        str(suite),
        "--agent",
        "oracle",
        "--sandbox",
        kind,
        "-k",
        "2",
        "--out",
        str(out),
        "--json",
    ]
    return subprocess.Popen(
        argv,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(what: str, check, within_s: float) -> None:
    deadline = time.monotonic() + within_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def wait_sleeping(proc: subprocess.Popen, token: str) -> None:
    def both_sleeping() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"eval exited early ({proc.returncode}): {proc.stderr.read()}")
        return len(processes_with(f"sleep 60.{token}")) == 2

    wait_for("both attempts to run their command", both_sleeping, 90)


def mounts_of(pid: int) -> list[str]:
    text = Path("/proc/self/mounts").read_text()
    return [line for line in text.splitlines() if "thundersync-" in line and f"-{pid}-" in line]


# --- Ctrl-C and SIGTERM ----------------------------------------------------------------------


@pytest.mark.parametrize("kind", SANDBOX_KINDS)
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_closes_live_sandboxes_at_once_and_writes_a_partial_report(
    tmp_path: Path, kind: str, signum: int
) -> None:
    token = str(random.randrange(10**8, 10**9))
    out = tmp_path / "out"
    proc = start_eval(write_slow_task(tmp_path, token), out, kind, {})
    try:
        wait_sleeping(proc, token)
        sent = time.monotonic()
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=60)
        took = time.monotonic() - sent
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signum, stderr
    assert took < EXIT_WITHIN_S, f"exit took {took:.1f} s after the signal"
    assert "Traceback" not in stderr
    report = json.loads((out / "results.json").read_text())
    assert report == json.loads(stdout)
    assert report["interrupted"] == signal.Signals(signum).name
    attempts = report["tasks"][0]["attempts"]
    assert len(attempts) == 2
    for attempt in attempts:
        assert attempt["infra_failure"] and attempt["error"].startswith("RunCancelled")
    assert processes_with(f"sleep 60.{token}") == []
    assert leftover_sandbox_processes(proc.pid) == [] and leftover_containers(proc.pid) == []
    assert mounts_of(proc.pid) == []


# --- a lost Docker daemon --------------------------------------------------------------------


@dataclass
class Daemon:
    """A dockerd of our own; ``stop()`` sends SIGTERM to its pid (it stops its containers)."""

    proc: subprocess.Popen
    root: Path
    host: str

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)


def tiny_rootfs() -> bytes:
    """A tar of the host's bash, coreutils and tar with their libraries: enough for the
    sandbox's exec wrapper and the reference solution, in ~0.2 s instead of a 365 MB image."""
    paths: set[str] = set()
    for tool in TINY_IMAGE_TOOLS:
        ldd = subprocess.run(["ldd", f"/usr/bin/{tool}"], capture_output=True, text=True).stdout
        for path in [f"/usr/bin/{tool}", *(w for w in ldd.split() if w.startswith("/"))]:
            merged = path if path.startswith("/usr/") else "/usr" + path  # /lib -> usr/lib
            paths.update([merged, os.path.realpath(merged)])  # a link and what it points to
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        folders = {str(parent) for path in paths for parent in Path(path).parents}
        for folder in sorted({*folders, "/tmp", "/proc", "/dev", "/sys", "/etc"} - {"/"}):
            info = tarfile.TarInfo(folder.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if folder == "/tmp" else 0o755
            tar.addfile(info)
        for link in ("bin", "lib", "lib64", "sbin"):
            info = tarfile.TarInfo(link)
            info.type, info.linkname = tarfile.SYMTYPE, f"usr/{link}"
            tar.addfile(info)
        for path in sorted(paths):
            tar.add(path, arcname=path.lstrip("/"), recursive=False)
    return buffer.getvalue()


@pytest.fixture
def second_daemon() -> Iterator[Daemon]:
    if shutil.which("dockerd") is None or os.geteuid() != 0:
        pytest.skip("needs dockerd and root to start a daemon of our own")
    import docker

    root = Path(f"/tmp/ts-faults-{os.getpid()}")  # short: containerd's socket path is bounded
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir()
    host = f"unix://{root}/docker.sock"
    argv = [
        "dockerd",
        "--host",
        host,
        "--data-root",
        f"{root}/data",
        "--exec-root",
        f"{root}/exec",
        "--pidfile",
        f"{root}/docker.pid",
        "--bridge=none",
        "--iptables=false",
    ]
    log = (root / "dockerd.log").open("wb")
    daemon = Daemon(subprocess.Popen(argv, stdout=log, stderr=log), root, host)
    try:
        wait_for("the second dockerd's API", lambda: _pings(host), 30)
        client = docker.DockerClient(base_url=host, timeout=30)
        client.api.import_image_from_data(
            tiny_rootfs(), repository="thundersync/base", tag="bookworm"
        )
        client.close()
        yield daemon
    finally:
        daemon.stop()
        log.close()
        reap_shims(root)
        disk.unmount_under(root)
        shutil.rmtree(root, ignore_errors=True)


def reap_shims(root: Path) -> None:
    """Kill, by pid, what the daemon left behind: a container's shim outlives a daemon stopped
    under it (this test's point), with the container's processes below it."""
    shims = processes_with(f"{root}/")
    children: dict[int, list[int]] = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
    doomed, todo = [], list(shims)
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo.extend(children.get(pid, []))
    for pid in reversed(doomed):  # the container's processes first, then their shim
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _pings(host: str) -> bool:
    import docker

    try:
        client = docker.DockerClient(base_url=host, timeout=5)
    except docker.errors.DockerException:
        return False  # not listening yet
    try:
        return bool(client.ping())
    finally:
        client.close()


@pytest.mark.docker
@pytest.mark.slow
def test_a_lost_docker_daemon_ends_the_run_as_infra_failures_with_a_report(
    tmp_path: Path, second_daemon: Daemon
) -> None:
    token = str(random.randrange(10**8, 10**9))
    out = tmp_path / "out"
    suite = write_slow_task(tmp_path, token)
    proc = start_eval(suite, out, "docker", {"DOCKER_HOST": second_daemon.host})
    try:
        wait_sleeping(proc, token)
        second_daemon.stop()
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr, stderr
    report = json.loads((out / "results.json").read_text())
    assert report == json.loads(stdout) and report["num_infra_failures"] == 1
    attempts = report["tasks"][0]["attempts"]
    assert len(attempts) == 2 and all(a["infra_failure"] and a["error"] for a in attempts)
    assert processes_with(f"sleep 60.{token}") == [] and mounts_of(proc.pid) == []


@pytest.mark.docker
@pytest.mark.slow
def test_every_docker_call_raises_sandbox_error_once_the_daemon_is_gone(
    tmp_path: Path, second_daemon: Daemon
) -> None:
    import docker

    client = docker.DockerClient(base_url=second_daemon.host, timeout=30)
    sandbox = DockerSandbox(SandboxSpec(disk_mb=32), client=client)
    (tmp_path / "up.txt").write_text("up")
    sandbox.execute("echo kept > kept.txt", 10)
    host = sandbox._disk.root
    second_daemon.stop()
    calls = {
        "execute": lambda: sandbox.execute("true", 10),
        "upload": lambda: sandbox.upload(tmp_path / "up.txt", "up.txt"),
        "download": lambda: sandbox.download("kept.txt", tmp_path / "kept.txt"),
        "close": sandbox.close,
        "close again": sandbox.close,
        "a new sandbox": lambda: DockerSandbox(SandboxSpec(), client=client),
    }
    for name, call in calls.items():
        with pytest.raises(SandboxError):
            call()
            pytest.fail(f"{name} did not raise")
    assert host is not None and not host.exists()
    client.close()


# --- a full disk next to a concurrent episode ------------------------------------------------


@dataclass(frozen=True)
class WriteTask:
    """Solved iff the agent wrote ``num_mb`` MiB to ``data`` (its workspace disk is 32 MiB)."""

    task_id: str
    num_mb: int
    instruction: str = "Write the data file."
    max_turns: int = 3
    timeout_s: float = 30.0

    def sandbox_spec(self, kind: str | None) -> SandboxSpec:
        return SandboxSpec(disk_mb=32)

    def setup(self, sandbox) -> None:
        return None

    def grade(self, sandbox, context: GradingContext) -> Grade:
        result = sandbox.execute("stat -c %s data", self.timeout_s)
        size = int(result.output) if result.exit_code == 0 else 0
        return Grade(float(size == self.num_mb * 2**20), details={"size": size})

    def reference_solution(self) -> list[str]:
        # the sleep makes the two episodes overlap while the disk fills
        return [f"sleep 1; head -c {self.num_mb}M /dev/zero > data"]


@pytest.mark.skipif(not disk.available(), reason="workspace disks need root and loop devices")
@pytest.mark.parametrize("kind", SANDBOX_KINDS)
def test_an_agent_filling_its_disk_scores_zero_and_a_concurrent_episode_is_unaffected(
    kind: str,
) -> None:
    tasks = [WriteTask("fills-its-disk", num_mb=64), WriteTask("writes-a-little", num_mb=8)]
    runner = EpisodeRunner(
        lambda: ShellEnv(tasks, sandbox=kind), OracleAgent(), lambda e: None, max_concurrency=2
    )
    (filler,), (neighbour,) = runner.run_groups(tasks, group_size=1)
    assert (filler.reward, filler.infra_failure) == (0.0, False)
    assert 0 < filler.details["size"] < 64 * 2**20
    assert (neighbour.reward, neighbour.infra_failure) == (1.0, False)
