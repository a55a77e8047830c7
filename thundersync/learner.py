"""The learner: consumes events in any arrival order and takes one exact optimizer step per batch.

``Learner(model, objective=GRPO(...), optimizer=opt, streaming=True)``; ``consume(event)`` for
every event; ``step()`` finishes the batch: fold, divide by the batch denominator, clip the
gradient norm, ``optimizer.step()``.

- sync (``streaming=False``): collects the batch; at ``step`` computes advantages and runs the
  textbook batched backward (padded micro-batches).
- streaming: starts each piece of gradient work as soon as its inputs are fixed — a GRPO
  trajectory's backward at its ``RewardReady`` (or at ``EpisodeCompleted`` with
  ``early_start``), an OPD turn's at its ``TeacherScored`` — and produces the same update.
- ``deterministic``: sync and streaming both reduce per-trajectory (per-turn) pieces in
  canonical order (groups, then episodes by natural id) and are bitwise equal.

Exactness holds for one optimizer step per rollout batch, which is what this learner does.
Several PPO minibatches per batch would make later minibatches depend on earlier updates:
streaming could then apply to the first minibatch only; this learner does not offer them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from thundersync import events as ev
from thundersync.assembly import Assembler, EpisodeRecord
from thundersync.batch import grpo_batch_grad, opd_batch_grad
from thundersync.canonical import PieceStore, reduce_grpo, select_groups
from thundersync.distill import OPDStream
from thundersync.gradients import BufferPool, grpo_piece, write_grads
from thundersync.objectives import (
    GRPO,
    OPD,
    Objective,
    clip_coefficient,
    denominator,
    is_degenerate,
)
from thundersync.policy import Policy
from thundersync.streaming import GRPOStream


class StaleTokenError(ValueError):
    """Streaming consumed a token sampled by another policy version than the learner's."""


class IncompleteBatchError(RuntimeError):
    """``step()`` was called before every input of the batch was consumed."""


