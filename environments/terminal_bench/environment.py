"""A task's sandbox: a Docker build of its Dockerfile, or its files staged for bubblewrap."""

from __future__ import annotations

import atexit
import dataclasses
import os
import shlex
import shutil
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from environments.sandboxes.engines import (
    ANY_WORKDIR,
    BUILDS_IMAGES,
    RUNS_ANY_IMAGE,
    RUNS_MULTI_CONTAINER,
    sandbox_engine,
)
from environments.sandboxes.host_view import validate_workdir
from environments.sandboxes.image_build import ALIASES_VARIABLE, normalise_image, resolve_image
from environments.sandboxes.orphans import reap_once, remove_orphan_workspaces
from environments.sandboxes.protocol import NeedsDockerError, Sandbox, SandboxSpec, ServiceSpec
from environments.terminal_bench.dockerfile import BASE_IMAGE, DockerfilePlan

SETUP_MARKER = ".thundersync-setup-pending"
"""Staged workspaces whose Dockerfile has RUN steps carry this file; ``setup`` replays the steps
and removes it. A sandbox built by ``docker build`` has no marker, so nothing is replayed twice."""

STAGING_PREFIX = "thundersync-tb-"
"""Staged files live in ``<tmp>/thundersync-tb-<pid>-<task>-*``; a run killed before its atexit
hook leaves them behind, and the next process that stages files removes those of dead pids."""

_staged: dict[Path, Path] = {}
_image_contexts: dict[str, Path] = {}
_staged_lock = threading.Lock()


@atexit.register
def _remove_staged() -> None:
    with _staged_lock:
        for folder in [*_staged.values(), *_image_contexts.values()]:
            shutil.rmtree(folder.parent, ignore_errors=True)
        _staged.clear()
        _image_contexts.clear()


