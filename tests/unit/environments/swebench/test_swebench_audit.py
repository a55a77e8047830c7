"""Strict grading's audit: the task's test files, the test folders, git state, no false alarm
on any official gold patch, and the test files the official eval script fails to restore."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import replace
from pathlib import Path

import pytest

from environments.swebench import SWEBenchTask, load_instances
from environments.swebench.audit import (
    BaseTree,
    git_state_reasons,
    patch_reasons,
    restore_command,
    task_test_files,
    task_test_folders,
)
from environments.swebench.snapshot import make_eval_script, snapshot_commit
from environments.tasks import GradingContext
from tests.unit.environments.swebench.host_sandbox import FreshSandboxes

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURES = REPO_ROOT / "environments/fixtures/swebench"
DATA = Path(os.environ.get("THUNDERSYNC_SWEBENCH_DATA", REPO_ROOT.parent / "shared/data/swebench"))
OFFICIAL = [DATA / "SWE-bench_Verified.test.parquet", DATA / "SWE-bench_Lite.test.parquet"]


@pytest.fixture
def shipped() -> SWEBenchTask:
    return load_instances(FIXTURES).get("thundersync__intervals-1")


class NoBase:
    """A base tree known to hold nothing: every new path counts as new."""

    def exists(self, path: str) -> bool:
        return False

    def text(self, path: str) -> str | None:
        return None


def test_task_test_files_come_from_the_test_patch_and_pytest_ids(shipped: SWEBenchTask) -> None:
    instance = replace(
        shipped.instance,
        pass_to_pass=(
            "tests/test_other.py::test_a[x::y]",
            "test_name (admin_views.tests.AdminViewTests)",  # django: not a path
            "../escape.py::test_b",  # not inside the repository: ignored
            "-rf.py::test_c",
        ),
    )
    assert task_test_files(instance) == ("tests/test_ops.py", "tests/test_other.py")
    assert task_test_folders(["tests/admin/tests.py", "lib/pkg/tests/t.py", "test_root.py"]) == (
        "lib/pkg/tests",
        "tests",
    )


def test_git_state_reasons_flag_new_hooks_and_risky_config() -> None:
    fresh = {"config system\tfilter.lfs.clean=git-lfs clean -- %f", "config local\tcore.bare=false"}
    agent = fresh | {
        "hook pre-commit",
        "config local\tcore.hookspath=.agent-hooks",
        "config global\tinclude.path=/tmp/x",
        "config local\tuser.email=agent@example.invalid",
        "config local\tcore.pager=cat",
    }
    reasons = git_state_reasons(agent, fresh)
    assert len(reasons) == 3, reasons
    stuck = git_state_reasons({"stuck listing hooks and config (a fifo?)"}, fresh)
    assert stuck == [".git: stuck listing hooks and config (a fifo?)"]
    assert reasons[0].startswith("git config (global) include.path")
    assert reasons[1].startswith("git config (local) core.hookspath")
    assert reasons[2].startswith(".git/hooks/pre-commit: a git hook")


@pytest.mark.parametrize("path", OFFICIAL, ids=["verified", "lite"])
def test_no_official_gold_patch_is_suspected(path: Path) -> None:
    """The whole audit of the diff (shared rules, test files, test folders) on every gold
    patch: strict grading must not zero a real fix."""
    if not path.exists():
        warnings.warn(f"SKIPPED: {path} absent (set THUNDERSYNC_SWEBENCH_DATA)", stacklevel=1)
        pytest.skip(f"{path} absent")
    for task in load_instances(path):
        reasons = patch_reasons(task.instance, task.instance.patch, NoBase())  # type: ignore[arg-type]
        assert reasons == [], task.task_id


def test_test_files_the_eval_script_cannot_restore(shipped: SWEBenchTask, tmp_path: Path) -> None:
    """A test patch that creates a file: an agent creating it first makes the official script's
    ``git checkout <base> <files>`` fail as a whole (so its edits to the other test files stay)
    and the test patch fail to apply (so the agent's tests run instead). That scores 0 in
    both modes, and strict grading restores the files so that the task's own tests run."""
    new_test = "def test_touching():\n    from intervals.ops import merge\n"
    new_test += "    assert merge([(1, 3), (3, 5)]) == [(1, 5)]\n"
    test_patch = (
        "diff --git a/tests/test_new.py b/tests/test_new.py\nnew file mode 100644\n"
        "--- /dev/null\n+++ b/tests/test_new.py\n@@ -0,0 +1,3 @@\n"
        + "".join(f"+{line}\n" for line in new_test.splitlines())
    )
    files = ["tests/test_ops.py", "tests/test_new.py"]
    command = f"{sys.executable} -m pytest -rA -p no:cacheprovider {' '.join(files)}"
    instance = replace(
        shipped.instance,
        test_patch=test_patch,
        fail_to_pass=("tests/test_new.py::test_touching",),
        eval_script=make_eval_script(
            base_commit=shipped.instance.base_commit,
            test_patch=test_patch,
            test_files=files,
            test_command=command,
        ),
    )
    task = SWEBenchTask(instance)
    fake = "def test_touching():\n    pass\n"
    for strict in (False, True):
        root = tmp_path / f"strict-{strict}"
        sandbox = FreshSandboxes(root, task)()
        task.setup(sandbox)
        (sandbox.root / "tests" / "test_new.py").write_text(fake)
        grade = task.grade(sandbox, GradingContext(FreshSandboxes(root, task), strict=strict))
        assert grade.reward == 0.0 and not grade.infra_failure, grade.details
        assert grade.details["tamper_suspected"] is True
        assert any("tests/test_new.py: a test file" in r for r in grade.details["tamper_reasons"])
        if strict:  # the task's own test ran, and failed on the unfixed code
            status = grade.details["tests_status"]
            assert status["FAIL_TO_PASS"]["failure"] == ["tests/test_new.py::test_touching"]
        else:
            assert "test patch did not apply" in grade.details["error"]


def test_strict_grading_restores_pass_to_pass_files_outside_the_test_patch(
    shipped: SWEBenchTask, tmp_path: Path
) -> None:
    """A PASS_TO_PASS test in a file the test patch does not touch: the official script runs
    the agent's version of it, so a fix that breaks it and rewrites it resolves; strict
    grading runs the task's version (and flags the edit)."""
    snapshot = tmp_path / "repo"
    shutil.copytree(shipped.instance.repo_snapshot, snapshot)
    other = "from intervals.ops import merge\n\n\ndef test_empty():\n"
    (snapshot / "tests" / "test_other.py").write_text(other + "    assert merge([]) == []\n")
    commit = snapshot_commit(snapshot)
    command = f"{sys.executable} -m pytest -rA -p no:cacheprovider tests"
    instance = replace(
        shipped.instance,
        base_commit=commit,
        repo_snapshot=snapshot,
        pass_to_pass=(*shipped.instance.pass_to_pass, "tests/test_other.py::test_empty"),
        eval_script=make_eval_script(
            base_commit=commit,
            test_patch=shipped.instance.test_patch,
            test_files=["tests/test_ops.py"],
            test_command=command,
        ),
    )
    task = SWEBenchTask(instance)
    for strict in (False, True):
        agent = FreshSandboxes(tmp_path / f"agent-{strict}", task)()
        task.setup(agent)
        for command in task.reference_solution():
            assert agent.execute(command, timeout=60).exit_code == 0
        ops = agent.root / "intervals" / "ops.py"
        broken = "\n\n_merge = merge\n\n\ndef merge(intervals):\n"
        ops.write_text(ops.read_text() + broken + "    return _merge(intervals) or None\n")
        (agent.root / "tests" / "test_other.py").write_text(other + "    pass\n")
        fresh = FreshSandboxes(tmp_path / f"fresh-{strict}", task)
        grade = task.grade(agent, GradingContext(fresh, strict=strict))
        assert not grade.infra_failure, grade.details
        assert grade.reward == (0.0 if strict else 1.0), grade.details
        status = grade.details["tests_status"]["PASS_TO_PASS"]
        assert ("tests/test_other.py::test_empty" in status["failure"]) is strict
        assert any("tests/test_other.py: a test file" in r for r in grade.details["tamper_reasons"])


def test_the_base_tree_is_listed_once_whatever_the_number_of_paths_asked(tmp_path: Path) -> None:
    """A diff of 40000 new empty files asked git about each, one sandbox command apiece, and
    kept grading busy for hours (red team, 2026-12-07): the base commit is listed once."""
    import subprocess

    from environments.sandboxes.protocol import SandboxSpec
    from tests.unit.environments.shell_fakes import LocalSandbox

    sandbox = LocalSandbox(SandboxSpec())
    try:
        git = "git -c user.email=a@b.c -c user.name=a"
        made = sandbox.execute(
            f"git init -q . && mkdir -p pkg/sub && touch pkg/__init__.py pkg/sub/mod.py "
            f"'odd name.py' && {git} add -A && {git} commit -qm base && git rev-parse HEAD",
            30,
        )
        assert made.exit_code == 0, made.output
        commit = made.output.strip().splitlines()[-1]
        subprocess.run(["touch", f"{sandbox.workdir}/new.py"], check=True)  # not in the commit
        base = BaseTree(sandbox, commit, scratch=sandbox.workdir)
        before = len(sandbox.commands)
        asked = [f"junk/d{i}/f{i}.py" for i in range(2000)]
        assert not any(base.exists(path) for path in asked)
        for path in ("pkg", "pkg/", "pkg/__init__.py", "pkg/sub/mod.py", "odd name.py"):
            assert base.exists(path), path
        assert not base.exists("new.py") and not base.exists("pkg/nope.py")
        assert len(sandbox.commands) - before <= 4  # the listing, its size and its read
    finally:
        sandbox.close()


def test_the_restore_reads_no_global_git_configuration(
    shipped: SWEBenchTask, tmp_path: Path
) -> None:
    """In bubblewrap HOME is the work folder, so the agent's patch can write git's global
    files: a ``.config/git/attributes`` naming an encoding that does not exist made the strict
    restore's ``git checkout`` die, and the attempt an infrastructure failure (red team,
    2026-12-07). The restore reads the repository's configuration alone."""
    sandbox, home = FreshSandboxes(tmp_path / "fresh", shipped)(), tmp_path / "home"
    shipped.setup(sandbox)  # the repository at the base commit
    testbed = sandbox.root
    (home / ".config/git").mkdir(parents=True)
    (home / ".config/git/attributes").write_text("tests/* working-tree-encoding\n")
    (home / ".gitconfig").write_text("[core]\n\tattributesFile = ~/.config/git/attributes\n")
    (testbed / "tests/test_ops.py").write_text("changed\n")
    instance = shipped.instance
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    done = subprocess.run(
        ["bash", "-c", restore_command(instance, str(testbed))], env=env, capture_output=True
    )
    assert done.returncode == 0, done.stderr
    assert (testbed / "tests/test_ops.py").read_text() != "changed\n"
