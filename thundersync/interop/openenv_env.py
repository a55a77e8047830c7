"""``openenv/Remote-v0``: a running OpenEnv server, by URL, as one of our Gymnasium envs.

``gymnasium.make("openenv/Remote-v0", url="http://127.0.0.1:8000")`` is a text-in, text-out
env like ``ShellEnv``: ``EpisodeRunner`` drives it and publishes our events, so ``train``,
``eval`` and ``compare`` take it with ``--env openenv/Remote-v0 --env-kwargs '{"url": ...}'``.
It speaks ``thundersync serve``'s wire (``openenv_wire``): the action ``{"text": reply}``
(``action_field`` renames it for another server), the observation's ``text`` (or
``observation_field``), reward and ``done``; the other ``TextObservation`` fields (task id,
tool result, stop reason, grade details) are read when the server sends them.

Tasks live on the server, so a task here is a seed (``RemoteTask``): every episode of a group
resets the server with the same seed, hence plays the same task, and the server's task id
replaces ``seed-N`` once the reset answers. Grading happens on the server (strict unless the
env's ``strict_grading=False`` asks otherwise); the reward arrives with the terminal step, and
``before_grading`` is called then, when the grade is already known. The oracle agent cannot
play it: a server does not send its tasks' reference solutions.

A server that is down, answers something that is not this wire, or stays silent past
``timeout_s`` ends the episode as an infrastructure failure naming the URL and the reason
(``info["error"]``), never a hang. ``interrupt`` closes the connection from any thread.

A server allows so many sessions at once (``serve --max-sessions``): a session past them is
refused as over capacity, which is no failure of the episode. So this process opens no more
sessions on a server than it allows (``SessionGate``: asked once, ``GET /capacity``, or learnt
from the first refusal), an episode past them waits for a free one (said once on stderr), and
closing a session waits until the server has closed it, so the next one is not refused while
the server is still removing the last one's sandbox. ``max_sessions`` lets ``train`` play no
more episodes at once, and open no more envs ahead, than the server allows.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import gymnasium as gym
import numpy as np

from environments.actions import SUBMIT_WORD, format_action
from environments.splits import TRAIN
from environments.tasks import Grade
from environments.text_space import MAX_ACTION_CHARS, MAX_OBSERVATION_CHARS, UnicodeText
from thundersync.interop.openenv_gate import (
    ASK_TIMEOUT_S,
    ENV_ID,
    RemoteError,
    capacity_refusal,
    session_gate,
)
from thundersync.protocol.types import StopReason

SEEDS = 2**31
CLOSE_TIMEOUT_S = 10.0
"""The longest wait, after closing a session, for the server to close its connection."""
RETRY_S = (0.05, 2.0)
"""A refused session, while no session of this process holds the server: the first and the
longest wait before trying again (doubling), within the call's ``timeout_s``."""


@dataclass(frozen=True, slots=True)
class RemoteTask:
    """A task of the server, named by the seed its reset draws it with (the ``Task`` fields
    the runner reads; its sandbox and grading are the server's)."""

    task_id: str
    seed: int
    instruction: str = ""
    max_turns: int = 0
    timeout_s: float = 0.0

    def sandbox_spec(self, kind: str | None) -> Any:
        raise RemoteError(f"task {self.task_id}: its sandbox is made by the OpenEnv server")

    def setup(self, sandbox: Any) -> None:
        raise RemoteError(f"task {self.task_id}: it is set up by the OpenEnv server")

    def grade(self, sandbox: Any, context: Any) -> Grade:
        raise RemoteError(f"task {self.task_id}: it is graded by the OpenEnv server")

    def reference_solution(self) -> list[str]:
        raise RemoteError(
            f"task {self.task_id}: the OpenEnv server keeps its reference solution "
            "(the oracle agent cannot play a remote env)"
        )


@dataclass(frozen=True, slots=True)
class RemoteTasks:
    """The ``TaskSource`` of a server: generated (a draw is a seed), one training split."""

    name: str

    def splits(self) -> tuple[str, ...]:
        return (TRAIN,)

    def tasks(self, split: str = TRAIN) -> None:
        self._check(split)
        return None

    def draw(self, rng: np.random.Generator, split: str = TRAIN) -> RemoteTask:
        self._check(split)
        seed = int(rng.integers(SEEDS))
        return RemoteTask(f"seed-{seed}", seed)

    def _check(self, split: str) -> None:
        if split != TRAIN:
            raise ValueError(f"task source {self.name!r}: no split {split!r}; it has ['train']")

    def max_sessions(self) -> int | None:
        """How many sessions (episodes, envs) the server allows at once, or None when it does
        not say (``GET /capacity``; asked once per process). ``train`` plays no more episodes
        at once, and opens no more envs ahead, than this."""
        return session_gate(self.name).ask()


