"""An episode as a generator (``EpisodeRunner.episode``): it yields an ``ActionNeeded`` wherever
the agent's next action is due and is sent the ``Action`` (or thrown what producing it raised).
``drive`` runs one to its end on this thread; ``thundersync.training.episodes`` advances many as
coroutines on one loop, asking the policy for their actions in batches."""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass

from environments.agents import Action, Agent, Message
from environments.tasks import Grade, Task
from thundersync.protocol.events import EpisodeStepGraded, Event
from thundersync.protocol.types import Trajectory

__all__ = ["ActionNeeded", "EpisodeSteps", "drive", "step_graded"]


@dataclass(frozen=True, slots=True)
class ActionNeeded:
    """What an episode generator (``EpisodeRunner.episode``) yields: the agent's next action,
    ``agent.act(task, messages, episode_id=episode_id)``, is due."""

    task: Task
    messages: Sequence[Message]
    episode_id: str
    instant_steps: bool = False
    """The env declares that its steps answer at once (``environments.core.INSTANT_STEPS``):
    a driver may advance the episode on its own thread, as no step waits on anything."""


EpisodeSteps = Generator[ActionNeeded, Action, Trajectory]


def drive(steps: EpisodeSteps, agent: Agent) -> Trajectory:
    """Run an episode generator to its end on this thread, asking ``agent`` for each action
    (what ``act`` raises is thrown into the episode, where the call would have raised it)."""
    try:
        need = next(steps)
        while True:
            error: BaseException | None = None
            try:
                action = agent.act(need.task, need.messages, episode_id=need.episode_id)
            except BaseException as exc:
                error = exc
            # Thrown outside the handler, so that what the episode raises next does not carry
            # the agent's exception as its context.
            need = steps.throw(error) if error is not None else steps.send(action)
    except StopIteration as stop:
        return stop.value
    finally:
        steps.close()  # an interrupt between two calls still closes the episode's env


def step_graded(publish: Callable[[Event], None], episode_id: str) -> Callable[[int, Grade], None]:
    """``ShellEnv``'s ``step_graded`` option: each step of a multi-step task, once graded,
    published as an ``EpisodeStepGraded``."""

    def graded(index: int, grade: Grade) -> None:
        reward, failed = float(grade.reward), grade.infra_failure
        publish(
            EpisodeStepGraded(
                episode_id=episode_id, step=index, reward=reward, infra_failure=failed
            )
        )

    return graded
