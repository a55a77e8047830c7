"""Hostile task folders: every input a loader reads or ships stays inside the task folder, ids
match in full, instructions are bounded, and environment names cannot reach a shell."""

from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import pytest

from environments.tasks import TaskFormatError
from environments.terminal_bench import load_tasks
from environments.terminal_bench.inputs import MAX_INSTRUCTION_BYTES

from .fakes import ScriptedSandbox

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"
SECRET = "thundersync-host-secret-5d1e"


@pytest.fixture
def host_folder(tmp_path: Path) -> Path:
    """A folder outside every task, holding what a hostile task would like to read."""
    folder = tmp_path / "host"
    folder.mkdir()
    (folder / "secret.txt").write_text(SECRET + "\n")
    (folder / "test.sh").write_text(f"#!/bin/bash\necho {SECRET}\n")
    (folder / "solve.sh").write_text(f"#!/bin/bash\necho {SECRET}\n")
    (folder / "Dockerfile").write_text("FROM thundersync/base:bookworm\nWORKDIR /app\n")
    (folder / "task.toml").write_text('version = "1.0"\n')
    (folder / "task.yaml").write_text(f"instruction: {SECRET}\n")
    return folder


def copy_task(tmp_path: Path, fmt: str, name: str = "sales-report") -> Path:
    task_dir = tmp_path / "tasks" / name
    shutil.copytree(FIXTURES / fmt / "sales-report", task_dir)
    return task_dir


def relink(task_dir: Path, name: str, target: Path | str) -> None:
    path = task_dir / name
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif os.path.lexists(path):
        path.unlink()
    path.symlink_to(target)


# (case id, format, file replaced by a link, what it points to: "host/<name>" or an absolute path)
LINKS = [
    ("harbor-instruction-to-environ", "harbor", "instruction.md", "/proc/self/environ"),
    ("harbor-task-toml", "harbor", "task.toml", "host/task.toml"),
    ("harbor-tests-folder", "harbor", "tests", "host"),
    ("harbor-file-in-tests", "harbor", "tests/checks.py", "host/secret.txt"),
    ("harbor-test-sh", "harbor", "tests/test.sh", "host/test.sh"),
    ("harbor-solution-folder", "harbor", "solution", "host"),
    ("harbor-solve-sh", "harbor", "solution/solve.sh", "host/solve.sh"),
    ("harbor-environment-folder", "harbor", "environment", "host"),
    ("harbor-dockerfile", "harbor", "environment/Dockerfile", "host/Dockerfile"),
    ("harbor-copy-source", "harbor", "environment/sales.csv", "host/secret.txt"),
    ("tb1-task-yaml", "tb1", "task.yaml", "host/task.yaml"),
    ("tb1-run-tests", "tb1", "run-tests.sh", "host/test.sh"),
    ("tb1-solution-sh", "tb1", "solution.sh", "host/solve.sh"),
    ("tb1-tests-folder", "tb1", "tests", "host"),
    ("tb1-dockerfile", "tb1", "Dockerfile", "host/Dockerfile"),
    ("tb1-copy-source-to-etc", "tb1", "sales.csv", "/etc/passwd"),
]


@pytest.mark.parametrize(
    ("fmt", "name", "target"), [pytest.param(*case[1:], id=case[0]) for case in LINKS]
)
def test_a_link_out_of_the_task_folder_is_refused_naming_it(
    tmp_path: Path, host_folder: Path, fmt: str, name: str, target: str
) -> None:
    task_dir = copy_task(tmp_path, fmt)
    relink(task_dir, name, host_folder / target[5:] if target.startswith("host") else target)
    with pytest.raises(TaskFormatError) as caught:
        load_tasks(task_dir)
    assert caught.value.field == name
    assert "outside the task folder" in str(caught.value)
    assert SECRET not in str(caught.value)


