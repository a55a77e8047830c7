"""SWEBenchTask without a real sandbox: instruction, spec, setup, reference solution, grading
plumbing (chunked file transfer, infra failures) on a host-subprocess stand-in."""

from __future__ import annotations

import json
import os
import random
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from environments.sandboxes.protocol import ExecResult, SandboxError
from environments.swebench import SWEBenchTask, load_instances
from environments.swebench.transfer import read_bytes, read_text, write_text
from environments.tasks import GradingContext
from tests.unit.environments.swebench.host_sandbox import (
    BrokenSandbox,
    FreshSandboxes,
    SubprocessSandbox,
)

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURES = REPO_ROOT / "environments/fixtures/swebench"


@pytest.fixture
def shipped() -> SWEBenchTask:
    return load_instances(FIXTURES).get("thundersync__intervals-1")


@pytest.fixture
def testbed(tmp_path: Path, shipped: SWEBenchTask) -> Path:
    """The shipped snapshot copied and committed, as setup leaves /testbed."""
    root = tmp_path / "testbed"
    subprocess.run(["cp", "-r", str(shipped.instance.repo_snapshot), str(root)], check=True)
    return root


def test_instruction_describes_issue_and_protocol(shipped: SWEBenchTask) -> None:
    text = shipped.instruction
    assert shipped.instance.problem_statement.strip() in text
    assert "/testbed" in text and "```bash" in text and "submit" in text
    assert shipped.task_id == "thundersync__intervals-1"


def test_snapshot_spec_uses_base_image_and_copies_snapshot(shipped: SWEBenchTask) -> None:
    from environments.sandboxes import BASE_IMAGE

    spec = shipped.sandbox_spec()
    assert spec.image == BASE_IMAGE
    assert spec.files == shipped.instance.repo_snapshot
    assert spec.workdir == "/testbed"


def test_setup_commits_snapshot_at_base_commit(shipped: SWEBenchTask, testbed: Path) -> None:
    shipped.setup(SubprocessSandbox(testbed))
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=testbed, capture_output=True, text=True, check=True
    )
    assert head.stdout.strip() == shipped.instance.base_commit


@pytest.mark.parametrize(
    "result, says",
    [
        (ExecResult("fatal: cannot lock ref", 128, False, 0.1), "(exit 128) ('fatal: cannot"),
        (ExecResult("", None, True, 300.0), "setting up /testbed timed out"),
    ],
)
def test_a_setup_that_fails_says_how(shipped: SWEBenchTask, result: ExecResult, says: str) -> None:
    class Failing:
        def execute(self, command: str, timeout: float | None = None) -> ExecResult:
            return result

    with pytest.raises(SandboxError) as caught:
        shipped.setup(Failing())  # type: ignore[arg-type]
    assert says in str(caught.value), caught.value
    assert ("changed since" in str(caught.value)) == (result.exit_code is not None)


def test_setup_rejects_a_snapshot_that_drifted(shipped: SWEBenchTask, testbed: Path) -> None:
    (testbed / "intervals" / "ops.py").write_text("# edited after the instance was built\n")
    with pytest.raises(SandboxError, match="expected base_commit"):
        shipped.setup(SubprocessSandbox(testbed))


@pytest.mark.parametrize("fenced", [False, True])
def test_reference_solution_applies_gold_patch(
    shipped: SWEBenchTask, testbed: Path, fenced: bool
) -> None:
    task = shipped
    if fenced:  # a patch holding a Markdown fence must survive the action protocol
        task = SWEBenchTask(replace(shipped.instance, patch=_readme_patch()))
    sandbox = SubprocessSandbox(testbed)
    task.setup(sandbox)
    commands = task.reference_solution()
    assert not any("```" in c for c in commands)
    for command in commands:
        result = sandbox.execute(command, timeout=30)
        assert result.exit_code == 0, result.output
    diff = subprocess.run(["git", "diff"], cwd=testbed, capture_output=True, text=True).stdout
    assert ("```" in diff) is fenced
    assert ("start <= merged[-1][1]" in diff) is not fenced


def _readme_patch() -> str:
    return (
        "diff --git a/README.md b/README.md\n--- a/README.md\n+++ b/README.md\n"
        "@@ -1,2 +1,3 @@\n # intervals\n+```text\n \n"
    )


