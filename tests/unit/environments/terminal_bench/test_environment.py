"""A task's sandbox: staged files a killed run left are reaped; workdirs bwrap cannot use."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from environments.sandboxes import orphans
from environments.sandboxes.protocol import NeedsDockerError
from environments.terminal_bench import load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE
from environments.terminal_bench.environment import STAGING_PREFIX, TaskEnvironment

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"


def test_staged_files_of_a_dead_run_are_removed_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.setattr(orphans, "_reaped", set())
    dead = subprocess.Popen(["true"])
    dead.wait()
    orphan = temp / f"{STAGING_PREFIX}{dead.pid}-sales-report-abc123"
    live = temp / f"{STAGING_PREFIX}{os.getppid()}-sales-report-def456"
    for folder in (orphan, live):
        (folder / "workspace").mkdir(parents=True)
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    staged = load_tasks(task_dir).get("sales-report").sandbox_spec("bwrap").files
    assert staged is not None and (staged / "sales.csv").is_file()
    assert staged.parent.name.startswith(f"{STAGING_PREFIX}{os.getpid()}-sales-report-")
    assert not orphan.exists()
    assert live.exists()


def test_a_workdir_over_the_interpreter_needs_docker_rather_than_failing_in_bwrap() -> None:
    env = TaskEnvironment(task_id="t", workdir=sys.prefix, image=BASE_IMAGE)
    reason = env.needs_docker_reason
    assert reason is not None and "workdir" in reason
    with pytest.raises(NeedsDockerError, match="needs Docker"):
        env.spec("bwrap")
    plain = TaskEnvironment(task_id="t", workdir="/app", image=BASE_IMAGE)
    assert plain.needs_docker_reason is None
