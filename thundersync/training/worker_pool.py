"""The run's worker processes behind one inbox: started on a backend, received from through one
loop with one timeout policy, stopped by their own ids (docs/design.md §5).

Every worker (rollout, OPD teacher, learner ranks 1 … N−1) sends what it has — events, spans,
rank reports, its crash report — to the inbox. ``receive`` is the only place the run waits on
it: it blocks for the first item, checks every ``POLL_S`` of silence that no worker has exited
(a crashed worker is reported with its own traceback when it sent one), and gives up after the
run's ``worker_timeout_s`` of silence from every worker.
"""

from __future__ import annotations

import contextlib
import os
import queue
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from environments.registry import task_source
from thundersync.training.config import TrainConfig
from thundersync.training.control import Channel, RolloutMessage, TeacherMessage
from thundersync.training.placement import Placement
from thundersync.training.rollout_worker import RolloutSpec, rollout_main
from thundersync.training.teacher import teacher_main
from thundersync.training.workers import LocalBackend, WorkerFailed

if TYPE_CHECKING:
    from thundersync.training.ray_backend import ObjectStoreWeights
    from thundersync.training.weights import SharedWeights

POLL_S = 1.0
"""How often a silent wait checks that every worker is still alive."""
STOP_POLLS, STOP_POLL_S = 60, 0.5
"""A worker told to stop gets this long (while the inbox is drained) before it is killed."""
SHARED_GPU = 0.5
"""What the HF engine and the OPD teacher each ask Ray for with ``--device cuda``: one GPU
holds both (and the trainer's learner on a one-GPU machine)."""


class WorkerError(RuntimeError):
    """A worker process crashed, died, or went silent: the run stops (``--resume`` continues
    it from its last checkpoint)."""


def gpu_asks(config: TrainConfig) -> tuple[float, float]:
    """The GPUs the rollout and the teacher workers ask Ray for: half a GPU each with
    ``--device cuda`` (vLLM on a GPU: a whole one), none on the CPU."""
    if config.device == "cpu":
        return 0.0, 0.0
    rollout = 1.0 if config.engine == "vllm" else SHARED_GPU
    return rollout, SHARED_GPU if config.algo == "opd" else 0.0


def make_backend(config: TrainConfig) -> Any:
    """Where the run's workers go: local processes, or Ray actors (``--backend ray``)."""
    if config.backend == "local":
        return LocalBackend()
    from thundersync.training.ray_backend import RayBackend  # the optional ray extra

    cpus = (
        config.rollout_threads
        + (config.algo == "opd")
        + ((config.learner_ranks - 1) * config.learner_threads)
    )
    return RayBackend(
        cpus_needed=cpus,
        gpus_needed=sum(gpu_asks(config)),
        gpu_for_rollout=config.engine == "vllm",
        log=Path(config.out) / "ray.log",
    )


def session_limit(c: TrainConfig) -> int | None:
    """The most envs of ``c.env`` that may be open at once, where its task source says
    (``max_sessions()``: an OpenEnv server's ``--max-sessions``, asked of the server), else
    None. A session past them would be refused, and an episode refused its env is lost."""

    source = task_source(c.env, **{"sandbox": c.sandbox, **c.env_kwargs})
    ask = getattr(source, "max_sessions", None)
    return ask() if callable(ask) else None


def start_rollout(
    pool: WorkerPool,
    c: TrainConfig,
    *,
    model_dir: str,
    batches_in_flight: int,
    control: Channel[RolloutMessage],
    teacher_inbox: Channel[TeacherMessage] | None,
    weights: SharedWeights | ObjectStoreWeights,
    say: Callable[[str], None],
    placement: Placement | None = None,
) -> None:
    """Start the rollout worker (engine, episodes, sandboxes, graders) and, with an inbox for
    it, the OPD teacher, on the rollout side of ``placement`` (its cores; its GPU with
    ``--device cuda``); both load their models first. Where the env allows so many envs open
    at once (``session_limit``), no more episodes play at once, and no more envs are made
    ahead, than that, and ``say`` tells so once: the episodes past it wait, none is lost (an
    episode refused its env would be an infrastructure failure, not trained on)."""
    cores = placement.rollout_cores if placement else None
    device = placement.engine_devices[0] if placement and placement.engine_devices else c.device
    in_flight = c.max_concurrency or c.tasks_per_step * c.group_size * batches_in_flight
    max_sessions = session_limit(c)
    if max_sessions is not None and max_sessions < in_flight:
        plural = "" if max_sessions == 1 else "s"
        say(
            f"{c.env} allows {max_sessions} session{plural} at once: at most {max_sessions} "
            f"episode{plural} play at a time ({c.tasks_per_step * c.group_size} a step), the "
            "others wait for a free session"
        )
    spec = RolloutSpec(
        env=c.env,
        env_kwargs=dict(c.env_kwargs),
        sandbox=c.sandbox,
        model_dir=model_dir,
        dtype=c.dtype,
        seed=c.seed,
        deterministic=c.deterministic,
        max_new_tokens=c.max_new_tokens,
        temperature=c.temperature,
        max_concurrency=min(in_flight, max_sessions or in_flight),
        batch_window_s=c.batch_window_s,
        engine=c.engine,
        device=device,
        max_sessions=max_sessions or 0,
    )
    rollout_gpus = 1 if pool.backend.gpu_for_rollout else gpu_asks(c)[0]
    pool.spawn(
        "rollout",
        rollout_main,
        spec,
        control,
        pool.inbox,
        teacher_inbox,
        weights,
        num_threads=c.rollout_threads,
        num_gpus=rollout_gpus,
        cores=cores,
    )
    if teacher_inbox is not None:
        pool.spawn(
            "teacher",
            teacher_main,
            os.path.abspath(c.teacher or ""),
            c.dtype,
            device,
            c.deterministic,
            teacher_inbox,
            pool.inbox,
            num_threads=1,
            num_gpus=gpu_asks(c)[1],
            cores=cores,
        )


