"""Host stand-ins for sandboxes in SWE-bench unit tests: commands run with ``bash`` on the
host, the literal ``/testbed`` rewritten to a temporary folder. Not isolated: only for the
tests' own commands."""

from __future__ import annotations

import posixpath
import shutil
import subprocess
import tempfile
import time
from collections.abc import Collection
from pathlib import Path

from environments.sandboxes.protocol import ExecResult, SandboxError, truncate_output
from environments.sandboxes.workspace import archive_folder
from environments.swebench import SWEBenchTask


class SubprocessSandbox:
    """Runs each command with ``bash -c`` on the host in ``root``, with the literal path
    ``/testbed`` in the command rewritten to ``root``; output truncated like a real sandbox.
    Not isolated: only for the tests' own commands."""

    def __init__(self, root: Path, *, max_output_bytes: int = 64 * 1024) -> None:
        self.root = root
        self.workdir = "/testbed"
        self.max_output_bytes = max_output_bytes
        self.commands: list[str] = []
        self.closed = False

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        self.commands.append(cmd)
        start = time.monotonic()
        try:
            done = subprocess.run(
                ["bash", "-c", cmd.replace("/testbed", str(self.root))],
                cwd=self.root,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as exc:
            text, truncated = truncate_output(exc.stdout or b"", self.max_output_bytes)
            return ExecResult(text, None, True, time.monotonic() - start, truncated)
        text, truncated = truncate_output(done.stdout, self.max_output_bytes)
        return ExecResult(text, done.returncode, False, time.monotonic() - start, truncated)

    def _host(self, path: str) -> Path:
        return Path(path.replace("/testbed", str(self.root), 1))

    def upload(self, src: Path, dst: str) -> None:
        (shutil.copytree if src.is_dir() else shutil.copy)(src, self._host(dst))

    def download(self, src: str, dst: Path) -> None:
        raise NotImplementedError

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        """Read by the host, as bubblewrap's engine reads its workspace."""
        archive_folder(self._host(path), posixpath.basename(path), dst, exclude=exclude)

    def stop_processes(self) -> None:
        """Each command's processes end with it (``subprocess.run``): nothing to stop."""

    def close(self) -> None:
        self.closed = True


class BrokenSandbox:
    """A sandbox whose every command fails the way a dead container does."""

    workdir = "/testbed"

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        raise SandboxError("container vanished")

    def upload(self, src: Path, dst: str) -> None: ...

    def download(self, src: str, dst: Path) -> None: ...

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        raise SandboxError("container vanished")

    def stop_processes(self) -> None:
        raise SandboxError("container vanished")

    def close(self) -> None: ...


class FreshSandboxes:
    """A ``fresh_sandbox`` factory: each call copies the task's sandbox files (its snapshot)
    to a new host folder, as a real sandbox would."""

    def __init__(self, tmp_path: Path, task: SWEBenchTask) -> None:
        tmp_path.mkdir(parents=True, exist_ok=True)
        self.tmp_path = Path(tempfile.mkdtemp(prefix="fresh-", dir=tmp_path))
        self.files = task.sandbox_spec().files
        self.made: list[SubprocessSandbox] = []

    def __call__(self) -> SubprocessSandbox:
        root = self.tmp_path / f"fresh-{len(self.made)}"
        subprocess.run(["cp", "-r", str(self.files), str(root)], check=True)
        self.made.append(SubprocessSandbox(root))
        return self.made[-1]