class Learner:
    """See the module docstring. ``buffer_budget_bytes`` caps what streaming holds beyond the
    step's gradient (per-group accumulators, early per-trajectory buffers, deterministic
    pieces); past it work waits for its inputs to be final and stays exact."""

    def __init__(
        self,
        model: torch.nn.Module,
        objective: Objective,
        optimizer: torch.optim.Optimizer,
        streaming: bool = False,
        *,
        reference: torch.nn.Module | None = None,
        deterministic: bool = False,
        early_start: bool = False,
        eager: bool = True,
        max_grad_norm: float | None = 1.0,
        buffer_budget_bytes: int | None = None,
        micro_batch_size: int = 8,
        policy_version: int = 0,
        publish: Callable[[ev.Event], None] | None = None,
    ) -> None:
        if not isinstance(objective, GRPO | OPD):
            raise TypeError(f"objective: expected GRPO(...) or OPD(...), got {objective!r}")
        self.policy = Policy(model)
        self.reference = Policy(reference) if reference is not None else None
        if isinstance(objective, GRPO) and objective.kl_coef != 0.0 and reference is None:
            raise ValueError("GRPO(kl_coef != 0) needs reference=<a frozen reference model>")
        self.objective, self.optimizer = objective, optimizer
        self.streaming, self.deterministic, self.early_start = streaming, deterministic, early_start
        self.eager = eager
        self.max_grad_norm, self.micro_batch_size = max_grad_norm, micro_batch_size
        self.policy_version, self.publish = policy_version, publish
        self.budget_bytes = buffer_budget_bytes
        self.num_steps = 0
        self.peak_buffer_bytes = 0
        self.last_gradient: torch.Tensor | None = None
        self._new_batch()

    def _new_batch(self) -> None:
        params = self.policy.params
        numel = sum(p.numel() for p in params)
        self.pool = BufferPool(numel, self.policy.dtype, self.policy.device, self.budget_bytes)
        self.episodes = Assembler()
        self.store = PieceStore(self.pool)
        self.grpo: GRPOStream | None = None
        self.opd: OPDStream | None = None
        self.learner_time_s = 0.0
        if isinstance(self.objective, OPD) and (self.streaming or self.deterministic):
            self.opd = OPDStream(
                self.policy, self.objective, self.pool, deterministic=self.deterministic,
                streaming=self.streaming, micro_batch_size=self.micro_batch_size,
                publish=self.publish,
            )  # fmt: skip
        elif isinstance(self.objective, GRPO) and self.streaming and not self.deterministic:
            self.grpo = GRPOStream(
                self.policy, self.objective, self.pool, reference=self.reference,
                early_start=self.early_start, micro_batch_size=self.micro_batch_size,
                publish=self.publish,
            )  # fmt: skip

    # --- consuming events ----------------------------------------------------------------------

    def consume(self, event: ev.Event) -> None:
        """Take one event (any type, any arrival order); streaming starts work it unblocks."""
        if self.streaming:
            self._audit(event)
        rec = self.episodes.apply(event)
        if isinstance(event, ev.ToolFinished) and self.opd is not None:
            self.opd.observe_tool(event.duration_s)
        if rec is None or not self.streaming:
            return
        started = time.perf_counter()
        if self.grpo is not None:
            self.grpo.update(rec)
        elif self.opd is not None:
            self.opd.update(rec)
        elif rec.tokens_ready and not rec.is_infra_failure:
            key = rec.episode_id
            count = 1 + int(isinstance(self.objective, GRPO) and self.objective.kl_coef != 0.0)
            self.store.offer(key, count, lambda: self._grpo_piece(rec))
        if rec.is_infra_failure:
            self.store.discard(rec.episode_id)
        self._discard_dropped(rec)
        self.learner_time_s += time.perf_counter() - started
        if self.eager:
            self.drain()

    def drain(self) -> None:
        """Run the gradient work that consumed events unblocked.

        With ``eager=True`` (default) ``consume`` calls this itself, so work starts the moment
        its inputs are fixed. A worker that receives events in bursts passes ``eager=False``
        and calls ``drain()`` whenever its inbox is empty: work that became ready together
        is then batched (one padded backward per micro-batch), which is what keeps streaming's
        learner time at sync's when nothing overlaps. Exact either way.
        """
        started = time.perf_counter()
        if self.grpo is not None:
            self.grpo.drain()
        elif self.opd is not None:
            self.opd.drain()
        self.learner_time_s += time.perf_counter() - started

    def _discard_dropped(self, rec: EpisodeRecord) -> None:
        """Deterministic streaming: free the pieces of a group dynamic sampling drops."""
        objective = self.objective
        if not (isinstance(objective, GRPO) and objective.dynamic_sampling and self.store.pieces):
            return
        members = [m for m in self.episodes.records.values() if m.group_id == rec.group_id]
        if len(members) < (rec.started.group_size if rec.started else 0):
            return
        if all(m.has_reward for m in members):
            rewards = [m.reward.reward for m in members if not m.is_infra_failure]
            if is_degenerate(rewards):
                for m in members:
                    self.store.discard(m.episode_id)

    def _audit(self, event: ev.Event) -> None:
        version = getattr(event, "policy_version", None)
        is_token_event = isinstance(event, ev.EpisodeStarted | ev.TurnCompleted)
        if is_token_event and version != self.policy_version:
            raise StaleTokenError(
                f"{type(event).__name__}(episode_id={event.episode_id!r}) was sampled by policy "
                f"version {version}, but the learner is at version {self.policy_version}: "
                "streaming trains only on tokens of the current policy (zero staleness)"
            )

    def _grpo_piece(self, rec: EpisodeRecord) -> tuple:
        assert isinstance(self.objective, GRPO)
        return grpo_piece(self.policy, self.objective, rec.trajectory(), self.reference)

    # --- the step --------------------------------------------------------------------------------

    def _check_complete(self) -> dict[str, list[EpisodeRecord]]:
        groups = self.episodes.groups()
        if not groups:
            raise IncompleteBatchError("step() on an empty batch: no EpisodeStarted consumed")
        orphans = [r.episode_id for r in self.episodes.records.values() if r.started is None]
        if orphans:
            raise IncompleteBatchError(f"events for episodes never started: {orphans[:5]}")
        is_grpo = isinstance(self.objective, GRPO)
        for gid, members in groups.items():
            size = members[0].started.group_size
            if is_grpo and len(members) != size:
                raise IncompleteBatchError(
                    f"group {gid!r}: {len(members)} of {size} episodes consumed"
                )
            for m in members:
                if is_grpo and not m.has_reward:
                    raise IncompleteBatchError(f"episode {m.episode_id!r}: no RewardReady yet")
                if is_grpo and m.is_infra_failure:
                    continue  # excluded from GRPO; OPD needs no reward and trains on it
                if not m.tokens_ready:
                    raise IncompleteBatchError(f"episode {m.episode_id!r}: tokens incomplete")
                if not is_grpo and not m.teacher_ready:
                    raise IncompleteBatchError(f"episode {m.episode_id!r}: teacher scores missing")
        return groups

    def _gradient_sum(self, groups: dict[str, list[EpisodeRecord]]) -> tuple[torch.Tensor, list]:
        """Σ of the batch's loss gradients before 1/D, and the trained-on episodes."""
        if isinstance(self.objective, OPD):
            episodes = [m for members in groups.values() for m in members if m.num_turns]
            if self.opd is not None:
                return self.opd.finish(episodes), episodes
            total = opd_batch_grad(
                self.policy, self.objective, episodes,
                micro_batch_size=self.micro_batch_size, total=self.pool.zeros(),
            )  # fmt: skip
            return total, episodes
        selected = select_groups(groups, self.objective)
        kept = [m for g in selected for m in groups[g] if not m.is_infra_failure]
        if self.grpo is not None:
            return self.grpo.finish(selected), kept
        if self.deterministic:

            def piece(m: EpisodeRecord) -> tuple:
                vectors = self.store.get(m.episode_id, lambda: self._grpo_piece(m))
                return vectors[0], (vectors[1] if len(vectors) > 1 else None)

            total = reduce_grpo(groups, selected, self.objective, piece, self.pool.zeros())
            return total, kept
        total = grpo_batch_grad(
            self.policy, self.objective, groups, selected, self.reference,
            micro_batch_size=self.micro_batch_size, total=self.pool.zeros(),
        )  # fmt: skip
        return total, kept

    def step(self) -> dict[str, Any]:
        """Finish the batch: complete the gradient, divide by D, clip, ``optimizer.step()``.

        Afterwards each parameter's ``.grad`` holds the step's gradient (until the next step)
        and ``policy_version`` is one higher. Returns the step's metrics.
        """
        groups = self._check_complete()
        started = time.perf_counter()
        total, trained = self._gradient_sum(groups)
        counts = [m.trajectory().num_action_tokens for m in trained]
        denom = denominator(self.objective.loss_agg, counts) if trained else 1.0
        total.div_(denom)
        grad_norm = float(total.norm())
        scale = clip_coefficient(grad_norm, self.max_grad_norm)
        if scale != 1.0:
            total.mul_(scale)
        write_grads(self.policy.params, total)
        self.optimizer.step()
        self.last_gradient = total
        self.learner_time_s += time.perf_counter() - started
        self.store.clear()
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.pool.peak_bytes)
        rewards = [m.reward.reward for m in trained if m.reward is not None]
        metrics = {
            "step": self.num_steps,
            "policy_version": self.policy_version + 1,
            "grad_norm": grad_norm,
            "num_trajectories": len(trained),
            "num_groups": len(groups),
            "num_tokens": sum(counts),
            "denominator": denom,
            "reward_mean": sum(rewards) / len(rewards) if rewards else None,
            "learner_time_s": self.learner_time_s,
            "peak_buffer_bytes": self.pool.peak_bytes,
            "buffer_bytes": self.pool.buffer_bytes,
        }
        self.num_steps += 1
        self.policy_version += 1
        if self.publish is not None:
            self.publish(ev.StepFinished(
                step=metrics["step"], policy_version=self.policy_version, metrics=metrics
            ))  # fmt: skip
        self._new_batch()
        return metrics
