"""Every kind of malformed Terminal-Bench 1 or Harbor task raises an error naming file, field."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from environments.tasks import TaskFormatError
from environments.terminal_bench import load_tasks

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _write(name: str, text: str) -> Callable[[Path], None]:
    def mutate(task: Path) -> None:
        (task / name).write_text(text)

    return mutate


def _replace(name: str, old: str, new: str) -> Callable[[Path], None]:
    return lambda task: _edit(task / name, old, new)


def _remove(name: str) -> Callable[[Path], None]:
    def mutate(task: Path) -> None:
        target = task / name
        shutil.rmtree(target) if target.is_dir() else target.unlink()

    return mutate


def _both(*mutations: Callable[[Path], None]) -> Callable[[Path], None]:
    def mutate(task: Path) -> None:
        for mutation in mutations:
            mutation(task)

    return mutate


TWO_SERVICES = """services:
  client:
    build:
      context: .
  db:
    image: postgres
"""

COPY_LINE = "FROM thundersync/base:bookworm\nWORKDIR /app\nCOPY {}\n"

# (case id, source format, mutation, file named in the message, field named in the message)
CASES = [
    (
        "tb1-invalid-yaml",
        "tb1",
        _write("task.yaml", "instruction: [unclosed\n"),
        "task.yaml",
        "<document>",
    ),
    ("tb1-yaml-not-a-mapping", "tb1", _write("task.yaml", "- a\n- b\n"), "task.yaml", "<document>"),
    (
        "tb1-missing-instruction",
        "tb1",
        _replace("task.yaml", "instruction: |-", "notes: |-"),
        "task.yaml",
        "notes",
    ),
    (
        "tb1-missing-instruction-key",
        "tb1",
        _write("task.yaml", "difficulty: easy\nmax_test_timeout_sec: 10\n"),
        "task.yaml",
        "instruction",
    ),
    (
        "tb1-instruction-not-a-string",
        "tb1",
        _write("task.yaml", "instruction: 42\n"),
        "task.yaml",
        "instruction",
    ),
    (
        "tb1-empty-instruction",
        "tb1",
        _write("task.yaml", "instruction: '   '\n"),
        "task.yaml",
        "instruction",
    ),
    (
        "tb1-timeout-not-a-number",
        "tb1",
        _replace("task.yaml", "max_agent_timeout_sec: 120.0", "max_agent_timeout_sec: soon"),
        "task.yaml",
        "max_agent_timeout_sec",
    ),
    (
        "tb1-negative-timeout",
        "tb1",
        _replace("task.yaml", "max_test_timeout_sec: 180.0", "max_test_timeout_sec: -5"),
        "task.yaml",
        "max_test_timeout_sec",
    ),
    (
        "tb1-unknown-difficulty",
        "tb1",
        _replace("task.yaml", "difficulty: easy", "difficulty: epic"),
        "task.yaml",
        "difficulty",
    ),
    (
        "tb1-tags-not-a-list",
        "tb1",
        _replace("task.yaml", "tags:\n  - csv\n  - json\n  - multi-metric", "tags: csv,json"),
        "task.yaml",
        "tags",
    ),
    (
        "tb1-same-shell-not-bool",
        "tb1",
        _replace(
            "task.yaml", "run_tests_in_same_shell: false", "run_tests_in_same_shell: sometimes"
        ),
        "task.yaml",
        "run_tests_in_same_shell",
    ),
    (
        "tb1-unknown-key",
        "tb1",
        _replace("task.yaml", "category:", "categroy:"),
        "task.yaml",
        "categroy",
    ),
    (
        "tb1-unsupported-parser",
        "tb1",
        _replace("task.yaml", "parser_name: pytest", "parser_name: swebench"),
        "task.yaml",
        "parser_name",
    ),
    (
        "tb1-shared-environment",
        "tb1",
        _replace("task.yaml", "category:", "env_name: py\ncategory:"),
        "task.yaml",
        "env_name",
    ),
    ("tb1-missing-run-tests", "tb1", _remove("run-tests.sh"), "sales-report", "run-tests.sh"),
    ("tb1-missing-tests-folder", "tb1", _remove("tests"), "sales-report", "tests"),
    ("tb1-missing-solution", "tb1", _remove("solution.sh"), "sales-report", "solution.sh"),
    (
        "tb1-solution-yaml-step-without-command",
        "tb1",
        _both(_remove("solution.sh"), _write("solution.yaml", "- cmd: ls\n")),
        "solution.yaml",
        "[0].command",
    ),
    (
        "tb1-solution-yaml-not-a-list",
        "tb1",
        _both(_remove("solution.sh"), _write("solution.yaml", "command: ls\n")),
        "solution.yaml",
        "<document>",
    ),
    ("tb1-missing-dockerfile", "tb1", _remove("Dockerfile"), "sales-report", "Dockerfile"),
    (
        "tb1-compose-two-services",
        "tb1",
        _write("docker-compose.yaml", TWO_SERVICES),
        "docker-compose.yaml",
        "services",
    ),
    (
        "tb1-dockerfile-without-from",
        "tb1",
        _write("Dockerfile", "WORKDIR /app\n"),
        "Dockerfile",
        "FROM",
    ),
    (
        "tb1-dockerfile-unknown-instruction",
        "tb1",
        _write("Dockerfile", "FROM thundersync/base:bookworm\nFROBNICATE now\n"),
        "Dockerfile",
        "line 2",
    ),
    (
        "tb1-dockerfile-copy-missing-source",
        "tb1",
        _replace("Dockerfile", "COPY sales.csv", "COPY missing.csv"),
        "Dockerfile",
        "line 3 COPY",
    ),
    (
        "harbor-invalid-toml",
        "harbor",
        _write("task.toml", "[verifier\ntimeout_sec = 1\n"),
        "task.toml",
        "<document>",
    ),
    (
        "harbor-missing-instruction-md",
        "harbor",
        _remove("instruction.md"),
        "sales-report",
        "instruction.md",
    ),
    (
        "harbor-empty-instruction-md",
        "harbor",
        _write("instruction.md", "\n  \n"),
        "instruction.md",
        "instruction",
    ),
    (
        "harbor-instruction-not-utf8",
        "harbor",
        lambda task: (task / "instruction.md").write_bytes(b"caf\xe9\n"),
        "instruction.md",
        "instruction",
    ),
    (
        "harbor-verifier-timeout-not-a-number",
        "harbor",
        _replace("task.toml", "timeout_sec = 180.0", 'timeout_sec = "a minute"'),
        "task.toml",
        "verifier.timeout_sec",
    ),
    (
        "harbor-negative-agent-timeout",
        "harbor",
        _replace("task.toml", "timeout_sec = 120.0", "timeout_sec = -1"),
        "task.toml",
        "agent.timeout_sec",
    ),
    (
        "harbor-boolean-agent-timeout",
        "harbor",
        _replace("task.toml", "timeout_sec = 120.0", "timeout_sec = true"),
        "task.toml",
        "agent.timeout_sec",
    ),
    (
        "harbor-verifier-not-a-table",
        "harbor",
        _write("task.toml", 'version = "1.0"\nverifier = 3\n'),
        "task.toml",
        "verifier",
    ),
    (
        "harbor-unknown-difficulty",
        "harbor",
        _replace("task.toml", 'difficulty = "easy"', 'difficulty = "trivial"'),
        "task.toml",
        "metadata.difficulty",
    ),
    (
        "harbor-tags-not-a-list",
        "harbor",
        _replace("task.toml", 'tags = ["csv", "json", "multi-metric"]', 'tags = "csv"'),
        "task.toml",
        "metadata.tags",
    ),
    (
        "harbor-unknown-top-level-table",
        "harbor",
        _replace("task.toml", "[verifier]", "[verifer]"),
        "task.toml",
        "verifer",
    ),
    (
        "harbor-task-name-with-path",
        "harbor",
        _replace("task.toml", "[metadata]", '[task]\nname = "../../etc"\n\n[metadata]'),
        "task.toml",
        "task.name",
    ),
    (
        "harbor-bad-memory",
        "harbor",
        _replace("task.toml", 'memory = "2G"', 'memory = "lots"'),
        "task.toml",
        "environment.memory",
    ),
    (
        "harbor-zero-cpus",
        "harbor",
        _replace("task.toml", "cpus = 1", "cpus = 0"),
        "task.toml",
        "environment.cpus",
    ),
    ("harbor-missing-environment", "harbor", _remove("environment"), "sales-report", "environment"),
    (
        "harbor-environment-without-dockerfile",
        "harbor",
        _remove("environment/Dockerfile"),
        "Dockerfile",
        "Dockerfile",
    ),
    ("harbor-missing-test-sh", "harbor", _remove("tests/test.sh"), "tests", "test.sh"),
    ("harbor-missing-solution", "harbor", _remove("solution"), "sales-report", "solution/solve.sh"),
    (
        "tb1-test-timeout-over-a-day",
        "tb1",
        _replace("task.yaml", "max_test_timeout_sec: 180.0", "max_test_timeout_sec: 100000"),
        "task.yaml",
        "max_test_timeout_sec",
    ),
    (
        "tb1-dockerfile-copy-bad-glob",
        "tb1",
        _write("Dockerfile", COPY_LINE.format("**x /app/")),
        "Dockerfile",
        "line 3 COPY",
    ),
    (
        "harbor-dockerfile-copy-only-flags",
        "harbor",
        _write("environment/Dockerfile", COPY_LINE.format("--chown=a:b --chmod=755")),
        "Dockerfile",
        "line 3 COPY",
    ),
    (
        "harbor-dockerfile-copy-flags-and-one-word",
        "harbor",
        _write("environment/Dockerfile", COPY_LINE.format("--chmod=755 /app/")),
        "Dockerfile",
        "line 3 COPY",
    ),
    (
        "harbor-dockerfile-copy-unbalanced-quote",
        "harbor",
        _write("environment/Dockerfile", COPY_LINE.format('"a b /app/')),
        "Dockerfile",
        "line 3 COPY",
    ),
    (
        "harbor-dockerfile-copy-bad-glob",
        "harbor",
        _write("environment/Dockerfile", COPY_LINE.format("**x /app/")),
        "Dockerfile",
        "line 3 COPY",
    ),
    (
        "harbor-dockerfile-copy-json-flags-and-one-word",
        "harbor",
        _write("environment/Dockerfile", COPY_LINE.format('["--chmod=755", "/app/"]')),
        "Dockerfile",
        "line 3 COPY",
    ),
    (
        "harbor-memory-mb-infinite",
        "harbor",
        _replace("task.toml", 'memory = "2G"', "memory_mb = inf"),
        "task.toml",
        "environment.memory_mb",
    ),
    (
        "harbor-memory-mb-under-one",
        "harbor",
        _replace("task.toml", 'memory = "2G"', "memory_mb = 0.5"),
        "task.toml",
        "environment.memory_mb",
    ),
    (
        "harbor-memory-over-a-tebibyte",
        "harbor",
        _replace("task.toml", 'memory = "2G"', 'memory = "2000T"'),
        "task.toml",
        "environment.memory",
    ),
    (
        "harbor-cpus-infinite",
        "harbor",
        _replace("task.toml", "cpus = 1", "cpus = inf"),
        "task.toml",
        "environment.cpus",
    ),
    (
        "harbor-cpus-nan",
        "harbor",
        _replace("task.toml", "cpus = 1", "cpus = nan"),
        "task.toml",
        "environment.cpus",
    ),
    (
        "harbor-workdir-in-a-system-folder",
        "harbor",
        _replace("task.toml", "cpus = 1", 'cpus = 1\nworkdir = "/usr/x"'),
        "task.toml",
        "environment.workdir",
    ),
    (
        "harbor-workdir-relative",
        "harbor",
        _replace("task.toml", "cpus = 1", 'cpus = 1\nworkdir = "app"'),
        "task.toml",
        "environment.workdir",
    ),
    (
        "harbor-agent-timeout-huge",
        "harbor",
        _replace("task.toml", "timeout_sec = 120.0", "timeout_sec = 1e300"),
        "task.toml",
        "agent.timeout_sec",
    ),
    (
        "harbor-build-timeout-infinite",
        "harbor",
        _replace("task.toml", "build_timeout_sec = 300.0", "build_timeout_sec = inf"),
        "task.toml",
        "environment.build_timeout_sec",
    ),
    (
        "harbor-one-step-strategy-unknown",  # Harbor checks the enum on every task
        "harbor",
        _replace(
            "task.toml", 'version = "1.0"', 'version = "1.0"\nmulti_step_reward_strategy = "max"'
        ),
        "task.toml",
        "multi_step_reward_strategy",
    ),
    (
        "both-task-files",
        "harbor",
        lambda task: shutil.copy(FIXTURES / "tb1" / "sales-report" / "task.yaml", task),
        "sales-report",
        "task.yaml",
    ),
]


@pytest.mark.parametrize(
    ("source", "mutate", "file_name", "field"),
    [pytest.param(*case[1:], id=case[0]) for case in CASES],
)
def test_malformed_task_names_file_and_field(
    tmp_path: Path, source: str, mutate: Callable[[Path], None], file_name: str, field: str
) -> None:
    task = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / source / "sales-report", task)
    mutate(task)
    with pytest.raises(TaskFormatError) as caught:
        load_tasks(task)
    message = str(caught.value)
    assert file_name in message
    assert f"field {field!r}" in message
    assert caught.value.field == field


def test_at_least_fifteen_kinds_are_covered() -> None:
    assert len({case[0] for case in CASES}) >= 15


def test_task_id_with_unsafe_characters(tmp_path: Path) -> None:
    task = tmp_path / "bad task!"
    shutil.copytree(FIXTURES / "tb1" / "sales-report", task)
    with pytest.raises(TaskFormatError, match="task_id") as caught:
        load_tasks(task)
    assert "bad task!" in str(caught.value)


def test_folder_without_tasks(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(TaskFormatError, match="neither"):
        load_tasks(tmp_path)


def test_one_bad_task_in_a_suite_fails_the_whole_load(tmp_path: Path) -> None:
    shutil.copytree(FIXTURES / "harbor" / "sales-report", tmp_path / "good")
    shutil.copytree(FIXTURES / "harbor" / "sales-report", tmp_path / "bad")
    (tmp_path / "bad" / "instruction.md").write_text("")
    with pytest.raises(TaskFormatError) as caught:
        load_tasks(tmp_path)
    assert str(tmp_path / "bad" / "instruction.md") in str(caught.value)