def test_the_compose_file_and_its_context_stay_inside(tmp_path: Path, host_folder: Path) -> None:
    task_dir = copy_task(tmp_path, "tb1")
    compose = host_folder / "docker-compose.yaml"
    compose.write_text("services:\n  client:\n    build:\n      context: .\n")
    (task_dir / "docker-compose.yaml").symlink_to(compose)
    with pytest.raises(TaskFormatError, match="outside the task folder"):
        load_tasks(task_dir)
    (task_dir / "docker-compose.yaml").unlink()
    (task_dir / "docker-compose.yaml").write_text(
        "services:\n  client:\n    build:\n      context: ../../host\n"
    )
    with pytest.raises(TaskFormatError, match="inside the task folder"):
        load_tasks(task_dir)


def test_links_inside_the_task_folder_are_shipped_as_their_files(tmp_path: Path) -> None:
    task_dir = copy_task(tmp_path, "harbor")
    (task_dir / "common").mkdir()
    (task_dir / "common" / "helper.py").write_text("VALUE = 1\n")
    (task_dir / "tests" / "helper.py").symlink_to(task_dir / "common" / "helper.py")
    (task_dir / "tests" / "lib").symlink_to("../common")
    task = load_tasks(task_dir).get("sales-report")
    uploads = dict((rel, path) for path, rel in task.test_uploads())
    assert uploads["helper.py"] == (task_dir / "common" / "helper.py").resolve()
    assert uploads["lib/helper.py"].read_text() == "VALUE = 1\n"
    assert all(not path.is_symlink() for path in uploads.values())


def test_a_folder_swapped_for_a_link_after_loading_is_caught_when_used(
    tmp_path: Path, host_folder: Path
) -> None:
    task_dir = copy_task(tmp_path, "harbor")
    task = load_tasks(task_dir).get("sales-report")
    relink(task_dir, "tests", host_folder)
    with pytest.raises(TaskFormatError, match="outside the task folder"):
        task.test_uploads()
    relink(task_dir, "solution", host_folder)
    with pytest.raises(TaskFormatError, match="outside the task folder"):
        task.reference_solution()


@pytest.mark.parametrize("kind", ["fifo", "dangling-link"])
def test_fifos_and_dangling_links_are_refused(tmp_path: Path, kind: str) -> None:
    task_dir = copy_task(tmp_path, "harbor")
    if kind == "fifo":
        os.mkfifo(task_dir / "tests" / "pipe")
    else:
        (task_dir / "tests" / "pipe").symlink_to(task_dir / "missing")
    with pytest.raises(TaskFormatError, match="fifo|missing") as caught:
        load_tasks(task_dir)
    assert caught.value.field == "tests/pipe"


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_a_task_id_with_a_trailing_newline_is_refused(tmp_path: Path, fmt: str) -> None:
    task_dir = copy_task(tmp_path, fmt, name="sales-report\n")
    with pytest.raises(TaskFormatError, match="task_id"):
        load_tasks(task_dir)


def test_a_harbor_task_name_must_match_in_full(tmp_path: Path) -> None:
    task_dir = copy_task(tmp_path, "harbor")
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text() + '\n[task]\nname = "acme/sales\\n"\n')
    with pytest.raises(TaskFormatError, match="task.name"):
        load_tasks(task_dir)


@pytest.mark.parametrize("fmt", ["tb1", "harbor"])
def test_an_oversized_instruction_is_an_error_stating_the_limit(tmp_path: Path, fmt: str) -> None:
    task_dir = copy_task(tmp_path, fmt)
    text = "x" * MAX_INSTRUCTION_BYTES
    if fmt == "harbor":
        (task_dir / "instruction.md").write_text(text)
        assert len(load_tasks(task_dir).get("sales-report").instruction) == len(text) + 1
        (task_dir / "instruction.md").write_text(text + "y")
    else:
        task_yaml = task_dir / "task.yaml"
        body = task_yaml.read_text().split("\n", 1)[1]
        body = body[body.index("\nauthor_name") + 1 :]
        task_yaml.write_text(f"instruction: {text}y\n{body}")
    with pytest.raises(TaskFormatError, match=f"at most {MAX_INSTRUCTION_BYTES} bytes"):
        load_tasks(task_dir)


