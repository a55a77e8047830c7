"""A data-parallel learner: each rank trains on its own groups, one all-reduce per step.

Every rank holds a replica of the model and a ``DataParallelLearner``, and is given the whole
event stream (or any superset of its own events); it keeps only the events of the groups
assigned to it (``assign(group_id) -> rank``, by default ``stable_rank``: a hash every process
computes the same way). The per-group accumulators are linear (docs/design.md §3), so
the batch's gradient sum is the sum over ranks of each rank's own sum. ``step()``:

1. *Plan* (one small ``all_gather_object``, before any gradient work of the step): every rank
   says whether its groups are complete and lists, for each group it may train on, the
   trained episodes' action-token counts (and rewards, for the metrics). From that every rank
   derives the same global facts: dynamic sampling's ``max_groups`` cut (the first N
   informative groups in canonical order over *all* ranks), the denominator D (sequences or
   tokens, exact integer sums), and whether to raise ``IncompleteBatchError`` — on every rank
   at once, with nothing changed, so that no rank waits in a collective for one that raised.
2. Each rank finishes its own groups with the learner's usual strategy (streaming or sync).
3. *Reduce*: one ``all_reduce`` (sum) of the flat gradient sum; then every rank divides by D,
   clips and steps identically, so the replicas stay equal.

Exactness. A sum over ranks regroups the single learner's sum, so the default path agrees
with one learner to rounding (≤ 1e-12 relative on a float64 GPT-2-style model, the same
contract as streaming vs sync), and the ranks agree with each other bitwise (gloo's and
NCCL's all-reduce hand every rank the same vector). ``deterministic=True`` is **bitwise
equal to the single-rank deterministic learner**: the deterministic strategies add
canonical addends (a GRPO group's fold and its KL pieces; an OPD episode's or turn's piece)
into the step sum one by one, in canonical order. Here that sum records each group's
addends instead (``AddendLog``); the ranks exchange them (``all_gather_object``) and every
rank replays the whole batch's sequence in canonical group order into a zero vector — the
very operations one deterministic learner performs, given pieces that are bitwise equal on
every replica (same parameters, same arithmetic: keep torch's thread count equal across
the processes compared). The price: every rank receives every addend, about one
parameter-sized vector per group (per episode or turn for OPD) instead of one summed
vector, so deterministic mode is for verification and small models. (Summing per-rank
sums in rank order instead would be bitwise reproducible across data-parallel runs of one
world size and assignment, but only ≤ 1e-12 from one learner: floating-point addition is
not associative, and the ranks' groups interleave in the canonical order.)

Limits: one process group, CPU tensors tested (gloo); the reference model of GRPO's KL term
must be identical on every rank (the policy's parameters are broadcast from rank 0 at
construction, the reference's are not); a rank that fails inside its gradient work leaves the
others waiting in the all-reduce until the process group's timeout.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, cast

import torch
import torch.distributed as dist

from thundersync.core.assembly import natural_key
from thundersync.core.batch import opd_episodes
from thundersync.core.canonical import select_groups
from thundersync.core.learner import Learner
from thundersync.core.objectives import GRPO, Objective, denominator
from thundersync.core.strategy import Groups
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord
from thundersync.protocol.errors import IncompleteBatchError, InvariantError

__all__ = ["AddendLog", "DataParallelLearner", "stable_rank"]


def stable_rank(group_id: str, world_size: int) -> int:
    """The rank that trains ``group_id``: a hash that is the same in every process (Python's
    ``hash`` of a string is salted per process, so it is not used)."""
    digest = hashlib.blake2b(group_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % world_size


class AddendLog:
    """A deterministic strategy's step sum that keeps the addends, by group, in the order
    they were added (``strategy.begin_group`` marks where a group's addends start)."""

    def __init__(self) -> None:
        self.by_group: dict[str, list[torch.Tensor]] = {}
        self._current: list[torch.Tensor] | None = None

    def begin_group(self, group_id: str) -> None:
        self._current = self.by_group.setdefault(group_id, [])

    def add_(self, other: torch.Tensor, *, alpha: float = 1.0) -> AddendLog:
        if self._current is None or alpha != 1.0:
            raise InvariantError("a canonical addend outside a group, or scaled: not replayable")
        self._current.append(other)  # kept, not copied: each addend is a fresh vector
        return self


@dataclass(frozen=True, slots=True)
class RankPlan:
    """What one rank tells the others before the step's gradient work."""

    error: str | None
    num_groups: int
    candidates: list[tuple[str, list[int], list[float]]]
    """(group id, trained episodes' action-token counts, their rewards) for every group the
    rank would train on by itself, in canonical order."""


@dataclass(frozen=True, slots=True)
class StepPlan:
    """The global facts every rank derives identically from all ranks' plans."""

    selected: set[str]
    counts: list[int]
    rewards: list[float]
    num_groups: int
    local_counts: list[int]


class DataParallelLearner(Learner):
    """``Learner`` on one rank of a data-parallel group (see the module docstring).

    Takes the ``Learner``'s arguments plus ``process_group`` (None: the default group,
    which ``torch.distributed.init_process_group`` must have set up) and ``assign`` (group
    id → rank; default ``stable_rank``). Every rank must be built with the same options and
    see the same batches; the policy's parameters are broadcast from rank 0 at construction.

    Events of an episode whose ``EpisodeStarted`` has not arrived yet are held until it does
    (only then is the owner known), and checked when they are applied: a refused held event
    is dropped and raised from the ``consume`` of its ``EpisodeStarted``, after the episode's
    other held events were applied. Events of other ranks' groups are not checked here
    (their owner checks them).

    ``step()``'s metrics ``num_trajectories``, ``num_groups``, ``num_tokens``,
    ``denominator``, ``reward_mean`` and ``grad_norm`` are the whole batch's (equal on every
    rank); the others (times, buffers, staleness, log-prob mismatch) are this rank's, and
    ``rank``, ``world_size`` and ``local_num_trajectories`` are added.
    """

    def __init__(
        self,
        model: torch.nn.Module,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        streaming: bool = False,
        *,
        process_group: dist.ProcessGroup | None = None,
        assign: Callable[[str], int] | None = None,
        **options: Any,
    ) -> None:
        if not dist.is_initialized():
            raise RuntimeError(
                "DataParallelLearner needs torch.distributed.init_process_group(...) first"
            )
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        self.assign = assign or (lambda gid: stable_rank(gid, self.world_size))
        super().__init__(model, objective, optimizer, streaming, **options)
        self._broadcast_parameters()

    # --- routing --------------------------------------------------------------------------------

    def consume(self, event: ev.Event) -> None:
        """Take ``event`` if it belongs to one of this rank's groups (see the class doc)."""
        episode_id = getattr(event, "episode_id", None)
        if episode_id is None or isinstance(event, ev.GradientComputed):
            super().consume(event)
            return
        if isinstance(event, ev.EpisodeStarted) and episode_id not in self._mine:
            owner = self.assign(event.group_id)
            if not (isinstance(owner, int) and 0 <= owner < self.world_size):
                raise ValueError(f"assign({event.group_id!r}) = {owner!r}: not a rank")
            if owner == self.rank:
                super().consume(event)  # a refused event raises here and changes nothing
            self._mine[episode_id] = owner == self.rank
            held = self._held.pop(episode_id, [])
            if owner == self.rank:
                self._apply_held(held)
            return
        if episode_id not in self._mine:
            self._held.setdefault(episode_id, []).append(event)
        elif self._mine[episode_id]:
            super().consume(event)

    def _apply_held(self, held: list[ev.Event]) -> None:
        """Apply an episode's held events; the first refused one is raised after the rest."""
        refused: Exception | None = None
        for event in held:
            try:
                super().consume(event)
            except Exception as exc:  # re-raised below, after the rest
                refused = refused or exc
        if refused is not None:
            raise refused

    def _new_batch(self) -> None:
        super()._new_batch()
        self._mine: dict[str, bool] = {}
        """Episode id → whether this rank trains it (known from its ``EpisodeStarted``)."""
        self._held: dict[str, list[ev.Event]] = {}
        self._plan: StepPlan | None = None

    # --- the step's hooks -----------------------------------------------------------------------

    def _batch_groups(self) -> Groups:
        error, groups = None, {}
        try:
            groups = self._local_groups()
        except IncompleteBatchError as exc:
            error = str(exc)
        plans: list[RankPlan | None] = [None] * self.world_size
        own = RankPlan(error, len(groups), self._candidates(groups) if error is None else [])
        dist.all_gather_object(plans, own, group=self.process_group)
        for r, plan in enumerate(plans):
            if plan is not None and plan.error is not None:
                raise IncompleteBatchError(
                    plan.error if r == self.rank else f"rank {r}: {plan.error}"
                )
        ready = [p for p in plans if p is not None]
        if not sum(p.num_groups for p in ready):
            raise IncompleteBatchError("step() on an empty batch: no rank consumed an episode")
        self._plan = self._global_plan(ready, own)
        return {
            g: ms
            for g, ms in groups.items()
            if g in self._plan.selected or g not in {c[0] for c in own.candidates}
        }

    def _reduce(self, total: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, float]:
        plan = self._plan
        if plan is None:
            raise InvariantError("_reduce before _batch_groups")
        log = cast(Any, total)
        if isinstance(log, AddendLog):
            total = self._replay(log)
        else:
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=self.process_group)
        if sorted(counts) != sorted(plan.local_counts):
            raise InvariantError(
                f"rank {self.rank} trained on token counts {sorted(counts)}, planned "
                f"{sorted(plan.local_counts)}"
            )
        return total, denominator(self.objective.loss_agg, plan.counts) if plan.counts else 1.0

    def _step_sum_factory(self) -> Callable[[], torch.Tensor] | None:
        return (lambda: cast(torch.Tensor, AddendLog())) if self.deterministic else None

    def _metrics(
        self,
        groups: Groups,
        trained: list[EpisodeRecord],
        counts: list[int],
        denom: float,
        grad_norm: float,
    ) -> dict[str, Any]:
        metrics = super()._metrics(groups, trained, counts, denom, grad_norm)
        plan = self._plan
        if plan is not None:
            metrics.update(
                num_trajectories=len(plan.counts),
                num_groups=plan.num_groups,
                num_tokens=sum(plan.counts),
                reward_mean=sum(plan.rewards) / len(plan.rewards) if plan.rewards else None,
                rank=self.rank,
                world_size=self.world_size,
                local_num_trajectories=len(trained),
            )
        return metrics

    # --- helpers --------------------------------------------------------------------------------

    def _local_groups(self) -> Groups:
        if self._held:
            raise IncompleteBatchError(f"events for episodes never started: {list(self._held)[:5]}")
        if not self.episodes.records:
            return {}
        return self.episodes.complete_groups()

    def _candidates(self, groups: Groups) -> list[tuple[str, list[int], list[float]]]:
        """Each group this rank would train on alone, with its trained episodes: the same
        rule as the strategies (checked against them after the step's gradient work)."""
        out = []
        if isinstance(self.objective, GRPO):
            uncapped = replace(self.objective, max_groups=None)
            for gid in select_groups(groups, uncapped):
                kept = [m for m in groups[gid] if not m.is_infra_failure]
                out.append((gid, [m.num_action_tokens for m in kept], _rewards(kept)))
        else:
            for gid, members in groups.items():
                kept = opd_episodes({gid: members})
                out.append((gid, [m.num_action_tokens for m in kept], _rewards(kept)))
        return out

    def _global_plan(self, plans: list[RankPlan], own: RankPlan) -> StepPlan:
        candidates = [c for p in plans for c in p.candidates]
        candidates.sort(key=lambda c: natural_key(c[0]))
        cap = getattr(self.objective, "max_groups", None)
        chosen = candidates if cap is None else candidates[:cap]
        selected = {c[0] for c in chosen}
        return StepPlan(
            selected=selected,
            counts=[n for c in chosen for n in c[1]],
            rewards=[r for c in chosen for r in c[2]],
            num_groups=sum(p.num_groups for p in plans),
            local_counts=[n for c in own.candidates if c[0] in selected for n in c[1]],
        )

    def _replay(self, log: AddendLog) -> torch.Tensor:
        """Every rank's addends, added in canonical group order into a zero vector: the
        operations one deterministic learner performs on the whole batch."""
        gathered: list[dict[str, list[torch.Tensor]] | None] = [None] * self.world_size
        # on the CPU: unpickled GPU tensors would land on the sender's device (exact copies)
        own = {g: [a.cpu() for a in addends] for g, addends in log.by_group.items()}
        dist.all_gather_object(gathered, own, group=self.process_group)
        by_group = {g: v for part in gathered if part is not None for g, v in part.items()}
        total = self.pool.zeros()
        for gid in sorted(by_group, key=natural_key):
            for addend in by_group[gid]:
                total.add_(addend.to(device=total.device, dtype=total.dtype))
        return total

    def _broadcast_parameters(self) -> None:
        """Start every replica from rank 0's parameters (one broadcast of a flat vector)."""
        params = self.policy.params
        with torch.no_grad():
            flat = torch.cat([p.detach().reshape(-1) for p in params])
            group = self.process_group
            source = 0 if group is None else dist.get_global_rank(group, 0)
            dist.broadcast(flat, src=source, group=group)
            offset = 0
            for p in params:
                p.copy_(flat[offset : offset + p.numel()].view_as(p))
                offset += p.numel()


def _rewards(trained: list[EpisodeRecord]) -> list[float]:
    return [m.reward_value for m in trained if m.has_reward and not m.is_infra_failure]
