"""The sessions this process holds on each OpenEnv server, kept within the server's limit
(``SessionGate``): asked once (``GET /capacity``) or learnt from a refusal (``openenv_env``)."""

from __future__ import annotations

import json
import re
import sys
import threading
import time
import urllib.request
from typing import Any
from urllib.parse import urlsplit

ENV_ID = "openenv/Remote-v0"
"""The remote env's id (``openenv_env``): the gate's note on stderr names it."""
CAPACITY_PATH = "/capacity"
"""``thundersync serve``'s route answering how many sessions it allows (``max_sessions``);
openenv-core 0.3.0 counts its sessions but has no route for it (``openenv_server``)."""
ASK_TIMEOUT_S = 10.0
"""The longest wait for that answer (a server without the route answers 404 at once)."""
LOOPBACK = ("127.0.0.1", "::1", "localhost")
"""Hosts asked directly, never through a proxy the environment names."""


class RemoteError(RuntimeError):
    """The OpenEnv server could not be reached, timed out, or answered off the wire."""


class SessionGate:
    """The sessions this process holds on one OpenEnv server (``session_gate(url)``), kept
    within the server's limit: ``acquire`` before a session opens waits while this process
    holds the limit (a ``Condition``: woken by ``release``, or by ``wake`` on an interrupt);
    ``refused`` after the server refused one as over capacity learns the limit from the
    refusal and waits likewise, or, when the sessions that fill the server are not this
    process's (another client's, or one the server is still closing), a short while that
    doubles. Each wait ends by the caller's deadline. The first wait is said once on stderr:
    an episode that waits is slower, not lost."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.limit: int | None = None
        self.held = 0
        self.waiting = 0
        self._changed = threading.Condition()
        self._asking = threading.Lock()  # one question, outside the condition's lock
        self._asked = False
        self._said = False

    def ask(self, timeout_s: float = ASK_TIMEOUT_S) -> int | None:
        """The server's limit: asked once (``GET /capacity``, waiting ``timeout_s`` at most
        for the answer; callers meanwhile wait for it); None when it does not say."""
        with self._asking:
            if not self._asked:
                asked = _ask_capacity(self.url, timeout_s)
                with self._changed:
                    self._asked = True
                    if asked is not None:
                        self.limit = asked if self.limit is None else min(self.limit, asked)
        with self._changed:
            return self.limit

    def acquire(self, deadline: float, stopped: Any, ask_timeout_s: float) -> None:
        """Hold one session (wait while this process holds the limit); ``RemoteError`` past
        ``deadline`` (``time.monotonic``) or once ``stopped()`` names a reason."""
        self.ask(ask_timeout_s)
        with self._changed:
            while self.limit is not None and self.held >= self.limit:
                self._wait(deadline, stopped)
            self.held += 1

    def refused(self, limit: int | None, deadline: float, stopped: Any, retry_s: float) -> None:
        """The session just held was refused as over capacity (``limit``: the server's, as the
        refusal says it): release it, wait for a free one, hold it again."""
        with self._changed:
            self.held -= 1
            self._changed.notify_all()
            if limit is not None:
                self.limit = limit if self.limit is None else min(self.limit, limit)
            if self.limit is not None and self.held >= self.limit:
                while self.held >= self.limit:  # ours fill the server: wait for one of them
                    self._wait(deadline, stopped)
            else:  # others' sessions fill it, or one the server is still closing
                self._wait(deadline, stopped, retry_s)
            self.held += 1

    def release(self) -> None:
        with self._changed:
            self.held -= 1
            self._changed.notify_all()

    def wake(self) -> None:
        """Wake every waiter to check its ``stopped`` (an env interrupted)."""
        with self._changed:
            self._changed.notify_all()

    def wait_for_waiting(self, count: int, timeout: float) -> bool:
        """Whether ``count`` callers wait for a session within ``timeout`` seconds (tests)."""
        with self._changed:
            return self._changed.wait_for(lambda: self.waiting >= count, timeout)

    def _wait(self, deadline: float, stopped: Any, at_most: float | None = None) -> None:
        """One wait on the condition (the lock held), at most ``at_most`` seconds."""
        if not self._said:
            self._said = True
            allows = f"allows {_sessions(self.limit)} at once" if self.limit else "is at capacity"
            print(
                f"{ENV_ID}: the OpenEnv server at {self.url} {allows}; episodes past them "
                "wait for a free session (thundersync serve --max-sessions N allows more)",
                file=sys.stderr,
                flush=True,
            )
        left = deadline - time.monotonic()
        if left <= 0:
            allows = f"it allows {self.limit} at once" if self.limit else "it is at capacity"
            raise RemoteError(f"OpenEnv server {self.url}: no free session in time ({allows})")
        self.waiting += 1
        self._changed.notify_all()
        try:
            self._changed.wait(left if at_most is None else min(left, at_most))
        finally:
            self.waiting -= 1
        reason = stopped()
        if reason is not None:
            raise RemoteError(f"the env was interrupted: {reason}")


def _sessions(count: int) -> str:
    return f"{count} session" + ("" if count == 1 else "s")


_GATES: dict[str, SessionGate] = {}
_GATES_LOCK = threading.Lock()


def session_gate(url: str) -> SessionGate:
    """This process's ``SessionGate`` of the server at ``url`` (one per server)."""
    with _GATES_LOCK:
        return _GATES.setdefault(url, SessionGate(url))


def _ask_capacity(url: str, timeout_s: float) -> int | None:
    """The server's ``max_sessions`` (``GET /capacity``), or None: a server without the route,
    one that is down, or an answer that is not a positive integer."""

    parts = urlsplit(url)
    scheme = {"ws": "http", "wss": "https"}.get(parts.scheme, parts.scheme)
    address = parts._replace(scheme=scheme).geturl().rstrip("/") + CAPACITY_PATH
    handlers = [urllib.request.ProxyHandler({})] if parts.hostname in LOOPBACK else []
    try:
        with urllib.request.build_opener(*handlers).open(address, timeout=timeout_s) as answer:
            limit = json.loads(answer.read(4096)).get("max_sessions")
    except Exception:  # noqa: BLE001 (no answer is an answer: the limit is learnt on refusal)
        return None
    return limit if type(limit) is int and limit >= 1 else None


_CAPACITY = re.compile(r"(\d+)/(\d+) sessions active")


def capacity_refusal(said: object) -> tuple[bool, int | None]:
    """Whether ``said`` (an exception, or a message the server sent) is openenv's refusal of a
    session over capacity, and the server's limit it names (``Server at capacity: 8/8 sessions
    active ... (code: CAPACITY_REACHED)``)."""
    text = str(said) if said is not None else ""
    if "CAPACITY_REACHED" not in text:
        return False, None
    found = _CAPACITY.search(text)
    return True, int(found[2]) if found else None
