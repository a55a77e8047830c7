"""Run records: metrics (JSONL always; TensorBoard and W&B offline when asked and installed),
spans, and the per-batch bookkeeping that says when a batch is complete and what it scored."""

from __future__ import annotations

import json
import math
import operator
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord
from thundersync.protocol.strict_json import dumps_nulled

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


@dataclass(slots=True)
class BatchTracker:
    """What arrived for one rollout batch, as one ``EpisodeRecord`` per episode; complete when
    every episode has its reward (and, for OPD, a teacher score for each of its turns)."""

    step: int
    episode_ids: frozenset[str]
    needs_teacher: bool
    submitted_at: float = 0.0
    """Run-clock time the batch was handed to the rollout worker."""
    events: list[ev.Event] = field(default_factory=list)
    records: dict[str, EpisodeRecord] = field(default_factory=dict)
    graded: int = 0
    """Episodes whose reward arrived: ``complete`` is asked after every event, so it counts
    instead of scanning every record until the last reward is in."""

    def apply(self, event: ev.EpisodeEvent) -> None:
        self.events.append(event)
        eid = event.episode_id
        record = self.records.setdefault(eid, EpisodeRecord(eid))
        self.graded += isinstance(event, ev.RewardReady) and record.reward is None
        record.fold(event)

    def take(self) -> list[ev.Event]:
        """The events that arrived since the last ``take``."""
        taken, self.events = self.events, []
        return taken

    @property
    def complete(self) -> bool:
        if self.graded < len(self.episode_ids):
            return False
        records = [self.records.get(e) for e in self.episode_ids]
        if not all(r is not None and r.has_reward for r in records):
            return False
        return not self.needs_teacher or all(
            len(r.scores) >= (r.num_turns or 0) for r in records if r is not None
        )

    @property
    def num_action_tokens(self) -> int:
        return sum(r.num_action_tokens for r in self.records.values())

    def stats(self) -> dict[str, Any]:
        """Rollout statistics; ``teacher_kl`` (OPD) is the mean over sampled tokens of
        log π_sampler − log π_teacher, an estimate of KL(student ‖ teacher) on the student's
        own samples: what on-policy distillation drives down."""
        records = self.records.values()
        graded = [r.reward for r in records if r.reward is not None]
        scored = [r for r in graded if not r.infra_failure]
        rewards = [float(r.reward) for r in scored]  # ints, Fractions, Decimals too
        completed = [r.completed for r in records if r.completed is not None]
        turns = [c.num_turns for c in completed]
        lengths = [
            self.records[e].num_action_tokens if e in self.records else 0
            for e in sorted(self.episode_ids)
        ]
        gap = [  # (Σ log π_sampler − log π_teacher, tokens) of each scored turn
            (
                sum(map(operator.sub, a.action_logprobs, r.scores[k].teacher_logprobs)),
                len(a.action_ids),
            )
            for r in records
            for k, a in r.actions.items()
            if k in r.scores
        ]
        gap_sum, gap_count = sum(g for g, _ in gap), sum(n for _, n in gap)
        mean = sum(rewards) / len(rewards) if rewards else None
        return {
            "reward_mean": mean,
            "reward_std": (
                math.sqrt(sum((r - mean) ** 2 for r in rewards) / len(rewards))
                if mean is not None
                else None
            ),
            "accuracy": sum(r >= 1.0 for r in rewards) / len(rewards) if rewards else None,
            "num_episodes": len(self.episode_ids),
            "num_infra_failures": len(graded) - len(scored),
            "stop_reasons": dict(Counter(c.stop_reason for c in completed)),
            "turns_mean": sum(turns) / len(turns) if turns else None,
            "num_action_tokens": self.num_action_tokens,
            "response_tokens_mean": sum(lengths) / len(lengths) if lengths else None,
            "response_tokens_max": max(lengths, default=None),
            "teacher_kl": gap_sum / gap_count if gap_count else None,
        }
