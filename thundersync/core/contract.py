"""What a training mode promises the learner, and what the learner accepts in return
(docs/design.md §4): whether gradient work starts as events arrive, which policy versions'
tokens it takes (its version window), which objectives it can train, and the gradient
strategy (``thundersync.core.strategy``) that makes each batch's gradient.

Three contracts: ``OnBatch`` (sync: the batch is learned from at ``step()``), ``Streaming``
(zero staleness, work as its inputs fix) and ``BoundedStaleness(k)`` (async: tokens up to k
versions old, PPO-clip against the sampler). Each mode object of ``thundersync.training.modes``
gives one (``Mode.learner_contract()``); the public flags ``Learner(streaming=...,
max_staleness=...)`` name one through ``contract_for``, the only place the flags are read.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import ClassVar, Protocol

from thundersync.core.batch import BatchGRPO, BatchOPD, OffPolicyGRPO
from thundersync.core.canonical import CanonicalGRPO
from thundersync.core.distill import PiecewiseOPD
from thundersync.core.objectives import GRPO, OPD, Objective
from thundersync.core.strategy import BatchContext, GradientStrategy
from thundersync.core.streaming_grpo import StreamingGRPO

StrategyMaker = Callable[[BatchContext], GradientStrategy]
"""Makes the strategy of one batch (the learner calls it once per batch)."""


class LearnerContract(Protocol):
    """One mode's terms with the learner."""

    @property
    def streams(self) -> bool:
        """Whether gradient work starts while the batch still arrives (at ``consume``)."""
        ...

    def accepted_lag(self) -> tuple[int, str] | None:
        """How many versions behind the learner a token may be, and why (said when a token
        is refused); None: not checked (sync trains the batch it is given as on-policy)."""
        ...

    def problem(self, objective: Objective) -> str | None:
        """Why this contract cannot train ``objective`` (a config error), or None."""
        ...

    def strategy(
        self, objective: Objective, *, deterministic: bool, early_start: bool
    ) -> StrategyMaker:
        """The strategy class, with its options, of every batch."""
        ...


@dataclass(frozen=True, slots=True)
class OnBatch:
    """Sync: the learner collects the batch and computes its gradient at ``step()``."""

    streams: ClassVar[bool] = False

    def accepted_lag(self) -> tuple[int, str] | None:
        return None

    def problem(self, objective: Objective) -> str | None:
        return None

    def strategy(
        self, objective: Objective, *, deterministic: bool, early_start: bool
    ) -> StrategyMaker:
        if isinstance(objective, OPD):
            if deterministic:
                return partial(
                    PiecewiseOPD, objective=objective, deterministic=True, streaming=False
                )
            return partial(BatchOPD, objective=objective)
        if deterministic:
            return partial(CanonicalGRPO, objective=objective, precompute=False)
        return partial(BatchGRPO, objective=objective)


@dataclass(frozen=True, slots=True)
class Streaming:
    """Zero staleness: each piece of gradient work starts when its inputs are fixed."""

    streams: ClassVar[bool] = True

    def accepted_lag(self) -> tuple[int, str] | None:
        return 0, "streaming trains only on tokens of the current policy (zero staleness)"

    def problem(self, objective: Objective) -> str | None:
        return None

    def strategy(
        self, objective: Objective, *, deterministic: bool, early_start: bool
    ) -> StrategyMaker:
        if isinstance(objective, OPD):
            return partial(
                PiecewiseOPD, objective=objective, deterministic=deterministic, streaming=True
            )
        if deterministic:
            return partial(CanonicalGRPO, objective=objective, precompute=True)
        return partial(StreamingGRPO, objective=objective, early_start=early_start)


@dataclass(frozen=True, slots=True)
class BoundedStaleness:
    """Async: tokens sampled up to ``staleness`` versions behind the learner, learned from at
    ``step()`` with the PPO ratio against the sampler's log-probs (one reduction order, so
    ``deterministic`` changes nothing)."""

    staleness: int
    streams: ClassVar[bool] = False

    def __post_init__(self) -> None:
        if not isinstance(self.staleness, int) or isinstance(self.staleness, bool):
            raise ValueError(f"max_staleness={self.staleness!r}: expected an int >= 1")
        if self.staleness < 1:
            raise ValueError(f"max_staleness={self.staleness!r}: expected an int >= 1")

    def accepted_lag(self) -> tuple[int, str] | None:
        return self.staleness, f"max_staleness={self.staleness}"

    def problem(self, objective: Objective) -> str | None:
        if isinstance(objective, OPD):
            return f"max_staleness={self.staleness}: OPD has no off-policy correction here"
        if isinstance(objective, GRPO) and objective.tis_cap is not None:
            return (
                f"GRPO(tis_cap={objective.tis_cap}) with max_staleness={self.staleness}: the "
                "PPO ratio against the sampler's log-probs already holds π_learner/π_engine; "
                "tis_cap corrects the on-policy path only"
            )
        return None

    def strategy(
        self, objective: Objective, *, deterministic: bool, early_start: bool
    ) -> StrategyMaker:
        return partial(OffPolicyGRPO, objective=objective)


def contract_for(*, streaming: bool, max_staleness: int) -> LearnerContract:
    """The contract the public flags of ``Learner`` name."""
    if not isinstance(max_staleness, int) or isinstance(max_staleness, bool) or max_staleness < 0:
        raise ValueError(f"max_staleness={max_staleness!r}: expected an int >= 0")
    if max_staleness > 0 and streaming:
        raise ValueError(
            f"max_staleness={max_staleness} with streaming=True: streaming is zero-staleness "
            "by definition (it trains only on tokens of the current policy); use "
            "streaming=False for async training"
        )
    if max_staleness > 0:
        return BoundedStaleness(max_staleness)
    return Streaming() if streaming else OnBatch()
