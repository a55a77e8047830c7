"""Tasks of several steps played in one episode (Harbor's multi-step tasks): what ``ShellEnv``
asks of such a task.

A stepped task's episode plays its steps in order in one sandbox. ``reset`` shows step 0's
instruction (the task's ``setup`` prepared step 0). When the agent submits, the env grades the
step with ``step_task(i).grade`` (the same grading as a one-step task, strict rules included);
unless that was the last step, an infrastructure failure, or ``stop_after`` names a reason (the
task's gate), ``start_step(sandbox, i + 1)`` prepares the next step in the same sandbox and its
instruction is the observation, the next user turn (reward 0, the episode goes on). An episode
that ends otherwise (turn or time limit, format errors, a full context) grades the step it was
in and plays no more. The episode's grade is ``combine_steps`` of the graded steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from environments.sandboxes.protocol import Sandbox
from environments.tasks import Grade, Task


class StepSetupFailed(Exception):
    """Preparing a step in the episode's sandbox ran but failed (a ``setup.sh`` exited
    non-zero in the state the agent left): the episode stops there, scored on the steps graded
    before it. A SandboxError instead is an infrastructure failure."""


class SteppedTask(Protocol):
    """What a task of several steps adds to ``environments.tasks.Task``."""

    @property
    def num_steps(self) -> int:
        """How many steps the episode may play (0: a one-step task)."""
        ...

    def step_task(self, index: int) -> Task:
        """Step ``index`` as a task: its instruction, per-command timeout and ``grade``."""
        ...

    def start_step(self, sandbox: Sandbox, index: int) -> None:
        """Prepare step ``index`` (from 1) in the episode's sandbox after step ``index - 1``
        was graded: raises StepSetupFailed or SandboxError."""
        ...

    def stop_after(self, index: int, grade: Grade) -> str | None:
        """Why the episode stops after step ``index`` graded ``grade`` (its gate), or None."""
        ...

    def combine_steps(
        self, grades: Sequence[Grade], stopped: str | None, *, gated: bool = False
    ) -> Grade:
        """The episode's grade from its graded steps (in order); ``stopped``: why the
        episode ended before its last step, if it did; ``gated``: a step's gate stopped it
        (then the steps never played do not count; otherwise they score 0)."""
        ...


def stepped(task: object) -> SteppedTask | None:
    """``task`` as a stepped task when it has steps, else None (a one-step task)."""
    num_steps = getattr(task, "num_steps", 0)
    if isinstance(num_steps, int) and num_steps > 0 and callable(getattr(task, "step_task", None)):
        return task  # type: ignore[return-value]
    return None