def _closed(exc: BaseException) -> bool:
    """Whether ``exc`` says the server closed the connection (websockets' ConnectionClosed)."""
    from websockets.exceptions import ConnectionClosed

    return isinstance(exc, ConnectionClosed)


def _left_unread(client: Any) -> str | None:
    """The message the server sent before closing the connection, if it is still unread, else
    None. openenv's server refuses a session over capacity by sending its error at once and
    closing: a client whose first message meets the closed connection has not read it yet
    (``_ws`` and ``_run``: openenv-core 0.3.0's, pinned)."""

    socket = getattr(getattr(client, "async_client", None), "_ws", None)
    if socket is None:
        return None

    async def read() -> Any:
        return await asyncio.wait_for(socket.recv(), ASK_TIMEOUT_S)

    try:
        message = client._run(read())
    except Exception:  # noqa: BLE001 (nothing left: it was not a refusal)
        return None
    return message if isinstance(message, str) else None


def checked_url(url: Any) -> str:
    """``url`` if it is an http(s):// or ws(s):// address with a host; ValueError otherwise."""
    example = "e.g. http://127.0.0.1:8000, where thundersync serve listens"
    if url is None:
        raise ValueError(f"{ENV_ID}: env kwarg 'url' is required ({example})")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https", "ws", "wss") or not parts.hostname:
        raise ValueError(
            f"{ENV_ID}: env kwarg 'url': expected an OpenEnv server's address "
            f"({example}), got {url!r}"
        )
    return url.rstrip("/")


