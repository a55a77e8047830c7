"""Placement: which cores (CPU) or devices (GPU) the learner and the rollout side use.

``colocated`` (the default): the learner and rollout (engine, agents, sandboxes, graders)
share every core this process may use. ``disaggregated``: the learner gets its own cores —
``learner_ranks`` x ``learner_threads`` of them, the lowest — and rollout the rest; on GPUs
(``--device cuda``) the learner ranks take ``cuda:0..R-1`` and the engine the GPUs after.

Placement is a property of the run's resources, never of its mode: every mode runs the same
way on either, and the math does not change (``--deterministic`` runs are bitwise equal).
A process applies its side with ``apply`` (``os.sched_setaffinity`` of the calling thread,
which threads and subprocesses started later inherit: the engine's, the sandboxes').
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Literal

PlacementKind = Literal["colocated", "disaggregated"]
Role = Literal["learner", "rollout"]


@dataclass(frozen=True)
class Placement:
    """The cores (and GPUs) of each side; ``None``: everything this process may use."""

    kind: str
    learner_cores: tuple[int, ...] | None = None
    rollout_cores: tuple[int, ...] | None = None
    learner_devices: tuple[str, ...] | None = None
    engine_devices: tuple[str, ...] | None = None

    def cores(self, role: Role) -> tuple[int, ...] | None:
        return self.learner_cores if role == "learner" else self.rollout_cores

    def record(self) -> dict[str, Any]:
        """What a run's config.json and results.json keep (lists, strict JSON)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}


def allowed_cores() -> list[int]:
    """The cores this process may run on, sorted."""
    try:
        return sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return list(range(os.cpu_count() or 1))


def split_cores(
    kind: str, cores: list[int], *, learner_ranks: int, learner_threads: int, rollout_threads: int
) -> tuple[tuple[int, ...] | None, tuple[int, ...] | None]:
    """(learner cores, rollout cores) of ``cores``; a ValueError of one line when impossible."""
    if kind == "colocated":
        return None, None
    need = learner_ranks * learner_threads
    if len(cores) < need + 1:
        raise ValueError(
            f"--placement disaggregated needs at least {need + 1} cores (the learner's "
            f"{need} = learner_ranks {learner_ranks} x learner_threads {learner_threads}, "
            f"rollout >= 1); this process may use {len(cores)}: use --placement colocated"
        )
    learner, rollout = tuple(cores[:need]), tuple(cores[need:])
    if rollout_threads > len(rollout):
        raise ValueError(
            f"--placement disaggregated leaves rollout {len(rollout)} core(s), fewer than "
            f"rollout_threads {rollout_threads}: lower --rollout-threads or --learner-threads"
        )
    return learner, rollout


def split_devices(
    kind: str, device: str, gpus: int, *, learner_ranks: int
) -> tuple[tuple[str, ...] | None, tuple[str, ...] | None]:
    """(learner devices, engine devices) with ``device`` cuda and ``gpus`` visible GPUs
    (``None, None`` on the CPU or colocated: the learner and engine share as today)."""
    if kind == "colocated" or not device.startswith("cuda"):
        return None, None
    if device != "cuda":
        raise ValueError(
            f"--placement disaggregated with --device {device}: name --device cuda, and the "
            "learner takes the first GPUs, the engine the next"
        )
    if gpus < learner_ranks + 1:
        raise ValueError(
            f"--placement disaggregated needs at least {learner_ranks + 1} GPUs (the "
            f"learner's {learner_ranks}, the engine >= 1); {gpus} visible: use --placement "
            "colocated"
        )
    learner = tuple(f"cuda:{i}" for i in range(learner_ranks))
    return learner, tuple(f"cuda:{i}" for i in range(learner_ranks, gpus))


def plan(config: Any, *, cores: list[int] | None = None, gpus: int | None = None) -> Placement:
    """The run's placement from its config (``placement``, ``learner_ranks``, threads,
    ``device``) and this machine (``cores``: allowed; ``gpus``: visible CUDA devices)."""
    kind = config.placement
    cores = allowed_cores() if cores is None else cores
    learner, rollout = split_cores(
        kind,
        cores,
        learner_ranks=config.learner_ranks,
        learner_threads=config.learner_threads,
        rollout_threads=config.rollout_threads,
    )
    if gpus is None:
        gpus = _visible_gpus() if config.device.startswith("cuda") else 0
    learner_dev, engine_dev = split_devices(
        kind, config.device, gpus, learner_ranks=config.learner_ranks
    )
    return Placement(kind, learner, rollout, learner_dev, engine_dev)


def placement_problem(config: Any) -> str | None:
    """Why the config's placement cannot run here (one line), or None."""
    if config.backend != "local" and config.placement != "colocated":
        return "--placement disaggregated with --backend ray: Ray places by resources"
    try:
        plan(config)
    except ValueError as exc:
        return str(exc)
    return None


def apply(placement: Placement, role: Role) -> None:
    """Pin the calling thread (and what it starts later) to ``role``'s cores, if any."""
    cores = placement.cores(role)
    if cores is not None:
        os.sched_setaffinity(0, cores)


def place_learner(config: Any) -> tuple[Placement, dict[str, Any], list[int]]:
    """Plan the run's placement and pin the calling thread (the learner's) to its side; the
    run's config.json record with the plan and that thread's affinity as pinned (``placed``),
    and the affinity it had before, for ``restore_affinity`` when the run ends."""
    before = allowed_cores()
    placement = plan(config)
    apply(placement, "learner")
    placed = {**placement.record(), "learner_affinity": allowed_cores()}
    return placement, {**config.record(), "placed": placed}, before


def restore_affinity(cores: list[int]) -> None:
    """Give the calling thread back ``cores`` (its affinity before ``place_learner``): in a
    user's own process the next run, or the user's own work, gets every core again."""
    os.sched_setaffinity(0, cores)


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
