"""A scripted sandbox double: ``cat`` of known files answers, everything else succeeds."""

from __future__ import annotations

import shlex
from collections.abc import Collection
from pathlib import Path

from environments.sandboxes.protocol import ExecResult, own


def result(output: str, exit_code: int | None, *, timed_out: bool = False) -> ExecResult:
    return ExecResult(output=output, exit_code=exit_code, timed_out=timed_out, duration_s=0.01)


class ScriptedSandbox:
    """Answers ``cat PATH`` (the grader's ``own`` too) from ``files``; any other command exits
    0 with no output."""

    workdir = "/app"

    def __init__(self, files: dict[str, str] | None = None) -> None:
        self.files = dict(files or {})
        self.commands: list[str] = []
        self.uploads: list[tuple[Path, str]] = []

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        self.commands.append(cmd)
        words = shlex.split(cmd.removeprefix(own("")))
        if words[:1] == ["cat"]:
            path = words[1]
            if path in self.files:
                return result(self.files[path], 0)
            return result(f"cat: {path}: No such file or directory", 1)
        return result("", 0)

    def upload(self, src: Path, dst: str) -> None:
        self.uploads.append((src, dst))

    def download(self, src: str, dst: Path) -> None:
        raise NotImplementedError

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        raise NotImplementedError

    def stop_processes(self) -> None:
        pass

    def close(self) -> None:
        pass