class WorkerPool:
    """See the module docstring. ``backend`` is a ``LocalBackend`` or a ``RayBackend``."""

    def __init__(self, backend: Any, *, timeout_s: float) -> None:
        self.backend, self.timeout_s = backend, timeout_s
        self.inbox = backend.queue()
        self._procs: list[Any] = []
        self._torn = False  # a read was cut short: the pipe is between two frames

    def queue(self) -> Any:
        """A new queue to a worker, on the pool's backend."""
        return self.backend.queue()

    def spawn(
        self, name: str, target: Callable[..., None], *args: Any, num_threads: int, **place: Any
    ) -> None:
        """Start ``target(*args)`` as worker ``name``; its crash report goes to the inbox.
        ``place``: what the backend places it by (``num_gpus``)."""
        self._procs.append(
            self.backend.spawn(
                name, target, *args, num_threads=num_threads, output=self.inbox, **place
            )
        )

    def receive(self, route: Callable[[Any], None], *, timeout_s: float | None = None) -> None:
        """``route`` every item waiting in the inbox, blocking for the first; a worker's crash
        report, its exit or ``worker_timeout_s`` of silence raise WorkerError. With
        ``timeout_s``, silence that long returns instead."""
        limit = self.timeout_s if timeout_s is None else timeout_s
        waited = 0.0
        while True:
            try:
                item = self._get(min(POLL_S, limit))
                break
            except queue.Empty:
                waited += min(POLL_S, limit)
                self.check()
                if waited >= limit:
                    if timeout_s is not None:
                        return
                    raise WorkerError(f"no event from any worker for {limit:g} s") from None
        while True:
            if isinstance(item, WorkerFailed):
                raise failed(item)
            route(item)
            try:
                item = self._get(None)
            except queue.Empty:
                return

    def _get(self, timeout_s: float | None) -> Any:
        """The inbox's next item (``queue.Empty`` when none comes in ``timeout_s``; None: at
        once). An interrupt (Ctrl-C) while a message is read leaves the pipe between two
        frames: from then on the inbox is only drained, raw (``_discard_inbox``)."""
        try:
            return (
                self.inbox.get_nowait() if timeout_s is None else self.inbox.get(timeout=timeout_s)
            )
        except queue.Empty:
            raise
        except BaseException:
            self._torn = True
            raise

    def check(self) -> None:
        """WorkerError if a worker has exited (with its crash report when it sent one)."""
        for proc in self._procs:
            if proc.exitcode is not None:
                for item in self._discard_inbox():
                    if isinstance(item, WorkerFailed):
                        raise failed(item)
                raise WorkerError(
                    f"{proc.name} exited with code {proc.exitcode}; continue the run with --resume"
                )

    def close(self) -> None:
        """Wait for every worker (told to stop before) while draining the inbox, so none
        blocks on a full pipe; stop a worker that does not exit by its own id."""
        for proc in self._procs:
            for _ in range(STOP_POLLS):
                proc.join(STOP_POLL_S)
                if not proc.is_alive():
                    break
                self._discard_inbox()
            self.backend.stop(proc, timeout_s=1.0)
        self._discard_inbox()
        self.backend.close()

    def _discard_inbox(self) -> list[Any]:
        """Take what the inbox holds (so no worker blocks on a full pipe); once a read was cut
        short, the pipe's bytes are read and dropped instead, never decoded: a length read
        from the middle of a message could block on bytes that never come."""
        items = []
        while not self._torn:
            try:
                items.append(self.inbox.get_nowait())
            except (queue.Empty, OSError, ValueError):
                return items
            except Exception:  # a frame that does not decode: the stream is torn
                self._torn = True
        reader = getattr(self.inbox, "_reader", None)  # a multiprocessing queue's pipe
        if reader is not None:
            with contextlib.suppress(OSError):
                os.set_blocking(reader.fileno(), False)
                while os.read(reader.fileno(), 1 << 16):
                    pass
        return items


def failed(item: WorkerFailed) -> WorkerError:
    return WorkerError(f"the {item.worker} worker failed:\n{item.error}")
