"""Run records: metrics (JSONL always; TensorBoard and W&B offline when asked and installed),
spans, and the per-batch bookkeeping that says when a batch is complete and what it scored."""

from __future__ import annotations

import json
import math
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thundersync import events as ev
from thundersync.strict_json import dumps_nulled

STEP_BASE = 1
"""``metrics.jsonl``'s ``step`` counts optimizer steps from 1, as checkpoints do: the record of
step N describes the N-th optimizer step, whose weights ``checkpoints/step-00000N`` holds.
Each record says so with ``"step_base": 1``; records written before (no ``step_base``)
counted from 0, and ``step_number`` reads both."""


def step_number(record: dict[str, Any]) -> int:
    """The step (counted from 1) a ``metrics.jsonl`` record describes, old records included."""
    return int(record["step"]) + 1 - int(record.get("step_base", 0))


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """A run's ``metrics.jsonl``, every record's ``step`` counted from 1 (old runs' too)."""
    records = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    return [{**r, "step": step_number(r), "step_base": STEP_BASE} for r in records]


class MetricsLogger:
    """``metrics.jsonl`` (one JSON object per step), plus TensorBoard / W&B with the same
    names (nested keys joined with ``/``). Non-finite numbers are written as null."""

    def __init__(self, folder: Path, *, tensorboard: bool, wandb: bool, config: dict) -> None:
        self.path = folder / "metrics.jsonl"
        self._file = self.path.open("a", encoding="utf-8")
        self._tb = self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

            self._tb = SummaryWriter(log_dir=str(folder / "tensorboard"))
        if wandb:
            import wandb as wandb_module

            self._wandb = wandb_module.init(
                mode="offline", dir=str(folder), config=config, project="thundersync"
            )

    def log(self, metrics: dict[str, Any]) -> None:
        line = dumps_nulled(metrics)
        clean = json.loads(line)
        self._file.write(line + "\n")
        self._file.flush()
        scalars = {k: v for k, v in _flatten(clean).items() if isinstance(v, int | float)}
        step = int(metrics["step"])
        if self._tb is not None:
            for key, value in scalars.items():
                self._tb.add_scalar(key, value, step)
            self._tb.flush()
        if self._wandb is not None:
            self._wandb.log(scalars, step=step)

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()


def truncate_metrics(path: Path, completed_steps: int) -> None:
    """Drop records of steps a resumed run will redo (step number > completed_steps), and
    renumber an old run's records from 1 so the file the resumed run appends to is uniform."""
    if not path.is_file():
        return
    kept = [r for r in read_metrics(path) if r["step"] <= completed_steps]
    path.write_text("".join(dumps_nulled(r) + "\n" for r in kept), encoding="utf-8")


def _flatten(metrics: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "/"))
        elif not isinstance(value, bool):
            flat[name] = value
    return flat


# --- one batch ---------------------------------------------------------------------------------


def step_of(episode_id: str) -> int:
    """The batch an episode id (``s<step>-g<group>-e<sample>``) belongs to; -1 if none."""
    head = episode_id.split("-", 1)[0]
    return int(head[1:]) if head.startswith("s") and head[1:].isdigit() else -1


@dataclass(slots=True)
class BatchTracker:
    """What arrived for one rollout batch; complete when every episode has its reward (and,
    for OPD, a teacher score for each of its turns)."""

    step: int
    episode_ids: frozenset[str]
    needs_teacher: bool
    submitted_at: float = 0.0
    """Run-clock time the batch was handed to the rollout worker."""
    events: list[ev.Event] = field(default_factory=list)
    rewards: dict[str, ev.RewardReady] = field(default_factory=dict)
    completed: dict[str, ev.EpisodeCompleted] = field(default_factory=dict)
    scored: Counter = field(default_factory=Counter)
    num_action_tokens: int = 0
    episode_tokens: Counter = field(default_factory=Counter)
    """Action (response) tokens per episode, over all its turns."""
    tool_s: float = 0.0
    grading_s: float = 0.0
    sampler_logprobs: dict[tuple[str, int], tuple[float, ...]] = field(default_factory=dict)
    teacher_gap: list[float] = field(default_factory=lambda: [0.0, 0.0])
    """Σ (log π_sampler − log π_teacher) over scored tokens, and their count (OPD)."""

    def apply(self, event: ev.Event) -> None:
        self.events.append(event)
        eid = getattr(event, "episode_id", None)
        if isinstance(event, ev.RewardReady):
            self.rewards[eid] = event
            if eid in self.completed:
                self.grading_s += max(0.0, event.t - self.completed[eid].t)
        elif isinstance(event, ev.EpisodeCompleted):
            self.completed[eid] = event
        elif isinstance(event, ev.TeacherScored):
            self.scored[eid] += 1
            sampled = self.sampler_logprobs.pop((eid, event.turn), ())
            self.teacher_gap[0] += sum(s - t for s, t in zip(sampled, event.teacher_logprobs))
            self.teacher_gap[1] += len(sampled)
        elif isinstance(event, ev.TurnCompleted):
            self.num_action_tokens += len(event.action_ids)
            self.episode_tokens[eid] += len(event.action_ids)
            self.sampler_logprobs[(eid, event.turn)] = event.action_logprobs
        elif isinstance(event, ev.ToolFinished):
            self.tool_s += event.duration_s

    def take(self) -> list[ev.Event]:
        """The events that arrived since the last ``take``."""
        taken, self.events = self.events, []
        return taken

    @property
    def complete(self) -> bool:
        if len(self.rewards) < len(self.episode_ids):
            return False
        if not self.needs_teacher:
            return True
        return all(self.scored[e] >= self.completed[e].num_turns for e in self.episode_ids)

    def stats(self) -> dict[str, Any]:
        """Rollout statistics; ``teacher_kl`` (OPD) is the mean over sampled tokens of
        log π_sampler − log π_teacher, an estimate of KL(student ‖ teacher) on the student's
        own samples: what on-policy distillation drives down."""
        scored = [r for r in self.rewards.values() if not r.infra_failure]
        rewards = [float(r.reward) for r in scored]  # ints, Fractions, Decimals too
        turns = [c.num_turns for c in self.completed.values()]
        lengths = [self.episode_tokens[e] for e in sorted(self.episode_ids)]
        mean = sum(rewards) / len(rewards) if rewards else None
        return {
            "reward_mean": mean,
            "reward_std": (
                math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards)) if rewards else None
            ),
            "accuracy": sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else None,
            "num_episodes": len(self.episode_ids),
            "num_infra_failures": len(self.rewards) - len(scored),
            "stop_reasons": dict(Counter(c.stop_reason for c in self.completed.values())),
            "turns_mean": sum(turns) / len(turns) if turns else None,
            "num_action_tokens": self.num_action_tokens,
            "response_tokens_mean": sum(lengths) / len(lengths) if lengths else None,
            "response_tokens_max": max(lengths, default=None),
            "teacher_kl": (
                self.teacher_gap[0] / self.teacher_gap[1] if self.teacher_gap[1] else None
            ),
        }
