"""The rollout worker: an engine and many concurrent agent episodes in sandboxes, in one process.

It receives messages (``training/control.py``) on its control queue, in order:

- ``LoadWeights(payload)``: copy the latest published weights into the engine (between two
  generation batches; ``payload`` is what the backend's ``weights.publish`` returned) and
  report ``WeightsSynced``;
- ``RunBatch(step, B, G)``: start the batch's episodes (B tasks × G samples), coroutines on
  one asyncio loop (``EpisodeDriver``); they share one ``DynamicBatcher``, so requests that
  wait together are generated together;
- ``PrepareBatch(batch)``: make and reset a later batch's envs once no episode plays (the
  learner is training on the batch before), so that its ``RunBatch`` starts with its
  sandboxes up and its tasks set up instead of making them on the engine's path (no more than
  ``max_sessions`` of them: an env whose server allows so many sessions at once);
- ``Stop()``: cancel running episodes (their sandboxes are closed at once), close everything.

Every episode event goes to the trainer's queue (and the token events to the teacher's, for
OPD), stamped on the trainer's clock. Task draws and sampling seeds are functions of the run's
seed, the step and the episode only, so every mode rolls out the same episodes.
"""

from __future__ import annotations

import hashlib
from concurrent.futures import Future
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from environments.tasks import TRAIN, TaskSource
from thundersync.protocol import events as ev
from thundersync.training.control import (
    Inbox,
    LoadWeights,
    Outbox,
    PrepareBatch,
    RolloutMessage,
    RunBatch,
    Stop,
    TeacherMessage,
)

if TYPE_CHECKING:
    from environments.runner import EpisodeRunner
    from thundersync.training.episodes import EpisodeDriver
    from thundersync.training.ray_backend import ObjectStoreWeights
    from thundersync.training.weights import SharedWeights

TEACHER_EVENTS = (ev.EpisodeStarted, ev.TurnCompleted, ev.ToolFinished, ev.EpisodeCompleted)


@dataclass(frozen=True, slots=True)
class RolloutSpec:
    """What the rollout worker needs (picklable: it crosses to the spawned process)."""

    env: str
    env_kwargs: dict[str, Any]
    sandbox: str
    model_dir: str
    dtype: str
    seed: int
    deterministic: bool
    max_new_tokens: int
    temperature: float
    max_concurrency: int
    batch_window_s: float
    engine: str = "hf"
    """``hf`` or ``vllm`` (``build_engine``)."""
    device: str = "cpu"
    """The HF engine's device (vLLM places itself)."""
    max_sessions: int = 0
    """The most envs the env allows open at once (an OpenEnv server's sessions; 0: no limit):
    envs made ahead (``PrepareBatch``) stay within it, as ``max_concurrency`` does."""


TRAINING_DRAW = ord("s")
"""Part of every training task draw's seed (as since 0.1, so a run draws the same tasks)."""


def derive_seed(*parts: object) -> int:
    digest = hashlib.sha256("/".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def build_engine(spec: RolloutSpec) -> Any:
    """The rollout engine ``spec.engine`` names, on the checkpoint ``spec.model_dir``."""
    from thundersync.training.engines import build_engine as build

    return build(
        spec.engine,
        spec.model_dir,
        dtype=spec.dtype,
        device=spec.device,
        deterministic=spec.deterministic,
        seed=spec.seed,
    )


def rollout_main(
    spec: RolloutSpec,
    control: Inbox[RolloutMessage],
    output: Outbox[ev.Event],
    teacher: Outbox[TeacherMessage] | None,
    weights: SharedWeights | ObjectStoreWeights,
) -> None:
    """The worker's entry point (runs in its own process; see ``workers.spawn``): messages
    in on ``control``, events out on ``output`` (the token events also on ``teacher``, for
    OPD), the published weights read from ``weights``."""
    import environments  # noqa: F401  (registers the built-in envs and plugins)
    from environments.registry import episode_envs, load_plugins, task_source
    from thundersync.training.rollout_stack import RolloutStack, Sampling

    load_plugins()

    def on_batch(started: float, finished: float, requests: list, completions: list) -> None:
        output.put(
            ev.SpanRecorded(
                name="engine",
                started=started,
                finished=finished,
                worker="engine",
                metrics={
                    "batch_size": len(requests),
                    "num_tokens": sum(len(c.token_ids) for c in completions),
                    # a padded call computes every row to the longest prompt and completion
                    "prompt_tokens": sum(len(r.prompt_ids) for r in requests),
                    "longest_prompt": max((len(r.prompt_ids) for r in requests), default=0),
                    "longest_completion": max((len(c.token_ids) for c in completions), default=0),
                },
            )
        )

    def sink(event: ev.Event) -> None:
        output.put(event)
        if teacher is not None and isinstance(event, TEACHER_EVENTS):
            teacher.put(event)

    stack = RolloutStack.build(
        build_engine(spec),
        spec.model_dir,
        Sampling(spec.seed, spec.max_new_tokens, spec.temperature),
        max_batch_size=spec.max_concurrency,
        window_s=spec.batch_window_s,
        on_batch=on_batch,
        record=output.put,
    )
    runner: EpisodeRunner | None = None
    episodes: EpisodeDriver | None = None
    running: list[Future] = []
    try:
        env_kwargs = {"sandbox": spec.sandbox, **spec.env_kwargs}
        tasks = task_source(spec.env, **env_kwargs)
        runner = stack.runner(episode_envs(spec.env, **env_kwargs), sink, tasks=tasks)
        episodes = stack.driver(
            runner, max_concurrency=spec.max_concurrency, max_prepared=spec.max_sessions or None
        )
        while not isinstance(message := control.get(), Stop):
            running = [f for f in running if not f.done() or _raise(f)]
            match message:
                case LoadWeights(payload):
                    started = ev.now()

                    def load(engine: Any, payload: tuple = payload) -> int:
                        return weights.load_into(engine, *payload)

                    version = stack.batcher.call(load)
                    output.put(
                        ev.WeightsSynced(
                            policy_version=version,
                            metrics={"started": started, "finished": ev.now()},
                        )
                    )
                case RunBatch():
                    running += episodes.submit_all(_jobs(tasks, spec, message))
                case PrepareBatch(batch):
                    episodes.prepare_all(_jobs(tasks, spec, batch))
    finally:  # stopping, or unwinding from SIGTERM: live sandboxes are closed at once
        try:
            if runner is not None:
                runner.cancel("the rollout worker is stopping")
            if episodes is not None:
                episodes.shutdown()
        finally:
            stack.close()
    for future in running:
        _raise(future)


def _jobs(source: TaskSource, spec: RolloutSpec, batch: RunBatch) -> list[dict[str, Any]]:
    """The batch's episodes (their ``EpisodeRunner.episode`` arguments): every member of a
    group plays the same task, drawn from the env's training split (no env is made to draw
    it)."""
    tasks = [
        source.draw(np.random.default_rng([spec.seed, batch.step, g, TRAINING_DRAW]), TRAIN)
        for g in range(batch.num_tasks)
    ]
    return [
        {
            "task": tasks[key.group],
            "group_id": key.group_id,
            "group_size": batch.group_size,
            "seed": derive_seed(spec.seed, key.episode_id),
            "episode_id": key.episode_id,
        }
        for key in batch.episodes()
    ]


def _raise(future: Future) -> bool:
    """Re-raise an episode's exception (only a broken event sink escapes a run); an episode
    cancelled before it started (at stop) raised nothing."""
    if not future.cancelled():
        future.result()
    return False
