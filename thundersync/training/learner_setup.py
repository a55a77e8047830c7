"""The run's learner: one ``Learner``, or rank 0 of ``learner_ranks`` data-parallel ranks.

With ``--learner-ranks N`` (N > 1) the trainer is rank 0 and ranks 1 … N−1 are workers
(``thundersync.training.ranks``) that each hold a replica of the model and a
``DataParallelLearner`` (docs/design.md §5). The processes meet through a file in the run
folder (``file://``) and exchange tensors over loopback only (gloo on ``lo``), or with NCCL
when each rank has its own GPU (``--device cuda``: rank r on cuda:r); Ray actors meet over
TCP at the driver's node (``thundersync.training.ray_backend``).

Every rank is built here, the same way, from the same checkpoint, optimizer state and options
(the mode's among them), so the step is the single learner's (``--deterministic``: bitwise).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from thundersync.core.data_parallel import DataParallelLearner
from thundersync.core.learner import Learner
from thundersync.core.objectives import GRPO
from thundersync.lora import BaseOfAdapter, is_adapted, load_policy
from thundersync.models import deterministic_cuda, load_model, load_tokenizer
from thundersync.protocol import events as ev
from thundersync.training import checkpoint as ckpt
from thundersync.training.config import TrainConfig


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


@dataclass(slots=True)
class BuiltLearner:
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    learner: Learner
    start_step: int
    tokenizer: Any


def build_learner(
    spec: LearnerSpec,
    *,
    rank: int,
    publish: Callable[[ev.Event], None],
    loaded: Callable[[], None] | None = None,
) -> BuiltLearner:
    """The model, its optimizer (restored when resuming) and the learner of ``rank``; for a
    data-parallel run, joins the process group first (every rank must call this), after
    calling ``loaded()`` (a rank tells the trainer it got that far)."""
    config = spec.config
    dtype = getattr(torch, config.dtype)
    device = torch.device(rank_device(config.device, rank))
    if device.type == "cuda":
        torch.cuda.set_device(device)  # NCCL's collectives use the current device
        if config.deterministic:
            deterministic_cuda(device)
    model = load_policy(spec.model_dir, dtype=dtype).to(device)  # an adapter: base + LoRA
    trainable = [p for p in model.parameters() if p.requires_grad]  # with LoRA: the adapter's
    optimizer_class = torch.optim.AdamW if config.optimizer == "adamw" else torch.optim.SGD
    optimizer = optimizer_class(trainable, lr=config.lr, weight_decay=config.weight_decay)
    start_step, version = 0, 0
    if spec.checkpoint is not None:
        state = ckpt.load_state(Path(spec.checkpoint))
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # the state dict holds the saved run's settings:
            group.update(lr=config.lr, weight_decay=config.weight_decay)  # --resume --lr acts
        ckpt.restore_rng(state)
        start_step, version = state["completed_steps"], state["policy_version"]
    objective = config.build_objective()
    reference: torch.nn.Module | None = None
    if isinstance(objective, GRPO) and objective.kl_coef and is_adapted(model):
        reference = BaseOfAdapter(model)  # the base, adapters disabled: no second copy
    elif isinstance(objective, GRPO) and objective.kl_coef:
        reference = load_model(spec.initial_model, dtype=dtype).to(device)
    options: dict[str, Any] = dict(
        contract=config.training_mode().learner_contract(),
        reference=reference,
        deterministic=config.deterministic,
        early_start=config.early_start,
        eager=False,
        # the streaming loop wakes the learner for held deposits; ranks' loops do not
        hold_deposits=config.learner_ranks == 1,
        max_grad_norm=config.max_grad_norm or None,
        buffer_budget_bytes=config.buffer_budget_bytes or None,
        micro_batch_size=config.micro_batch_size,
        policy_version=version,
        publish=publish,
    )
    if loaded is not None:
        loaded()
    if config.learner_ranks > 1:
        _join_process_group(spec, rank)
        learner: Learner = DataParallelLearner(model, objective, optimizer, **options)
    else:
        learner = Learner(model, objective, optimizer, **options)
    return BuiltLearner(model, optimizer, learner, start_step, load_tokenizer(spec.model_dir))


def _join_process_group(spec: LearnerSpec, rank: int) -> None:
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
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def rank_device(device: str, rank: int) -> str:
    """The device of learner rank ``rank`` for the run's ``device``: ``cuda`` spreads the
    ranks over cuda:0, cuda:1, ... (NCCL needs one GPU per rank)."""
    return f"cuda:{rank}" if device == "cuda" else device
