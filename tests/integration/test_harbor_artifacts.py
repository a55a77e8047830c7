"""Harbor's ``artifacts`` and ``[[verifier.collect]]`` hooks (schema 1.4, issue 37 item 5)
played in bubblewrap and (marked ``docker``) Docker: the hooks run in the episode's sandbox
before each step is graded (the task's, then the step's; a failing one only warns), and each
step's artifacts land in the episode's folder under ``artifacts_dir`` with Harbor's
``manifest.json``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from environments.agents import OracleAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.terminal_bench import load_tasks

TASK = (
    Path(__file__).resolve().parents[1] / "fixtures" / "harbor-1.4-extras" / "artifacts-and-hooks"
)


def test_each_steps_artifacts_and_hook_output_reach_the_episodes_folder(
    tmp_path: Path, kind: str
) -> None:
    task = load_tasks(TASK).get(TASK.name)
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=kind, artifacts_dir=tmp_path),
        OracleAgent(),
        lambda event: None,
    )
    with pytest.warns(UserWarning, match="collect hook 'echo this hook fails; exit 3' exited 3"):
        result = runner.run_episode(task)
    assert result.reward == 1.0, result.details
    (episode,) = tmp_path.iterdir()
    first, second = episode / "01-write", episode / "02-append"
    assert (first / "kept" / "report.txt").read_text() == "hello\n"
    assert (second / "kept" / "report.txt").read_text() == "hello\nworld\n"
    # the task's hook ran before each step's grading, the step's hook only in its own step
    assert (first / "app/out/collected.txt").read_text() == "task-hook\nstep-hook\n"
    assert (second / "app/out/collected.txt").read_text() == "task-hook\nstep-hook\ntask-hook\n"
    assert (first / "app/note.txt").read_text() == "note\n"  # the step's own artifact
    assert not (second / "app/note.txt").exists()
    manifest = json.loads((first / "manifest.json").read_text())
    assert [(e["source"], e["type"], e["status"]) for e in manifest] == [
        ("/logs/artifacts", "directory", "empty"),
        ("/app/out", "directory", "ok"),
        ("report.txt", "file", "ok"),
        ("/app/note.txt", "file", "ok"),
    ]
    assert manifest[2]["destination"] == "kept/report.txt"
