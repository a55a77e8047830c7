"""Who failed decides the label (docs/design.md §6.1, principles 3 and 4), on a host stand-in
for sandboxes: once the agent's code has run, nothing read from what it could reach may make an
episode an infrastructure failure (excluded from training, so the failure would be hidden from
RL). The agent's repository, ``.git`` included, leaves its sandbox through one error map; an
eval log too large to read is its 0 with the log's tail; a log that never reached the tests is
an infrastructure failure only when a control run of the same script on the base commit fails
too (run once per instance)."""

from __future__ import annotations

import errno
import os
import subprocess
from collections.abc import Collection, Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from environments.sandboxes.protocol import ExportTooLarge, SandboxError
from environments.swebench import SWEBenchTask, load_instances
from environments.swebench import task as swebench_task
from environments.swebench.control_run import CONTROL_RUNS
from environments.swebench.patch import AgentFailure, export_repo
from environments.tasks import Grade, GradingContext
from tests.unit.environments.swebench.host_sandbox import FreshSandboxes, SubprocessSandbox

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURES = REPO_ROOT / "environments/fixtures/swebench"
START = ": '>>>>> Start Test Output'"
END = ": '>>>>> End Test Output'"


@pytest.fixture(autouse=True)
def _no_control_outcomes_between_tests() -> Iterator[None]:
    """Control outcomes are cached per process; each test starts from none."""
    CONTROL_RUNS.clear()
    yield
    CONTROL_RUNS.clear()


@pytest.fixture
def shipped() -> SWEBenchTask:
    return load_instances(FIXTURES).get("thundersync__intervals-1")


@pytest.fixture
def testbed(tmp_path: Path, shipped: SWEBenchTask) -> Path:
    root = tmp_path / "testbed"
    subprocess.run(["cp", "-r", str(shipped.instance.repo_snapshot), str(root)], check=True)
    return root


def summary(task: SWEBenchTask, failing: Collection[str] = ()) -> str:
    """Shell lines printing a pytest-style result for every test of the task."""
    tests = task.instance.fail_to_pass + task.instance.pass_to_pass
    return "\n".join(f"echo '{'FAILED' if t in failing else 'PASSED'} {t}'" for t in tests)


def with_script(task: SWEBenchTask, script: str) -> SWEBenchTask:
    return SWEBenchTask(replace(task.instance, eval_script=script))


def grade(task: SWEBenchTask, sandbox: SubprocessSandbox, fresh: FreshSandboxes) -> Grade:
    return task.grade(sandbox, GradingContext(fresh))


def set_up(task: SWEBenchTask, testbed: Path) -> SubprocessSandbox:
    sandbox = SubprocessSandbox(testbed)
    task.setup(sandbox)
    return sandbox


# --- 1, 2: one error map for every export of the agent's repository --------------------------


class FailingExport(SubprocessSandbox):
    """The agent's sandbox, whose engine fails with ``error`` archiving ``.git`` or the work
    tree (``fails``); the other export works."""

    def __init__(self, root: Path, error: Exception, fails: str) -> None:
        super().__init__(root)
        self.error, self.fails = error, fails

    def export_folder(self, path: str, dst: Path, *, exclude: Collection[str] = ()) -> None:
        if path.endswith("/.git") == (self.fails == ".git"):
            raise self.error
        super().export_folder(path, dst, exclude=exclude)


@pytest.mark.parametrize("fails", [".git", "tree"])
@pytest.mark.parametrize(
    ("error", "agents"),
    [
        (OSError(errno.ENAMETOOLONG, "File name too long"), True),
        (OSError(errno.ELOOP, "Too many levels of symbolic links"), True),
        (ExportTooLarge("over the limit"), True),
        (PermissionError(errno.EACCES, "Permission denied"), True),
        (OSError(errno.EIO, "Input/output error"), False),
        (OSError(errno.ENOSPC, "No space left on device"), False),
    ],
    ids=["name-too-long", "link-loop", "too-large", "unreadable", "host-io", "host-disk"],
)
def test_every_export_of_the_repository_maps_errors_alike(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path, fails: str, error: Exception, agents: bool
) -> None:
    """``.git`` and the work tree are both agent-reachable state: what the agent's names,
    links and sizes cause is its failure in either, the host's failures are infrastructure."""
    set_up(shipped, testbed)
    host = tmp_path / "host"
    host.mkdir()
    with pytest.raises(AgentFailure if agents else SandboxError):
        export_repo(FailingExport(testbed, error, fails), "/testbed", host)


