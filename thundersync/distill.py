"""Streaming on-policy distillation: each turn's gradient while that turn's tool call runs.

Turn k's OPD terms depend only on the context up to action k and on the teacher's scores of
action k, so its piece can be computed as soon as ``TeacherScored(turn=k)`` arrives, before
observation k exists. A per-turn piece re-runs the prefix forward, so the learner's cost grows
with the number of turns; per-episode work runs one forward at the end. Both are exact; the
``auto`` granularity picks per episode from the measured tool latency and turn backward time.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from thundersync import events as ev
from thundersync.assembly import EpisodeRecord
from thundersync.batch import opd_batch_grad
from thundersync.canonical import PieceStore
from thundersync.gradients import BufferPool, opd_piece
from thundersync.objectives import OPD
from thundersync.policy import Policy

EPISODE = -1  # the piece key's turn for per-episode work


class OPDStream:
    """OPD pieces for one batch. ``update`` after every consumed event; ``finish`` returns the
    gradient sum (before the denominator). In deterministic mode pieces are held and summed in
    canonical order (episodes by natural id, then turns), the same as deterministic sync."""

    def __init__(
        self,
        policy: Policy,
        objective: OPD,
        pool: BufferPool,
        *,
        deterministic: bool,
        streaming: bool,
        micro_batch_size: int,
        publish: Callable[[ev.Event], None] | None,
    ) -> None:
        self.policy, self.objective, self.publish = policy, objective, publish
        self.deterministic, self.streaming = deterministic, streaming
        self.micro_batch_size = micro_batch_size
        self.queue: dict[str, EpisodeRecord] = {}
        self.store = PieceStore(pool)
        self.step_grad = pool.zeros()
        self.done: set[tuple[str, int]] = set()
        self.granularity: dict[str, str] = {}
        self.tool_latency_s: float | None = None
        self.turn_backward_s: float | None = None
        self.num_backward = 0

    def observe_tool(self, duration_s: float) -> None:
        self.tool_latency_s = _ema(self.tool_latency_s, duration_s)

    def _resolve(self, rec: EpisodeRecord) -> str:
        if rec.episode_id not in self.granularity:
            choice = self.objective.granularity
            if self.objective.loss_agg == "seq-mean-token-mean":
                choice = "episode"  # its weight 1/T_i needs the episode's final length
            elif choice == "auto" and (self.deterministic or not self.streaming):
                choice = "episode"
            elif choice == "auto":
                slow_tools = (
                    self.turn_backward_s is None or self.tool_latency_s is None
                    or self.tool_latency_s >= self.turn_backward_s
                )  # fmt: skip
                choice = "turn" if slow_tools else "episode"
            self.granularity[rec.episode_id] = choice
        return self.granularity[rec.episode_id]

    def _keys(self, rec: EpisodeRecord) -> list[tuple[str, int]]:
        if self._resolve(rec) == "episode":
            return [(rec.episode_id, EPISODE)]
        return [(rec.episode_id, k) for k in range(rec.num_turns or len(rec.actions))]

    def _compute(self, rec: EpisodeRecord, turn: int) -> torch.Tensor:
        started = ev.now()
        if turn == EPISODE:
            turns = list(range(rec.num_turns or 0))
            vector = opd_piece(self.policy, self.objective, rec.trajectory(), turns)
        else:
            vector = opd_piece(self.policy, self.objective, rec.trajectory(turn), [turn])
            self.turn_backward_s = _ema(self.turn_backward_s, ev.now() - started)
        self._published(rec.episode_id, None if turn == EPISODE else turn, started)
        return vector

    def _published(self, episode_id: str, turn: int | None, started: float) -> None:
        self.num_backward += 1
        if self.publish is not None:
            self.publish(ev.GradientComputed(
                episode_id=episode_id, turn=turn, started=started, finished=ev.now()
            ))  # fmt: skip

    def _ready(self, rec: EpisodeRecord, turn: int) -> bool:
        if turn == EPISODE:
            return rec.tokens_ready and rec.teacher_ready
        return rec.turn_ready(turn) and turn in rec.teacher

    def update(self, rec: EpisodeRecord) -> None:
        if rec.started is not None and rec.num_turns != 0:  # no actions, nothing to train
            self.queue[rec.episode_id] = rec

    def drain(self) -> None:
        """Run queued pieces. Outside deterministic mode, episodes that became wholly ready
        with no piece done yet are batched at episode granularity (exact, and one padded
        backward per micro-batch instead of one per turn)."""
        queued, self.queue = list(self.queue.values()), {}
        if not self.deterministic:
            whole = [
                rec for rec in queued
                if rec.tokens_ready and rec.teacher_ready
                and not any(key in self.done for key in self._keys(rec))
            ]  # fmt: skip
            if len(whole) > 1:
                started = ev.now()
                opd_batch_grad(self.policy, self.objective, whole,
                               micro_batch_size=self.micro_batch_size, total=self.step_grad)
                for rec in whole:
                    self.done.update(self._keys(rec))
                    self._published(rec.episode_id, None, started)
        for rec in queued:
            self._run_ready(rec)

    def _run_ready(self, rec: EpisodeRecord) -> None:
        if self._resolve(rec) == "turn":
            candidates = [(rec.episode_id, k) for k in sorted(rec.actions)]
        else:
            candidates = [(rec.episode_id, EPISODE)]
        for key in candidates:
            if key in self.done or not self._ready(rec, key[1]):
                continue
            if self.deterministic:
                self.store.offer(key, 1, lambda k=key: (self._compute(rec, k[1]),))
                if self.store.has(key):
                    self.done.add(key)
            else:
                self.step_grad.add_(self._compute(rec, key[1]))
                self.done.add(key)

    def finish(self, episodes: list[EpisodeRecord]) -> torch.Tensor:
        """Complete every missing piece; sum in canonical order when deterministic."""
        self.drain()
        for rec in episodes:
            for key in self._keys(rec):
                if self.deterministic:
                    (vector,) = self.store.get(key, lambda k=key, r=rec: (self._compute(r, k[1]),))
                    self.step_grad.add_(vector)
                elif key not in self.done:
                    self.step_grad.add_(self._compute(rec, key[1]))
        self.store.clear()
        return self.step_grad


def _ema(old: float | None, new: float, alpha: float = 0.2) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new
