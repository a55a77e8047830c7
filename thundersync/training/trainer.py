"""The run: one learner, its worker processes and its run folder, composed for a mode to drive.

``Trainer`` implements ``modes.Run`` (``submit``, ``wait_batch``, ``arrivals``,
``finish_step``) over four parts with one job each: the worker processes behind one receive
loop (``worker_pool``), the data-parallel ranks (``ranks``), the run folder's records
(``telemetry``, a subscriber) and the checkpoints (``checkpoint.Checkpoints``).

The learner runs on the trainer's main thread, never on a thread that publishes events: they
reach it through the inbox (docs/design.md §5), and ``_route`` sends each item where it
belongs — an episode event to its batch (and its group's rank), a span to the telemetry — so
a mode can take what has queued and compute it as one micro-batch.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from thundersync.cli_output import Progress
from thundersync.core.learner import Learner
from thundersync.lora import synced_parameters
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeKey
from thundersync.protocol.errors import NonFiniteParameterError, ThunderSyncError
from thundersync.training.checkpoint import Checkpoints
from thundersync.training.checks import grading_place_of
from thundersync.training.config import TrainConfig
from thundersync.training.control import LoadWeights, PrepareBatch, RunBatch, Stop
from thundersync.training.learner_setup import LearnerSpec, build_learner, leave_process_group
from thundersync.training.modes import Arrivals
from thundersync.training.placement import place_learner, restore_affinity
from thundersync.training.ranks import RankReady, Ranks, RankStepped
from thundersync.training.run_metrics import BatchTracker
from thundersync.training.starting_point import starting_point
from thundersync.training.telemetry import Telemetry, progress_line
from thundersync.training.worker_pool import WorkerError, WorkerPool, make_backend, start_rollout

RANK_REPORT_S = 5.0
"""After a failed collective, how long rank 0 waits for the failed rank's own report."""


