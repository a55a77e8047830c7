"""The bubblewrap rule: which Dockerfiles run without a build, and how their files are staged."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.sandboxes.protocol import NeedsDockerError
from environments.terminal_bench import load_tasks
from environments.terminal_bench.dockerfile import BASE_IMAGE, read_dockerfile
from environments.terminal_bench.environment import SETUP_MARKER

from .fakes import ScriptedSandbox, result

FIXTURES = Path(__file__).resolve().parents[4] / "environments" / "fixtures" / "terminal_bench"


def plan_for(tmp_path: Path, text: str, files: dict[str, str] | None = None):
    for name, content in (files or {}).items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(content)
    (tmp_path / "Dockerfile").write_text(text)
    return read_dockerfile(tmp_path / "Dockerfile", tmp_path)


def test_copy_workdir_env_and_run_are_reproducible(tmp_path: Path) -> None:
    plan = plan_for(
        tmp_path,
        f'# a comment\nFROM {BASE_IMAGE}\nWORKDIR /srv/app\nENV MODE=fast LEVEL="2 3"\n'
        "COPY data/ ./data/\nCOPY run.sh tool.py /srv/app/bin/\n"
        'RUN chmod +x bin/run.sh && \\\n    echo done\nCMD ["bash"]\n',
        {"data/a.txt": "a", "run.sh": "echo", "tool.py": "print()"},
    )
    assert plan.build_step is None
    assert plan.workdir == "/srv/app"
    assert plan.env == {"MODE": "fast", "LEVEL": "2 3"}
    assert [c.dest for c in plan.copies] == ["data", "bin"]
    assert [s.command for s in plan.run_steps] == ["chmod +x bin/run.sh && echo done"]
    assert plan.run_steps[0].cwd == "/srv/app"


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (f"FROM {BASE_IMAGE}\nADD https://x/y.tgz /app/\n", "ADD"),
        (f"FROM {BASE_IMAGE}\nUSER nobody\n", "USER"),
        (f"FROM {BASE_IMAGE}\nARG VERSION=1\n", "ARG"),
        (f"FROM {BASE_IMAGE} AS build\nFROM {BASE_IMAGE}\n", "multi-stage"),
        (f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY f.txt /usr/local/bin/f\n", "outside the"),
        (f"FROM {BASE_IMAGE}\nWORKDIR /app\nCOPY --from=build /x /app/x\n", "COPY with"),
        (f'FROM {BASE_IMAGE}\nRUN ["echo", "hi"]\n', "exec or heredoc"),
        (f"FROM {BASE_IMAGE}\nWORKDIR /\n", "root folder"),
        (f"FROM {BASE_IMAGE}\nWORKDIR /usr/src/app\n", "system folder"),
    ],
    ids=[
        "add",
        "user",
        "arg",
        "multi-stage",
        "copy-outside",
        "copy-from",
        "run-exec-form",
        "workdir-root",
        "workdir-system-folder",
    ],
)
def test_build_steps_need_docker(tmp_path: Path, text: str, reason: str) -> None:
    plan = plan_for(tmp_path, text, {"f.txt": "f"})
    assert plan.build_step is not None and reason in plan.build_step


def test_a_build_step_task_refuses_bwrap_with_a_clear_message(tmp_path: Path) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    dockerfile = task_dir / "environment" / "Dockerfile"
    dockerfile.write_text(dockerfile.read_text() + "USER nobody\n")
    task = load_tasks(task_dir).get("sales-report")
    with pytest.raises(NeedsDockerError, match=r"task sales-report needs Docker: .*USER"):
        task.sandbox_spec("bwrap")
    docker_spec = task.sandbox_spec("docker")
    assert docker_spec.build_context == task_dir / "environment"
    assert task.sandbox_spec().build_context == task_dir / "environment"


def test_a_reproducible_task_is_staged_for_both_sandboxes() -> None:
    task = load_tasks(FIXTURES / "tb1" / "sort-files").get("sort-files")
    spec = task.sandbox_spec("bwrap")
    assert spec.image == BASE_IMAGE and spec.build_context is None and spec.workdir == "/app"
    staged = sorted(p.name for p in (spec.files / "inbox").iterdir())
    assert "Report 2024-03-15.TXT" in staged and len(staged) == 8
    assert not (spec.files / "tests").exists()
    assert not (spec.files / "solution.sh").exists()
    assert task.sandbox_spec() == spec
    assert task.sandbox_spec("docker").build_context == FIXTURES / "tb1" / "sort-files"


def test_single_file_copy_to_a_file_name(tmp_path: Path) -> None:
    task = load_tasks(FIXTURES / "harbor" / "fix-backup-script").get("fix-backup-script")
    files = task.sandbox_spec("bwrap").files
    assert (files / "backup.sh").read_text().startswith("#!/bin/bash")


def test_setup_replays_run_steps_once_in_a_staged_workspace() -> None:
    task = load_tasks(FIXTURES / "tb1" / "git-revert-commit").get("git-revert-commit")
    assert (task.sandbox_spec("bwrap").files / SETUP_MARKER).is_file()
    sandbox = ScriptedSandbox()
    task.setup(sandbox)
    assert SETUP_MARKER in sandbox.commands[0]
    assert "bash /app/make_repo.sh && rm /app/make_repo.sh" in sandbox.commands[1]


def test_setup_does_nothing_after_a_docker_build() -> None:
    task = load_tasks(FIXTURES / "tb1" / "git-revert-commit").get("git-revert-commit")

    class Built(ScriptedSandbox):
        def execute(self, cmd: str, timeout: float):
            self.commands.append(cmd)
            return result("", 1)

    sandbox = Built()
    task.setup(sandbox)
    assert len(sandbox.commands) == 1


def test_a_failing_replayed_step_raises_needs_docker() -> None:
    task = load_tasks(FIXTURES / "harbor" / "git-revert-commit").get("git-revert-commit")

    class Failing(ScriptedSandbox):
        def execute(self, cmd: str, timeout: float):
            self.commands.append(cmd)
            if len(self.commands) == 1:
                return result("", 0)
            return result("E: Could not open lock file", 100)

    with pytest.raises(NeedsDockerError, match=r"RUN bash /app/make_repo.sh.*exit 100.*lock file"):
        task.setup(Failing())


def test_single_service_compose_uses_its_build_context(tmp_path: Path) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "tb1" / "sales-report", task_dir)
    env = task_dir / "env"
    env.mkdir()
    (task_dir / "Dockerfile").rename(env / "Dockerfile")
    (task_dir / "sales.csv").rename(env / "sales.csv")
    (task_dir / "docker-compose.yaml").write_text(
        "services:\n  client:\n    build:\n      context: ./env\n"
        "    image: ${T_BENCH_TASK_DOCKER_CLIENT_IMAGE_NAME}\n"
    )
    task = load_tasks(task_dir).get("sales-report")
    assert task.sandbox_spec("docker").build_context == env.resolve()
    assert (task.sandbox_spec("bwrap").files / "sales.csv").is_file()


@pytest.mark.parametrize(
    ("image", "reason"), [(BASE_IMAGE, None), ("ghcr.io/acme/tool:1", "prebuilt image")]
)
def test_harbor_prebuilt_image_without_environment_folder(
    tmp_path: Path, image: str, reason: str | None
) -> None:
    task_dir = tmp_path / "sales-report"
    shutil.copytree(FIXTURES / "harbor" / "sales-report", task_dir)
    shutil.rmtree(task_dir / "environment")
    toml = task_dir / "task.toml"
    toml.write_text(
        toml.read_text().replace("[environment]", f'[environment]\ndocker_image = "{image}"')
    )
    task = load_tasks(task_dir).get("sales-report")
    spec = task.sandbox_spec("docker")
    if reason is None:
        assert spec.image == image and spec.build_context is None
        assert task.sandbox_spec("bwrap").files is None
    else:  # built FROM the image, so that aliases apply and a missing image is never pulled
        assert spec.image is None
        assert (spec.build_context / "Dockerfile").read_text() == f"FROM {image}\n"
        assert reason in (task.needs_docker_reason or "")
        with pytest.raises(NeedsDockerError, match=reason):
            task.sandbox_spec("bwrap")
