"""One bubblewrap namespace per sandbox that runs its commands one after another.

Starting bwrap costs ~20 ms of machine CPU and ~25 ms of wall time per command here (new
network, PID, IPC and UTS namespaces, a dozen mounts, five execs); a command run by a session
that is already up costs what the command itself costs. On a training machine that starts dozens
of tool calls at once, that CPU is taken from the engine and the learner (docs/measurements.md,
"agent loop").

A session is ``bwrap … setpriv … python -I -S -c INIT``: INIT, the session's init, reads
commands on its stdin (framed: 4-byte length, then ``cpu_s␀command``), and for each one

1. forks a child that takes the command's rlimits (the same ``prlimit`` set as before, one more
   process for the init itself), stdin ``/dev/null``, stdout and stderr the session's output
   pipe, no other descriptor, and execs ``bash -c COMMAND`` (a long command: sourced from a
   memfd);
2. waits for the command's shell, then SIGKILLs every other process in the namespace
   (``kill(-1)``, repeated until ``/proc`` lists none alive): background jobs, ``setsid`` and
   double-forked daemons end with their command, as when each command had a namespace of its
   own;
3. writes the shell's wait status on the result pipe.

Everything the command wrote reached the output pipe before its result was sent, so the host
reads output until the result comes, then what is left without blocking.

What holds the guarantee: the init runs as the sandbox's uid with no capabilities, like the
commands, and makes itself non-dumpable (``PR_SET_DUMPABLE`` 0), so no command can ptrace it,
read or write its memory or open its descriptors through ``/proc``. A command that kills it
(same uid) kills its own session: bwrap's own init is PID 1 of the namespace, the kernel kills
everything in it when bwrap exits, and the host reports the command as killed (exit 137); the
next command starts a new session. A timeout, ``close()`` and ``stop_processes()`` kill the
session's process group from outside, as before.

What changes against a namespace per command: ``/tmp`` (a tmpfs) lives as long as the session,
as it would in a container, instead of being fresh for every command; a timed-out or killed
command starts the next one in a fresh session, with a fresh ``/tmp``.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from environments.sandboxes.capture import (
    READ_CHUNK_BYTES,
    OutputCapture,
    read_fd_until,
    readable,
)
from environments.sandboxes.protocol import MAX_ARGV_CMD_BYTES

KILLED_EXIT_CODE = 128 + signal.SIGKILL
END_S = 2.0
"""How long an idle session may take to end by itself before it is killed."""
NICE = 10
"""The nice value of a session's processes and of its scheduling group. Tools run behind the
trainer on a shared machine: the loop that sends every episode its next step, the engine and
the learner take the cores first, and tools use what they leave. Where the kernel groups
processes by session (autogroups), a new session, as bwrap's ``--new-session`` makes, is a
group of its own that weighs as much as the whole trainer, whatever its processes' nice: 32
sandboxes outweighed the trainer 32 to 1. So the host sets the group's nice too
(``lower_priority``; at 10 a sandbox weighs about a tenth of the trainer). A preference, not a
limit: a command cannot go below it (that needs ``CAP_SYS_NICE``) but may set its group back to
0. Measured in docs/measurements.md ("agent loop")."""

INIT = r"""
import ctypes, os, resource, signal, sys

os.nice(int(sys.argv[6]))  # with autogroups, the host sets the session's group too
ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE 0: no ptrace, no /proc/<init>/mem
signal.signal(signal.SIGINT, signal.SIG_DFL)
results = int(sys.argv[1])
as_bytes, nproc, fsize = map(int, sys.argv[2:5])
long_cmd = int(sys.argv[5])
workdir = sys.argv[7]
me = os.getpid()


def read_exact(n):
    data = b""
    while len(data) < n:
        chunk = os.read(0, n - len(data))
        if not chunk:
            sys.exit(0)
        data += chunk
    return data


def alive():
    for name in os.listdir("/proc"):
        if name.isdigit() and int(name) not in (1, me):
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    if fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                        return True
            except (OSError, IndexError):
                pass
    return False


