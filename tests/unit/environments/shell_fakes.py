"""Test doubles for the env tests: a host-temp-dir sandbox and a one-file task."""

from __future__ import annotations

import os
import posixpath
import shutil
import subprocess
import tempfile
import time
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from environments.sandboxes.protocol import ExecResult, SandboxError, SandboxSpec, truncate_output
from environments.sandboxes.workspace import archive_folder
from environments.tasks import Grade, GradingContext
from thundersync.protocol.events import now


class LocalSandbox:
    """Runs ``bash -c`` in a host temp dir (no isolation; tests only). Maps ``spec.workdir``
    in ``spec.env`` to the temp dir, as a real sandbox maps its workspace. Records the run
    clock time at which each command started, and can be told to fail."""

    def __init__(self, spec: SandboxSpec, *, fail_on_call: int | None = None) -> None:
        self.spec = spec
        self.workdir = tempfile.mkdtemp(prefix="ts-fake-sandbox-")
        self.env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": self.workdir,
        }
        self.env.update({k: v.replace(spec.workdir, self.workdir) for k, v in spec.env.items()})
        self.fail_on_call = fail_on_call
        self.exec_started: list[float] = []
        self.commands: list[str] = []
        self.closed = False

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        if self.closed:
            raise SandboxError("sandbox is closed")
        self.exec_started.append(now())
        self.commands.append(cmd)
        if self.fail_on_call is not None and len(self.commands) == self.fail_on_call:
            raise SandboxError("fake sandbox died")
        started = time.monotonic()
        try:
            proc = subprocess.run(
                ["bash", "-c", cmd],
                cwd=self.workdir,
                env=self.env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            output, truncated = truncate_output(exc.stdout or b"", self.spec.max_output_bytes)
            return ExecResult(output, None, True, time.monotonic() - started, truncated)
        output, truncated = truncate_output(proc.stdout, self.spec.max_output_bytes)
        return ExecResult(output, proc.returncode, False, time.monotonic() - started, truncated)

    def upload(self, src: Path, dst: str) -> None:
        (shutil.copytree if src.is_dir() else shutil.copy)(src, Path(self.workdir) / dst)

    def download(self, src: str, dst: Path) -> None:
        shutil.copy(Path(self.workdir) / src, dst)

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        """Read by the host from the temp dir, as bubblewrap's engine reads its workspace
        (``path`` absolute under ``spec.workdir``, or relative to it)."""
        inside = posixpath.relpath(posixpath.join(self.spec.workdir, path), self.spec.workdir)
        folder = Path(self.workdir) / inside
        archive_folder(folder, posixpath.basename(folder), dst, exclude=exclude)

    def stop_processes(self) -> None:
        """Nothing to do: without isolation, a command's leftovers cannot be told from the
        host's processes (tests that need them killed use a real sandbox)."""

    def close(self) -> None:
        self.closed = True
        shutil.rmtree(self.workdir, ignore_errors=True)


class SandboxMaker:
    """A sandbox factory for ``ShellEnv(sandbox=...)`` that keeps every sandbox it made."""

    def __init__(self, *, fail_on_call: int | None = None, fail_on_create: bool = False) -> None:
        self.made: list[LocalSandbox] = []
        self.fail_on_call = fail_on_call
        self.fail_on_create = fail_on_create

    def __call__(self, spec: SandboxSpec) -> LocalSandbox:
        if self.fail_on_create:
            raise SandboxError("could not start the fake sandbox")
        sandbox = LocalSandbox(spec, fail_on_call=self.fail_on_call)
        self.made.append(sandbox)
        return sandbox

    @property
    def num_open(self) -> int:
        return sum(not sandbox.closed for sandbox in self.made)


@dataclass
class FileTask:
    """Solved iff ``answer.txt`` holds ``expected``; records when grading started."""

    task_id: str = "file-task"
    instruction: str = "Write ok to answer.txt."
    expected: str = "ok"
    max_turns: int = 5
    timeout_s: float = 5.0
    grade_started: list[float] = field(default_factory=list)

    def sandbox_spec(self, kind: str | None) -> SandboxSpec:
        return SandboxSpec()

    def setup(self, sandbox: LocalSandbox) -> None:
        sandbox.execute("echo ready > .setup", self.timeout_s)

    def grade(self, sandbox: LocalSandbox, context: GradingContext) -> Grade:
        self.grade_started.append(now())
        result = sandbox.execute("cat answer.txt", self.timeout_s)
        ok = result.exit_code == 0 and result.output.strip() == self.expected
        return Grade(1.0 if ok else 0.0, details={"output": result.output})

    def reference_solution(self) -> list[str]:
        return [f"echo {self.expected} > answer.txt"]
