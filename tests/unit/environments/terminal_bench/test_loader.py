"""Loading the shipped Terminal-Bench 1 and Harbor suites, and format detection."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.tasks import Task
from environments.terminal_bench import (
    TerminalBenchTask,
    load_tasks,
    looks_like_terminal_bench,
)

from .fakes import ScriptedSandbox

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"
SHIPPED = [
    "fast-pair-count",
    "fix-backup-script",
    "fix-python-bug",
    "git-revert-commit",
    "sales-report",
    "sort-files",
]


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_shipped_suites_hold_the_six_tasks_in_each_format(fmt: str) -> None:
    suite = load_tasks(FIXTURES / fmt)
    assert suite.name == fmt
    assert [task.task_id for task in suite] == SHIPPED
    assert len(suite) == 6
    for task in suite:
        assert task.format == fmt
        assert task.instruction.strip() and task.instruction.endswith("\n")
        assert task.environment.workdir == "/app"
        assert task.needs_docker_reason is None, task.task_id
        assert task.reference_solution()


def test_both_formats_carry_the_same_instructions_and_timeouts() -> None:
    tb1, harbor = load_tasks(FIXTURES / "tb1"), load_tasks(FIXTURES / "harbor")
    for old, new in zip(tb1, harbor, strict=True):
        assert old.instruction == new.instruction
        assert old.test_timeout_s == new.test_timeout_s
        assert old.timeout_s == new.timeout_s
        assert old.metadata["difficulty"] == new.metadata["difficulty"]


def test_task_matches_the_task_protocol() -> None:
    task = load_tasks(FIXTURES / "harbor").get("sales-report")
    checked: Task = task
    for name in ("task_id", "instruction", "max_turns", "timeout_s"):
        assert hasattr(checked, name)
    for name in ("sandbox_spec", "setup", "grade", "reference_solution"):
        assert callable(getattr(checked, name))
    assert isinstance(task, TerminalBenchTask)


def test_tb1_fields_are_read() -> None:
    task = load_tasks(FIXTURES / "tb1" / "fast-pair-count").get("fast-pair-count")
    assert task.test_timeout_s == 180.0
    assert task.timeout_s == 120.0
    assert task.metadata["tags"] == ("python", "algorithms", "timeout")
    assert task.metadata["difficulty"] == "medium"
    assert task.test_script.name == "run-tests.sh"
    assert task.solution_script is not None and task.solution_script.name == "solution.sh"


def test_harbor_fields_are_read(tmp_path: Path) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    toml = task_dir / "task.toml"
    text = toml.read_text().replace('memory = "2G"', 'memory = "512M"\nenv = { MODE = "strict" }')
    text = text.replace("timeout_sec = 180.0", 'timeout_sec = 180.0\nenv = { LEVEL = "high" }')
    toml.write_text(text + '\n[solution]\nenv = { ANSWER = "42" }\n')
    task = load_tasks(task_dir).get("sales-report")
    spec = task.sandbox_spec()
    assert spec.memory_mb == 512
    assert spec.env["MODE"] == "strict"
    assert task.test_timeout_s == 180.0
    assert task.solution_env == {"ANSWER": "42"}
    assert "export ANSWER=42" in task.reference_solution()[-1]
    assert task.test_env == {"LEVEL": "high"}
    sandbox = ScriptedSandbox()
    task.grade(sandbox)
    assert any("LEVEL=high" in c and c.endswith("/tests/test.sh") for c in sandbox.commands)


def test_unknown_key_inside_a_harbor_table_only_warns(tmp_path: Path) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text().replace("[agent]", "[agent]\nfancy_new_option = 1"))
    with pytest.warns(UserWarning, match="agent.fancy_new_option"):
        assert len(load_tasks(task_dir)) == 1


def test_legacy_descriptions_list_is_accepted(tmp_path: Path) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "tb1" / "sales-report", task_dir)
    text = (task_dir / "task.yaml").read_text()
    body = text.split("author_name:", 1)[1]
    (task_dir / "task.yaml").write_text(
        "descriptions:\n  - key: base\n    description: Do the thing.\nauthor_name:" + body
    )
    assert load_tasks(task_dir).get("sales-report").instruction == "Do the thing.\n"


def test_solution_yaml_commands_are_the_reference_solution(tmp_path: Path) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "tb1" / "sales-report", task_dir)
    (task_dir / "solution.sh").unlink()
    (task_dir / "solution.yaml").write_text(
        "- command: echo one\n  min_timeout_sec: 5\n- command: echo two\n"
    )
    assert load_tasks(task_dir).get("sales-report").reference_solution() == [
        "echo one",
        "echo two",
    ]


def test_hidden_and_underscore_folders_are_skipped(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "harbor" / "sort-files", tmp_path / "sort-files")
    (tmp_path / ".git").mkdir()
    (tmp_path / "_drafts").mkdir()
    assert [t.task_id for t in load_tasks(tmp_path)] == ["sort-files"]


def test_get_names_the_known_ids() -> None:
    with pytest.raises(KeyError, match="sort-files"):
        load_tasks(FIXTURES / "tb1").get("nope")


def test_looks_like_terminal_bench(tmp_path: Path) -> None:
    assert looks_like_terminal_bench(FIXTURES / "tb1")
    assert looks_like_terminal_bench(FIXTURES / "harbor" / "sort-files")
    assert not looks_like_terminal_bench(tmp_path)
    assert not looks_like_terminal_bench(tmp_path / "missing")
    (tmp_path / "x.jsonl").write_text("{}\n")
    assert not looks_like_terminal_bench(tmp_path / "x.jsonl")
