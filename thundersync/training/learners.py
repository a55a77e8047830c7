"""The run's learner: one ``Learner``, or rank 0 of ``learner_ranks`` data-parallel ranks.

With ``--learner-ranks N`` (N > 1) the trainer is rank 0 and ranks 1 … N−1 are workers
(``rank_main``) that each hold a replica of the model and a ``DataParallelLearner``
(docs/design.md §5). The trainer forwards every episode event to the rank that owns the
episode's group (``stable_rank``) and keeps its own; each rank computes its groups' gradient
work as the events arrive (streaming) or at the step (sync, async), and the step is one small
gather plus one all-reduce, so every rank ends the step with the same parameters and only
rank 0 publishes weights and writes checkpoints. The processes meet through a file in the run
folder (``file://``) and exchange tensors over loopback only (gloo on ``lo``), or with NCCL
when each rank has its own GPU (``--device cuda``: rank r on cuda:r); Ray actors meet over
TCP at the driver's node (``thundersync.training.ray_backend``).

Every rank is built here, the same way, from the same checkpoint, optimizer state and options,
so the step is the single learner's (``--deterministic``: bitwise).
"""

from __future__ import annotations

import os
import queue
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from thundersync import events as ev
from thundersync.training import checkpoint as ckpt
from thundersync.training.config import TrainConfig, rank_device


@dataclass(frozen=True, slots=True)
class LearnerSpec:
    """Where a learner's replica comes from (picklable: it crosses to rank workers)."""

    config: TrainConfig
    model_dir: str
    """The checkpoint the replica starts from (the run's last one when resuming)."""
    initial_model: str
    """The run's initial policy: GRPO's KL reference."""
    checkpoint: str | None
    """A resumed run's checkpoint: its optimizer state, RNG, step and version."""
    rendezvous: str
    """``torch.distributed``'s init method (data-parallel runs only): ``file://`` for local
    ranks, ``tcp://`` at the driver's node for Ray actors."""


@dataclass(frozen=True, slots=True)
class RankReady:
    """Rank ``rank`` loaded its replica and is about to join the process group."""

    rank: int


@dataclass(frozen=True, slots=True)
class RankStepped:
    """Rank ``rank`` took step ``step``: its own metrics and its backward spans of the step
    (sent together, so that rank 0 counts them in the step they belong to)."""

    rank: int
    step: int
    metrics: dict[str, Any]
    spans: list[ev.SpanRecorded]


@dataclass(slots=True)
class BuiltLearner:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    learner: Any
    start_step: int
    tokenizer: Any


def build_learner(
    spec: LearnerSpec, *, rank: int, publish: Any, loaded: Any = None
) -> BuiltLearner:
    """The model, its optimizer (restored when resuming) and the learner of ``rank``; for a
    data-parallel run, joins the process group first (every rank must call this), after
    calling ``loaded()`` (a rank tells the trainer it got that far)."""
    from thundersync.learner import Learner
    from thundersync.models import deterministic_cuda, load_model, load_tokenizer
    from thundersync.objectives import GRPO

    config = spec.config
    dtype = getattr(torch, config.dtype)
    device = torch.device(rank_device(config.device, rank))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives use the current device
        if config.deterministic:
            deterministic_cuda(device)
    model = load_model(spec.model_dir, dtype=dtype).to(device)
    optimizer_class = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.SGD
    optimizer = optimizer_class(model.parameters(), lr=config.lr, weight_decay=config.weight_decay)
    start_step, version = 0, 0
    if spec.checkpoint is not None:
        state = ckpt.load_state(Path(spec.checkpoint))
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # the state dict holds the saved run's settings:
            group.update(lr=config.lr, weight_decay=config.weight_decay)  # --resume --lr acts
        ckpt.restore_rng(state)
        start_step, version = state["completed_steps"], state["policy_version"]
    objective = config.build_objective()
    reference = None
    if isinstance(objective, GRPO) and objective.kl_coef:
        reference = load_model(spec.initial_model, dtype=dtype).to(device)
    options: dict[str, Any] = dict(
        streaming=config.mode == "streaming",
        reference=reference,
        deterministic=config.deterministic,
        early_start=config.early_start,
        eager=False,
        max_grad_norm=config.max_grad_norm or None,
        buffer_budget_bytes=config.buffer_budget_bytes or None,
        micro_batch_size=config.micro_batch_size,
        policy_version=version,
        publish=publish,
    )
    if config.mode == "async":
        options["max_staleness"] = config.staleness
    if loaded is not None:
        loaded()
    if config.learner_ranks > 1:
        from thundersync.data_parallel import DataParallelLearner

        _join_process_group(spec, rank)
        learner: Any = DataParallelLearner(model, objective, optimizer, **options)
    else:
        learner = Learner(model, objective, optimizer, **options)
    return BuiltLearner(model, optimizer, learner, start_step, load_tokenizer(spec.model_dir))


