"""What a grading sandbox of its own gets of Harbor's collection phase (issue 37): a separate
verifier (``[verifier] environment_mode = "separate"``) and strict grading's fresh sandbox get
the collected artifacts at their source paths and the convention folder at /logs/artifacts, as
Harbor uploads them to its separate verifier, so a verifier reading what the agent published or
what a ``[[verifier.collect]]`` hook wrote outside the work folder scores the work, not 0 (a
separate verifier) or an infrastructure failure (strict). Strict grading judges the files the
artifacts place by the work folder's path rules, and never places one in the grader's folders."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.agents import NopAgent, OracleAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.sandboxes import make_sandbox
from environments.tasks import Grade
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.collection import MAX_ARTIFACT_ENTRIES, collect
from tests.integration.test_reward_hacks_terminal_bench import run_episode
from thundersync.protocol.types import Trajectory

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "harbor-1.4-extras" / "hook-snapshot"
SOLVE = "printf 'one\\ntwo\\nthree\\n' > /app/lines.txt && echo done > /logs/artifacts/status.txt"


def play(task: TerminalBenchTask, kind: str, *, oracle: bool, strict: bool) -> Trajectory:
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox=kind, strict_grading=strict),
        OracleAgent() if oracle else NopAgent(),
        lambda event: None,
    )
    return runner.run_episode(task)


def _variant(tmp_path: Path, toml: str = "", test: str = "") -> TerminalBenchTask:
    """The fixture with ``toml`` added to its task.toml and ``test`` to its test's checks."""
    folder = tmp_path / "hook-snapshot"
    shutil.copytree(FIXTURE, folder)
    config = folder / "task.toml"
    config.write_text(toml + config.read_text())
    script = folder / "tests" / "test.sh"
    script.write_text(script.read_text().replace('[ "$count" = "3" ]', f'[ "$count" = "3" ]{test}'))
    return load_tasks(folder).get("hook-snapshot")


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_hooks_output_outside_the_work_folder_is_graded(kind: str, strict: bool) -> None:
    """Strict grading's fresh sandbox lacked /logs/artifacts: the reference solution scored 0
    there, so every attempt was an infrastructure failure under --strict."""
    task = load_tasks(FIXTURE).get("hook-snapshot")
    oracle = play(task, kind, oracle=True, strict=strict)
    assert not oracle.infra_failure, oracle.details
    assert oracle.reward == 1.0, oracle.details
    assert oracle.details["tamper_suspected"] is False
    nop = play(task, kind, oracle=False, strict=strict)
    assert not nop.infra_failure, nop.details
    assert nop.reward == 0.0, nop.details


SEPARATE = '[verifier]\nenvironment_mode = "separate"\n\n'


@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_separate_verifier_gets_the_convention_folder(
    tmp_path: Path, kind: str, strict: bool
) -> None:
    """It got the work folder only: the published status and the hook's count were missing."""
    config = (FIXTURE / "task.toml").read_text().replace("[verifier]\n", SEPARATE)
    folder = tmp_path / "task"
    shutil.copytree(FIXTURE, folder)
    (folder / "task.toml").write_text(config)
    task = load_tasks(folder).get("task")
    assert task.verifier is not None
    oracle = play(task, kind, oracle=True, strict=strict)
    assert oracle.reward == 1.0, oracle.details
    assert oracle.details["separate_verifier"] is True
    assert play(task, kind, oracle=False, strict=strict).reward == 0.0


@pytest.mark.docker
@pytest.mark.parametrize("strict", [False, True], ids=["default", "strict"])
def test_a_separate_verifier_gets_each_artifact_at_its_source_path(
    tmp_path: Path, strict: bool
) -> None:
    """An artifact's source outside the work folder (here a hook's copy in /srv/snapshot) is
    re-created there in the verifier's container, as Harbor uploads it."""
    hook = (
        '[[verifier.collect]]\ncommand = "mkdir -p /srv/snapshot && '
        'cp /app/lines.txt /srv/snapshot/"\n\n'
    )
    base = (FIXTURE / "task.toml").read_text().replace("[verifier]\n", SEPARATE)
    folder = tmp_path / "task"
    shutil.copytree(FIXTURE, folder)
    (folder / "task.toml").write_text('artifacts = ["/srv/snapshot"]\n' + base + "\n" + hook)
    script = folder / "tests" / "test.sh"
    check = ' && [ "$(sed -n 3p /srv/snapshot/lines.txt)" = "three" ]'
    script.write_text(
        script.read_text().replace('[ "$count" = "3" ]', f'[ "$count" = "3" ]{check}')
    )
    task = load_tasks(folder).get("task")
    oracle = play(task, "docker", oracle=True, strict=strict)
    assert oracle.reward == 1.0, oracle.details
    assert play(task, "docker", oracle=False, strict=strict).reward == 0.0


def _strict(task: TerminalBenchTask, kind: str, command: str) -> Grade:
    return run_episode(task, kind, [command], strict=True)


def test_strict_grading_judges_the_files_an_artifact_places(kind: str) -> None:
    """A conftest.py published in /logs/artifacts is placed in the grading sandbox only as one
    of the agent's files judged by the path rules: the attempt is flagged and scores 0."""
    task = load_tasks(FIXTURE).get("hook-snapshot")
    honest = _strict(task, kind, SOLVE)
    assert honest.reward == 1.0, honest.details
    planted = _strict(task, kind, f"{SOLVE} && echo 'import os' > /logs/artifacts/conftest.py")
    assert planted.reward == 0.0, planted.details
    assert planted.details["tamper_suspected"] is True
    assert any("/logs/artifacts/conftest.py" in r for r in planted.details["tamper_reasons"])


