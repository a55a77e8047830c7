"""Groups of episodes on a bounded pool of threads (``EpisodeRunner.run_groups``): what
evaluation and scripted agents use; training plays episodes as coroutines instead
(``thundersync.training.episodes``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import gymnasium
import numpy as np

from environments.tasks import TRAIN, Task, TaskSource
from thundersync.protocol.types import Trajectory


class GroupRunner(Protocol):
    """What ``run_groups`` asks of its runner (``environments.runner.EpisodeRunner``)."""

    max_concurrency: int
    tasks: TaskSource | None
    make_env: Callable[[], gymnasium.Env[Any, Any]]

    def new_group_id(self) -> str: ...

    def cancel(self, reason: str = ...) -> None: ...

    def run_episode(
        self,
        task: Task | None = ...,
        *,
        group_id: str | None = ...,
        group_size: int = ...,
        seed: int | None = ...,
    ) -> Trajectory: ...


def run_groups(
    runner: GroupRunner,
    tasks: Sequence[Task | None],
    group_size: int,
    *,
    seed: int | None = None,
) -> list[list[Trajectory]]:
    """One group of ``group_size`` episodes per task, all on a pool of the runner's
    ``max_concurrency`` threads.

    Results come back per group in ``tasks`` order. A None task is drawn from the env with
    a generator seeded from ``seed``, so every episode of a group plays the same task.
    """
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    rng = np.random.default_rng(seed)
    jobs = []
    for task in tasks:
        chosen = task if task is not None else _draw_task(runner, rng)
        group_id = runner.new_group_id()
        for _ in range(group_size):
            episode_seed = int(rng.integers(2**31))
            jobs.append((chosen, group_id, episode_seed))
    pool = ThreadPoolExecutor(max_workers=runner.max_concurrency)
    futures = [
        pool.submit(
            runner.run_episode, task, group_id=group_id, group_size=group_size, seed=episode_seed
        )
        for task, group_id, episode_seed in jobs
    ]
    try:
        results = [future.result() for future in futures]
    except BaseException as exc:
        # Ctrl-C, SIGTERM (the CLI turns it into SystemExit) or a sink error: running
        # episodes are cut short (their sandboxes closed now), queued ones never start, and
        # we wait for them so that every sandbox is removed before the exception leaves.
        for future in futures:
            future.cancel()  # first: cancelled episodes would end at once and drain the queue
        runner.cancel(type(exc).__name__)
        pool.shutdown(wait=True)
        raise
    pool.shutdown(wait=True)
    return [results[i : i + group_size] for i in range(0, len(results), group_size)]


def _draw_task(runner: GroupRunner, rng: np.random.Generator) -> Task:
    if runner.tasks is not None:
        return runner.tasks.draw(rng, TRAIN)
    env = runner.make_env()  # an env that only knows its tasks once made
    try:
        return env.get_wrapper_attr("draw_task")(rng)
    finally:
        env.close()
