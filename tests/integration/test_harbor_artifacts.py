"""Harbor's ``artifacts`` and ``[[verifier.collect]]`` hooks (schema 1.4, issue 37 item 5)
played in bubblewrap and (marked ``docker``) Docker: the hooks run in the episode's sandbox
before each step is graded (the task's, then the step's; a failing one only warns), and each
step's artifacts land in the episode's folder under ``artifacts_dir`` with Harbor's
``manifest.json``."""

from __future__ import annotations

import json
import warnings
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


def _publishing_task(root: Path) -> Path:
    """A one-step Harbor task whose solution publishes into /logs/artifacts (Harbor's
    convention folder, mounted into every container) and whose collect hook writes there too."""
    task = root / "publishes"
    for folder in ("environment", "solution", "tests"):
        (task / folder).mkdir(parents=True)
    (task / "task.toml").write_text(
        'schema_version = "1.4"\n\n[agent]\ntimeout_sec = 30.0\n\n'
        '[[verifier.collect]]\ncommand = "ls /logs/artifacts > /logs/artifacts/listing.txt"\n'
    )
    (task / "environment" / "Dockerfile").write_text(
        "FROM thundersync/base:bookworm\nWORKDIR /app\n"
    )
    (task / "instruction.md").write_text("Publish a note.\n")
    (task / "solution" / "solve.sh").write_text(
        "#!/bin/bash\nset -e\necho note > /logs/artifacts/note.txt\n"
    )
    (task / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return task


def test_the_convention_folder_is_there_for_the_agent_and_the_hooks(
    tmp_path: Path, kind: str
) -> None:
    """Harbor mounts /logs/artifacts before the container starts; a Docker image lacks the
    folder, so an agent publishing there failed and a hook writing there exited 1 (only
    bubblewrap, which binds /logs, had it)."""
    folder = _publishing_task(tmp_path / "tasks")
    task = load_tasks(folder).get(folder.name)
    out = tmp_path / "artifacts"
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=kind, artifacts_dir=out), OracleAgent(), lambda e: None
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a failing collect hook warns
        result = runner.run_episode(task)
    assert result.reward == 1.0, result.details
    (episode,) = out.iterdir()
    published = episode / "logs" / "artifacts"
    assert (published / "note.txt").read_text() == "note\n"
    assert (published / "listing.txt").read_text() == "listing.txt\nnote.txt\n"
