"""Worker processes on one machine: spawned, tied to the trainer's life, stopped by their own id.

Each worker is a ``spawn``ed process (no forked torch or thread state) that

- dies with the trainer: ``PR_SET_PDEATHSIG`` sends it SIGTERM when the trainer dies, even
  by ``kill -9``, and SIGTERM unwinds it (``finally`` blocks close its sandboxes) with a
  hard exit a few seconds later if unwinding hangs;
- stamps events on the trainer's run clock (``events.set_clock_epoch``);
- runs with an explicit torch thread count (docs/design.md §5: a learner with 2 threads slows
  3–4× as soon as another process competes for a core);
- reports a crash as a ``WorkerFailed`` message on its output queue before exiting.

Events cross processes on ``multiprocessing`` queues, whose feeder thread keeps a sender from
blocking while the receiver computes (a batch's events pickle to ~100 KB, more than a pipe
buffer).
"""

from __future__ import annotations

import ctypes
import os
import signal
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from thundersync.protocol import events as ev
from thundersync.training.control import Outbox
from thundersync.training.weights import SharedWeights

CONTEXT = mp.get_context("spawn")
_PR_SET_PDEATHSIG = 1
_UNWIND_GRACE_S = 10.0


class BackendError(RuntimeError):
    """Where the workers should run is not usable (a Ray cluster that cannot be reached or
    lacks the resources the run asks for): the run stops before any worker starts."""


@dataclass(frozen=True, slots=True)
class WorkerFailed:
    """A worker process crashed: its name and the traceback."""

    worker: str
    error: str


def spawn(
    name: str,
    target: Callable[..., None],
    *args: Any,
    num_threads: int,
    output: Outbox[WorkerFailed],
    cores: tuple[int, ...] | None = None,
) -> Any:
    """Start ``target(*args)`` in a new process named ``name``, on ``cores`` (None: the
    parent's); crashes go to ``output``."""
    process = CONTEXT.Process(
        target=_bootstrap,
        args=(name, target, args, num_threads, output, os.getpid(), ev.clock_epoch(), cores),
        name=f"thundersync-{name}",
        daemon=False,
    )
    process.start()
    return process


def stop(process: Any, *, timeout_s: float = 30.0) -> None:
    """Wait for a worker that was told to stop; SIGTERM it, then SIGKILL it, by its own pid."""
    process.join(timeout_s)
    if process.is_alive():
        os.kill(process.pid, signal.SIGTERM)
        process.join(_UNWIND_GRACE_S)
    if process.is_alive():
        os.kill(process.pid, signal.SIGKILL)
        process.join(5.0)


class LocalBackend:
    """Workers as local processes (``--backend local``): ``multiprocessing`` queues, weights
    through shared memory. ``thundersync.training.ray_backend.RayBackend`` has the same
    methods."""

    gpu_for_rollout = False
    """Whether the rollout worker is given a GPU (placement is Ray's; locally, torch's)."""

    def __init__(self) -> None:
        self._rendezvous: Path | None = None

    def queue(self) -> Any:
        return CONTEXT.Queue()

    def spawn(
        self,
        name: str,
        target: Callable[..., None],
        *args: Any,
        num_threads: int,
        output: Outbox[WorkerFailed],
        num_gpus: float = 0,
        cores: tuple[int, ...] | None = None,
    ) -> Any:
        return spawn(name, target, *args, num_threads=num_threads, output=output, cores=cores)

    def stop(self, worker: Any, *, timeout_s: float) -> None:
        stop(worker, timeout_s=timeout_s)

    def weights(self, params: Any) -> SharedWeights:
        return SharedWeights(params)

    def rendezvous(self, folder: Path) -> str:
        """Where data-parallel learner ranks meet: a file in the run folder (they share this
        machine); a killed run's leftover one is removed first, this one in ``close``."""
        for stale in folder.glob(".learner-group-*"):
            stale.unlink(missing_ok=True)
        self._rendezvous = folder / f".learner-group-{os.getpid()}"
        return f"file://{self._rendezvous}"

    def close(self) -> None:
        """Remove the rendezvous file (the trainer stopped every worker by its own id)."""
        if self._rendezvous is not None:
            self._rendezvous.unlink(missing_ok=True)


def _bootstrap(
    name: str,
    target: Callable[..., None],
    args: tuple,
    num_threads: int,
    output: Outbox[WorkerFailed],
    parent_pid: int,
    epoch: float,
    cores: tuple[int, ...] | None = None,
) -> None:
    if cores is not None:  # --placement disaggregated: before torch starts its threads
        os.sched_setaffinity(0, cores)
    _die_with_parent(parent_pid)
    signal.signal(signal.SIGTERM, _unwind)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the trainer's to handle
    run_target(name, target, args, num_threads, output, epoch)


def run_target(
    name: str,
    target: Callable[..., None],
    args: tuple,
    num_threads: int,
    output: Outbox[WorkerFailed],
    epoch: float,
) -> None:
    """A worker's body, on either backend: torch threads, the run clock, crashes reported."""
    torch.set_num_threads(max(1, num_threads))
    ev.set_clock_epoch(epoch)
    try:
        target(*args)
    except SystemExit:
        raise
    except BaseException:
        output.put(WorkerFailed(name, traceback.format_exc()))
        raise SystemExit(1) from None


def _die_with_parent(parent_pid: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(143)


def _unwind(signum: int, frame: object) -> None:
    timer = threading.Timer(_UNWIND_GRACE_S, os._exit, args=(128 + signum,))
    timer.daemon = True
    timer.start()
    raise SystemExit(128 + signum)