def _join_process_group(spec: LearnerSpec, rank: int) -> None:
    import torch.distributed as dist

    if spec.rendezvous.startswith(("file://", "tcp://127.")):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")  # ranks on one machine: loopback only
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    # On GPUs: NCCL for tensors, gloo for the small object gathers, so a dead rank fails the
    # step's plan gather at once (NCCL alone would wait out its timeout, then abort).
    dist.init_process_group(
        "cpu:gloo,cuda:nccl" if spec.config.device.startswith("cuda") else "gloo",
        init_method=spec.rendezvous,
        rank=rank,
        world_size=spec.config.learner_ranks,
        timeout=timedelta(seconds=spec.config.worker_timeout_s),
    )


def leave_process_group() -> None:
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def owner_of(episode_id: str, world_size: int) -> int:
    """The rank that trains ``episode_id``'s group (ids are ``{group}-e{sample}``)."""
    from thundersync.data_parallel import stable_rank

    return stable_rank(episode_id.rsplit("-e", 1)[0], world_size)


def rank_main(spec: LearnerSpec, rank: int, inbox: Any, output: Any) -> None:
    """Rank ``rank`` ≥ 1 (a worker process): consume the events the trainer forwards, step
    when told, until ``None`` arrives.

    Messages: ``("event", event)`` — an event of one of this rank's episodes;
    ``("step", n)`` — every event of batch n was sent: take the step with the others.
    Events of later batches (async) wait until the batches before them are stepped."""

    spans: list[ev.SpanRecorded] = []

    def publish(event: ev.Event) -> None:
        if isinstance(event, ev.GradientComputed):
            spans.append(
                ev.SpanRecorded(
                    name="backward",
                    started=event.started,
                    finished=event.finished,
                    worker=f"learner-{rank}",
                    episode_id=event.episode_id,
                    turn=event.turn,
                )
            )

    built = build_learner(
        spec, rank=rank, publish=publish, loaded=lambda: output.put(RankReady(rank))
    )
    learner, current = built.learner, built.start_step
    later: dict[int, list[ev.Event]] = {}
    try:
        while True:
            for message in _waiting(inbox):
                if message is None:
                    return
                if message[0] == "step":
                    metrics = learner.step()
                    output.put(RankStepped(rank, message[1], metrics, list(spans)))
                    spans.clear()
                    current = message[1] + 1
                    for event in later.pop(current, []):
                        learner.consume(event)
                    continue
                event = message[1]
                step = step_of(event.episode_id)
                if step == current:
                    learner.consume(event)
                else:
                    later.setdefault(step, []).append(event)
            if spec.config.mode == "streaming":
                learner.drain()  # what arrived, as one micro-batch (docs/design.md §4)
    finally:
        leave_process_group()


def _waiting(inbox: Any) -> list[Any]:
    """The next message (blocking) and every one queued behind it."""
    messages = [inbox.get()]
    while messages[-1] is not None:
        try:
            messages.append(inbox.get_nowait())
        except queue.Empty:
            break
    return messages


def step_of(episode_id: str) -> int:
    head = episode_id.split("-", 1)[0]
    return int(head[1:]) if head.startswith("s") and head[1:].isdigit() else -1