os.write(results, b"ok\n")
while True:
    message = read_exact(int.from_bytes(read_exact(4), "big"))
    cpu_s, command = message.split(b"\0", 1)
    memfd = -1
    if len(command) > long_cmd:
        memfd = os.memfd_create("command")
        os.write(memfd, command)
        os.lseek(memfd, 0, os.SEEK_SET)
    pid = os.fork()
    if pid == 0:
        try:
            for sig in (signal.SIGPIPE, signal.SIGXFSZ):
                signal.signal(sig, signal.SIG_DFL)
            cpu = int(cpu_s)
            for limit, value in (
                (resource.RLIMIT_AS, as_bytes), (resource.RLIMIT_NPROC, nproc),
                (resource.RLIMIT_FSIZE, fsize), (resource.RLIMIT_CPU, cpu),
                (resource.RLIMIT_CORE, 0),
            ):
                resource.setrlimit(limit, (value, value))
            null = os.open("/dev/null", os.O_RDONLY)
            os.dup2(null, 0)
            os.dup2(1, 2)
            try:
                os.chdir(workdir)
            except OSError as exc:  # the agent's chmod: the command fails, as a shell's cd would
                os.write(1, f"thundersync: cannot enter {workdir}: {exc.strerror}\n".encode())
                os._exit(126)
            if memfd >= 0:
                os.dup2(memfd, 3)  # a no-op when memfd is 3: inheritable either way
                os.set_inheritable(3, True)
                os.closerange(4, 1 << 20)
                argv = ["bash", "-c", ". /proc/self/fd/3"]
            else:
                os.closerange(3, 1 << 20)
                argv = ["bash", "-c", command.decode("utf-8", "surrogateescape")]
            os.execvp("bash", argv)
        finally:
            os._exit(127)
    if memfd >= 0:
        os.close(memfd)
    _, status = os.waitpid(pid, 0)
    while alive():
        try:
            os.kill(-1, signal.SIGKILL)
        except ProcessLookupError:
            pass
        os.sched_yield()
    os.write(results, b"%d\n" % status)
