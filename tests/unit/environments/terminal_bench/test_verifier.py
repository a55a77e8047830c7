"""Harbor's separate verifier (task.toml ``[verifier]`` and ``tests/Dockerfile``), its
``rewards.json`` with several metrics, and the schema versions Harbor publishes."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.sandboxes.protocol import NeedsDockerError
from environments.tasks import TaskFormatError
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.grading import GraderPaths, grade_harbor

from .fakes import ScriptedSandbox, result

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"
SEPARATE = FIXTURES / "published" / "separate-verifier"
PATHS = GraderPaths("/tests", "/logs/verifier")


def _copy(tmp_path: Path) -> Path:
    task_dir = tmp_path / "separate-verifier"
    shutil.copytree(SEPARATE, task_dir)
    return task_dir


def _edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


def _load(task_dir: Path) -> TerminalBenchTask:
    return load_tasks(task_dir).get(task_dir.name)


def test_the_template_task_is_graded_in_an_image_built_from_tests_dockerfile() -> None:
    task = _load(SEPARATE)
    assert task.verifier is not None and task.verifier.plan is not None
    assert task.verifier.build_context == SEPARATE / "tests"
    assert task.verifier.plan.base_image == "ubuntu:24.04"
    assert task.verifier.workdir == task.environment.workdir == "/app"
    uploads = {rel: host.name for host, rel in task.test_uploads()}
    # COPY . /tests/ gives what the grader uploads anyway; COPY answer_key.txt
    # /tests/expected/answer.txt is made again in either sandbox.
    assert uploads == {
        "Dockerfile": "Dockerfile",
        "answer_key.txt": "answer_key.txt",
        "expected/answer.txt": "answer_key.txt",
        "test.sh": "test.sh",
    }


def test_without_separate_mode_tests_dockerfile_is_ignored_as_harbor_does(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    _edit(task_dir / "task.toml", 'environment_mode = "separate"\n', "")
    assert _load(task_dir).verifier is None
    _edit(task_dir / "task.toml", "[verifier]\n", '[verifier]\nenvironment_mode = "shared"\n')
    assert _load(task_dir).verifier is None


def test_separate_mode_takes_its_image_from_verifier_environment_or_the_task(
    tmp_path: Path,
) -> None:
    task_dir = _copy(tmp_path)
    _edit(
        task_dir / "task.toml",
        'environment_mode = "separate"\n',
        '\n[verifier.environment]\ndocker_image = "example/verifier:1"\n',
    )
    verifier = _load(task_dir).verifier
    assert verifier is not None and (verifier.image, verifier.plan) == ("example/verifier:1", None)
    _edit(
        task_dir / "task.toml",
        '\n[verifier.environment]\ndocker_image = "example/verifier:1"\n',
        "",
    )
    _edit(task_dir / "task.toml", "[verifier]\n", '[verifier]\nenvironment_mode = "separate"\n')
    (task_dir / "tests" / "Dockerfile").unlink()
    task = _load(task_dir)
    assert task.verifier == task.environment  # a fresh copy of the task's own environment


@pytest.mark.parametrize(
    ("file_name", "old", "new", "field", "message"),
    [
        ("tests/Dockerfile", "FROM ubuntu:24.04\n", "", "FROM", "expected FROM"),
        ("tests/Dockerfile", "WORKDIR /app", "WORKDIR /srv", "WORKDIR", "task's workdir /app"),
        (
            "tests/Dockerfile",
            "COPY answer_key.txt",
            "COPY missing.txt",
            "line 10 COPY",
            "not found",
        ),
        ("tests/Dockerfile", "WORKDIR /app", "WORKDIR /app\nFETCH x", "line 6", "unknown instr"),
        ("task.toml", '"separate"', '"isolated"', "verifier.environment_mode", "'separate'"),
        (
            "task.toml",
            'environment_mode = "separate"\n',
            'environment_mode = "shared"\n[verifier.environment]\ncpus = 1\n',
            "verifier.environment",
            "conflicts",
        ),
    ],
    ids=["no-from", "other-workdir", "missing-source", "unknown-line", "bad-mode", "conflict"],
)
def test_a_malformed_verifier_is_refused_naming_file_and_field(
    tmp_path: Path, file_name: str, old: str, new: str, field: str, message: str
) -> None:
    task_dir = _copy(tmp_path)
    _edit(task_dir / file_name, old, new)
    with pytest.raises(TaskFormatError, match=message) as caught:
        _load(task_dir)
    assert caught.value.field == field
    assert str(task_dir / file_name) in str(caught.value)


def test_a_verifier_image_with_a_run_step_needs_docker_before_the_episode(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    _edit(task_dir / "tests" / "Dockerfile", "COPY . /tests/", "COPY . /tests/\nRUN touch /x")
    task = _load(task_dir)
    alias = "ubuntu:24.04=thundersync/base:bookworm"
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("THUNDERSYNC_IMAGE_ALIASES", alias)
        assert task.environment.needs_docker_reason is None
        with pytest.raises(NeedsDockerError, match="its verifier image .*RUN touch /x.*Docker"):
            task.sandbox_spec("bwrap")
        assert task.sandbox_spec("docker").build_context == task_dir / "environment"


def test_a_separate_verifier_without_a_sandbox_maker_is_an_infra_failure_not_a_shared_grade() -> (
    None
):
    grade = _load(SEPARATE).grade(ScriptedSandbox({"/logs/verifier/reward.txt": "1"}), None)
    assert (grade.reward, grade.infra_failure) == (0.0, True)
    assert "separate verifier" in grade.details["error"]


def test_rewards_json_with_several_metrics_gives_the_documented_training_reward() -> None:
    files = {"/logs/verifier/rewards.json": '{"accuracy": 1, "style": 0.5, "speed": 0}'}
    mean = grade_harbor(ScriptedSandbox(files), PATHS, result("", 0), 30)
    assert mean.reward == pytest.approx(0.5)  # no "reward" metric, no reward_key: the mean
    assert mean.details["metrics"] == {"accuracy": 1.0, "style": 0.5, "speed": 0.0}
    chosen = grade_harbor(ScriptedSandbox(files), PATHS, result("", 0), 30, "style")
    assert (chosen.reward, chosen.details["metrics"]) == (0.5, mean.details["metrics"])
    files["/logs/verifier/rewards.json"] = '{"reward": 0.25, "accuracy": 1}'
    assert grade_harbor(ScriptedSandbox(files), PATHS, result("", 0), 30).reward == 0.25


def test_a_missing_reward_key_scores_zero_naming_the_key(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    _edit(task_dir / "task.toml", "[verifier]\n", '[verifier]\nreward_key = "accuracy"\n')
    assert _load(task_dir).reward_key == "accuracy"
    files = {"/logs/verifier/rewards.json": '{"style": 1}'}
    grade = grade_harbor(ScriptedSandbox(files), PATHS, result("", 0), 30, "accuracy")
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert "reward_key 'accuracy' is missing" in grade.details["reward_error"]


def test_harbors_published_schema_versions_load_and_others_are_refused(tmp_path: Path) -> None:
    task_dir = _copy(tmp_path)
    toml = task_dir / "task.toml"
    previous = 'schema_version = "1.4"'
    for line in ['version = "1.0"', *(f'schema_version = "1.{minor}"' for minor in range(4))]:
        _edit(toml, previous, line)
        previous = line
        assert _load(task_dir).task_id == "separate-verifier"
    _edit(toml, previous, 'schema_version = "2.0"')
    with pytest.raises(TaskFormatError, match=r"1\.0, 1\.1, 1\.2, 1\.3, 1\.4.*got '2\.0'"):
        _load(task_dir)