class Trainer:
    """See the module docstring. ``with Trainer(config) as run: mode.run(run)``."""

    def __init__(
        self, config: TrainConfig, *, resume: bool = False, progress: Progress | None = None
    ) -> None:
        self.config, self.mode = config, config.training_mode()
        self.progress = progress or Progress("train", config.steps, "steps")
        self.out = Path(config.out)
        self.out.mkdir(parents=True, exist_ok=True)
        ev.reset_clock()
        self.placement, self.record, self._affinity = place_learner(config)  # first: inherited
        torch.set_num_threads(config.learner_threads)
        every, keep = config.checkpoint_every, config.keep_checkpoints
        self.checkpoints = Checkpoints(
            self.out / "checkpoints", every=every, last_step=config.steps, keep=keep
        )
        self.batches: dict[int, BatchTracker] = {}
        self.ranks = Ranks(config.learner_ranks)
        self.backend = make_backend(config)
        try:  # each part, once made, is closed by ``close`` (which checks what was made)
            self.pool = WorkerPool(self.backend, timeout_s=config.worker_timeout_s)
            self.control = self.pool.queue()
            self._setup_learner(resume)
            self.telemetry = Telemetry(
                self.out, self.record, resume=resume, start_step=self.start_step
            )
            self._setup_workers()
        except BaseException:  # a worker that failed to start: stop the others
            self.close()
            raise

    # --- setup -------------------------------------------------------------------------------

    def _setup_learner(self, resume: bool) -> None:
        """The policy, its optimizer and the learner; with ``learner_ranks`` > 1, the other
        ranks' workers first (every rank joins the process group while it is built)."""
        config = self.config
        found = self.checkpoints.start(resume=resume)
        self.initial_model, self.model_dir = starting_point(
            config, self.out, found, self.progress.phase
        )
        self.progress.phase(
            f"loading the model {self.model_dir} into the learner ({config.device}, {config.dtype})"
        )
        spec = LearnerSpec(
            config,
            self.model_dir,
            self.initial_model,
            str(found) if found else None,
            self.backend.rendezvous(self.out),
        )
        self.ranks.start(self.pool, spec)
        self.ranks.await_loaded(self.pool)
        built = build_learner(spec, rank=0, publish=self._on_learner_event)
        self.model, self.optimizer, self._learner = built.model, built.optimizer, built.learner
        self.tokenizer, self.start_step = built.tokenizer, built.start_step
        self.progress.skip_to(self.start_step)
        self._optimizer_started = 0.0
        self.optimizer.register_step_pre_hook(self._optimizer_pre_hook)
        self.optimizer.register_step_post_hook(self._optimizer_post_hook)

    def _setup_workers(self) -> None:
        """The rollout worker (and the OPD teacher), started and ready with the weights."""
        c = self.config
        self.teacher_inbox = self.pool.queue() if c.algo == "opd" else None
        self.weights = self.backend.weights(synced_parameters(self.model))
        self.progress.phase(
            f"starting the rollout worker{' and the OPD teacher' if c.algo == 'opd' else ''} "
            f"({c.engine} engine, env {c.env}): each loads its model first"
        )
        start_rollout(
            self.pool,
            c,
            model_dir=self.model_dir,
            batches_in_flight=self.mode.batches_in_flight,
            control=self.control,
            teacher_inbox=self.teacher_inbox,
            weights=self.weights,
            say=self.progress.say,
            placement=self.placement,
        )
        self.publish_weights()
        self.engine_version = -1
        while self.engine_version < self._learner.policy_version:  # workers loaded and ready
            self.pool.receive(self._route)
        self.telemetry.start_clock()
        self.progress.phase(f"workers ready after {ev.now():.0f} s")

    # --- modes.Run ---------------------------------------------------------------------------

    @property
    def learner(self) -> Learner:
        return self._learner

    def steps(self) -> range:
        return range(self.start_step, self.config.steps)

    def submit(self, step: int) -> None:
        """Start rolling out batch ``step`` (with whatever weights the engine has by then);
        the next batch's envs are made ahead, once this one has played."""
        c = self.config
        batch, later = (RunBatch(s, c.tasks_per_step, c.group_size) for s in (step, step + 1))
        ids = frozenset(key.episode_id for key in batch.episodes())
        self.batches[step] = BatchTracker(step, ids, c.algo == "opd", submitted_at=ev.now())
        self.control.put(batch)
        if later.step in self.steps() and later.step not in self.batches:
            self.control.put(PrepareBatch(later))
        n = f"{c.tasks_per_step} tasks × {c.group_size} episodes"
        what = f"rolling out step {step + 1}/{c.steps}: {n}, graded {grading_place_of(c)}"
        if step == self.start_step:
            self.progress.phase(what)  # the first batch: tell what the wait is for
        else:
            self.progress.quietly(what)

    def wait_batch(self, step: int) -> list[ev.Event]:
        while not self.batches[step].complete:
            self.pool.receive(self._route)
        return self.batches[step].take()

    def arrivals(self, step: int, timeout_s: float | None = None) -> Arrivals:
        self.pool.receive(self._route, timeout_s=timeout_s)
        batch = self.batches[step]
        events = batch.take()
        return Arrivals(events, batch.complete)

    def finish_step(self, step: int) -> dict[str, Any]:
        """``learner.step()``, weights to the engine, checkpoint, metrics; returns them."""
        tracker, ranks, telemetry = self.batches.pop(step), self.ranks, self.telemetry
        self.pool.check()  # a dead rank would leave this one waiting in the step
        ranks.step(step)  # every event of the batch was forwarded before
        try:
            with telemetry.timed("step", step=step + 1):
                learned = self._learner.step()
        except NonFiniteParameterError as exc:
            then = self.checkpoints.after_failed_step()
            raise NonFiniteParameterError(
                f"{exc}; nothing of this step was saved, published or logged ({then})"
            ) from exc
        except RuntimeError as exc:
            if not ranks or isinstance(exc, ThunderSyncError):
                raise
            self._raise_rank_failure(exc)  # a collective failed: a rank died in the step
        learned = {**learned, "weight_sync_bytes": self.publish_weights()}
        if ranks:
            learned = {**learned, "ranks": self._rank_metrics(step)}
        if self.checkpoints.is_due(step + 1):
            self.save_checkpoint(step + 1)
        device = str(next(self.model.parameters()).device)
        metrics = telemetry.step_record(step, tracker, learned, device=device)
        self.progress.say(progress_line(metrics, self.config.steps))
        self.progress.advance()
        return metrics

    # --- the step's parts --------------------------------------------------------------------

    def publish_weights(self) -> int:
        """The weights the engine samples with (the adapter only, with ``--lora``) to the
        rollout worker; returns the bytes that moved."""
        with self.telemetry.timed("weight_publish"):
            params = synced_parameters(self.model)
            payload = self.weights.publish(params, self._learner.policy_version)
            self.control.put(LoadWeights(payload))
        return sum(p.numel() * p.element_size() for p in params)

    def save_checkpoint(self, completed_steps: int) -> Path:
        with self.telemetry.timed("checkpoint"):
            path = self.checkpoints.save(
                self.model,
                self.tokenizer,
                self.optimizer,
                completed_steps=completed_steps,
                policy_version=self._learner.policy_version,
            )
            self.telemetry.event(ev.CheckpointSaved(step=completed_steps, path=str(path)))
        return path

    def _rank_metrics(self, step: int) -> dict[str, dict[str, Any]]:
        """The other ranks' ``learner`` metrics of ``step``, by rank (their backward spans
        are counted in this step's window)."""
        reports = self.ranks.reports(step, self.pool, self._route)
        for report in reports:
            for span in report.spans:
                self.telemetry.span(span)
        return {str(report.rank): report.metrics for report in reports}

    def _raise_rank_failure(self, exc: BaseException) -> None:
        """Turn a failed collective into the failed rank's own report, when it sends one."""
        deadline = ev.now() + RANK_REPORT_S
        while (left := deadline - ev.now()) > 0:
            self.pool.receive(_ignore, timeout_s=left)  # raises at the report or the exit
        raise WorkerError(
            f"a learner rank failed during the step ({exc}); continue the run with --resume"
        ) from exc

    def _route(self, item: ev.Event | RankReady | RankStepped) -> None:
        telemetry = self.telemetry
        match item:
            case ev.SpanRecorded():
                telemetry.span(item)
            case RankStepped():
                self.ranks.stepped(item)
            case ev.WeightsSynced():
                telemetry.event(item)
                self.engine_version = item.policy_version
            case _:
                telemetry.event(item)
                episode = item if isinstance(item, ev.EPISODE_EVENTS) else None
                key = EpisodeKey.parse(episode.episode_id) if episode is not None else None
                tracker = self.batches.get(key.step) if key and key.step is not None else None
                if tracker is not None and key is not None and episode is not None:
                    tracker.apply(episode)
                    telemetry.batch_event(episode)
                    self.ranks.forward(episode, key)  # the owner of the episode's group trains it

    def _on_learner_event(self, event: ev.Event) -> None:
        self.telemetry.learner_event(event)

    def _optimizer_pre_hook(self, *args: object) -> None:
        self._optimizer_started = ev.now()

    def _optimizer_post_hook(self, *args: object) -> None:
        span = ev.SpanRecorded(
            name="optimizer", started=self._optimizer_started, finished=ev.now(), worker="learner"
        )
        self.telemetry.span(span)

    # --- shutdown ----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop every worker (draining the inbox so none blocks on a full pipe), close the run's
        files, give the thread its cores back (``restore_affinity``); safe on every path out."""
        try:
            if not hasattr(self, "control"):  # the backend's queues never started
                self.backend.close()
                return
            self.progress.quietly("stopping the workers")
            leave_process_group()  # a rank blocked in a collective fails now, not waiting
            for inbox in (self.control, getattr(self, "teacher_inbox", None)):
                if inbox is not None:
                    inbox.put(Stop())
            self.ranks.stop()
            self.pool.close()
        finally:
            if hasattr(self, "telemetry"):  # its records and its load sampler, on every path
                self.telemetry.close()
            restore_affinity(self._affinity)

    def __enter__(self) -> Trainer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _ignore(item: object) -> None:
    """What waiting for a failed rank's report does with anything else that arrives."""