"""


class SessionLost(Exception):
    """The session ended without answering (killed from inside, or by the OOM killer)."""

    def __init__(self, message: str, *, sent: bool) -> None:
        super().__init__(message)
        self.sent = sent
        """False when the command never reached the init (it did not run)."""


@dataclass(frozen=True, slots=True)
class Limits:
    """The rlimits every command of a session runs under (``prlimit``'s, as before)."""

    address_space_bytes: int
    processes: int
    file_bytes: int


def init_argv(limits: Limits, results_fd: int, python: str, workdir: str) -> list[str]:
    """The session's init: ``python`` (the project's interpreter, visible in the sandbox)
    isolated from site-packages and the environment, running INIT; each command runs in
    ``workdir`` (a command that cannot enter it fails with 126 and says why)."""
    numbers = (limits.address_space_bytes, limits.processes + 1, limits.file_bytes)
    return [python, "-I", "-S", "-c", INIT, str(results_fd), *map(str, numbers)] + [
        str(MAX_ARGV_CMD_BYTES),
        str(NICE),
        workdir,
    ]


def lower_priority(bwrap_pid: int) -> None:
    """Set the autogroup of the session under ``bwrap_pid`` (made by its ``--new-session``,
    holding bwrap's child and everything the session runs) to ``NICE``. Only root may set a
    group's nice freely: other users are limited to one change in 100 ms on the whole machine,
    so a burst of sessions mostly keeps nice 0 groups (the processes' own nice still holds
    where the kernel has no autogroups). Best effort: a kernel without autogroups or without
    ``/proc/PID/task/PID/children`` leaves it as it is."""
    with contextlib.suppress(OSError, ValueError):
        children = Path(f"/proc/{bwrap_pid}/task/{bwrap_pid}/children").read_text().split()
        if children:
            Path(f"/proc/{int(children[0])}/autogroup").write_text(str(NICE))


class Session:
    """The host's end of a running session: ``proc`` (bwrap, a process group of its own), the
    command pipe (its stdin), the output pipe (its stdout and stderr) and the result pipe."""

    def __init__(self, proc: subprocess.Popen[bytes], results: int) -> None:
        assert proc.stdin is not None and proc.stdout is not None
        self.proc = proc
        self.results = results
        self.output = proc.stdout.fileno()
        os.set_blocking(self.output, False)
        os.set_blocking(results, False)
        self._pending = b""

    def wait_ready(self, capture: OutputCapture, deadline: float) -> bool | None:
        """True once the init runs; False when bwrap exited first (its error is in
        ``capture``); None at ``deadline``."""
        line = self._result_line(capture, deadline)
        if line is None:
            return None
        if line == b"ok":
            return True
        read_fd_until(self.output, capture, deadline)
        return False

    def run(self, command: str, cpu_s: int, capture: OutputCapture, deadline: float) -> int | None:
        """Run ``command``; its exit code (128 + N for a signal), or None at ``deadline``.
        SessionLost when the session died under it."""
        assert self.proc.stdin is not None
        body = b"%d\0" % cpu_s + command.encode("utf-8", "surrogateescape")
        try:
            self.proc.stdin.write(len(body).to_bytes(4, "big") + body)
            self.proc.stdin.flush()
        except OSError as exc:  # a broken pipe: the init is gone
            raise SessionLost("the session's init is gone", sent=False) from exc
        line = self._result_line(capture, deadline)
        if line is None:
            return None
        if line == b"":
            raise SessionLost("the session ended during the command", sent=True)
        _drain_ready(self.output, capture)
        code = os.waitstatus_to_exitcode(int(line))
        return code if code >= 0 else 128 - code

    def _result_line(self, capture: OutputCapture, deadline: float) -> bytes | None:
        """The next line on the result pipe (b"" at its end), feeding output meanwhile; None
        at ``deadline``."""
        while b"\n" not in self._pending:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready = readable([self.results, self.output], min(remaining, 0.25))
            if self.output in ready:
                _drain_ready(self.output, capture)
            if self.results in ready:
                chunk = _read(self.results)
                if chunk == b"":
                    return b""
                self._pending += chunk or b""
        line, self._pending = self._pending.split(b"\n", 1)
        return line

    def kill(self) -> None:
        """SIGKILL the session's process group (bwrap and, with it, its namespace)."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

    def drain_after_kill(self, capture: OutputCapture, seconds: float) -> None:
        """What a killed session's command wrote before it died."""
        read_fd_until(self.output, capture, time.monotonic() + seconds)

    def close(self) -> None:
        """End the session and release its pipes and process. Between commands the init
        reads the end of its commands and exits; bwrap's PID 1 then exits only once the
        kernel has reaped everything in the namespace, and bwrap after it, so once ``proc``
        is reaped nothing of the session is left (its cgroup can be removed at once). A
        session that does not end within ``END_S`` (a command still running) is killed."""
        for stream in (self.proc.stdin, self.proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        with contextlib.suppress(OSError):
            os.close(self.results)
        if not _exits_within(self.proc, END_S):
            self.kill()
        self.proc.wait()


def _exits_within(proc: subprocess.Popen[bytes], seconds: float) -> bool:
    """Whether ``proc`` exits within ``seconds``: waited on its pidfd (``Popen.wait`` with a
    timeout polls with sleeps)."""
    try:
        pidfd = os.pidfd_open(proc.pid)
    except ProcessLookupError:  # exited and reaped already
        return True
    except OSError:  # no pidfds (Linux < 5.3): Popen's own wait
        try:
            proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            return False
        return True
    try:
        return bool(readable([pidfd], seconds))
    finally:
        os.close(pidfd)


def _read(fd: int) -> bytes | None:
    """One chunk from non-blocking ``fd``: b"" at its end, None when nothing is there yet."""
    try:
        return os.read(fd, READ_CHUNK_BYTES)
    except BlockingIOError:
        return None


def _drain_ready(fd: int, capture: OutputCapture) -> None:
    """Feed ``capture`` everything ``fd`` holds now, without waiting for more."""
    while chunk := _read(fd):
        capture.feed(chunk)
