"""Who failed decides the label, with real sandboxes and the real eval script (pytest and all),
in bubblewrap and (marked ``docker``) Docker: a log that never reached the tests because of
the agent's code is its 0, found by a control run of the same script on the base commit, run
once per instance (docs/design.md §6.1, principle 3). Host stand-in versions, with the export
and log-size cases: tests/unit/environments/swebench/test_swebench_labels.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from environments.proof import reference
from environments.sandboxes import Sandbox, make_sandbox
from environments.swebench import SWEBenchTask, load_instances, tree_audit
from environments.swebench.control_run import CONTROL_RUNS
from environments.tasks import Grade, GradingContext

FIXTURES = Path(__file__).resolve().parents[2] / "environments/fixtures/swebench"
TASK = load_instances(FIXTURES).get("thundersync__intervals-1")

TRUNCATE_THE_LOG = (
    "printf '%s\\n' 'import os' "
    "\"open('/proc/%d/fd/1' % os.getppid(), 'w').close()\" >> intervals/ops.py"
)
"""The code under test, imported by pytest's collection, reopens its parent's standard output
(the eval log) for writing: the log is emptied, its start marker with it."""
KILL_THE_EVAL_SCRIPT = (
    "printf '%s\\n' 'import os, signal' 'os.kill(os.getppid(), signal.SIGKILL)' > setup.py"
)
"""A ``setup.py`` that kills whatever runs it: the eval script's install step."""


@pytest.fixture(autouse=True)
def _no_control_outcomes_between_tests() -> Iterator[None]:
    CONTROL_RUNS.clear()
    yield
    CONTROL_RUNS.clear()


def with_install_step(task: SWEBenchTask) -> SWEBenchTask:
    """The instance with an install step before the test files are reset, as official eval
    scripts have (``python -m pip install -e .`` runs ``setup.py`` just the same)."""
    script = task.instance.eval_script
    at = script.index(f"git checkout {task.instance.base_commit} ")
    step = "if [ -f setup.py ]; then python3 setup.py develop; fi\n"
    return SWEBenchTask(replace(task.instance, eval_script=script[:at] + step + script[at:]))


def reference_runs_in(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Strict grading's reference runs cached in ``folder`` alone: none is known yet."""
    monkeypatch.setenv(reference.CACHE_VARIABLE, str(folder / "reference-runs"))
    monkeypatch.setattr(reference, "_memory", {})


def graded(task: SWEBenchTask, kind: str, command: str) -> tuple[Grade, int]:
    """Run ``command`` in a set-up sandbox and grade it strictly; the grade and how many fresh
    sandboxes grading made."""
    sandbox = make_sandbox(task.sandbox_spec(kind), kind=kind)
    made: list[Sandbox] = []

    def fresh() -> Sandbox:
        made.append(make_sandbox(task.sandbox_spec(kind), kind=kind))
        return made[-1]

    try:
        task.setup(sandbox)
        result = sandbox.execute(command, timeout=60)
        assert result.exit_code == 0, result.output
        grade = task.grade(sandbox, GradingContext(fresh, sandbox_kind=kind))
    finally:
        sandbox.close()
        for each in made:
            each.close()
    return grade, len(made)


@pytest.mark.parametrize(
    ("case", "command"),
    [("truncated-log", TRUNCATE_THE_LOG), ("killed-at-install", KILL_THE_EVAL_SCRIPT)],
)
def test_a_log_the_agents_code_stopped_is_its_zero(
    kind: str, case: str, command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both logs lack the start marker, which once made the episode an infrastructure
    failure; the control run on the base commit reaches the tests, so it is the agent's 0.
    A second attempt reuses the control's outcome and the reference run's standard (one
    fresh sandbox, not three)."""
    task = with_install_step(TASK)
    reference_runs_in(tmp_path, monkeypatch)  # the first attempt runs the gold patch's
    for attempt, sandboxes in ((1, 3), (2, 1)):
        grade, made = graded(task, kind, command)
        assert (grade.reward, grade.infra_failure) == (0.0, False), (attempt, grade.details)
        assert "did not reach the tests" in grade.details["agent_failure"], grade.details
        assert grade.details["control_run"] == "reached the tests"
        assert made == sandboxes, f"attempt {attempt}: {made} fresh sandboxes"


CONFIG_TEXT_PAST_THE_RECORD = (
    'python3 -c "import os\n'
    "for i in range(24):\n"
    "    os.makedirs('data/d%d' % i)\n"
    "    open('data/d%d/setup.cfg' % i, 'wb').write(b'\\\\1' * 64 * 1024)\""
)
"""1.5 MB of config files whose text the tree record keeps (64 KiB each of a control
character, which JSON writes in 6 bytes; binary: the patch stays small): the record of the
tree as the patch left it, past its cap. The cap is ``SMALL_RECORD`` here; the real one
(``MAX_RECORD_BYTES``, 24 MiB) took the red team's 78 MB, a minute and a half in Docker, and
the recorder's accounting at it is tested in tests/unit/environments/swebench/
test_swebench_tree_audit.py."""
SMALL_RECORD = 1 << 20
FOLDERS_1100_DEEP = (
    "mkdir -p $(printf 'd/%.0s' $(seq 1100)) && touch $(printf 'd/%.0s' $(seq 1100))f"
)
"""A file 1,100 folders down: the recorder's ``os.walk`` recursed (Python before 3.12) and died."""


@pytest.mark.parametrize(
    ("case", "command"),
    [("config-text", CONFIG_TEXT_PAST_THE_RECORD), ("deep-tree", FOLDERS_1100_DEEP)],
)
def test_a_tree_past_what_the_recorder_holds_is_the_agents_zero(
    kind: str, case: str, command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The tree is recorded once the agent's patch is applied, before the eval script: what
    its files make the recorder do is the agent's doing. Both made the attempt an
    infrastructure failure (red team, 2026-12-07); a tree past the record's caps is now
    flagged (a change there could hide), one only deep is recorded like any other."""
    monkeypatch.setattr(tree_audit, "MAX_RECORD_BYTES", SMALL_RECORD)
    grade, _ = graded(TASK, kind, command)
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details
    capped = [r for r in grade.details["tamper_reasons"] if "more files or config text" in r]
    assert bool(capped) == (case == "config-text"), grade.details["tamper_reasons"]
