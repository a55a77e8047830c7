"""Reference solutions: the oracle's commands unpack and run the task's solution script."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from environments.terminal_bench import load_tasks
from environments.terminal_bench.task import SOLUTION_DIR_VARIABLE

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"


def run_commands(commands: list[str], cwd: Path) -> list[subprocess.CompletedProcess[str]]:
    """Run the oracle's commands on the host, with its /solution redirected into ``cwd``'s
    parent (never a folder at the host's root)."""
    env = {**os.environ, SOLUTION_DIR_VARIABLE: str(cwd.parent / "solution-dir")}
    return [
        subprocess.run(
            ["bash", "-c", c], cwd=cwd, capture_output=True, text=True, timeout=60, env=env
        )
        for c in commands
    ]


def test_harbor_solution_folder_runs_from_the_workspace(tmp_path: Path) -> None:
    task_dir = tmp_path / "task" / "sort-files"
    shutil.copytree(FIXTURES / "harbor" / "sort-files", task_dir)
    (task_dir / "solution" / "answer.txt").write_text("forty-two\n")
    (task_dir / "solution" / "solve.sh").write_text(
        '#!/bin/bash\ncp "$SOLUTION_DIR/answer.txt" ./out.txt\necho "$GREETING" >> out.txt\n'
        'ls "$SOLUTION_DIR" > ../listing.txt\n'
    )
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text() + '\n[solution]\nenv = { GREETING = "hi there" }\n')
    task = load_tasks(task_dir).get("sort-files")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    commands = task.reference_solution()
    assert len(commands) == 1
    assert "answer.txt" not in commands[0]
    (done,) = run_commands(commands, workspace)
    assert done.returncode == 0, done.stderr
    assert (workspace / "out.txt").read_text() == "forty-two\nhi there\n"
    assert sorted(p.name for p in workspace.iterdir()) == ["out.txt"]
    assert (tmp_path / "listing.txt").read_text().split() == ["answer.txt", "solve.sh"]
    assert list((tmp_path / "solution-dir").iterdir()) == []  # emptied after the run


def test_solution_exit_status_is_kept(tmp_path: Path) -> None:
    task_dir = tmp_path / "sort-files"
    shutil.copytree(FIXTURES / "tb1" / "sort-files", task_dir)
    (task_dir / "solution.sh").write_text("#!/bin/bash\nexit 7\n")
    (done,) = run_commands(load_tasks(task_dir).get("sort-files").reference_solution(), tmp_path)
    assert done.returncode == 7


def test_a_large_solution_is_sent_in_chunks(tmp_path: Path) -> None:
    task_dir = tmp_path / "task" / "sort-files"
    shutil.copytree(FIXTURES / "tb1" / "sort-files", task_dir)
    noise = "".join(f"# {i:06d} {hash((i, 'x')):x}\n" for i in range(8000))
    (task_dir / "solution.sh").write_text(f"#!/bin/bash\n{noise}echo solved > result.txt\n")
    commands = load_tasks(task_dir).get("sort-files").reference_solution()
    assert len(commands) > 3
    assert all(len(c) < 100_000 for c in commands)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    outcomes = run_commands(commands, workspace)
    assert [o.returncode for o in outcomes] == [0] * len(commands), outcomes[-1].stderr
    assert sorted(p.name for p in workspace.iterdir()) == ["result.txt"]