def test_sparse_file_in_git_past_the_export_limit_is_the_agents_zero(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """A 3 GiB sparse file (no disk used) in ``.git``: over ``MAX_EXPORT_BYTES`` of file data
    as an archive holds it. The work tree's export already scored this 0; ``.git``'s raised."""
    sandbox = set_up(shipped, testbed)
    with open(testbed / ".git/sparse.bin", "wb") as sparse:
        sparse.truncate(3 * 1024**3)
    fresh = FreshSandboxes(tmp_path, shipped)
    graded = grade(shipped, sandbox, fresh)
    assert (graded.reward, graded.infra_failure) == (0.0, False), graded.details
    assert "bytes of file data" in graded.details["agent_failure"], graded.details


def test_folder_names_in_git_past_the_path_limit_are_the_agents_zero(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """24 nested folders of 200-character names in ``.git`` pass the host's 4096-byte path
    limit (``ENAMETOOLONG``): the agent's doing, as the same folders in the work tree are."""
    sandbox = set_up(shipped, testbed)
    fd = os.open(testbed / ".git", os.O_RDONLY)
    try:
        for _ in range(24):
            os.mkdir("d" * 200, dir_fd=fd)
            inner = os.open("d" * 200, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
    finally:
        os.close(fd)
    graded = grade(shipped, sandbox, FreshSandboxes(tmp_path, shipped))
    assert (graded.reward, graded.infra_failure) == (0.0, False), graded.details
    assert "File name too long" in graded.details["agent_failure"], graded.details


# --- 3: an eval log too large to read --------------------------------------------------------


def test_an_oversized_eval_log_is_the_agents_zero_with_its_tail(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """A wrong fix's debug print in a loop: a ~70 MB log, over what grading reads (64 MiB).
    The agent's 0 (its code printed it), with the log's last lines kept, read alone."""
    failing = {shipped.instance.fail_to_pass[0]}
    script = (
        f"{START}\nyes 'debug: merged = [(1, 3), (3, 5)]' | head -c 70000000\n"
        f"{summary(shipped, failing)}\nfalse\n{END}\n"
    )
    task = with_script(shipped, script)
    sandbox = set_up(task, testbed)
    fresh = FreshSandboxes(tmp_path, task)
    graded = grade(task, sandbox, fresh)
    assert (graded.reward, graded.infra_failure) == (0.0, False), graded.details
    assert "over 67108864" in graded.details["agent_failure"], graded.details
    tail = graded.details["log_tail"]
    assert f"FAILED {shipped.instance.fail_to_pass[0]}" in tail and len(tail) <= 2000
    reads = [c for c in fresh.made[0].commands if "base64 -w0" in c and "test_output" in c]
    assert len(reads) <= 4, f"{len(reads)} reads of the log: its tail alone is read"


# --- 4, 5: a log that never reached the tests ------------------------------------------------

TRUNCATES_ITS_LOG = (
    "\nimport os\n\n"
    "open('/proc/%d/fd/1' % os.getppid(), 'w').close()  # reopens the log: truncates it\n"
)
"""Appended to ``intervals/ops.py``: imported by the tests, it reopens its parent's standard
output, the eval log, for writing, which empties it (the start marker with it)."""


def truncating_task(shipped: SWEBenchTask) -> SWEBenchTask:
    """The tests import the code under test (after the start marker) and fail."""
    failing = {shipped.instance.fail_to_pass[0]}
    script = (
        f"{START}\npython3 -c 'import intervals.ops'\n{summary(shipped, failing)}\nfalse\n{END}\n"
    )
    return with_script(shipped, script)


def test_code_under_test_truncating_its_log_is_the_agents_zero(
    shipped: SWEBenchTask, tmp_path: Path
) -> None:
    """No start marker in the log, yet the same script on the base commit (a control run,
    without the agent's patch) reaches the tests: the agent's code removed it. The control's
    outcome belongs to the instance: a second attempt runs none."""
    task = truncating_task(shipped)
    fresh = FreshSandboxes(tmp_path / "fresh", task)
    for attempt in range(2):
        root = tmp_path / f"testbed-{attempt}"
        subprocess.run(["cp", "-r", str(shipped.instance.repo_snapshot), str(root)], check=True)
        sandbox = set_up(task, root)
        with open(root / "intervals/ops.py", "a") as ops:
            ops.write(TRUNCATES_ITS_LOG)
        graded = grade(task, sandbox, fresh)
        assert (graded.reward, graded.infra_failure) == (0.0, False), graded.details
        assert "did not reach the tests" in graded.details["agent_failure"], graded.details
        assert "control run" in graded.details["agent_failure"], graded.details
        assert len(fresh.made) == 2 + attempt, "one control run for the instance, then none"
        assert all(made.closed for made in fresh.made)


def test_a_log_line_swebench_cannot_parse_printed_by_the_agents_code_is_its_zero(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """The code under test prints an exit-code line of 5,000 digits, which swebench's parser
    raises on (it takes the first such line): the base commit's log parses, so it is the
    agent's 0, not an infrastructure failure."""
    script = f"{START}\npython3 -c 'import intervals.ops'\n{summary(shipped)}\n{END}\n"
    task = with_script(shipped, script)
    sandbox = set_up(task, testbed)
    with open(testbed / "intervals/ops.py", "a") as ops:
        ops.write("print('>>>>> Test Exit Code: ' + '9' * 5000)\n")
    fresh = FreshSandboxes(tmp_path, task)
    graded = grade(task, sandbox, fresh)
    assert (graded.reward, graded.infra_failure) == (0.0, False), graded.details
    assert "could not parse the eval log" in graded.details["agent_failure"], graded.details
    assert graded.details["control_run"] == "reached the tests"


def test_test_files_the_agents_patch_keeps_from_being_restored_are_its_zero(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Strict grading restores the task's test files over the agent's patch; a restore that
    failed there raised, an infrastructure failure whoever caused it (a global git
    attributes file the patch wrote: red team, 2026-12-07). A control run decides: here the
    restore fails only where the agent's file is (a stand-in for what its patch can do)."""
    monkeypatch.setattr(
        swebench_task, "restore_command", lambda instance, tb: f"test ! -e {tb}/BREAKS_RESTORE"
    )
    task = with_script(shipped, f"{START}\n{summary(shipped)}\n{END}\n")
    sandbox = set_up(task, testbed)
    (testbed / "BREAKS_RESTORE").write_text("")
    fresh = FreshSandboxes(tmp_path, task)
    graded = task.grade(sandbox, GradingContext(fresh, strict=True))
    assert (graded.reward, graded.infra_failure) == (0.0, False), graded.details
    assert "restoring the task's test files failed" in graded.details["agent_failure"]
    assert graded.details["control_run"] == "reached the tests"


def test_setup_py_killing_the_eval_script_at_install_is_the_agents_zero(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """Official layout: an install step runs the repository's ``setup.py`` before the start
    marker. The agent's kills the eval script there; without the agent's patch the script
    reaches the tests."""
    script = (
        "if [ -f setup.py ]; then python3 setup.py develop; fi\n"
        f"{START}\n{summary(shipped)}\n{END}\n"
    )
    task = with_script(shipped, script)
    sandbox = set_up(task, testbed)
    (testbed / "setup.py").write_text(
        "import os, signal\n\nos.kill(os.getppid(), signal.SIGKILL)\n"
    )
    fresh = FreshSandboxes(tmp_path, task)
    graded = grade(task, sandbox, fresh)
    assert (graded.reward, graded.infra_failure) == (0.0, False), graded.details
    assert "did not reach the tests" in graded.details["agent_failure"], graded.details
    assert len(fresh.made) == 2


@pytest.mark.parametrize("broken", ["no-start-marker", "test-patch-fails"])
def test_an_instance_broken_without_the_agent_stays_infrastructure(
    shipped: SWEBenchTask, tmp_path: Path, broken: str
) -> None:
    """When the control run on the base commit fails the same way, the instance (or the
    machine) is at fault, whatever the agent did: an infrastructure failure, as before. The
    control runs once for the instance."""
    if broken == "no-start-marker":
        script = f"exit 3\n{START}\n{summary(shipped)}\n{END}\n"
        expected = "did not reach the tests"
    else:
        script = (
            "echo 'error: patch failed: tests/test_ops.py:27'\n"
            f"{START}\n{summary(shipped)}\n{END}\n"
        )
        expected = "test patch did not apply"
    task = with_script(shipped, script)
    fresh = FreshSandboxes(tmp_path / "fresh", task)
    for attempt in range(2):
        root = tmp_path / f"testbed-{attempt}"
        subprocess.run(["cp", "-r", str(shipped.instance.repo_snapshot), str(root)], check=True)
        sandbox = set_up(task, root)
        for command in task.reference_solution():
            assert sandbox.execute(command, timeout=30).exit_code == 0
        graded = grade(task, sandbox, fresh)
        assert (graded.reward, graded.infra_failure) == (0.0, True), graded.details
        assert expected in graded.details["error"], graded.details
        assert expected in graded.details["control_run"], graded.details
        assert len(fresh.made) == 2 + attempt


def test_a_control_that_cannot_run_is_not_remembered(
    shipped: SWEBenchTask, testbed: Path, tmp_path: Path
) -> None:
    """A control run the machine failed (its sandbox did not set up) is an infrastructure
    failure of this grading, and is run again next time rather than cached."""
    task = truncating_task(shipped)
    sandbox = set_up(task, testbed)
    with open(testbed / "intervals/ops.py", "a") as ops:
        ops.write(TRUNCATES_ITS_LOG)
    fresh = FreshSandboxes(tmp_path / "fresh", task)

    def second_fails() -> SubprocessSandbox:
        made = fresh()
        if len(fresh.made) == 2:  # the control's: drifted from the base commit
            (made.root / "README.md").write_text("drifted\n")
        return made

    first = task.grade(sandbox, GradingContext(second_fails))
    assert first.infra_failure and "expected base_commit" in first.details["error"], first.details
    again = grade(task, sandbox, fresh)
    assert (again.reward, again.infra_failure) == (0.0, False), again.details
    assert len(fresh.made) == 4