@pytest.mark.parametrize("table", ["verifier", "solution", "environment"], ids=lambda t: f"{t}-env")
@pytest.mark.parametrize("key", ["A;touch /tmp/x", "1ABC", "A B", "A=B", ""])
def test_env_keys_must_be_shell_names(tmp_path: Path, table: str, key: str) -> None:
    task_dir = copy_task(tmp_path, "harbor")
    toml = task_dir / "task.toml"
    toml.write_text(toml.read_text() + f'\n[{table}.env]\n{json.dumps(key)} = "1"\n')
    with pytest.raises(TaskFormatError) as caught:
        load_tasks(task_dir)
    assert caught.value.field == f"{table}.env.{key}"


def test_verifier_env_values_reach_the_grader_quoted(tmp_path: Path) -> None:
    task_dir = copy_task(tmp_path, "harbor")
    value = "$(touch /tmp/owned); `id` 'quoted' \"double\""
    toml = task_dir / "task.toml"
    line = f"[verifier]\nenv = {{ MODE = {json.dumps(value)} }}"
    text = toml.read_text().replace("[verifier]", line)
    toml.write_text(text)
    task = load_tasks(task_dir).get("sales-report")
    assert task.test_env == {"MODE": value}
    sandbox = ScriptedSandbox()
    task.grade(sandbox)
    run = next(c for c in sandbox.commands if c.endswith("test.sh"))
    assert f"MODE={shlex.quote(value)}" in run


def nested_aliases(levels: int, width: int = 9) -> str:
    """A YAML flow list defining ``levels`` anchors, each ``width`` aliases of the one before:
    width**levels strings once expanded, in a few hundred bytes."""
    items = ["&a0 [" + ",".join(['"lol"'] * width) + "]"]
    items += [f"&a{i} [" + ",".join([f"*a{i - 1}"] * width) + "]" for i in range(1, levels)]
    return "[" + ",".join(items) + "]"


def test_a_yaml_alias_bomb_in_task_yaml_is_refused_naming_the_file(tmp_path: Path) -> None:
    task_dir = copy_task(tmp_path, "tb1")
    path = task_dir / "task.yaml"
    _edit_line(path, "parser_name: pytest", f"parser_name: {nested_aliases(9)}")
    with pytest.raises(TaskFormatError, match="aliases followed") as caught:
        load_tasks(task_dir)
    assert str(caught.value).startswith(f"{path}: field '<document>': ")
    assert "\n" not in str(caught.value)


def test_an_error_quotes_a_bounded_excerpt_of_a_large_value(tmp_path: Path) -> None:
    task_dir = copy_task(tmp_path, "tb1")
    _edit_line(task_dir / "task.yaml", "parser_name: pytest", f"parser_name: {nested_aliases(5)}")
    with pytest.raises(TaskFormatError, match="expected 'pytest', got") as caught:
        load_tasks(task_dir)
    assert len(str(caught.value)) < 500


DEEP = 10_000


@pytest.mark.parametrize(
    ("fmt", "name", "old", "new"),
    [
        ("tb1", "task.yaml", "parser_name: pytest", "tags: " + "[" * DEEP + "]" * DEEP),
        ("tb1", "solution.yaml", None, "- " * 2 + "[" * DEEP + "]" * DEEP),
        ("harbor", "task.toml", None, "\n[verifier.deep]\nx = " + "[" * DEEP + "]" * DEEP),
        ("harbor", "task.toml", None, "\n[verifier.deep]\n" + ".".join(["a"] * DEEP) + " = 1"),
    ],
    ids=["tb1-task-yaml", "tb1-solution-yaml", "harbor-task-toml", "harbor-dotted-keys"],
)
def test_a_task_file_nested_10000_deep_is_a_one_line_error_naming_it(
    tmp_path: Path, fmt: str, name: str, old: str | None, new: str
) -> None:
    task_dir = copy_task(tmp_path, fmt)
    path = task_dir / name
    if name == "solution.yaml":
        (task_dir / "solution.sh").unlink()
        path.write_text(new + "\n")
    elif old is None:
        path.write_text(path.read_text() + new + "\n")
    else:
        _edit_line(path, old, new)
    with pytest.raises(TaskFormatError, match="nested more than 100 levels deep") as caught:
        load_tasks(task_dir)
    assert str(caught.value).startswith(f"{path}: field '<document>': ")
    assert "\n" not in str(caught.value)


def _edit_line(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new, 1))
