"""On-policy distillation from pieces: streaming computes each turn's gradient while that
turn's tool call runs; deterministic mode sums the pieces in canonical order (sync and
streaming alike).

Turn k's OPD terms depend only on the context up to action k and on the teacher's scores of
action k, so its piece can be computed as soon as ``TeacherScored(turn=k)`` arrives, before
observation k exists. A per-turn piece re-runs the prefix forward, so the learner's cost grows
with the number of turns; per-episode work runs one forward at the end. Both are exact; the
``auto`` granularity picks per episode from the measured tool latency and turn backward time.
"""

from __future__ import annotations

import torch

from thundersync.core.batch import opd_batch_grad, opd_episodes
from thundersync.core.canonical import PieceStore
from thundersync.core.gradients import opd_piece
from thundersync.core.objectives import OPD
from thundersync.core.strategy import BatchContext, Groups, begin_group
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord

EPISODE = -1  # the piece key's turn for per-episode work


class PiecewiseOPD:
    """OPD from per-turn or per-episode pieces. Streaming computes each piece as soon as its
    inputs are fixed; ``deterministic`` holds the pieces and sums them in canonical order
    (episodes by natural id, then turns), so deterministic sync (which computes every piece
    at the step) and deterministic streaming are bitwise equal."""

    def __init__(
        self, ctx: BatchContext, objective: OPD, *, deterministic: bool, streaming: bool
    ) -> None:
        self.ctx, self.objective = ctx, objective
        self.deterministic, self.streaming = deterministic, streaming
        self.unblocked: dict[str, EpisodeRecord] = {}
        self.store = PieceStore(ctx.pool)
        self.computed: set[tuple[str, int]] = set()
        """Pieces already in the step's gradient (or, when deterministic, in the store)."""
        self.granularity: dict[str, str] = {}
        self.tool_latency_s: float | None = None
        self.turn_backward_s: float | None = None
        self._total: torch.Tensor | None = None

    def on_event(self, event: ev.Event, rec: EpisodeRecord) -> None:
        if isinstance(event, ev.ToolFinished):
            self.tool_latency_s = _ema(self.tool_latency_s, event.duration_s)
        if self.streaming and rec.started is not None and rec.num_turns != 0:
            self.unblocked[rec.episode_id] = rec  # no actions: nothing to train

    def _step_grad(self) -> torch.Tensor:
        """The step's gradient sum, allocated at first use (nothing outlives a step)."""
        if self._total is None:
            self._total = self.ctx.step_sum() if self.deterministic else self.ctx.pool.zeros()
        return self._total

    def _resolve(self, rec: EpisodeRecord) -> str:
        if rec.episode_id not in self.granularity:
            choice = self.objective.granularity
            if self.objective.loss_agg == "seq-mean-token-mean":
                choice = "episode"  # its weight 1/T_i needs the episode's final length
            elif choice == "auto" and (self.deterministic or not self.streaming):
                choice = "episode"
            elif choice == "auto":
                slow_tools = (
                    self.turn_backward_s is None
                    or self.tool_latency_s is None
                    or self.tool_latency_s >= self.turn_backward_s
                )
                choice = "turn" if slow_tools else "episode"
            self.granularity[rec.episode_id] = choice
        return self.granularity[rec.episode_id]

    def _keys(self, rec: EpisodeRecord) -> list[tuple[str, int]]:
        if self._resolve(rec) == "episode":
            return [(rec.episode_id, EPISODE)]
        return [(rec.episode_id, k) for k in range(rec.num_turns or len(rec.actions))]

    def _compute(self, rec: EpisodeRecord, turn: int) -> torch.Tensor:
        started = ev.now()
        ctx = self.ctx
        if turn == EPISODE:
            turns = list(range(rec.num_turns or 0))
            vector = opd_piece(
                ctx.policy,
                self.objective,
                rec.trajectory(),
                turns,
                ctx.stats,
                key=(rec.episode_id, None),
            )
        else:
            vector = opd_piece(
                ctx.policy,
                self.objective,
                rec.trajectory(turn),
                [turn],
                ctx.stats,
                key=(rec.episode_id, turn),
            )
            self.turn_backward_s = _ema(self.turn_backward_s, ev.now() - started)
        ctx.published(rec.episode_id, None if turn == EPISODE else turn, started)
        return vector

    def _ready(self, rec: EpisodeRecord, turn: int) -> bool:
        if turn == EPISODE:
            return rec.tokens_ready and rec.teacher_ready
        return rec.turn_ready(turn) and turn in rec.scores

    def drain(self) -> None:
        """Run unblocked pieces. Outside deterministic mode, what has queued shares padded
        passes (exact, one backward per micro-batch instead of one per piece): episodes that
        became wholly ready with no piece done yet, at episode granularity; then every ready
        turn not yet computed, one row per episode (the prefix to its last ready turn)."""
        unblocked, self.unblocked = list(self.unblocked.values()), {}
        if not self.deterministic:
            whole = [
                rec
                for rec in unblocked
                if rec.tokens_ready
                and rec.teacher_ready
                and not any(key in self.computed for key in self._keys(rec))
            ]
            if len(whole) > 1:
                started = ev.now()
                opd_batch_grad(self.ctx, self.objective, whole, total=self._step_grad())
                for rec in whole:
                    self.computed.update(self._keys(rec))
                    self.ctx.published(rec.episode_id, None, started)
            self._batch_turns(unblocked)
        for rec in unblocked:
            self._run_ready(rec)

    def _pending(self, rec: EpisodeRecord) -> list[int]:
        """The turns (or ``EPISODE``) of ``rec`` whose inputs are fixed and not yet computed."""
        turns = sorted(rec.actions) if self._resolve(rec) == "turn" else [EPISODE]
        return [
            k for k in turns if (rec.episode_id, k) not in self.computed and self._ready(rec, k)
        ]

    def _batch_turns(self, unblocked: list[EpisodeRecord]) -> None:
        """Every ready, uncomputed turn of per-turn episodes in one batched pass, where there
        is more than one (a lone turn is ``_run_ready``'s); ``auto`` is told what a turn cost."""
        pieces = [
            (rec, ready)
            for rec in unblocked
            if self._resolve(rec) == "turn" and (ready := self._pending(rec))
        ]
        count = sum(len(ks) for _, ks in pieces)
        if count < 2:
            return
        started = ev.now()
        records, turns = [rec for rec, _ in pieces], [ks for _, ks in pieces]
        opd_batch_grad(self.ctx, self.objective, records, total=self._step_grad(), turns=turns)
        self.turn_backward_s = _ema(self.turn_backward_s, (ev.now() - started) / count)
        for rec, ks in pieces:
            for k in ks:
                self.computed.add((rec.episode_id, k))
                self.ctx.published(rec.episode_id, k, started)

    def _run_ready(self, rec: EpisodeRecord) -> None:
        for key in [(rec.episode_id, k) for k in self._pending(rec)]:
            if self.deterministic:

                def piece(k: tuple[str, int] = key) -> tuple[torch.Tensor]:
                    return (self._compute(rec, k[1]),)

                self.store.offer(key, 1, piece)
                if self.store.has(key):
                    self.computed.add(key)
            else:
                self._step_grad().add_(self._compute(rec, key[1]))
                self.computed.add(key)

    def finish(self, groups: Groups) -> tuple[torch.Tensor, list[EpisodeRecord]]:
        """Complete every missing piece; sum in canonical order when deterministic."""
        episodes = opd_episodes(groups)
        self.drain()
        total = self._step_grad()
        for rec in episodes:
            if self.deterministic and rec.group_id is not None:
                begin_group(total, rec.group_id)
            for key in self._keys(rec):
                if self.deterministic:

                    def piece(
                        k: tuple[str, int] = key, r: EpisodeRecord = rec
                    ) -> tuple[torch.Tensor]:
                        return (self._compute(r, k[1]),)

                    (vector,) = self.store.get(key, piece)
                    total.add_(vector)
                elif key not in self.computed:
                    total.add_(self._compute(rec, key[1]))
        self.store.clear()
        return total, episodes


def _ema(old: float | None, new: float, alpha: float = 0.2) -> float:
    return new if old is None else (1 - alpha) * old + alpha * new