def test_no_artifact_is_placed_in_the_graders_folders(tmp_path: Path, kind: str) -> None:
    """A task that declares /logs/verifier an artifact does not let the agent's reward.txt
    reach the grading sandbox: the verifier's own result stands."""
    folder = tmp_path / "task"
    shutil.copytree(FIXTURE, folder)
    config = folder / "task.toml"
    config.write_text('artifacts = ["/logs/verifier"]\n' + config.read_text())
    script = folder / "tests" / "test.sh"  # a verifier that writes nothing when it fails
    script.write_text(script.read_text().replace("  echo 0 > /logs/verifier/reward.txt\n", "  :\n"))
    task = load_tasks(folder).get("task")
    grade = _strict(task, kind, "mkdir -p /logs/verifier && echo 1 > /logs/verifier/reward.txt")
    assert grade.reward == 0.0, grade.details
    assert not grade.infra_failure, grade.details
    assert grade.details["artifacts_not_placed"] == ["/logs/verifier: the grader's own folder"]


FAKE_CAT = "mkdir -p /usr/local/bin && printf '#!/bin/sh\\necho 1\\n' > /usr/local/bin/cat"
FAKE_CAT += " && chmod +x /usr/local/bin/cat"
"""A hack: a ``cat`` ahead of the image's on PATH that answers 1, whatever a reward file says."""


@pytest.mark.docker
def test_strict_grading_places_no_artifact_in_a_system_folder(tmp_path: Path) -> None:
    """A task that declares /usr/local/bin an artifact let the agent's programs, found first
    on PATH, into strict grading's fresh sandbox: a planted cat scored 1."""
    folder = tmp_path / "task"
    shutil.copytree(FIXTURE, folder)
    config = folder / "task.toml"
    config.write_text('artifacts = ["/usr/local/bin"]\n' + config.read_text())
    task = load_tasks(folder).get("task")
    assert _strict(task, "docker", SOLVE).reward == 1.0
    planted = _strict(task, "docker", FAKE_CAT)
    assert planted.reward == 0.0, planted.details
    assert planted.details["artifacts_not_placed"] == [
        "/usr/local/bin: a system folder (strict grading)"
    ]


REPLACED_CONVENTION = {
    "a-file": "rm -rf /logs/artifacts && echo x > /logs/artifacts",
    "a-link": "rm -rf /logs/artifacts && ln -s /etc/hostname /logs/artifacts",
}


@pytest.mark.parametrize("made", sorted(REPLACED_CONVENTION))
def test_a_convention_folder_the_agent_replaced_is_its_zero(kind: str, made: str) -> None:
    """/logs/artifacts made a file, or a link to one: placing the file over the grading
    sandbox's folder raised IsADirectoryError, and Docker's archive of the link a TarError,
    out of grading: an infrastructure failure, the attempt dropped from training (red team,
    2026-12-07). A link is not copied; a file replaces the folder."""
    task = load_tasks(FIXTURE).get("hook-snapshot")
    grade = _strict(task, kind, f"printf 'one\\n' > /app/lines.txt && {REPLACED_CONVENTION[made]}")
    assert not grade.infra_failure, grade.details
    assert grade.reward == 0.0, grade.details


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
def test_artifacts_that_outgrow_the_grading_disk_are_the_agents_zero(tmp_path: Path) -> None:
    """Sparse files are restored at full size: 24 MB of them in /logs/artifacts filled a 16 MB
    grading disk, and the ENOSPC left grading as an infrastructure failure (red team)."""
    folder = tmp_path / "task"
    shutil.copytree(FIXTURE, folder)
    config = folder / "task.toml"
    config.write_text(
        config.read_text().replace("[environment]\n", "[environment]\nstorage_mb = 16\n")
    )
    task = load_tasks(folder).get("task")
    sparse = (
        "mkdir -p /logs/artifacts && for i in 1 2 3; do truncate -s 8M /logs/artifacts/f$i; done"
    )
    grade = _strict(task, "bwrap", f"{SOLVE} && {sparse}")
    assert not grade.infra_failure, grade.details
    assert grade.reward == 0.0
    assert "does not fit a fresh sandbox" in grade.details["agent_failure"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap")
def test_an_artifact_folder_of_too_many_entries_is_not_copied(tmp_path: Path) -> None:
    """Each entry is re-created in the grading sandbox: 576,000 hard links to empty files took
    strict grading 20 minutes (red team). Past ``MAX_ARTIFACT_ENTRIES`` the folder is refused
    when collected, the refusal recorded."""
    spec = load_tasks(FIXTURE).get("hook-snapshot").sandbox_spec("bwrap")
    links = f"import os; [os.link('f', f'l{{i}}') for i in range({MAX_ARTIFACT_ENTRIES})]"
    with make_sandbox(spec, kind="bwrap") as sandbox:
        made = sandbox.execute(
            f'mkdir -p /logs/artifacts && cd /logs/artifacts && touch f && python3 -c "{links}"',
            timeout=120,
        )
        assert made.exit_code == 0, made.output
        manifest = collect(sandbox, [], tmp_path / "collected", workdir="/app")
    assert manifest[0]["status"] == "failed", manifest[0]
    assert f"over {MAX_ARTIFACT_ENTRIES} files and folders" in manifest[0]["reason"]