@dataclass(frozen=True, slots=True)
class TaskEnvironment:
    """How to make one task's sandbox.

    ``build_context``: the folder ``docker build`` runs in (None when the task names a prebuilt
    ``image`` instead); ``plan``: what its Dockerfile does; bubblewrap can run the task iff
    ``needs_docker_reason`` is None. ``services``: a compose file's other containers
    (``environments.terminal_bench.compose_task``), which only an engine that
    ``RUNS_MULTI_CONTAINER`` runs.
    """

    task_id: str
    workdir: str
    build_context: Path | None = None
    plan: DockerfilePlan | None = None
    image: str | None = None
    memory_mb: int = 2048
    cpus: float = 1.0
    build_timeout_s: float = 600.0
    env: dict[str, str] = field(default_factory=dict)
    services: tuple[ServiceSpec, ...] = ()
    disk_mb: int | None = None
    """Harbor's ``storage_mb``: the size of the work folder's disk (None: ``SandboxSpec``'s)."""

    @property
    def needs(self) -> dict[str, str]:
        """What a sandbox engine must be able to do to make this sandbox, each with why
        (``environments.sandboxes.engines`` capabilities): a Dockerfile's build step, a base
        image other than the one the host's files stand for (``BASE_IMAGE``; an image alias
        to it, looked up now, qualifies: ``environments.sandboxes.image_build``), a workdir
        over the host's read-only folders. Empty: every engine can, bubblewrap included."""
        needs = {}
        if self.services:
            names = ", ".join(s.name for s in self.services)
            needs[RUNS_MULTI_CONTAINER] = (
                f"its environment/docker-compose.yaml runs services beside main ({names})"
            )
        if self.plan is not None and self.plan.build_step is not None:
            needs[BUILDS_IMAGES] = f"its Dockerfile has a build step: {self.plan.build_step}"
        base = self.plan.base_image if self.plan is not None else self.image or BASE_IMAGE
        local = resolve_image(base)
        if normalise_image(local) != BASE_IMAGE:
            what = "its Dockerfile's base image" if self.plan else "it runs in the prebuilt image"
            aliased = f" (aliased to {local!r})" if local != base else ""
            needs[RUNS_ANY_IMAGE] = (
                f"{what} {base!r}{aliased} is not {BASE_IMAGE}; if the task needs nothing else "
                f"from it, pass --image-alias {base}={BASE_IMAGE} (or set {ALIASES_VARIABLE})"
            )
        try:
            validate_workdir(self.workdir)
        except ValueError as err:
            needs[ANY_WORKDIR] = f"bubblewrap cannot use its workdir: {err}"
        return needs

    @property
    def needs_docker_reason(self) -> str | None:
        """Why bubblewrap cannot make this sandbox (the first of ``needs``), or None."""
        return next(iter(self.needs.values()), None)

    def spec(self, kind: str | None = None) -> SandboxSpec:
        """The sandbox spec for engine ``kind`` (None: whichever works in every engine).

        An engine that builds images builds the task's Dockerfile, and so does None for a task
        with ``needs``. Otherwise the task gets the base image plus its staged files (Docker
        runs that too, replaying RUN steps in ``setup`` instead of building); an engine that
        cannot do what the task ``needs`` (bubblewrap: any of it) refuses it first, with
        NeedsDockerError. An unknown ``kind`` is a ValueError naming the engines.
        """
        engine = None if kind is None else sandbox_engine(kind)
        needs = self.needs
        if engine is not None:
            engine.refuse(needs, f"task {self.task_id}")
        env = {**(self.plan.env if self.plan else {}), **self.env}
        if needs or (engine is not None and engine.can(BUILDS_IMAGES)):
            image, context = self.image, self.build_context if self.plan else None
            if context is None and image is not None and image != BASE_IMAGE:
                context, image = self._image_context(image), None
            return self._sized(
                image=image,
                build_context=context,
                workdir=self.workdir,
                env=env,
                memory_mb=self.memory_mb,
                cpus=self.cpus,
                services=self.services,
            )
        files = self._staged_files() if self.plan else None
        return self._sized(
            image=BASE_IMAGE,
            files=files,
            workdir=self.workdir,
            env=env,
            memory_mb=self.memory_mb,
            cpus=self.cpus,
        )

    def _sized(self, **fields: Any) -> SandboxSpec:
        """A SandboxSpec of ``fields`` with the task's disk size, where it gives one."""
        spec = SandboxSpec(**fields)
        return spec if self.disk_mb is None else dataclasses.replace(spec, disk_mb=self.disk_mb)

    def _image_context(self, image: str) -> Path:
        """A build context of ``FROM image`` alone: a prebuilt image goes through
        ``build_image`` too, which maps it through the aliases and refuses a missing one
        without trying a pull (no registry is reachable)."""
        with _staged_lock:
            staged = _image_contexts.get(image)
            if staged is None or not staged.exists():
                prefix = f"{STAGING_PREFIX}{os.getpid()}-{self.task_id}-"
                staged = Path(tempfile.mkdtemp(prefix=prefix)) / "image"
                staged.mkdir()
                (staged / "Dockerfile").write_text(f"FROM {image}\n", encoding="utf-8")
                _image_contexts[image] = staged
            return staged

    def _staged_files(self) -> Path:
        if self.plan is None:
            raise ValueError(f"task {self.task_id} has no Dockerfile to stage files from")
        reap_once("terminal-bench-staging", lambda: remove_orphan_workspaces(STAGING_PREFIX))
        with _staged_lock:
            staged = _staged.get(self.plan.path)
            if staged is None or not staged.exists():
                prefix = f"{STAGING_PREFIX}{os.getpid()}-{self.task_id}-"
                staged = Path(tempfile.mkdtemp(prefix=prefix)) / "workspace"
                _stage(self.plan, staged)
                _staged[self.plan.path] = staged
            return staged

    def setup(self, sandbox: Sandbox) -> None:
        """Replay the Dockerfile's RUN steps in a staged workspace (no-op after a Docker build)."""
        if self.plan is None or not self.plan.run_steps:
            return
        marker = shlex.quote(f"{self.workdir.rstrip('/')}/{SETUP_MARKER}")
        probe = sandbox.execute(f"test -f {marker} && rm -f {marker}", timeout=30)
        if probe.exit_code != 0:
            return
        for step in self.plan.run_steps:
            cmd = f"cd {shlex.quote(step.cwd)} && sh -c {shlex.quote(step.command)}"
            result = sandbox.execute(cmd, timeout=self.build_timeout_s)
            if result.timed_out or result.exit_code != 0:
                status = "timed out" if result.timed_out else f"exit {result.exit_code}"
                raise NeedsDockerError(
                    f"task {self.task_id} needs Docker: its build step `RUN {step.command}` "
                    f"failed when replayed in the workspace ({status}): {result.output[-2000:]}"
                )


def _stage(plan: DockerfilePlan, root: Path) -> None:
    """Lay out the Dockerfile's COPY sources as they will appear under the workspace."""
    root.mkdir(parents=True)
    for copy in plan.copies:
        target = root / copy.dest if copy.dest != "." else root
        for source in copy.sources:
            if source.is_dir():
                shutil.copytree(source, target, dirs_exist_ok=True, symlinks=True)
            elif copy.dest_is_dir or target.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target / source.name)
            else:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    if plan.run_steps:
        (root / SETUP_MARKER).write_text("replay the Dockerfile's RUN steps\n")
