"""The learner: consumes events in any arrival order and takes one exact optimizer step per batch.

``Learner(model, objective=GRPO(...), optimizer=opt, streaming=True)``; ``consume(event)`` for
every event; ``step()`` finishes the batch: complete the gradient, divide by the batch
denominator, clip the gradient norm, ``optimizer.step()``.

How the gradient is computed is one strategy (``thundersync.core.strategy``), picked once by
the learner's contract (``thundersync.core.contract``: a training mode's terms, or the flags):

- sync (``streaming=False``): collects the batch; at ``step`` computes advantages and runs the
  textbook batched backward (padded micro-batches) — ``BatchGRPO``, ``BatchOPD``.
- streaming: starts each piece of gradient work as soon as its inputs are fixed — a GRPO
  trajectory's backward at its ``RewardReady`` (or at ``EpisodeCompleted`` with
  ``early_start``), an OPD turn's at its ``TeacherScored`` — and produces the same update —
  ``StreamingGRPO``, ``PiecewiseOPD``.
- ``deterministic``: sync and streaming both reduce per-trajectory (per-turn) pieces in
  canonical order (groups, then episodes by natural id) and are bitwise equal —
  ``CanonicalGRPO``, ``PiecewiseOPD``.
- ``max_staleness=k > 0`` (async; sync only): tokens sampled up to k versions behind the
  learner are accepted and the PPO ratio is taken against the sampler's log-probs, so the
  clip acts — ``OffPolicyGRPO``. It has one reduction order, so ``deterministic`` changes
  nothing there.

Rules every strategy shares:

- Infra failures: a GRPO episode whose ``RewardReady`` has ``infra_failure=True`` is dropped
  from its group, and the group's statistics (μ, σ, dynamic sampling's all-equal test) are
  over the rest; its tokens need not be complete, and it counts in no denominator. OPD uses no
  reward, so the flag excludes nothing: every OPD episode needs its tokens and teacher scores.
- Bad input is refused by ``consume`` before it changes anything (``thundersync.core.validation``
  for the rules): ``InvalidEventError`` for bad values (wrong types, non-finite or
  |reward| > 1e6, log-probs that are not finite or above +1e-3, ids outside the vocabulary,
  a context longer than the model's maximum), ``EventOrderError`` for contradictions with what
  was consumed (duplicates, teacher scores whose length differs from the action's),
  ``StaleTokenError`` for tokens of a policy version outside the accepted window. Afterwards
  the learner takes the rest of the batch; to go on without the refused event, send a
  corrected one or, for GRPO, end the episode as an infra failure.
- A non-finite gradient norm at ``step`` raises ``NonFiniteGradientError``: no optimizer step,
  parameters, ``.grad`` and optimizer state untouched, the batch dropped, ``policy_version``
  unchanged.
- A finite gradient can still make a parameter inf or NaN in the optimizer (``lr=1e308``):
  after ``optimizer.step()`` one fused max-|x| over the parameters (``torch._foreach_norm``
  with ord inf, one host sync) checks them, and a non-finite one raises
  ``NonFiniteParameterError`` before the step counts, is published or is reported. The
  parameters stay as the optimizer left them, so the learner refuses every later ``step``:
  a run stops with its last checkpoint the last good state. The check reads the parameters
  and changes nothing, so sync and streaming stay bitwise equal.

Data parallelism: ``thundersync.core.data_parallel.DataParallelLearner`` is this learner on one
rank; it overrides the hooks ``_batch_groups``, ``_reduce`` and ``_step_sum_factory``.

Exactness holds for one optimizer step per rollout batch, which is what this learner does.
Several PPO minibatches per batch would make later minibatches depend on earlier updates:
streaming could then apply to the first minibatch only; this learner does not offer them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch

from thundersync.core.assembly import Assembler
from thundersync.core.contract import LearnerContract, contract_for
from thundersync.core.gradients import BufferPool, write_grads
from thundersync.core.holds import Pace
from thundersync.core.learner_metrics import TokenStats, staleness_metrics
from thundersync.core.objectives import (
    GRPO,
    OPD,
    Objective,
    clip_coefficient,
    denominator,
    group_advantages,
)
from thundersync.core.policy import Policy
from thundersync.core.strategy import BatchContext
from thundersync.core.validation import EventLimits, VersionWindow
from thundersync.protocol import events as ev
from thundersync.protocol.episode import EpisodeRecord
from thundersync.protocol.errors import (
    IncompleteBatchError,
    NonFiniteGradientError,
    NonFiniteParameterError,
    StaleTokenError,
)

__all__ = ["IncompleteBatchError", "Learner", "StaleTokenError"]


class Learner:
    """See the module docstring. In every strategy an infra-failed GRPO episode is dropped
    from its group and the group's statistics are over the rest; OPD ignores the flag.

    Options past the public four: ``reference`` (the frozen model of GRPO's KL term);
    ``deterministic``; ``early_start``, ``eager``, ``hold_deposits`` (for a caller that runs
    ``drain()`` again by ``wake_after()``, with ``eager=False``) and ``buffer_budget_bytes``
    (streaming only, ignored by sync: the budget caps what streaming holds beyond the step's
    gradient, and past it work waits for its inputs to be final and stays exact);
    ``max_grad_norm`` (None: no clipping); ``micro_batch_size`` (trajectories per padded
    forward); ``max_staleness`` (0: on-policy; streaming takes only its own version's tokens,
    sync any batch it is given, treated as on-policy); ``keep_last_gradient`` (keep a copy
    of the step's gradient in ``last_gradient``; off, nothing parameter-sized outlives a step
    but ``.grad``); ``policy_version`` and ``num_steps`` (where a resumed run continues);
    ``publish`` (receives ``GradientComputed`` and ``StepFinished``).

    ``step()`` returns the metrics: ``step`` (this step's number counted from 1: ``num_steps``
    after it), ``policy_version``, ``grad_norm`` (before
    clipping), ``num_trajectories``, ``num_groups``, ``num_tokens``, ``denominator``,
    ``reward_mean``, ``learner_time_s``, ``peak_buffer_bytes``, ``buffer_bytes``,
    ``staleness_histogram`` ({versions behind: action tokens} over every action token the
    batch consumed, trained or not; string keys), ``max_staleness_seen``, ``clip_fraction``
    (the fraction of trained action tokens whose PPO ratio was clipped; 0.0 on-policy), and
    the engine-vs-learner mismatch over the trained action tokens whose log-probs the learner
    computed (``num_compared_tokens``; a trajectory with zero advantage and no KL term needs
    no forward on the batched path): ``logprob_mismatch_mean`` and ``logprob_mismatch_max``
    of |log π_learner − log π_sampler|, and ``kl_sampler_learner``, the mean k3 estimate of
    KL(π_sampler ‖ π_learner) (None when no token was compared, or when the sum
    overflowed a double: metrics are never inf or NaN). The mismatch
    comes from forward passes the learner runs anyway, and is not exactness (streaming vs
    sync): it measures the rollout engine against the learner.
    """

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
        hold_deposits: bool = False,
        max_grad_norm: float | None = 1.0,
        buffer_budget_bytes: int | None = None,
        micro_batch_size: int = 8,
        max_staleness: int = 0,
        keep_last_gradient: bool = False,
        policy_version: int = 0,
        num_steps: int = 0,
        publish: Callable[[ev.Event], None] | None = None,
        contract: LearnerContract | None = None,
    ) -> None:
        if contract is None:
            contract = contract_for(streaming=streaming, max_staleness=max_staleness)
        elif streaming or max_staleness:
            raise ValueError(
                "pass a contract= (a training mode's terms) or the flags streaming=/"
                "max_staleness=, not both"
            )
        _check_options(
            objective,
            contract,
            reference=reference,
            max_grad_norm=max_grad_norm,
            micro_batch_size=micro_batch_size,
            buffer_budget_bytes=buffer_budget_bytes,
            policy_version=policy_version,
            num_steps=num_steps,
        )
        self.policy = Policy(model)
        self.reference = Policy(reference) if reference is not None else None
        self.objective, self.optimizer, self.contract = objective, optimizer, contract
        streaming, self.accepted_lag = contract.streams, contract.accepted_lag()
        self.streaming, self.deterministic, self.eager = streaming, deterministic, eager
        self.pace = Pace() if hold_deposits and streaming and not eager else None
        self.max_grad_norm, self.micro_batch_size = max_grad_norm, micro_batch_size
        self.max_staleness = self.accepted_lag[0] if self.accepted_lag is not None else 0
        self.keep_last_gradient = keep_last_gradient
        self.budget_bytes, self.publish = buffer_budget_bytes, publish
        self.policy_version, self.num_steps = policy_version, num_steps
        self.limits = _limits(self.policy, self.reference)
        self.make_strategy = contract.strategy(
            objective, deterministic=deterministic, early_start=early_start
        )
        self.peak_buffer_bytes = 0
        self.last_gradient: torch.Tensor | None = None
        self.failure: str | None = None
        """Why the parameters are unusable (a step made one non-finite); None while they are
        fine."""
        self._new_batch()

    # --- consuming events ----------------------------------------------------------------------

    def consume(self, event: ev.Event) -> None:
        """Take one event (any type, any arrival order); streaming starts work it unblocks.
        A refused event raises (see the module docstring) and changes nothing."""
        rec = self.episodes.apply(event)
        if rec is None:
            return
        started = time.perf_counter()
        self.strategy.on_event(event, rec)
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
        self.strategy.drain()
        self.learner_time_s += time.perf_counter() - started

    def wake_after(self) -> float | None:
        """Seconds until held work must run (``drain()`` then; 0.0: now), or None when
        nothing is held. Only with ``hold_deposits`` (``thundersync.core.holds``): a caller
        that passes it comes back by then even if no event arrives."""
        wake_after = getattr(self.strategy, "wake_after", None)
        return None if wake_after is None else wake_after()

    # --- the step --------------------------------------------------------------------------------

    def step(self) -> dict[str, Any]:
        """Finish the batch: complete the gradient, divide by D, clip, ``optimizer.step()``.

        Afterwards each parameter's ``.grad`` holds the step's (clipped) gradient and
        ``policy_version`` is one higher. Returns the step's metrics (see the class doc).
        """
        if self.failure is not None:
            raise NonFiniteParameterError(self.failure)
        groups = self._batch_groups()
        started = time.perf_counter()
        total, trained = self.strategy.finish(groups)
        counts = [m.num_action_tokens for m in trained]
        total, denom = self._reduce(total, counts)
        total.div_(denom)
        grad_norm = float(total.norm())
        if not math.isfinite(grad_norm):
            self._new_batch()
            raise NonFiniteGradientError(
                f"step {self.num_steps + 1}: the gradient norm over {len(trained)} episodes is "
                f"{grad_norm}; no optimizer step was taken (parameters, .grad and optimizer "
                f"state are unchanged), the batch is dropped and policy_version stays "
                f"{self.policy_version}"
            )
        scale = clip_coefficient(grad_norm, self.max_grad_norm)
        if scale != 1.0:
            total.mul_(scale)
        write_grads(self.policy.params, total)
        self.optimizer.step()
        if not all_finite(self.policy.params):
            self._new_batch()
            self.failure = (
                f"step {self.num_steps + 1}: the optimizer step made a parameter non-finite "
                f"(inf or NaN) from a finite gradient (norm {grad_norm:.6g}): the learning "
                f"rate or optimizer settings overflow; the learner takes no further step and "
                f"policy_version stays {self.policy_version}"
            )
            raise NonFiniteParameterError(self.failure)
        self.last_gradient = total.clone() if self.keep_last_gradient else None
        self.learner_time_s += time.perf_counter() - started
        metrics = self._metrics(groups, trained, counts, denom, grad_norm)
        self.num_steps += 1
        self.policy_version += 1
        if self.publish is not None:
            self.publish(
                ev.StepFinished(
                    step=metrics["step"], policy_version=self.policy_version, metrics=metrics
                )
            )
        self._new_batch()
        return metrics

    # --- hooks a data-parallel learner overrides (core.data_parallel) ----------------------------

    def _batch_groups(self) -> dict[str, list[EpisodeRecord]]:
        """The groups the step trains on (checked complete; raises before any work)."""
        return self.episodes.complete_groups()

    def _reduce(self, total: torch.Tensor, counts: list[int]) -> tuple[torch.Tensor, float]:
        """The batch's gradient sum and its denominator D from the strategy's sum and the
        trained episodes' action-token counts. One learner: both as they are."""
        return total, denominator(self.objective.loss_agg, counts) if counts else 1.0

    def _step_sum_factory(self) -> Callable[[], torch.Tensor] | None:
        """What the deterministic strategies sum into (None: a zero buffer)."""
        return None

    def _metrics(
        self,
        groups: dict[str, list[EpisodeRecord]],
        trained: list[EpisodeRecord],
        counts: list[int],
        denom: float,
        grad_norm: float,
    ) -> dict[str, Any]:
        self.peak_buffer_bytes = max(self.peak_buffer_bytes, self.pool.peak_bytes)
        rewards = [m.reward_value for m in trained if m.has_reward and not m.is_infra_failure]
        return {
            "step": self.num_steps + 1,
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
            **staleness_metrics(self.episodes.records.values(), self.policy_version),
            **self.stats.summary(
                {m.episode_id for m in trained},
                sum(counts),
                advantages=self._advantages(groups),
                denominator=denom,
            ),
        }

    def _advantages(self, groups: dict[str, list[EpisodeRecord]]) -> dict[str, float] | None:
        """A_i of every scored GRPO episode (for the ``loss`` metric; None for OPD)."""
        if not isinstance(self.objective, GRPO):
            return None
        found: dict[str, float] = {}
        for members in groups.values():
            kept = [m for m in members if m.has_reward and not m.is_infra_failure]
            values = group_advantages([m.reward_value for m in kept], self.objective)
            found.update((m.episode_id, a) for m, a in zip(kept, values))
        return found

    def _new_batch(self) -> None:
        """Fresh per-batch state: assembler, buffer budget, token statistics, strategy. The
        step's gradient is allocated by the strategy at first use, not here."""
        numel = sum(p.numel() for p in self.policy.params)
        self.pool = BufferPool(numel, self.policy.dtype, self.policy.device, self.budget_bytes)
        versions = None
        if self.accepted_lag is not None:
            versions = VersionWindow(self.policy_version, *self.accepted_lag)
        self.episodes = Assembler(
            self.limits, needs_rewards=isinstance(self.objective, GRPO), versions=versions
        )
        self.stats = TokenStats()
        self.strategy = self.make_strategy(
            BatchContext(
                self.policy,
                self.reference,
                self.pool,
                self.stats,
                self.micro_batch_size,
                self.publish,
                self._step_sum_factory(),
                self.pace,
            )
        )
        self.learner_time_s = 0.0


def all_finite(tensors: Sequence[torch.Tensor]) -> bool:
    """Whether every element of ``tensors`` is finite: the max-|x| of each tensor (inf and NaN
    propagate through it, and unlike the 2-norm it cannot overflow for finite values) in one
    fused kernel per device and dtype, then one host sync."""
    if not tensors:
        return True
    maxima = torch._foreach_norm(list(tensors), float("inf"))
    device = maxima[0].device
    return bool(torch.stack([m.to(device, torch.float64) for m in maxima]).isfinite().all())


# --- choices made once, in the constructor --------------------------------------------------------


def _limits(policy: Policy, reference: Policy | None) -> EventLimits:
    """The vocabulary and context limits of the policy (and of the reference, if smaller)."""
    models = [policy] if reference is None else [policy, reference]
    vocab = [v for m in models if (v := m.vocab_size) is not None]
    context = [c for m in models if (c := m.max_context_tokens) is not None]
    return EventLimits(
        vocab_size=min(vocab, default=None), max_context_tokens=min(context, default=None)
    )


def _check_options(
    objective: Objective,
    contract: LearnerContract,
    *,
    reference: torch.nn.Module | None,
    max_grad_norm: float | None,
    micro_batch_size: int,
    buffer_budget_bytes: int | None,
    policy_version: int,
    num_steps: int,
) -> None:
    """Refuse option combinations that cannot work or would silently do nothing."""
    if not isinstance(objective, GRPO | OPD):
        raise TypeError(f"objective: expected GRPO(...) or OPD(...), got {objective!r}")
    if isinstance(objective, GRPO) and objective.kl_coef != 0.0 and reference is None:
        raise ValueError("GRPO(kl_coef != 0) needs reference=<a frozen reference model>")
    for name, value, minimum in (
        ("micro_batch_size", micro_batch_size, 1),
        ("policy_version", policy_version, 0),
        ("num_steps", num_steps, 0),
        ("buffer_budget_bytes", 0 if buffer_budget_bytes is None else buffer_budget_bytes, 0),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{name}={value!r}: expected an int >= {minimum}")
    if max_grad_norm is not None and not (math.isfinite(max_grad_norm) and max_grad_norm > 0):
        raise ValueError(f"max_grad_norm={max_grad_norm!r}: expected a finite number > 0 or None")
    problem = contract.problem(objective)
    if problem is not None:
        raise ValueError(problem)
