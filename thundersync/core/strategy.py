"""The gradient-strategy protocol: how one batch's gradient sum is computed.

The learner picks one implementation in its constructor and makes a fresh instance per batch:

| strategy | module | when |
|---|---|---|
| ``BatchGRPO`` | batch | GRPO, sync, on-policy: the textbook batched computation at the step |
| ``OffPolicyGRPO`` | batch | GRPO, sync, ``max_staleness > 0``: PPO-clip against the sampler |
| ``StreamingGRPO`` | streaming | GRPO, streaming: per-group accumulators, work as inputs fix |
| ``CanonicalGRPO`` | canonical | GRPO, ``deterministic``: sync and streaming, bitwise equal |
| ``BatchOPD`` | batch | OPD, sync |
| ``PiecewiseOPD`` | distill | OPD, streaming or ``deterministic`` |
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from thundersync.core.gradients import BufferPool
from thundersync.core.holds import Pace
from thundersync.core.learner_metrics import TokenStats
from thundersync.core.policy import Policy
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord

Groups = dict[str, list[EpisodeRecord]]
"""Episodes by group id, both in canonical order (``Assembler.groups``)."""


@dataclass(frozen=True, slots=True)
class BatchContext:
    """What every strategy of one batch computes with."""

    policy: Policy
    reference: Policy | None
    """The frozen reference model of GRPO's KL term (None without one)."""
    pool: BufferPool
    """The budget of parameter-sized buffers beyond the step's gradient."""
    stats: TokenStats
    """Where every forward pass notes the learner's log-probs against the sampler's."""
    micro_batch_size: int
    publish: Callable[[ev.Event], None] | None
    new_sum: Callable[[], torch.Tensor] | None = None
    """Makes the deterministic strategies' step sum (None: a zero buffer). The data-parallel
    learner passes a recorder of the canonical addends (``thundersync.core.data_parallel``)."""
    pace: Pace | None = None
    """The learner's measured pace, where its caller wakes it to run held work
    (``thundersync.core.holds``); None: streaming holds nothing."""

    def step_sum(self) -> torch.Tensor:
        """The sum a deterministic strategy adds its canonical addends into, in order."""
        return self.pool.zeros() if self.new_sum is None else self.new_sum()

    def published(self, episode_id: str, turn: int | None, started: float) -> None:
        """Announce one finished piece of gradient work (``GradientComputed``)."""
        if self.publish is not None:
            self.publish(
                ev.GradientComputed(
                    episode_id=episode_id, turn=turn, started=started, finished=ev.now()
                )
            )


def begin_group(total: torch.Tensor, group_id: str) -> None:
    """Say that the addends a deterministic reduction adds next belong to ``group_id``: a
    recording step sum keeps each group's addends apart; a plain tensor ignores this."""
    mark = getattr(total, "begin_group", None)
    if mark is not None:
        mark(group_id)


class GradientStrategy(Protocol):
    """One batch's gradient computation. ``on_event`` after every applied event, ``drain``
    when the caller wants unblocked work done, ``finish`` once at the step."""

    def on_event(self, event: ev.Event, rec: EpisodeRecord) -> None:
        """Note what ``event`` (already applied to ``rec``) unblocked; work runs in ``drain``."""
        ...

    def drain(self) -> None:
        """Run the work that consumed events unblocked (sync strategies have none)."""
        ...

    def finish(self, groups: Groups) -> tuple[torch.Tensor, list[EpisodeRecord]]:
        """The batch's gradient sum before the denominator D, and the episodes trained on
        (whose action tokens D counts)."""
        ...
