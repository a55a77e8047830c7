"""Schema 1.4's task-level keys without a sandbox (issue 37 item 5): ``[task]`` package info
kept in the metadata, ``artifacts`` and ``[[verifier.collect]]`` read and merged per step,
``[environment.healthcheck]`` run before the first step of the live episode only,
``mcp_servers`` refused in one line, unknown keys a warning."""

from __future__ import annotations

import shutil
import warnings
from pathlib import Path

import pytest

from environments.sandboxes.protocol import ExecResult, SandboxError
from environments.tasks import TaskFormatError
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.collection import Artifact, CollectHook, collect

from .fakes import ScriptedSandbox, result

ROOT = Path(__file__).resolve().parents[4]
TASK = ROOT / "tests" / "fixtures" / "harbor-1.4-extras" / "artifacts-and-hooks"


def copy(tmp_path: Path, replace: tuple[str, str] | None = None, append: str = "") -> Path:
    folder = tmp_path / TASK.name
    shutil.copytree(TASK, folder)
    toml = folder / "task.toml"
    text = toml.read_text()
    if replace is not None:
        assert replace[0] in text
        text = text.replace(*replace)
    toml.write_text(text + append)
    return folder


def load(folder: Path) -> TerminalBenchTask:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the fixture's every key is known
        return load_tasks(folder).get(folder.name)


def test_package_info_is_kept_in_the_metadata() -> None:
    package = load(TASK).metadata["package"]
    assert package == {
        "name": "thundersync/artifacts-and-hooks",
        "version": "1.2.0",
        "description": "Two steps whose sandbox leaves files behind for the episode's folder.",
        "authors": [{"name": "A. Author", "email": "author@example.com"}],
        "keywords": ["artifacts", "multi-step"],
    }


def test_artifacts_and_hooks_are_the_tasks_then_the_steps() -> None:
    task = load(TASK)
    task_hooks = (
        CollectHook("mkdir -p /app/out && echo task-hook >> /app/out/collected.txt"),
        CollectHook("echo this hook fails; exit 3", timeout_s=10.0),
    )
    assert task.collect == task_hooks
    first, second = task.step_task(0), task.step_task(1)
    assert first.artifacts == (
        Artifact("/app/out"),
        Artifact("report.txt", destination="kept/report.txt"),
        Artifact("/app/note.txt"),
    )
    assert first.collect == (*task_hooks, CollectHook("echo step-hook >> /app/out/collected.txt"))
    assert second.artifacts == task.artifacts and second.collect == task_hooks


@pytest.mark.parametrize(
    ("replace", "field"),
    [
        (('"/app/out",', '"../out",'), "artifacts[0].source"),
        (('destination = "kept/report.txt"', 'destination = "manifest.json"'), "destination"),
        (('destination = "kept/report.txt"', 'destination = "/etc/x"'), "destination"),
        (('"/app/out",', '{ source = "out", service = "db" },'), "artifacts[0].source"),
        (("timeout_sec = 10.0", "timeout_sec = -1"), "verifier.collect[1].timeout_sec"),
        (("retries = 2", "retries = -2"), "environment.healthcheck.retries"),
        (('version = "1.2.0"', 'version = ""'), "task.version"),
    ],
)
def test_a_malformed_value_names_its_field(tmp_path: Path, replace, field: str) -> None:
    with pytest.raises(TaskFormatError, match=field.replace("[", r"\[").replace("]", r"\]")):
        load(copy(tmp_path, replace))


def test_mcp_servers_are_refused_in_one_line_naming_the_field(tmp_path: Path) -> None:
    server = '\n[[environment.mcp_servers]]\nname = "files"\ntransport = "stdio"\ncommand = "x"\n'
    folder = copy(tmp_path, ("[environment.healthcheck]", server + "\n[environment.healthcheck]"))
    with pytest.raises(TaskFormatError) as caught:
        load(folder)
    message = str(caught.value)
    assert "environment.mcp_servers" in message and "not supported" in message
    assert "\n" not in message


def test_unknown_keys_warn_and_the_task_still_loads(tmp_path: Path) -> None:
    folder = copy(
        tmp_path,
        ('name = "01-write"', 'name = "01-write"\nrewind = true'),
        append='\n[environment.tpu]\ntype = "v5e"\n',
    )
    with pytest.warns(UserWarning) as caught:
        task = load_tasks(folder).get(folder.name)
    assert task.num_steps == 2
    fields = " ".join(str(w.message) for w in caught)
    assert "'steps[0].rewind'" in fields


class _Unhealthy(ScriptedSandbox):
    def execute(self, cmd: str, timeout: float) -> ExecResult:
        self.commands.append(cmd)
        return result("no /app", 1) if cmd == "test -d /app" else result("", 0)


def test_the_environments_healthcheck_runs_before_the_first_step_only_live() -> None:
    task = load(TASK)
    with pytest.raises(SandboxError, match=r"\[environment.healthcheck\].*no /app"):
        task.setup(_Unhealthy())
    replay = _Unhealthy()
    task.step_task(1).setup(replay)  # grading's pristine replay of the steps up to step 2
    assert "test -d /app" not in replay.commands
    live = ScriptedSandbox()
    task.setup(live)
    assert live.commands.count("test -d /app") == 1


class _PlantedStat(ScriptedSandbox):
    """The agent's sandbox where a root agent (Docker) replaced ``stat``: it answers '²'."""

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        self.commands.append(cmd)
        return result("\u00b2\n", 0)


def test_a_size_that_is_no_ascii_number_fails_the_artifact_not_the_grading(
    tmp_path: Path,
) -> None:
    """``str.isdigit()`` takes '²', which ``int()`` refuses: the ValueError ended grading as
    an infrastructure failure (red team, 2026-12-07). The artifact is not copied, saying why."""
    (entry,) = collect(_PlantedStat(), [], tmp_path, workdir="/app")
    assert (entry["type"], entry["status"]) == ("file", "failed")
    assert "not copied" in entry["reason"]