def _grade_with_script(task: SWEBenchTask, testbed: Path, body: str, **kw: object):
    script = f": '>>>>> Start Test Output'\n{body}\n: '>>>>> End Test Output'\n"
    instance = replace(task.instance, eval_script=script)
    scripted = SWEBenchTask(instance, **kw)  # type: ignore[arg-type]
    sandbox = SubprocessSandbox(testbed)
    scripted.setup(sandbox)
    return scripted.grade(sandbox, GradingContext(FreshSandboxes(testbed.parent, scripted)))


def _summary(task: SWEBenchTask, failing: set[str] = frozenset()) -> str:
    tests = task.instance.fail_to_pass + task.instance.pass_to_pass
    lines = [f"{'FAILED' if t in failing else 'PASSED'} {t}" for t in tests]
    return "\n".join(f"echo '{line}'" for line in lines)


def test_grade_resolved_and_unresolved(shipped: SWEBenchTask, testbed: Path) -> None:
    passing = _grade_with_script(shipped, testbed, _summary(shipped))
    assert passing.reward == 1.0 and not passing.infra_failure
    failing_body = _summary(shipped, {shipped.instance.fail_to_pass[0]}) + "\nfalse"
    failing = _grade_with_script(shipped, testbed, failing_body)
    assert failing.reward == 0.0 and not failing.infra_failure


def test_grade_reads_logs_far_over_the_output_limit(shipped: SWEBenchTask, testbed: Path) -> None:
    noise = "python3 -c \"print(('é' * 99 + chr(10)) * 3000)\""  # ~600 KB, multibyte
    grade = _grade_with_script(shipped, testbed, noise + "\n" + _summary(shipped))
    assert grade.reward == 1.0, grade.details


def test_grade_eval_timeout_scores_zero(shipped: SWEBenchTask, testbed: Path) -> None:
    grade = _grade_with_script(shipped, testbed, "sleep 5", eval_timeout_s=0.5)
    assert grade.reward == 0.0 and not grade.infra_failure
    assert grade.details["timed_out"] is True


def test_grade_on_dead_sandbox_is_infra_failure(shipped: SWEBenchTask) -> None:
    grade = shipped.grade(BrokenSandbox(), GradingContext(BrokenSandbox))
    assert grade.infra_failure and grade.reward == 0.0
    assert "container vanished" in grade.details["error"]


def test_grading_needs_a_fresh_sandbox(shipped: SWEBenchTask, testbed: Path) -> None:
    """No in-place fallback: the agent's sandbox never runs the tests."""
    with pytest.raises(TypeError):
        shipped.grade(SubprocessSandbox(testbed))  # type: ignore[call-arg]


def test_transfer_round_trip_in_small_chunks(tmp_path: Path) -> None:
    sandbox = SubprocessSandbox(tmp_path, max_output_bytes=4096)
    text = "".join(f"line {i}: ünïcødé ✓ {'x' * (i % 70)}\n" for i in range(1000))
    path = str(tmp_path / "deep" / "file.txt")
    write_text(sandbox, path, text)
    assert Path(path).read_text() == text
    assert read_text(sandbox, path, chunk_bytes=3001) == text  # odd size: splits characters
    assert len(sandbox.commands) > 20


def test_transfer_read_shrinks_chunks_that_overflow_the_output_limit(tmp_path: Path) -> None:
    sandbox = SubprocessSandbox(tmp_path, max_output_bytes=4096)
    text = "ü" * 20_000
    (tmp_path / "big.txt").write_text(text)
    assert read_text(sandbox, str(tmp_path / "big.txt"), chunk_bytes=1_000_000) == text


def test_transfer_reads_a_fifo_as_empty_without_blocking(tmp_path: Path) -> None:
    """A record the agent's code replaced by a fifo has size 0: nothing is read from it (the
    size comes with the first chunk's command, which must not block on the fifo)."""
    os.mkfifo(tmp_path / "record.json")
    sandbox = SubprocessSandbox(tmp_path)
    assert read_bytes(sandbox, str(tmp_path / "record.json"), chunk_bytes=1000, timeout=5) == b""


def test_transfer_errors_are_sandbox_errors(tmp_path: Path) -> None:
    sandbox = SubprocessSandbox(tmp_path)
    with pytest.raises(SandboxError, match="cannot stat"):
        read_text(sandbox, str(tmp_path / "absent"), chunk_bytes=1000)
    (tmp_path / "ro").mkdir(mode=0o500)
    if subprocess.run(["test", "-w", str(tmp_path / "ro")]).returncode != 0:
        with pytest.raises(SandboxError):
            write_text(sandbox, str(tmp_path / "ro" / "f"), "x")


