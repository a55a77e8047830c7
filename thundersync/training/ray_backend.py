"""``--backend ray``: the same workers as Ray actors, placed by the resources they ask for.

The rollout worker (engine, episodes, sandboxes and graders), the OPD teacher and learner ranks
1 … N−1 run as actors; the trainer (learner rank 0, which owns the run folder) is the Ray
driver. Nothing in the modes or the workers changes: they talk through queues (here
``ray.util.queue.Queue``, an actor) and receive weights after each step (here through Ray's
object store instead of shared memory: one ``ray.put`` per step, read by the rollout actor
between two generation batches). Data-parallel learner ranks meet over TCP at the driver's node
address (``torch.distributed``, gloo).

Where the run goes: with ``RAY_ADDRESS`` set (``ray start --head`` on a cluster, then
``RAY_ADDRESS=<head>:6379 thundersync train --backend ray …``), actors go wherever the cluster
has the resources — the rollout actor asks for ``rollout_threads`` CPUs and half a GPU with
``--device cuda`` (a whole one with ``--engine vllm`` on a cluster that has GPUs); the teacher
one CPU, and half a GPU with ``--device cuda``; each learner rank ``learner_threads`` CPUs. A
cluster without the CPUs or GPUs the run asks for is an error at once (Ray would wait forever).
Every node needs the project installed (and its env's sandboxes), and spans recorded on another
node are on that node's clock. Without ``RAY_ADDRESS`` the run starts a private Ray head on
this machine, on loopback only, that stops with it (``thundersync.training.ray_head``).
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from thundersync.protocol import events as ev
from thundersync.training.control import Outbox
from thundersync.training.ray_head import LOOPBACK_ENV, start_private_head
from thundersync.training.workers import BackendError, WorkerFailed, run_target

INSTALL_HINT = "--backend ray needs Ray: pip install 'thundersync[ray]'"


class RayWorker:
    """One worker actor: the ``multiprocessing.Process`` methods the trainer uses."""

    def __init__(self, name: str, actor: Any, done: Any) -> None:
        self.name, self.actor, self.done = name, actor, done

    @property
    def exitcode(self) -> int | None:
        import ray

        ready, _ = ray.wait([self.done], timeout=0)
        if not ready:
            return None
        try:
            return int(ray.get(self.done))
        except Exception:  # the actor died (killed, out of memory, its node lost)
            return 1

    def is_alive(self) -> bool:
        return self.exitcode is None

    def join(self, timeout: float | None = None) -> None:
        import ray

        ray.wait([self.done], timeout=timeout)


class ObjectStoreWeights:
    """Weights to the rollout actor through Ray's object store (``SharedWeights``' methods)."""

    def __init__(self, params: Sequence[torch.Tensor]) -> None:
        self._latest: Any = None  # keeps the newest weights alive until the next publish

    def publish(self, params: Sequence[torch.Tensor], policy_version: int) -> tuple:
        """Put the parameters (``model.parameters()`` order) as one flat vector; returns what
        the control message carries to ``load_into``."""
        import ray

        with torch.no_grad():  # on the CPU: the object store holds host memory
            flat = torch.cat([p.detach().reshape(-1) for p in params]).cpu()
        self._latest = ray.put(flat)
        return ([self._latest], policy_version)  # in a list: Ray passes it on unresolved

    @staticmethod
    def load_into(engine: Any, refs: list, policy_version: int) -> int:
        import ray

        engine.load_weights(ray.get(refs[0]), policy_version)
        return policy_version


class RayBackend:
    """Workers as Ray actors (see the module docstring); ``LocalBackend``'s methods."""

    def __init__(
        self, *, cpus_needed: int, gpus_needed: float, gpu_for_rollout: bool, log: Path
    ) -> None:
        for key, value in _loopback_env().items():
            os.environ.setdefault(key, value)
        import ray

        self._head = None
        address = os.environ.get("RAY_ADDRESS")
        if address == "local":  # Ray's name for "start a head here": ours, guarded
            address = None
        if address and address != "auto":  # auto: the head already running on this machine
            _check_reachable(address)
        if not address:
            gpus = torch.cuda.device_count() if gpu_for_rollout or gpus_needed else 0
            self._head = start_private_head(
                num_cpus=max(cpus_needed, os.cpu_count() or 1), num_gpus=gpus, log=log
            )
            address = self._head.address
        try:
            ray.init(address=address, logging_level=logging.WARNING, log_to_driver=True)
            have = ray.cluster_resources()
        except Exception as exc:
            self.close()
            raise BackendError(f"cannot use the Ray cluster at {address}: {exc}") from exc
        except BaseException:
            self.close()
            raise
        for kind, needed in (("CPU", cpus_needed), ("GPU", gpus_needed)):
            if have.get(kind, 0) < needed:  # Ray would wait for them forever
                self.close()
                raise BackendError(
                    f"the Ray cluster at {address} has {have.get(kind, 0):g} "
                    f"{kind}s; this run's workers ask for {needed}"
                )
        self.gpu_for_rollout = gpu_for_rollout and have.get("GPU", 0) >= 1
        self._actors: list[Any] = []

    def queue(self) -> Any:
        from ray.util.queue import Queue

        return Queue(actor_options={"num_cpus": 0})

    def spawn(
        self,
        name: str,
        target: Callable[..., None],
        *args: Any,
        num_threads: int,
        output: Outbox[WorkerFailed],
        num_gpus: float = 0,
        cores: tuple[int, ...] | None = None,  # Ray places by resources (colocated only)
    ) -> RayWorker:
        import ray

        actor = (
            ray.remote(_WorkerActor)
            .options(
                name=f"thundersync-{name}-{os.getpid()}",
                num_cpus=num_threads,
                num_gpus=num_gpus,
                max_restarts=0,
            )
            .remote()
        )
        self._actors.append(actor)
        # Ray's types show an actor's methods as the class's; Ray adds their .remote.
        done = actor.run.remote(  # type: ignore[attr-defined]
            name, target, args, num_threads, output, ev.clock_epoch()
        )
        return RayWorker(f"thundersync-{name}", actor, done)

    def stop(self, worker: RayWorker, *, timeout_s: float) -> None:
        import ray

        worker.join(timeout_s)
        ray.kill(worker.actor)

    def weights(self, params: Sequence[torch.Tensor]) -> ObjectStoreWeights:
        return ObjectStoreWeights(params)

    def rendezvous(self, folder: Path) -> str:
        """Where learner ranks meet: a free port at this (the driver's) node address."""
        import ray

        host = ray.util.get_node_ip_address()
        with socket.socket() as probe:
            probe.bind((host, 0))
            return f"tcp://{host}:{probe.getsockname()[1]}"

    def close(self) -> None:
        """Kill every actor, disconnect, and stop the private head (if this run started one)."""
        try:
            import ray

            if ray.is_initialized():
                for actor in self._actors if hasattr(self, "_actors") else []:
                    ray.kill(actor)
                ray.shutdown()
        finally:
            if self._head is not None:
                self._head.close()
                self._head = None


