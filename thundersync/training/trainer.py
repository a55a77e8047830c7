"""The trainer: one run's learner, its worker processes and its run folder. The modes
(``thundersync.training.modes``) drive it; this module owns everything they share.

The learner runs on the trainer's main thread and never on a thread that publishes events:
events reach it through the inbox queue (docs/design.md §5), and ``poll`` routes whatever is
waiting — episode events to their batch, spans to ``spans.jsonl``, a crashed worker to a
clear error — so a mode can drain what has queued and compute it as one micro-batch.
"""

from __future__ import annotations

import os
import queue
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from thundersync import events as ev
from thundersync.cli_output import Progress
from thundersync.errors import NonFiniteParameterError, ThunderSyncError
from thundersync.strict_json import dumps_nulled, dumps_refusing
from thundersync.training import checkpoint as ckpt
from thundersync.training.config import TrainConfig
from thundersync.training.learners import (
    LearnerSpec,
    RankReady,
    RankStepped,
    build_learner,
    leave_process_group,
    owner_of,
    rank_main,
    step_of,
)
from thundersync.training.metrics import (
    STEP_BASE,
    BatchTracker,
    MetricsLogger,
    truncate_metrics,
)
from thundersync.training.rollout import RolloutPlan, RolloutSpec, rollout_main
from thundersync.training.teacher import teacher_main
from thundersync.training.workers import LocalBackend, WorkerFailed

POLL_S = 1.0
SHARED_GPU = 0.5
"""What the HF engine and the OPD teacher each ask Ray for with ``--device cuda``: one GPU
holds both (and the trainer's learner on a one-GPU machine)."""


def gpu_asks(config: TrainConfig) -> tuple[float, float]:
    """The GPUs the rollout and the teacher workers ask Ray for: half a GPU each with
    ``--device cuda`` (vLLM on a GPU: a whole one), none on the CPU."""
    if config.device == "cpu":
        return 0.0, 0.0
    rollout = 1.0 if config.engine == "vllm" else SHARED_GPU
    return rollout, SHARED_GPU if config.algo == "opd" else 0.0


class WorkerError(RuntimeError):
    """A worker process crashed, died, or went silent: the run stops (``--resume`` continues
    it from its last checkpoint)."""