def test_setup_refuses_an_official_instance_without_its_image(tmp_path: Path) -> None:
    from environments.swebench.instance import parse_instance

    row = json.loads((FIXTURES / "instances.jsonl").read_text().splitlines()[0])
    del row["repo_snapshot"]
    task = SWEBenchTask(parse_instance(row, source="rows.jsonl", index=0, base_dir=None))
    assert task.sandbox_spec().image.startswith("swebench/sweb.eval.x86_64.thundersync_1776_")
    with pytest.raises(SandboxError, match="run it in Docker with the image"):
        task.setup(SubprocessSandbox(tmp_path))  # an empty /testbed, as bubblewrap would give


# --- grading the agent's patch in a fresh sandbox ---------------------------------------------


def _hook_hack_task(task: SWEBenchTask) -> SWEBenchTask:
    """The instance with an eval script shaped like the official ones (``git checkout`` of
    the base before the tests) whose tests fail."""
    failing = _summary(task, {task.instance.fail_to_pass[0]}) + "\nfalse"
    script = (
        f"git checkout {task.instance.base_commit} -- README.md\n"
        f": '>>>>> Start Test Output'\n{failing}\n: '>>>>> End Test Output'\n"
    )
    return SWEBenchTask(replace(task.instance, eval_script=script))


def _install_fake_pass_hook(task: SWEBenchTask, root: Path) -> None:
    tests = task.instance.fail_to_pass + task.instance.pass_to_pass
    block = "".join(f"PASSED {t}\\n" for t in tests)
    hook = (
        "#!/bin/sh\n"
        f"printf '>>>>> Start Test Output\\n{block}>>>>> End Test Output\\n"
        ">>>>> Test Exit Code: 0\\n'\n"
    )
    for folder in (root / ".git/hooks", root / ".agent-hooks"):
        folder.mkdir(exist_ok=True)
        (folder / "post-checkout").write_text(hook)
        (folder / "post-checkout").chmod(0o755)
    subprocess.run(["git", "config", "core.hooksPath", ".agent-hooks"], cwd=root, check=True)


