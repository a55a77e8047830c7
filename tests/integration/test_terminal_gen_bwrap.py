"""Generated Harbor tasks (thundersync/TerminalGen-v0) run for real in bubblewrap and graded
strictly in a fresh sandbox: the folder's solve.sh scores 1, doing nothing scores 0, and the
env's own two-action play (what warm start imitates) scores 1 while a wrong answer scores 0."""

from __future__ import annotations

import shutil
from pathlib import Path

import gymnasium
import pytest

import environments  # noqa: F401  (registers the built-in envs)
from environments.actions import format_action
from environments.agents import SUBMIT_ACTION
from environments.sandboxes import Sandbox, make_sandbox
from environments.tasks import Grade, GradingContext
from environments.terminal_bench.generated import load_generated_task, materialize, task_spec
from environments.terminal_bench.harbor import load_harbor_task

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap not installed")


def strict_grade(task_dir: Path, commands: list[str]) -> Grade:
    """Run ``commands`` in a bwrap sandbox of the Harbor folder and grade strictly."""
    task = load_harbor_task(task_dir)
    made: list[Sandbox] = []

    def fresh() -> Sandbox:
        made.append(make_sandbox(task.sandbox_spec("bwrap"), kind="bwrap"))
        return made[-1]

    try:
        sandbox = fresh()
        task.setup(sandbox)
        for command in commands:
            done = sandbox.execute(command, timeout=task.timeout_s)
            assert done.exit_code == 0, done.output[-2000:]
        return task.grade(sandbox, GradingContext(fresh_sandbox=fresh, strict=True))
    finally:
        for sandbox in made:
            sandbox.close()


@pytest.mark.parametrize("index", [3, 5, 6, 8])  # sum-column (awk), unique-words, max-number
# (compare-terminal's two families), find-file (a path answer)
def test_solve_sh_scores_one_and_nothing_scores_zero(tmp_path: Path, index: int) -> None:
    folder = materialize(index, tmp_path)
    oracle = load_harbor_task(folder).reference_solution()  # solve.sh, packed as Harbor runs it
    graded = strict_grade(folder, oracle)
    assert (graded.reward, graded.infra_failure) == (1.0, False), graded.details
    assert graded.details["strict"] and not graded.details["tamper_suspected"]
    nop = strict_grade(folder, [])
    assert (nop.reward, nop.infra_failure) == (0.0, False), nop.details


def test_the_env_plays_inspect_then_answer_and_grades_strictly(tmp_path: Path) -> None:
    task = load_generated_task(0, cache_dir=tmp_path)  # count-lines
    spec = task_spec(0)
    env = gymnasium.make("thundersync/TerminalGen-v0", cache_dir=str(tmp_path))
    try:
        env.reset(options={"task": task})
        observation, *_ = env.step(format_action(task.reference_solution()[0]))
        assert observation.strip() == spec.answer  # the real grep's output
        env.step(format_action(task.reference_solution()[1]))
        _, reward, terminated, _, info = env.step(SUBMIT_ACTION)
        assert (terminated, reward, info["infra_failure"]) == (True, 1.0, False), info
        env.reset(options={"task": task})
        env.step(format_action(f"echo {int(spec.answer) + 1} > answer.txt"))
        _, reward, terminated, _, info = env.step(SUBMIT_ACTION)
        assert (terminated, reward, info["infra_failure"]) == (True, 0.0, False), info
    finally:
        env.close()