class Trainer:
    """See the module docstring. ``with Trainer(config) as trainer: mode.run(trainer)``."""

    def __init__(
        self, config: TrainConfig, *, resume: bool = False, progress: Progress | None = None
    ) -> None:
        self.config = config
        self.progress = progress or Progress("train", config.steps, "steps")
        self.out = Path(config.out)
        self.out.mkdir(parents=True, exist_ok=True)
        ev.reset_clock()
        torch.set_num_threads(config.learner_threads)
        self._procs: list[Any] = []
        self._rank_inboxes: list[Any] = []
        self.teacher_inbox: Any = None
        self._rank_steps: dict[int, dict[int, RankStepped]] = {}
        self._window: dict[str, float] = defaultdict(float)
        self._backward_intervals: list[tuple[float, float]] = []
        self._completed: dict[str, float] = {}
        self.batches: dict[int, BatchTracker] = {}
        self.history: list[dict[str, Any]] = []
        self.backend = make_backend(config)
        try:
            self.inbox, self.control = self.backend.queue(), self.backend.queue()
            self._setup_model(resume)
            self._setup_records(resume)
            self._setup_workers()
        except BaseException:  # a worker that failed to start: stop the others
            self.close()
            raise

    # --- setup -------------------------------------------------------------------------------

    def _setup_model(self, resume: bool) -> None:
        """The policy, its optimizer and the learner; with ``learner_ranks`` > 1, the other
        ranks' workers first (every rank joins the process group while it is built)."""
        config, folder = self.config, self.out / "checkpoints"
        ckpt.remove_temporaries(folder)
        found = ckpt.list_checkpoints(folder) if resume else []
        # absolute: workers (Ray actors) need not share the trainer's working directory
        self.initial_model = os.path.abspath(config.model or self._tiny_model())
        self.model_dir = os.path.abspath(found[-1]) if found else self.initial_model
        self.progress.phase(
            f"loading the model {self.model_dir} into the learner ({config.device}, {config.dtype})"
        )
        spec = LearnerSpec(
            config,
            self.model_dir,
            self.initial_model,
            str(found[-1]) if found else None,
            self.backend.rendezvous(self.out),
        )
        for rank in range(1, config.learner_ranks):
            self._rank_inboxes.append(self.backend.queue())
            self._procs.append(
                self.backend.spawn(
                    f"learner-{rank}",
                    rank_main,
                    spec,
                    rank,
                    self._rank_inboxes[-1],
                    self.inbox,
                    num_threads=config.learner_threads,
                    output=self.inbox,
                )
            )
        self._await_ranks_loaded()
        built = build_learner(spec, rank=0, publish=self._on_learner_event)
        self.model, self.optimizer, self.learner = built.model, built.optimizer, built.learner
        self.tokenizer, self.start_step = built.tokenizer, built.start_step
        self.progress.skip_to(self.start_step)
        self._optimizer_started = 0.0
        self.optimizer.register_step_pre_hook(self._optimizer_pre_hook)
        self.optimizer.register_step_post_hook(self._optimizer_post_hook)

    def _await_ranks_loaded(self) -> None:
        """Wait until every other rank has loaded its replica (``RankReady``) before joining
        the process group: a rank that fails to start is then a clear error, not a wait in
        ``init_process_group`` until its timeout."""
        ready: set[int] = set()
        waited = 0.0
        while len(ready) < self.config.learner_ranks - 1:
            try:
                item = self.inbox.get(timeout=POLL_S)
            except queue.Empty:
                waited += POLL_S
                self._check_workers()
                if waited >= self.config.worker_timeout_s:
                    raise WorkerError(f"learner ranks not ready after {waited:g} s") from None
                continue
            if isinstance(item, WorkerFailed):
                raise _failed(item)
            if isinstance(item, RankReady):
                ready.add(item.rank)

    def _optimizer_pre_hook(self, *args: Any) -> None:
        self._optimizer_started = ev.now()

    def _optimizer_post_hook(self, *args: Any) -> None:
        self._span(
            ev.SpanRecorded(
                name="optimizer",
                started=self._optimizer_started,
                finished=ev.now(),
                worker="learner",
            )
        )

    def _tiny_model(self) -> Path:
        from thundersync.models import build_tiny_model

        folder = self.out / "init-model"
        if not (folder / "config.json").is_file():
            self.progress.phase(f"no --model given: building a tiny random model in {folder}")
            # vLLM's CPU attention needs a head_dim of 32 or more (the default tiny has 16).
            shape = {"hidden_size": 64, "num_heads": 2} if self.config.engine == "vllm" else {}
            build_tiny_model(folder, "qwen3", seed=self.config.seed, **shape)
        return folder

    def _setup_records(self, resume: bool) -> None:
        config_path = self.out / "config.json"
        text = dumps_refusing(self.config.to_dict(), what=str(config_path), indent=2)
        config_path.write_text(text + "\n")
        if resume:
            truncate_metrics(self.out / "metrics.jsonl", self.start_step)
        else:
            for name in ("metrics.jsonl", "events.jsonl", "spans.jsonl"):
                (self.out / name).unlink(missing_ok=True)
        self.metrics = MetricsLogger(
            self.out,
            tensorboard=self.config.tensorboard,
            wandb=self.config.wandb,
            config=self.config.to_dict(),
        )
        self.events_log = ev.JsonlSink(self.out / "events.jsonl")
        self.spans_log = (self.out / "spans.jsonl").open("a", encoding="utf-8")

    def _setup_workers(self) -> None:
        c = self.config
        self.teacher_inbox = self.backend.queue() if c.algo == "opd" else None
        self.weights = self.backend.weights(list(self.model.parameters()))
        concurrency = c.max_concurrency or c.tasks_per_step * c.group_size * (
            1 + (c.staleness if c.mode == "async" else 0)
        )
        teacher = " and the OPD teacher" if c.algo == "opd" else ""
        self.progress.phase(
            f"starting the rollout worker{teacher} ({c.engine} engine, env {c.env}): "
            "each loads its model first"
        )
        spec = RolloutSpec(
            env=c.env,
            env_kwargs=dict(c.env_kwargs),
            sandbox=c.sandbox,
            model_dir=self.model_dir,
            dtype=c.dtype,
            seed=c.seed,
            deterministic=c.deterministic,
            max_new_tokens=c.max_new_tokens,
            temperature=c.temperature,
            max_concurrency=concurrency,
            batch_window_s=c.batch_window_s,
            engine=c.engine,
            device=c.device,
        )
        self._procs.append(
            self.backend.spawn(
                "rollout",
                rollout_main,
                spec,
                self.control,
                self.inbox,
                self.teacher_inbox,
                self.weights,
                num_threads=c.rollout_threads,
                output=self.inbox,
                num_gpus=1 if self.backend.gpu_for_rollout else gpu_asks(c)[0],
            )
        )
        if self.teacher_inbox is not None:
            self._procs.append(
                self.backend.spawn(
                    "teacher",
                    teacher_main,
                    os.path.abspath(c.teacher),
                    c.dtype,
                    c.device,
                    c.deterministic,
                    self.teacher_inbox,
                    self.inbox,
                    num_threads=1,
                    output=self.inbox,
                    num_gpus=gpu_asks(c)[1],
                )
            )
        self.publish_weights()
        self.engine_version = -1
        while self.engine_version < self.learner.policy_version:  # workers loaded and ready
            self.poll()
        self.clock_start = ev.now()
        self.progress.phase(f"workers ready after {ev.now():.0f} s")

    # --- rollout -----------------------------------------------------------------------------

    def steps(self) -> range:
        return range(self.start_step, self.config.steps)

    def submit(self, step: int) -> None:
        """Start rolling out batch ``step`` (with whatever weights the engine has by then)."""
        c = self.config
        ids = frozenset(
            f"s{step}-g{g}-e{e}" for g in range(c.tasks_per_step) for e in range(c.group_size)
        )
        self.batches[step] = BatchTracker(
            step, ids, needs_teacher=c.algo == "opd", submitted_at=ev.now()
        )
        self.control.put(("run", RolloutPlan(step, c.tasks_per_step, c.group_size)))
        what = (
            f"rolling out step {step + 1}/{c.steps}: {c.tasks_per_step} tasks × "
            f"{c.group_size} episodes, graded in the {c.sandbox} sandbox"
        )
        if step == self.start_step:
            self.progress.phase(what)  # the first batch: tell what the wait is for
        else:
            self.progress.quietly(what)

    def wait_batch(self, step: int) -> list[ev.Event]:
        """Block until batch ``step`` is complete; its events not taken yet."""
        while not self.batches[step].complete:
            self.poll()
        return self.batches[step].take()

    def poll(self, timeout_s: float | None = None) -> None:
        """Route everything waiting in the inbox, blocking for the first item; a worker that
        died or stayed silent for ``worker_timeout_s`` raises WorkerError."""
        waited = 0.0
        limit = self.config.worker_timeout_s if timeout_s is None else timeout_s
        while True:
            try:
                item = self.inbox.get(timeout=min(POLL_S, limit))
                break
            except queue.Empty:
                waited += min(POLL_S, limit)
                self._check_workers()
                if waited >= limit:
                    if timeout_s is not None:
                        return
                    raise WorkerError(f"no event from any worker for {limit:g} s") from None
        self._route(item)
        while True:
            try:
                self._route(self.inbox.get_nowait())
            except queue.Empty:
                return

    def _check_workers(self) -> None:
        for proc in self._procs:
            if proc.exitcode is not None:
                raise WorkerError(
                    f"{proc.name} exited with code {proc.exitcode}; continue the run with --resume"
                )

    def _route(self, item: Any) -> None:
        if isinstance(item, WorkerFailed):
            raise _failed(item)
        if isinstance(item, ev.SpanRecorded):
            self._span(item)
            return
        if isinstance(item, RankStepped):
            self._rank_steps.setdefault(item.step, {})[item.rank] = item
            return
        self.events_log(item)
        if isinstance(item, ev.WeightsSynced):
            self.engine_version = item.policy_version
            m = item.metrics
            self._span(
                ev.SpanRecorded(
                    name="weight_sync",
                    started=m["started"],
                    finished=m["finished"],
                    worker="engine",
                )
            )
            return
        eid = getattr(item, "episode_id", "")
        tracker = self.batches.get(step_of(eid))
        if tracker is None:
            return
        tracker.apply(item)
        self._derived_spans(item)
        if self._rank_inboxes:  # the owner of the episode's group trains it (rank 0: us)
            owner = owner_of(eid, self.config.learner_ranks)
            if owner:
                self._rank_inboxes[owner - 1].put(("event", item))

    def _derived_spans(self, event: ev.Event) -> None:
        """Tool calls and grading as spans (from the events that bound them)."""
        if isinstance(event, ev.ToolFinished):
            self._span(
                ev.SpanRecorded(
                    name="tool",
                    started=event.t - event.duration_s,
                    finished=event.t,
                    worker="sandbox",
                    episode_id=event.episode_id,
                    turn=event.turn,
                )
            )
        elif isinstance(event, ev.EpisodeCompleted):
            self._completed[event.episode_id] = event.t
        elif isinstance(event, ev.RewardReady) and event.episode_id in self._completed:
            self._span(
                ev.SpanRecorded(
                    name="grading",
                    started=self._completed.pop(event.episode_id),
                    finished=event.t,
                    worker="sandbox",
                    episode_id=event.episode_id,
                )
            )

    def _span(self, span: ev.SpanRecorded) -> None:
        record = ev.summarize(span)
        record.pop("event", None)
        self.spans_log.write(dumps_nulled(record) + "\n")
        if span.name == "backward":  # batched pieces share one interval: count it once
            self._backward_intervals.append((span.started, span.finished))
        else:
            self._window[span.name] += max(0.0, span.finished - span.started)

    def _on_learner_event(self, event: ev.Event) -> None:
        self.events_log(event)
        if isinstance(event, ev.GradientComputed):
            self._span(
                ev.SpanRecorded(
                    name="backward",
                    started=event.started,
                    finished=event.finished,
                    worker="learner",
                    episode_id=event.episode_id,
                    turn=event.turn,
                )
            )

    # --- the step ----------------------------------------------------------------------------

    def publish_weights(self) -> None:
        started = ev.now()
        payload = self.weights.publish(list(self.model.parameters()), self.learner.policy_version)
        self.control.put(("weights", *payload))
        self._span(
            ev.SpanRecorded(
                name="weight_publish", started=started, finished=ev.now(), worker="learner"
            )
        )

    def finish_step(self, step: int) -> dict[str, Any]:
        """``learner.step()``, weights to the engine, checkpoint, metrics; returns them."""
        tracker = self.batches.pop(step)
        started = ev.now()
        self._check_workers()  # a dead rank would leave this one waiting in the step
        for inbox in self._rank_inboxes:  # every event of the batch was forwarded before
            inbox.put(("step", step))
        try:
            learned = self.learner.step()
        except NonFiniteParameterError as exc:
            found = ckpt.list_checkpoints(self.out / "checkpoints")
            then = (
                (f"the last good checkpoint is {found[-1]}: lower --lr and continue with --resume")
                if found
                else "no checkpoint yet: lower --lr and start again"
            )
            raise NonFiniteParameterError(
                f"{exc}; nothing of this step was saved, published or logged ({then})"
            ) from exc
        except RuntimeError as exc:
            if not self._rank_inboxes or isinstance(exc, ThunderSyncError):
                raise
            self._raise_rank_failure(exc)  # a collective failed: a rank died in the step
        self._span(
            ev.SpanRecorded(
                name="step", started=started, finished=ev.now(), worker="learner", step=step + 1
            )
        )
        self.publish_weights()
        if self._rank_inboxes:
            learned = {**learned, "ranks": self._rank_metrics(step)}
        completed = step + 1
        if completed % self.config.checkpoint_every == 0 or completed == self.config.steps:
            self.save_checkpoint(completed)
        metrics = self._step_metrics(step, tracker, learned)
        self.metrics.log(metrics)
        self.history.append(metrics)
        self.progress.say(progress_line(metrics, self.config.steps))
        self.progress.advance()
        return metrics

    def _rank_metrics(self, step: int) -> dict[str, dict[str, Any]]:
        """The other ranks' ``learner`` metrics of ``step``, by rank (their backward spans
        are counted in this step's window)."""
        while len(self._rank_steps.get(step, {})) < self.config.learner_ranks - 1:
            self.poll()
        stepped = self._rank_steps.pop(step)
        for item in stepped.values():
            for span in item.spans:
                self._span(span)
        return {str(rank): stepped[rank].metrics for rank in sorted(stepped)}

    def _raise_rank_failure(self, exc: BaseException) -> None:
        """Turn a failed collective into the failed rank's own report, when it sent one."""
        deadline = ev.now() + 5.0
        while ev.now() < deadline:
            try:
                item = self.inbox.get(timeout=0.5)
            except queue.Empty:
                continue
            if isinstance(item, WorkerFailed):
                raise _failed(item) from exc
        raise WorkerError(
            f"a learner rank failed during the step ({exc}); continue the run with --resume"
        ) from exc

    def save_checkpoint(self, completed_steps: int) -> Path:
        started = ev.now()
        path = ckpt.save_checkpoint(
            self.out / "checkpoints",
            self.model,
            self.tokenizer,
            self.optimizer,
            completed_steps=completed_steps,
            policy_version=self.learner.policy_version,
            keep=self.config.keep_checkpoints,
        )
        self.events_log(ev.CheckpointSaved(step=completed_steps, path=str(path)))
        self._span(
            ev.SpanRecorded(name="checkpoint", started=started, finished=ev.now(), worker="learner")
        )
        return path

    def _step_metrics(self, step: int, tracker: BatchTracker, learned: dict) -> dict[str, Any]:
        now = ev.now() - self.clock_start
        previous = self.history[-1]["time_s"] if self.history else 0.0
        step_time = now - previous
        window, self._window = dict(self._window), defaultdict(float)
        window["backward"] = _union(self._backward_intervals)
        self._backward_intervals = []
        busy = window.get("backward", 0.0) + window.get("step", 0.0)
        return {
            "step": step + 1,  # batch ``step`` (episode ids s<step>-…) feeds optimizer step step+1
            "step_base": STEP_BASE,
            "mode": self.config.mode,
            "time_s": now,
            "submitted_at": tracker.submitted_at,
            "finished_at": ev.now(),
            "step_time_s": step_time,
            **tracker.stats(),
            "learner": {**learned, "device": str(next(self.model.parameters()).device)},
            "breakdown_s": window,
            "learner_idle_fraction": max(0.0, 1.0 - busy / step_time) if step_time else None,
            "engine_idle_fraction": (
                max(0.0, 1.0 - window.get("engine", 0.0) / step_time) if step_time else None
            ),
        }

    # --- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every worker (draining the inbox so none blocks on a full pipe), then close
        the run's files. Safe on every path out, errors included."""
        if not hasattr(self, "control"):  # the backend's queues never started
            self.backend.close()
            return
        self.progress.quietly("stopping the workers")
        leave_process_group()  # a rank blocked in a collective fails now instead of waiting
        for inbox in self._rank_inboxes:
            getattr(inbox, "cancel_join_thread", lambda: None)()  # a dead rank's pipe
        self.control.put(("stop",))
        if self.teacher_inbox is not None:
            self.teacher_inbox.put(None)
        for inbox in self._rank_inboxes:
            inbox.put(None)
        for proc in self._procs:
            for _ in range(60):
                proc.join(0.5)
                if not proc.is_alive():
                    break
                self._discard_inbox()
            self.backend.stop(proc, timeout_s=1.0)
        self._discard_inbox()
        self.backend.close()
        for name in ("metrics", "events_log", "spans_log"):  # absent if setup failed early
            if hasattr(self, name):
                getattr(self, name).close()

    def _discard_inbox(self) -> None:
        while True:
            try:
                self.inbox.get_nowait()
            except (queue.Empty, OSError, ValueError):
                return

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_backend(config: TrainConfig) -> Any:
    """Where the run's workers go: local processes, or Ray actors (``--backend ray``)."""
    if config.backend == "local":
        return LocalBackend()
    from thundersync.training.ray_backend import RayBackend

    cpus = (
        config.rollout_threads
        + (config.algo == "opd")
        + ((config.learner_ranks - 1) * config.learner_threads)
    )
    log = Path(config.out) / "ray.log"
    return RayBackend(
        cpus_needed=cpus,
        gpus_needed=sum(gpu_asks(config)),
        gpu_for_rollout=config.engine == "vllm",
        log=log,
    )


def _failed(item: WorkerFailed) -> WorkerError:
    return WorkerError(f"the {item.worker} worker failed:\n{item.error}")


def _union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def progress_line(m: dict[str, Any], total: int) -> str:
    """A step's console line. The step's time is wall-clock; engine and learner are busy time
    within it (one engine, one learner); tools and grading are per-episode means, because
    episodes run them concurrently and their sum can exceed the step."""
    b, n = m["breakdown_s"], max(m["num_episodes"], 1)

    def fmt(v: Any, spec: str = ".3f") -> str:
        return "n/a" if v is None else format(v, spec)

    return (
        f"step {m['step']}/{total}: reward mean {fmt(m['reward_mean'])}, "
        f"solved {fmt(m['accuracy'], '.0%')} of {m['num_episodes']} episodes (reward >= 1); "
        f"wall-clock {m['step_time_s']:.2f} s (engine busy {b.get('engine', 0):.2f}, "
        f"learner {b.get('backward', 0) + b.get('step', 0):.2f}; per episode: tools "
        f"{b.get('tool', 0) / n:.2f}, grading {b.get('grading', 0) / n:.2f})"
    )