def test_git_hook_faking_a_passing_log_scores_zero(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    task = _hook_hack_task(shipped)
    sandbox = SubprocessSandbox(testbed)
    task.setup(sandbox)
    _install_fake_pass_hook(task, testbed)
    from environments.swebench.grading import grade_log, make_spec

    unprotected = subprocess.run(  # the hack works when the hooks run
        ["bash", "-c", make_spec(task.instance).eval_script],
        cwd=testbed,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert grade_log(task.instance, unprotected.stdout).reward == 1.0
    for strict in (False, True):
        fresh = FreshSandboxes(tmp_path / f"strict-{strict}", task)
        grade = task.grade(sandbox, GradingContext(fresh, strict=strict))
        assert grade.reward == 0.0 and not grade.infra_failure, grade.details
        assert len(fresh.made) == 1 and fresh.made[0].closed
        reasons = grade.details["tamper_reasons"]
        assert grade.details["tamper_suspected"] and grade.details["strict"] is strict
        assert any(r.startswith(".git/hooks/post-checkout: a git hook") for r in reasons)
        assert any("core.hooksPath" in r or "core.hookspath" in r for r in reasons), reasons


def test_fresh_sandbox_gets_the_agents_patch_and_nothing_else(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """Tracked edits (even ones hidden from the agent's index), new files and binary files
    reach the fresh sandbox; files git ignores (.gitignore, .git/info/exclude) do not."""
    script = f": '>>>>> Start Test Output'\n{_summary(shipped)}\n: '>>>>> End Test Output'\n"
    task = SWEBenchTask(replace(shipped.instance, eval_script=script))
    sandbox = SubprocessSandbox(testbed)
    task.setup(sandbox)
    (testbed / "README.md").write_text("edited\n")
    subprocess.run(["git", "update-index", "--skip-worktree", "README.md"], cwd=testbed)
    (testbed / "new.py").write_text("x = 1\n")
    (testbed / "blob.bin").write_bytes(bytes(range(256)) * 4)
    (testbed / "hidden.py").write_text("secret = 1\n")
    (testbed / ".git/info/exclude").write_text("hidden.py\n")
    (testbed / "intervals/__pycache__").mkdir(exist_ok=True)
    (testbed / "intervals/__pycache__/junk.pyc").write_bytes(b"junk")
    fresh = FreshSandboxes(tmp_path, task)
    grade = task.grade(sandbox, GradingContext(fresh))
    assert grade.reward == 1.0, grade.details
    graded = fresh.made[0].root
    assert (graded / "README.md").read_text() == "edited\n"
    assert (graded / "new.py").read_text() == "x = 1\n"
    assert (graded / "blob.bin").read_bytes() == bytes(range(256)) * 4
    assert not (graded / "hidden.py").exists()
    assert not (graded / "intervals/__pycache__/junk.pyc").exists()


class FailingApply(SubprocessSandbox):
    """A fresh sandbox in which ``git apply`` fails, as it would for a patch git rejects."""

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        if " apply " in cmd:
            return ExecResult("error: patch failed: README.md:1", 1, False, 0.0)
        return super().execute(cmd, timeout)


def test_fresh_sandbox_is_closed_on_every_path(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    sandbox = SubprocessSandbox(testbed)
    shipped.setup(sandbox)
    (testbed / "README.md").write_text("edited\n")
    fresh = FreshSandboxes(tmp_path, shipped)

    def drifted() -> SubprocessSandbox:
        made = fresh()
        (made.root / "README.md").write_text("drifted\n")
        return made

    setup_fails = shipped.grade(sandbox, GradingContext(drifted))
    assert setup_fails.infra_failure and "expected base_commit" in setup_fails.details["error"]
    assert fresh.made[-1].closed

    def failing_apply() -> SubprocessSandbox:
        made = fresh()
        fresh.made[-1] = FailingApply(made.root)
        return fresh.made[-1]

    not_applied = shipped.grade(sandbox, GradingContext(failing_apply))
    assert not_applied.reward == 0.0 and not not_applied.infra_failure
    assert not_applied.details["patch_successfully_applied"] is False
    assert "does not apply" in not_applied.details["error"]
    assert fresh.made[-1].closed


def test_agent_deleting_git_scores_zero_with_a_fresh_sandbox(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    sandbox = SubprocessSandbox(testbed)
    shipped.setup(sandbox)
    sandbox.execute("rm -rf /testbed/.git", timeout=10)
    fresh = FreshSandboxes(tmp_path, shipped)
    grade = shipped.grade(sandbox, GradingContext(fresh))
    assert grade.reward == 0.0 and not grade.infra_failure
    assert not fresh.made


def test_shell_env_grades_in_a_fresh_sandbox_it_closes(
    shipped: SWEBenchTask, tmp_path: Path
) -> None:
    """The call site real episodes use: ShellEnv passes ``fresh_sandbox`` (a sandbox made
    from the same spec as the episode's) and closes it once grading returns."""
    from environments.actions import SUBMIT_WORD, format_action
    from environments.core import ShellEnv

    task = _hook_hack_task(shipped)
    made: list[SubprocessSandbox] = []

    def make(spec: object) -> SubprocessSandbox:
        root = tmp_path / f"sandbox-{len(made)}"
        subprocess.run(["cp", "-r", str(spec.files), str(root)], check=True)  # type: ignore[attr-defined]
        made.append(SubprocessSandbox(root))
        return made[-1]

    env = ShellEnv([task], sandbox=make)
    env.reset(options={"task": task})
    _install_fake_pass_hook(task, made[0].root)
    env.step(format_action("git status --short"))
    _, reward, terminated, _, info = env.step(format_action(SUBMIT_WORD))
    assert terminated and reward == 0.0 and not info["infra_failure"], info
    assert len(made) == 2 and made[1].closed and not made[0].closed
    env.close()
    assert made[0].closed


# --- the agent's own programs take no part in making the patch ---------------------------------


class AgentSandbox(SubprocessSandbox):
    """The episode's sandbox, where the agent put its own programs first on PATH."""

    def __init__(self, root: Path, fake_bin: Path) -> None:
        super().__init__(root)
        self.fake_bin = fake_bin

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        return super().execute(f"export PATH={self.fake_bin}:$PATH; {cmd}", timeout)


def _checking_task(task: SWEBenchTask) -> SWEBenchTask:
    """The instance with an eval script that passes iff the fix is in intervals/ops.py."""
    fixed = f"if grep -q 'start <= merged' intervals/ops.py; then {_summary(task)}; else " + (
        _summary(task, {task.instance.fail_to_pass[0]}) + "; false; fi"
    )
    script = f": '>>>>> Start Test Output'\n{fixed}\n: '>>>>> End Test Output'\n"
    return SWEBenchTask(replace(task.instance, eval_script=script))


STEERED_GIT = """#!/bin/bash
# Asked for a diff, emit the gold patch, whatever the tree holds.
case " $* " in *" diff "*) cat "$(dirname "$0")/gold.patch"; exit 0;; esac
exec /usr/bin/git "$@"
"""
REPLACED = {
    "base64-fails": ("base64", "#!/bin/sh\nexit 1\n"),
    "tail-fails": ("tail", "#!/bin/sh\nexit 1\n"),
    "stat-says-0-bytes": ("stat", "#!/bin/sh\necho 0\n"),
    "git-fails": ("git", "#!/bin/sh\nexit 1\n"),
}


@pytest.mark.parametrize("name", sorted(REPLACED))
def test_replaced_programs_in_the_agents_sandbox_change_nothing(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path, name: str
) -> None:
    """Once the patch was read back with the agent's ``stat``, ``tail`` and ``base64`` and made
    by its ``git``: replaced, they made a fixed repository an infrastructure failure (base64,
    tail) or a 0 (stat, git). The tree the agent left is what is graded."""
    task = _checking_task(shipped)
    fake_bin = tmp_path / "agent-bin"
    fake_bin.mkdir()
    program, text = REPLACED[name]
    (fake_bin / program).write_text(text)
    (fake_bin / program).chmod(0o755)
    sandbox = AgentSandbox(testbed, fake_bin)
    task.setup(SubprocessSandbox(testbed))
    for command in task.reference_solution():
        assert SubprocessSandbox(testbed).execute(command, timeout=30).exit_code == 0
    grade = task.grade(sandbox, GradingContext(FreshSandboxes(tmp_path, task)))
    assert (grade.reward, grade.infra_failure) == (1.0, False), grade.details


def test_a_steered_git_emitting_the_gold_patch_scores_zero(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """A ``git`` of the agent's that answers every diff with a passing patch its tree does not
    hold scored 1.0: the graded patch was the agent's program's output, not its work."""
    task = _checking_task(shipped)
    fake_bin = tmp_path / "agent-bin"
    fake_bin.mkdir()
    (fake_bin / "git").write_text(STEERED_GIT)
    (fake_bin / "git").chmod(0o755)
    (fake_bin / "gold.patch").write_text(task.instance.patch)
    task.setup(SubprocessSandbox(testbed))
    grade = task.grade(
        AgentSandbox(testbed, fake_bin), GradingContext(FreshSandboxes(tmp_path, task))
    )
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details
    assert grade.details["tests_status"]["FAIL_TO_PASS"]["failure"], grade.details


class NoCommands(SubprocessSandbox):
    """The episode's sandbox once the agent's turn is over: a command run there fails the
    test (grading may only use the engine: ``stop_processes``, ``export_folder``)."""

    def __init__(self, root: Path) -> None:
        super().__init__(root)
        self.stopped = False

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        raise AssertionError(f"grading ran {cmd!r} in the agent's sandbox")

    def stop_processes(self) -> None:
        self.stopped = True


def test_grading_runs_nothing_in_the_agents_sandbox_and_stops_its_processes(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    task = _checking_task(shipped)
    setup = SubprocessSandbox(testbed)
    task.setup(setup)
    for command in task.reference_solution():
        assert setup.execute(command, timeout=30).exit_code == 0
    sandbox = NoCommands(testbed)
    grade = task.grade(sandbox, GradingContext(FreshSandboxes(tmp_path, task)))
    assert (grade.reward, grade.infra_failure) == (1.0, False), grade.details
    assert sandbox.stopped


@pytest.mark.parametrize("broken", ["git-folder-is-a-file", "patch-over-the-limit"])
def test_what_the_agent_breaks_is_its_zero_with_the_reason(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path, broken: str
) -> None:
    sandbox = SubprocessSandbox(testbed)
    shipped.setup(sandbox)
    if broken == "git-folder-is-a-file":
        sandbox.execute("rm -rf /testbed/.git && echo 'gitdir: /elsewhere' > /testbed/.git", 10)
    else:
        (testbed / "noise.bin").write_bytes(random.Random(0).randbytes(14 * 1024 * 1024))
    fresh = FreshSandboxes(tmp_path, shipped)
    grade = shipped.grade(sandbox, GradingContext(fresh))
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details
    expected = ".git is missing, not a folder" if broken.startswith("git") else "over 16777216"
    assert expected in grade.details["agent_failure"], grade.details
    assert all(made.closed for made in fresh.made)
