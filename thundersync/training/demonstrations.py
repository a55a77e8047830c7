"""Warm start's demonstrations: drawn tasks' reference solutions played in the real env (a
fraction of them corrupted on purpose), recorded as chat messages (``thundersync.training
.warmstart`` fine-tunes on them)."""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Any, Protocol


class DemoConfig(Protocol):
    """What the demonstrations are drawn from (``thundersync.training.warmstart``'s
    ``WarmStartConfig``)."""

    @property
    def env(self) -> str: ...

    @property
    def env_kwargs(self) -> dict[str, Any] | None: ...

    @property
    def sandbox(self) -> str: ...

    @property
    def num_demos(self) -> int: ...

    @property
    def seed(self) -> int: ...


Demo = list[tuple[str, str]]
"""(role, text) messages: the instruction, then alternating actions and observations."""


Progress = Callable[[str, int, int], None]
"""``progress(phase, done, total)``: called as each demonstration and fine-tuning step ends."""


def no_progress(phase: str, done: int, total: int) -> None:
    pass


def collect_demos(
    config: DemoConfig,
    *,
    corrupt_fraction: float,
    first: int = 0,
    num_threads: int = 8,
    progress: Progress = no_progress,
    phase: str = "demonstrations",
) -> list[Demo]:
    """Play ``num_demos`` drawn tasks' reference solutions (``corrupt_fraction`` of them
    corrupted) in a real env; a function of the config's seed only (threads just overlap
    sandboxes)."""
    indices = range(first, first + config.num_demos)
    with ThreadPoolExecutor(num_threads) as pool:
        futures = [pool.submit(_demo, config, i, corrupt_fraction) for i in indices]
        for done, _ in enumerate(as_completed(futures), 1):
            progress(phase, done, len(futures))
        return [f.result() for f in futures]


def _demo(config: DemoConfig, index: int, corrupt_fraction: float) -> Demo:
    # start-up cost: the command line imports warmstart (and this module) to build its flags,
    # and gymnasium with the envs takes about a second to import
    import gymnasium
    import numpy as np

    import environments  # noqa: F401  (registers the built-in envs)
    from environments.actions import format_action
    from environments.agents import SUBMIT_ACTION
    from environments.registry import task_source
    from environments.tasks import TRAIN

    rng = random.Random(f"{config.seed}/{index}")
    kwargs = {"sandbox": config.sandbox, **(config.env_kwargs or {})}
    task = task_source(config.env, **kwargs).draw(
        np.random.default_rng([config.seed, index]), TRAIN
    )
    env = gymnasium.make(config.env, **kwargs)  # made for the task
    try:
        steps = getattr(task, "reference_steps", None)  # a multi-step task: step by step
        plan = [list(c) for c in steps()] if callable(steps) else [task.reference_solution()]
        if rng.random() < corrupt_fraction and plan[-1]:
            plan[-1] = [_redraw_numbers(plan[-1][-1], rng)]
        observation, _ = env.reset(seed=index, options={"task": task})
        demo: Demo = [("user", observation)]
        for action in [a for c in plan for a in [*map(format_action, c), SUBMIT_ACTION]]:
            observation, _, terminated, truncated, _ = env.step(action)
            demo.append(("assistant", action))
            if terminated or truncated:
                break
            demo.append(("user", observation))
        return demo
    finally:
        env.close()


def _redraw_numbers(command: str, rng: random.Random) -> str:
    return re.sub(r"\d+", lambda m: str(rng.randint(0, 10 ** len(m.group()) - 1)), command)