class OpenEnvRemote(gym.Env[str, str]):
    """An OpenEnv server's env, one session per instance (see the module docstring).

    ``url``: the server; ``timeout_s``: the longest wait for one answer (a reset, a step with
    its grading); ``connect_timeout_s``: for the connection. ``strict_grading`` is sent with
    every reset (None: the server's own setting). ``sandbox`` is not used: the served env's
    sandbox is the server's (``thundersync serve --env-kwargs``); it is accepted because
    ``train`` and ``eval`` pass it to every env."""

    metadata: dict[str, Any] = {"render_modes": []}

    @classmethod
    def task_source(cls, url: Any = None, **_: Any) -> RemoteTasks:
        return RemoteTasks(checked_url(url))

    def __init__(
        self,
        url: str | None = None,
        *,
        timeout_s: float = 600.0,
        connect_timeout_s: float = 10.0,
        strict_grading: bool | None = None,
        action_field: str = "text",
        observation_field: str = "text",
        sandbox: Any = None,
    ) -> None:
        self.url = checked_url(url)
        for name, value in (("timeout_s", timeout_s), ("connect_timeout_s", connect_timeout_s)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"{ENV_ID}: env kwarg {name!r}: expected seconds > 0, got {value!r}"
                )
        self.timeout_s, self.connect_timeout_s = float(timeout_s), float(connect_timeout_s)
        self.strict_grading = strict_grading
        self.action_field, self.observation_field = action_field, observation_field
        self.source = RemoteTasks(self.url)
        self.observation_space = UnicodeText(MAX_OBSERVATION_CHARS)
        self.action_space = UnicodeText(MAX_ACTION_CHARS)
        self._client: Any = None
        self._gate = session_gate(self.url)
        self._held = False  # a session of the gate's is this env's (until close)
        self._lock = threading.Lock()
        self._interrupted: str | None = None
        self._task: RemoteTask | None = None
        self._before_grading: Any = None
        self._failure: str | None = None
        self._done = False
        self._num_turns = 0

    @property
    def task(self) -> RemoteTask:
        if self._task is None:
            raise gym.error.ResetNeeded("call reset() before using the task")
        return self._task

    def draw_task(self, rng: np.random.Generator) -> RemoteTask:
        return self.source.draw(rng, TRAIN)

    # --- reset and step ----------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        super().reset(seed=seed)
        options = options or {}
        choice = options.get("task")
        self._before_grading = options.get("before_grading")
        self._done, self._failure, self._num_turns = False, None, 0
        request: dict[str, Any] = {}
        if isinstance(choice, RemoteTask):
            draw = choice.seed
        elif isinstance(choice, str):
            draw, request["task_id"] = int(self.np_random.integers(SEEDS)), choice
        elif choice is None:
            draw = seed if seed is not None else int(self.np_random.integers(SEEDS))
        else:
            raise ValueError(f"options['task']: expected a RemoteTask or a task id, got {choice!r}")
        request["seed"] = draw
        if self.strict_grading is not None:
            request["strict_grading"] = bool(self.strict_grading)
        self._task = RemoteTask(f"seed-{draw}", draw)
        try:
            observation = self._call("reset", request)
        except RemoteError as exc:
            self._failure = str(exc)
            info = {"task_id": self._task.task_id, "infra_failure": True, "error": self._failure}
            return self._clip(f"Infrastructure failure: {self._failure}"), info
        self._task = RemoteTask(observation.task_id or self._task.task_id, draw, observation.text)
        info = {"task_id": self._task.task_id, "infra_failure": observation.infra_failure}
        if observation.infra_failure:
            self._failure = observation.error or "the server's env failed to reset"
            info["error"] = self._failure
        return self._clip(observation.text), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._task is None or self._done:
            raise gym.error.ResetNeeded("the episode is over (or never started): call reset()")
        return self._play(action, None)

    def end_episode(self, reason: StopReason) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """End the episode without the agent's action: the server is sent ``submit`` (its
        only way to end and grade an episode) and the stop reason is ``reason``."""
        if self._task is None or self._done:
            raise gym.error.ResetNeeded("the episode is over (or never started): call reset()")
        return self._play(format_action(SUBMIT_WORD), reason)

    def _play(
        self, action: str, reason: StopReason | None
    ) -> tuple[str, float, bool, bool, dict[str, Any]]:
        info: dict[str, Any] = {"turn": self._num_turns, "infra_failure": False}
        self._num_turns += 1
        if self._failure is None:
            try:
                observation = self._call("step", {self.action_field: action})
                stop = _stop_reason(observation) if observation.done else None
            except RemoteError as exc:
                self._failure = str(exc)
        if self._failure is not None:
            self._done = True
            info.update(
                infra_failure=True, error=self._failure, termination_reason=StopReason.ERROR
            )
            text = self._clip(f"Infrastructure failure: {self._failure}")
            self._call_before_grading(text, info)
            return text, 0.0, False, True, info
        for name in ("tool", "format_error"):
            if getattr(observation, name) is not None:
                info[name] = getattr(observation, name)
        info["termination_reason"] = reason or stop
        text = self._clip(observation.text)
        if not observation.done:
            return text, 0.0, False, False, info
        self._done = True
        self._call_before_grading(text, info)
        info["grade_details"] = dict(observation.grade_details or {})
        if observation.infra_failure:
            info.update(infra_failure=True, error=observation.error)
            info["termination_reason"] = StopReason.ERROR
        terminated = info["termination_reason"] is StopReason.SUBMITTED
        return text, float(observation.reward or 0.0), terminated, not terminated, info

    def _call_before_grading(self, text: str, info: dict[str, Any]) -> None:
        if self._before_grading is not None:
            self._before_grading(text, dict(info))

    # --- the connection ----------------------------------------------------------------------

    def _call(self, kind: str, payload: dict[str, Any]) -> Any:
        """Send a reset or a step; the answer as a ``TextObservation``, or ``RemoteError``."""
        from pydantic import ValidationError

        from thundersync.interop.openenv_wire import TextObservation

        where = f"OpenEnv server {self.url}"
        deadline = time.monotonic() + self.timeout_s
        retry_s = RETRY_S[0]
        while True:
            try:
                client = self._connected(deadline)
                result = client.reset(**payload) if kind == "reset" else client.step(payload)
                break
            except TimeoutError:
                raise RemoteError(
                    f"{where}: no answer to {kind} within {self.timeout_s:g} s"
                ) from None
            except RemoteError:
                raise
            except Exception as exc:  # a refused connection, a dropped socket, the server's error
                over, limit = capacity_refusal(exc)
                if not over and _closed(exc):  # the refusal may be waiting unread
                    over, limit = capacity_refusal(_left_unread(self._client))
                if not over:
                    raise RemoteError(
                        f"{where}: {kind} failed: {type(exc).__name__}: {exc}"
                    ) from None
            # over capacity: not the episode's failure; wait for a free session and try again
            self._refused(limit, deadline, retry_s)
            retry_s = min(2 * retry_s, RETRY_S[1])
        observation = result.observation
        text = observation.get(self.observation_field) if isinstance(observation, dict) else None
        if not isinstance(text, str):
            shown = repr(observation)[:200]
            raise RemoteError(
                f"{where}: {kind} answered no text field {self.observation_field!r}: {shown}"
            )
        fields = {k: v for k, v in observation.items() if k in TextObservation.model_fields}
        fields.update(text=text, reward=result.reward, done=result.done)
        try:
            return TextObservation.model_validate(fields)
        except ValidationError as exc:
            problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
            raise RemoteError(f"{where}: {kind} answered off the wire: {problem}") from None

    def _connected(self, deadline: float) -> Any:
        """The session's client, connected; a new session holds one of the server's
        (``SessionGate.acquire``: it may wait for a free one) until ``close``."""
        with self._lock:
            if self._interrupted is not None:
                raise RemoteError(f"the env was interrupted: {self._interrupted}")
            client, held = self._client, self._held
        if not held:
            self._gate.acquire(deadline, self._stopped, self.connect_timeout_s)
            with self._lock:
                self._held = True
        if client is None:
            from openenv.core.generic_client import GenericEnvClient

            client = GenericEnvClient(
                base_url=self.url,
                connect_timeout_s=self.connect_timeout_s,
                message_timeout_s=self.timeout_s,
            ).sync()
            with self._lock:
                self._client = client
        client.connect()
        return client

    def _stopped(self) -> str | None:
        with self._lock:
            return self._interrupted

    def _refused(self, limit: int | None, deadline: float, retry_s: float) -> None:
        """The server refused the session as over capacity: drop the refused connection, then
        hold a session again once one is free (``SessionGate.refused``)."""
        with self._lock:
            client, self._client, self._held = self._client, None, False
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
        self._gate.refused(limit, deadline, self._stopped, retry_s)
        with self._lock:
            self._held = True

    def interrupt(self, reason: str = "interrupted") -> None:
        """Close the connection now, from any thread: a call in flight fails at once."""
        with self._lock:
            self._interrupted = self._interrupted or reason
            client = self._client
        self._gate.wake()  # a call waiting for a free session fails at once too
        if client is not None:
            # Only the socket: stopping the client's loop here could strand the call in
            # flight, which the closed socket ends with an error instead. close() stops it.
            with contextlib.suppress(Exception):
                client.disconnect()

    def close(self) -> None:
        """Close the session: the server closes its env and removes its sandbox."""
        self._disconnect()
        super().close()

    def _disconnect(self) -> None:
        with self._lock:
            client, self._client = self._client, None
            held, self._held = self._held, False
        try:
            if client is not None:
                # A server already gone has nothing left to close: its session ended with the
                # connection, which is what closing asks for.
                with contextlib.suppress(Exception):
                    _close_session(client)
        finally:
            if held:
                self._gate.release()

    def _clip(self, text: str) -> str:
        return text[:MAX_OBSERVATION_CHARS]


