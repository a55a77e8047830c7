"""SandboxPool: at most N sandboxes alive at once, shared by concurrent episodes."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from environments.sandboxes.protocol import Sandbox, SandboxError, SandboxSpec


class SandboxPool:
    """A bounded pool: ``with pool.sandbox(spec) as sb:`` waits for one of ``size`` slots,
    makes a fresh sandbox, and closes it (freeing the slot) on every path out.

    Sandboxes are never reused between episodes: a task's files must not leak into the next.
    ``close()`` closes every sandbox still open and makes further requests fail.
    """

    def __init__(
        self,
        size: int,
        kind: str = "bwrap",
        *,
        factory: Callable[[SandboxSpec], Sandbox] | None = None,
    ) -> None:
        if size < 1:
            raise ValueError(f"SandboxPool size must be >= 1, got {size}")
        if factory is None:
            from environments.sandboxes import make_sandbox

            def factory(spec: SandboxSpec) -> Sandbox:
                return make_sandbox(spec, kind)

        self.size = size
        self._factory = factory
        self._slots = threading.BoundedSemaphore(size)
        self._lock = threading.Lock()
        self._sandboxes: dict[int, Sandbox] = {}
        self._closed = False

    @property
    def num_active(self) -> int:
        with self._lock:
            return len(self._sandboxes)

    def acquire(self, spec: SandboxSpec, timeout: float | None = None) -> Sandbox:
        """A new sandbox once a slot is free; SandboxError after ``timeout`` s or when closed."""
        if not self._slots.acquire(timeout=timeout):
            raise SandboxError(f"no sandbox slot free after {timeout} s (pool size {self.size})")
        try:
            with self._lock:
                if self._closed:
                    raise SandboxError("SandboxPool is closed")
            sandbox = self._factory(spec)
        except BaseException:
            self._slots.release()
            raise
        with self._lock:
            self._sandboxes[id(sandbox)] = sandbox
            closed = self._closed
        if closed:
            self.release(sandbox)
            raise SandboxError("SandboxPool is closed")
        return sandbox

    def release(self, sandbox: Sandbox) -> None:
        """Close ``sandbox`` and free its slot; safe to call twice."""
        with self._lock:
            owned = self._sandboxes.pop(id(sandbox), None) is not None
        try:
            sandbox.close()
        finally:
            if owned:
                self._slots.release()

    @contextmanager
    def sandbox(self, spec: SandboxSpec, timeout: float | None = None) -> Iterator[Sandbox]:
        sb = self.acquire(spec, timeout)
        try:
            yield sb
        finally:
            self.release(sb)

    def close(self) -> None:
        """Close every open sandbox; later ``acquire`` calls raise SandboxError."""
        with self._lock:
            self._closed = True
            open_now = list(self._sandboxes.values())
        for sb in open_now:
            self.release(sb)

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
