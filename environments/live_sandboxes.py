"""An env's open sandboxes: made by engine kind or factory, each closed when released, and all
closed at once by ``interrupt`` from any thread."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable

from environments.sandboxes.protocol import Sandbox, SandboxError, SandboxSpec

SandboxFactory = Callable[[SandboxSpec], Sandbox]


class LiveSandboxes:
    """The sandboxes an env has open (``ShellEnv.interrupt`` closes them all); once
    interrupted, it makes no more."""

    def __init__(self, kind: str | SandboxFactory) -> None:
        self._kind = kind
        self._live: dict[int, Sandbox] = {}  # every open sandbox, for interrupt()
        self._live_lock = threading.Lock()
        self._interrupted: str | None = None

    def make(self, spec: SandboxSpec) -> Sandbox:
        self._check_interrupted()
        if callable(self._kind):
            sandbox = self._kind(spec)
        else:
            from environments.sandboxes import make_sandbox

            sandbox = make_sandbox(spec, kind=self._kind)
        with self._live_lock:
            if self._interrupted is None:
                self._live[id(sandbox)] = sandbox
                return sandbox
        sandbox.close()  # interrupt() came while it was being made
        self._check_interrupted()
        raise AssertionError("unreachable: the env is interrupted")

    def _check_interrupted(self) -> None:
        if self._interrupted is not None:
            raise SandboxError(f"the env was interrupted: {self._interrupted}")

    def interrupt(self, reason: str) -> None:
        """Close every open sandbox now, from any thread; make no more."""
        with self._live_lock:
            self._interrupted = self._interrupted or reason
            live = list(self._live.values())
        for sandbox in live:
            # A sandbox that cannot be removed says so again to the episode's own close().
            with contextlib.suppress(SandboxError):
                sandbox.close()

    def release(self, sandbox: Sandbox) -> None:
        with self._live_lock:
            self._live.pop(id(sandbox), None)
        sandbox.close()