def _close_session(client: Any) -> None:
    """Close ``client``'s session and wait (``CLOSE_TIMEOUT_S`` at most) until the server has
    closed the connection: openenv's server closes it only after destroying the session (its
    env closed, the sandbox removed), so the session released here is free on the server too,
    and the next one is not refused while the server is still closing this one. openenv's
    client sends the close and returns at once; the wait reads its socket (``_ws``) on its
    loop (``_run``), as openenv-core 0.3.0 (pinned) has them."""

    async def close_and_wait() -> None:
        socket = getattr(client.async_client, "_ws", None)
        if socket is None:
            return
        await socket.send(json.dumps({"type": "close"}))

        async def until_closed() -> None:
            while True:
                await socket.recv()  # raises once the server has closed the connection

        with contextlib.suppress(Exception):
            await asyncio.wait_for(until_closed(), CLOSE_TIMEOUT_S)

    try:
        with contextlib.suppress(Exception):
            client._run(close_and_wait())
    finally:
        client.close()


def _stop_reason(observation: Any) -> StopReason:
    """The terminal step's stop reason: the server's, or (a server that sends none) a
    submission unless it says the episode was truncated."""
    if observation.termination_reason is None:
        return StopReason.MAX_TURNS if observation.truncated else StopReason.SUBMITTED
    try:
        return StopReason(observation.termination_reason)
    except ValueError:
        raise RemoteError(
            f"unknown termination_reason {observation.termination_reason!r}; expected one of "
            f"{[r.value for r in StopReason]}"
        ) from None
