"""A private, single-machine Ray head for ``--backend ray`` when no cluster is given, tied to
the trainer's life.

``start_private_head`` runs this module as a guard process (``python -m
thundersync.training.ray_head``) that starts ``ray start --head`` on loopback only, in a
temporary folder of its own. The guard is a child subreaper (``PR_SET_CHILD_SUBREAPER``): every
process Ray starts stays its descendant, even once its own parent exits. When the trainer
stops it, or dies (``PR_SET_PDEATHSIG``, so ``kill -9`` too), the guard stops every descendant
by its own pid (SIGTERM, then SIGKILL) and removes the temporary folder: no Ray process, actor
or session file outlives the run. (Ray's own clean-up misses some: its dashboard and runtime-env
agents were seen running minutes after their driver was killed.)

Ray listens on loopback only: ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` makes it resolve the node's
address to 127.0.0.1, and token auth is off (``RAY_AUTH_MODE=disabled``: nothing but local
processes can reach it, and auth would write a token file under the home directory).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

LOOPBACK_ENV = {
    "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
    "RAY_AUTH_MODE": "disabled",
    "RAY_USAGE_STATS_ENABLED": "0",
    # Ray starts workers at nice 15 (to favour the driver); ours do the run's work (rollout,
    # teacher, learner ranks), so on a busy machine they would starve behind anything else
    # while the local backend's workers would not: they run at the trainer's own priority.
    "RAY_worker_niceness": "0",
}
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER = 1, 36
_READY = "thundersync-ray-head: ready"
_START_TIMEOUT_S = 120.0
_MAX_BASE = 24


@dataclass(slots=True)
class PrivateHead:
    """A running guard: ``address`` to ``ray.init``; ``close()`` stops everything."""

    address: str
    guard: subprocess.Popen

    def close(self, timeout_s: float = 30.0) -> None:
        if self.guard.poll() is None:
            self.guard.send_signal(signal.SIGTERM)
            try:
                self.guard.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.guard.kill()
                self.guard.wait()
        if self.guard.stdout is not None:
            self.guard.stdout.close()


def start_private_head(*, num_cpus: int, num_gpus: int, log: Path) -> PrivateHead:
    """Start the guard and its Ray head; returns once the head accepts drivers."""
    with socket.socket() as probe:  # a free loopback port for the head's GCS
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [
        sys.executable,
        "-m",
        "thundersync.training.ray_head",
        "--port",
        str(port),
        "--num-cpus",
        str(num_cpus),
        "--num-gpus",
        str(num_gpus),
        "--parent",
        str(os.getpid()),
    ]
    with log.open("ab") as sink:
        guard = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=sink, env={**os.environ, **LOOPBACK_ENV}
        )
    head = PrivateHead(f"127.0.0.1:{port}", guard)
    assert guard.stdout is not None
    line = guard.stdout.readline().decode(errors="replace").strip()  # EOF if the guard died
    if line != _READY:
        head.close()
        from thundersync.training.workers import BackendError

        raise BackendError(f"the private Ray head did not start (see {log})")
    return head


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--num-cpus", type=int, required=True)
    parser.add_argument("--num-gpus", type=int, default=0)
    parser.add_argument("--parent", type=int, required=True)
    args = parser.parse_args()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    stopping: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    # Ray's socket paths under it must fit AF_UNIX's 107 bytes: a long TMPDIR falls back to /tmp
    base = tempfile.gettempdir()
    temp = tempfile.mkdtemp(prefix="ts-ray-", dir=base if len(base) <= _MAX_BASE else "/tmp")
    try:
        if os.getppid() != args.parent:  # the trainer died before prctl took effect
            return
        ray = shutil.which("ray", path=os.path.dirname(sys.executable)) or "ray"
        started = subprocess.run(
            [
                ray,
                "start",
                "--head",
                "--port",
                str(args.port),
                "--node-ip-address",
                "127.0.0.1",
                "--num-cpus",
                str(args.num_cpus),
                "--num-gpus",
                str(args.num_gpus),
                "--temp-dir",
                temp,
                "--include-dashboard",
                "false",
                "--disable-usage-stats",
            ],
            stdout=sys.stderr,
            stderr=sys.stderr,
            timeout=_START_TIMEOUT_S,
            check=False,
        )
        if started.returncode != 0 or stopping:
            return
        print(_READY, flush=True)
        while not stopping and os.getppid() == args.parent:
            _reap()
            time.sleep(0.5)
    finally:
        _stop_descendants()
        _remove(temp)


def _stop_descendants(grace_s: float = 5.0) -> None:
    """SIGTERM every descendant, then SIGKILL whatever is left, listing them again each time
    (one may have started another meanwhile)."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        deadline = time.monotonic() + grace_s
        while (left := _descendants(os.getpid())) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signum)
            _reap()
            time.sleep(0.1)
    _reap()


def _remove(temp: str, tries: int = 50) -> None:
    """Remove Ray's folder; a process still dying may write a log into it while it is walked
    (seen on a loaded machine), so remove again until it is gone (bounded: 5 s)."""
    for _ in range(tries):
        shutil.rmtree(temp, ignore_errors=True)
        if not os.path.lexists(temp):
            return
        _reap()
        time.sleep(0.1)


def _reap() -> None:
    """Collect exited children (Ray's orphans are ours to reap, as their subreaper)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


def _descendants(root: int) -> list[int]:
    """Live (non-zombie) descendants of ``root``, from /proc."""
    children: dict[int, list[int]] = {}
    zombies: set[int] = set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(name))
        if fields[0] == "Z":
            zombies.add(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return [pid for pid in found if pid not in zombies]


if __name__ == "__main__":
    main()
