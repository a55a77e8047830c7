"""The run's telemetry: a subscriber to what the run routes and computes, writing the run
folder's records — ``config.json``, ``events.jsonl``, ``trajectories.jsonl`` (the batches'
events in full, for ``thundersync export``), ``spans.jsonl``, ``metrics.jsonl`` (and
TensorBoard / W&B) — and keeping the per-step busy-time window the step's metrics report,
with the rollout's cores' load (``cpu_load``) among the spans.
It owns no control flow: the run would behave the same without it."""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from thundersync.protocol import events as ev
from thundersync.protocol.strict_json import dumps_nulled, dumps_refusing
from thundersync.training.cpu_load import CpuSampler
from thundersync.training.run_metrics import (
    STEP_BASE,
    BatchTracker,
    MetricsLogger,
    truncate_metrics,
)

RECORDS = ("metrics.jsonl", "events.jsonl", "spans.jsonl", "trajectories.jsonl")


class Telemetry:
    """See the module docstring. ``config`` is the resolved config with the run's warnings
    (``TrainConfig.record``); a resumed run keeps the records of its first ``start_step``
    steps, a new run none."""

    def __init__(self, out: Path, config: dict[str, Any], *, resume: bool, start_step: int) -> None:
        config_path = out / "config.json"
        config_path.write_text(dumps_refusing(config, what=str(config_path), indent=2) + "\n")
        if resume:
            truncate_metrics(out / "metrics.jsonl", start_step)
        else:
            for name in RECORDS:
                (out / name).unlink(missing_ok=True)
        self.metrics = MetricsLogger(
            out, tensorboard=config["tensorboard"], wandb=config["wandb"], config=config
        )
        self.events_log = ev.JsonlSink(out / "events.jsonl")
        # the batches' events in full (token ids, log-probs): what `thundersync export` reads
        self.trajectories_log = ev.JsonlSink(out / "trajectories.jsonl", lossless=True)
        self.spans_log = (out / "spans.jsonl").open("a", encoding="utf-8")
        self.mode = config["mode"]
        self.clock_start = self._last_time_s = 0.0
        self._window: dict[str, float] = defaultdict(float)
        self._backward_intervals: list[tuple[float, float]] = []
        self._completed: dict[str, float] = {}
        placed = config.get("placed") or {}
        cores = placed.get("rollout_cores") or placed.get("learner_affinity") or []
        self._loads: list[ev.SpanRecorded] = []  # the sampler's, written on the run's thread
        self._loads_lock = threading.Lock()
        self.sampler = CpuSampler(cores, self._load)

    def _load(self, started: float, finished: float, busy: float, cores: int) -> None:
        span = ev.SpanRecorded(
            name="cpu",
            started=started,
            finished=finished,
            worker="machine",
            metrics={"busy": round(busy, 4), "cores": cores},
        )
        with self._loads_lock:
            self._loads.append(span)

    def _write_loads(self) -> None:
        with self._loads_lock:
            loads, self._loads = self._loads, []
        for span in loads:  # not in the step's busy window: the machine's, not a worker's
            self._write(span)

    # --- what the run routes -----------------------------------------------------------------

    def event(self, event: Any) -> None:
        """An event from a worker (or the run's own, e.g. ``CheckpointSaved``)."""
        self.events_log(event)
        if isinstance(event, ev.WeightsSynced):
            m = event.metrics
            self.span(
                ev.SpanRecorded(
                    name="weight_sync",
                    started=m["started"],
                    finished=m["finished"],
                    worker="engine",
                )
            )

    def batch_event(self, event: ev.Event) -> None:
        """An event of a batch in flight: tool calls and grading as spans (from the events
        that bound them)."""
        self.trajectories_log(event)
        if isinstance(event, ev.ToolFinished):
            self.span(
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
            self.span(
                ev.SpanRecorded(
                    name="grading",
                    started=self._completed.pop(event.episode_id),
                    finished=event.t,
                    worker="sandbox",
                    episode_id=event.episode_id,
                )
            )

    def learner_event(self, event: ev.Event) -> None:
        """An event the learner (rank 0) publishes: its backward pieces are spans too."""
        self.events_log(event)
        if isinstance(event, ev.GradientComputed):
            self.span(backward_span(event, "learner"))

    def _write(self, span: ev.SpanRecorded) -> None:
        record = ev.summarize(span)
        record.pop("event", None)
        self.spans_log.write(dumps_nulled(record) + "\n")

    def span(self, span: ev.SpanRecorded) -> None:
        self._write(span)
        if span.name == "backward":  # batched pieces share one interval: count it once
            self._backward_intervals.append((span.started, span.finished))
        else:
            self._window[span.name] += max(0.0, span.finished - span.started)

    @contextmanager
    def timed(self, name: str, *, worker: str = "learner", **fields: Any) -> Iterator[None]:
        """A span of what the ``with`` block does (none if it raises)."""
        started = ev.now()
        yield
        self.span(
            ev.SpanRecorded(name=name, started=started, finished=ev.now(), worker=worker, **fields)
        )

    # --- the step's record -------------------------------------------------------------------

    def start_clock(self) -> None:
        """The workers are ready: the first step's time counts from now."""
        self.clock_start = ev.now()
        self.sampler.start()

    def step_record(
        self, step: int, tracker: BatchTracker, learned: dict[str, Any], *, device: str
    ) -> dict[str, Any]:
        """Batch ``step``'s metrics, written to ``metrics.jsonl``; the window starts anew."""
        self._write_loads()
        now = ev.now() - self.clock_start
        step_time, self._last_time_s = now - self._last_time_s, now
        window, self._window = dict(self._window), defaultdict(float)
        window["backward"] = _union(self._backward_intervals)
        self._backward_intervals = []
        busy = window.get("backward", 0.0) + window.get("step", 0.0)
        metrics = {
            "step": step + 1,  # batch ``step`` (episode ids s<step>-…) feeds optimizer step step+1
            "step_base": STEP_BASE,
            "mode": self.mode,
            "time_s": now,
            "submitted_at": tracker.submitted_at,
            "finished_at": ev.now(),
            "step_time_s": step_time,
            **tracker.stats(),
            "learner": {**learned, "device": device},
            "breakdown_s": window,
            "learner_idle_fraction": max(0.0, 1.0 - busy / step_time) if step_time else None,
            "engine_idle_fraction": (
                max(0.0, 1.0 - window.get("engine", 0.0) / step_time) if step_time else None
            ),
        }
        self.metrics.log(metrics)
        return metrics

    def close(self) -> None:
        self.sampler.close()
        self._write_loads()
        self.metrics.close()
        self.events_log.close()
        self.trajectories_log.close()
        self.spans_log.close()


def _union(intervals: list[tuple[float, float]]) -> float:
    """Seconds covered by at least one interval."""
    total, end = 0.0, float("-inf")
    for lo, hi in sorted(intervals):
        if hi > end:
            total += hi - max(lo, end)
            end = hi
    return total


def progress_line(m: dict[str, Any], total: int) -> str:
    """A step's console line. The step's time is wall-clock since the previous step ended;
    engine and learner are busy time within it (one engine, one learner); tools and grading
    are per-episode means, because episodes run them concurrently and their sum can exceed the
    step. Where the step's batch was handed out before the previous step ended (async: it
    rolls out during older steps), the line says how long before, so that a short step whose
    batch was already done does not read as a fast one."""
    b, n = m["breakdown_s"], max(m["num_episodes"], 1)
    early = ""
    if "submitted_at" in m and "finished_at" in m:
        age = m["finished_at"] - m["submitted_at"]
        if age > m["step_time_s"] * 1.05:
            early = f"; its batch was handed out {age:.2f} s before, during earlier steps"

    def fmt(v: Any, spec: str = ".3f") -> str:
        return "n/a" if v is None else format(v, spec)

    failed = m.get("num_infra_failures") or 0
    infra = (
        f"; {failed} infrastructure failure(s), not trained on (events.jsonl says why)"
        if failed
        else ""
    )
    return (
        f"step {m['step']}/{total}: reward mean {fmt(m['reward_mean'])}, "
        f"solved {fmt(m['accuracy'], '.0%')} of {m['num_episodes']} episodes (reward >= 1); "
        f"wall-clock {m['step_time_s']:.2f} s since the previous step (engine busy "
        f"{b.get('engine', 0):.2f}, learner {b.get('backward', 0) + b.get('step', 0):.2f}; per "
        f"episode: tools {b.get('tool', 0) / n:.2f}, grading {b.get('grading', 0) / n:.2f})"
        f"{early}{infra}"
    )


def backward_span(event: ev.GradientComputed, worker: str) -> ev.SpanRecorded:
    """The span of one backward piece a learner (``worker``) computed."""
    return ev.SpanRecorded(
        name="backward",
        started=event.started,
        finished=event.finished,
        worker=worker,
        episode_id=event.episode_id,
        turn=event.turn,
    )