class _WorkerActor:
    """The body of every worker actor: ``run`` blocks for the worker's whole life."""

    def run(
        self,
        name: str,
        target: Callable[..., None],
        args: tuple,
        num_threads: int,
        output: Outbox[WorkerFailed],
        epoch: float,
    ) -> int:
        try:
            run_target(name, target, args, num_threads, output, epoch)
        except SystemExit as exc:  # run_target reported the crash on ``output`` first
            return int(exc.code or 0)
        return 0


def _loopback_env() -> dict[str, str]:
    """Keep Ray on loopback when the cluster is this machine's (no RAY_ADDRESS, or a loopback
    one): otherwise Ray swaps 127.0.0.1 for the machine's network address."""

    address = os.environ.get("RAY_ADDRESS") or "local"
    if address == "local":
        address = "127.0.0.1:0"
    if address == "auto":
        return {}
    host = _split(address)[0]
    return LOOPBACK_ENV if host in ("127.0.0.1", "localhost", "::1") else {}


def _split(address: str) -> tuple[str, int]:
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        raise BackendError(f"RAY_ADDRESS={address!r}: expected HOST:PORT of a Ray head")
    return host.strip("[]"), int(port)


def _check_reachable(address: str, timeout_s: float = 10.0) -> None:
    """Fail in seconds, with one line, where ``ray.init`` would retry for minutes."""
    host, port = _split(address)
    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        raise BackendError(
            f"no Ray head answers at RAY_ADDRESS={address} ({exc}); start one "
            "with `ray start --head`, or unset RAY_ADDRESS for a private "
            "one"
        ) from exc
