"""``thundersync serve``: any registered env (ours or a plugin's) as an OpenEnv environment.

One OpenEnv session (a WebSocket connection) is one env instance, hence one sandbox at a time;
closing the session, or stopping the server, closes the env and removes its sandbox. Episodes
are played in sessions only, at most ``--max-sessions`` at once (GET ``/capacity`` says how
many, so ``openenv/Remote-v0`` opens no more and its episodes wait for a free one): the
server runs in openenv-core's production mode, where HTTP ``POST /reset``, ``POST /step``
and ``GET /state`` answer 404 naming the sessions, because in its simulation mode each such
request makes an env (and a reset, a sandbox) of its own outside the session limit
(``_production_app``). ``reset`` draws a task (seeded: the same seed draws the same task as
``gymnasium.make(id).reset(seed=s)``, or ``task_id`` names one of a finite list) and returns
its instruction; ``step`` takes the agent's reply (``TextAction.text``) and returns the tool's
output, with the reward graded here on the terminal step (strict unless the env's kwargs or
the reset say otherwise), never by the client. The wire models are ``openenv_wire``'s. The
server binds 127.0.0.1 unless ``--host`` names another address. Exit codes: 0 stopped, 2 bad
input (one line: unknown env, bad ``--env-kwargs``, a port in use).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import functools
import socket
import sys
from typing import Any

from thundersync.cli_output import WIDTH, HelpFormatter, fit, started
from thundersync.declared import json_object

LOOPBACK = ("127.0.0.1", "::1", "localhost")
DEFAULT_MAX_SESSIONS = 8
SHUTDOWN_GRACE_S = 10


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "serve",
        help="serve a registered env as an OpenEnv environment (WebSocket sessions)",
        description="Serve a registered env (built-in or a plugin's) through openenv-core: one "
        "env, hence one sandbox, per OpenEnv session (a WebSocket at /ws; HTTP /reset, /step "
        "and /state are off, as in openenv's production mode); reset(seed=, task_id=) returns the "
        "task's instruction, step({'text': reply}) the tool's output, and the terminal step "
        "the reward graded here. Listens on 127.0.0.1 unless --host says otherwise. Exit 0: "
        "stopped (Ctrl-C); 2: bad input.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--env", required=True, metavar="ID", help="a registered env id")
    parser.add_argument(
        "--env-kwargs",
        type=_json_object,
        default={},
        metavar="JSON",
        help='keyword arguments for gymnasium.make, e.g. \'{"sandbox": "docker"}\'',
    )
    parser.add_argument(
        "--host",
        default="127.0.0.1",
        help="address to listen on (default loopback; any other is reachable by others)",
    )
    parser.add_argument(
        "--port", type=int, default=8000, metavar="N", help="port (0: any free one, printed)"
    )
    parser.add_argument(
        "--max-sessions",
        type=int,
        default=DEFAULT_MAX_SESSIONS,
        metavar="N",
        help="concurrent sessions (each holds a sandbox while its episode runs)",
    )
    parser.set_defaults(func=run_serve_command)


def _json_object(text: str) -> dict[str, Any]:

    try:
        return json_object(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("value: ")) from None


def run_serve_command(args: argparse.Namespace) -> int:
    try:
        server = EnvServer(
            args.env,
            args.env_kwargs,
            host=args.host,
            port=args.port,
            max_sessions=args.max_sessions,
        )
    except ValueError as exc:
        print(fit(f"serve: error: {exc}", 10 * WIDTH), file=sys.stderr)
        return 2
    started()
    if args.host not in LOOPBACK:
        print(f"serve: warning: listening on {args.host}, not loopback", file=sys.stderr)
    print(
        f"serve: {args.env} at {server.url} (OpenEnv; sessions over {server.ws_url}, "
        f"up to {args.max_sessions}); Ctrl-C stops",
        flush=True,
    )
    # uvicorn shuts down gracefully on Ctrl-C, then raises it again: the stop asked for.
    with contextlib.suppress(KeyboardInterrupt):
        server.run()
    print("serve: stopped; every session's sandbox removed", flush=True)
    return 0


class EnvServer:
    """A bound, not yet running, OpenEnv server of ``env_id``: ``run()`` serves until
    ``stop()`` (or Ctrl-C), then closes every session's env. ValueError (one line) for an
    unknown env, kwargs the env refuses, or an address it cannot listen on."""

    def __init__(
        self,
        env_id: str,
        env_kwargs: dict[str, Any] | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        max_sessions: int = DEFAULT_MAX_SESSIONS,
    ) -> None:

        import gymnasium
        import uvicorn

        from environments.registry import require_env
        from thundersync.interop.openenv_session import ServedEnv, Sessions

        if max_sessions < 1:
            raise ValueError(f"--max-sessions: expected an integer >= 1, got {max_sessions}")
        kwargs = dict(env_kwargs or {})
        require_env(env_id)
        try:
            gymnasium.make(env_id, disable_env_checker=True, **kwargs).close()
        except Exception as exc:
            raise ValueError(f"--env-kwargs: cannot make {env_id} with {kwargs}: {exc}") from exc
        self.sock = _listen(host, port)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.sessions = Sessions()
        factory = functools.partial(ServedEnv, env_id, kwargs, self.sessions)
        app = _production_app(env_id, factory, max_sessions)
        config = uvicorn.Config(
            _quiet_disconnects(app), log_level="warning", timeout_graceful_shutdown=SHUTDOWN_GRACE_S
        )
        self._server = uvicorn.Server(config)

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://", 1) + "/ws"

    def run(self) -> None:
        """Serve until stopped; every session's env is closed on the way out, on every path."""
        try:
            self._server.run(sockets=[self.sock])
        finally:
            self.sessions.close_all()
            self.sock.close()

    def stop(self) -> None:
        """Ask ``run`` to return (from any thread)."""
        self._server.should_exit = True


CAPACITY_PATH = "/capacity"
"""GET: openenv's ``ServerCapacityStatus`` as JSON (``active_sessions``, ``max_sessions``)."""

NO_HTTP_EPISODES = (("POST", "/reset"), ("POST", "/step"), ("GET", "/state"))
"""openenv-core's simulation routes, off here: see ``_production_app``."""


def _production_app(env_id: str, factory: Any, max_sessions: int) -> Any:
    """openenv-core's app in its production mode, bounding sessions at ``max_sessions``, with
    ``NO_HTTP_EPISODES`` answering 404 and why (left out of the OpenAPI schema, as the mode's
    contract has them absent).

    In the simulation mode (``create_fastapi_app``'s) each of those HTTP requests makes an env
    of its own, outside ``max_concurrent_envs``, which bounds WebSocket sessions only:
    ``--max-sessions 1`` ran five sandboxes at once for six concurrent POST /reset. Nor could
    they play an episode: an HTTP /step gets a fresh env that was never reset. So an episode
    is a WebSocket session's alone, and every sandbox belongs to a session the limit counts;
    the routes left (``/metadata``, a stateless POST ``/mcp``) make an env but never reset it,
    and an env makes its sandbox in ``reset``. ``CAPACITY_PATH`` says how many sessions the
    server allows and holds, so that a client opens no more than that."""
    from fastapi import FastAPI
    from fastapi.responses import JSONResponse
    from openenv.core.env_server.http_server import HTTPEnvServer
    from openenv.core.env_server.types import ServerMode

    from thundersync.interop.openenv_wire import TextAction, TextObservation

    app = FastAPI(title=f"thundersync serve {env_id} (OpenEnv)")
    server = HTTPEnvServer(factory, TextAction, TextObservation, max_concurrent_envs=max_sessions)
    server.register_routes(app, mode=ServerMode.PRODUCTION)

    def refusal(method: str, path: str) -> Any:
        detail = (
            f"{method} {path}: not served over HTTP: thundersync serve plays episodes in "
            f"WebSocket sessions at /ws (openenv's EnvClient), at most {max_sessions} at once; "
            "an HTTP request has no session and would make a sandbox of its own"
        )

        async def no_session() -> JSONResponse:
            return JSONResponse({"detail": detail}, status_code=404)

        return no_session

    for method, path in NO_HTTP_EPISODES:
        app.add_api_route(path, refusal(method, path), methods=[method], include_in_schema=False)

    async def capacity() -> JSONResponse:
        status = server.get_capacity_status()
        return JSONResponse(status.model_dump())

    # openenv-core counts its sessions but serves no route for it: a client asks here how many
    # sessions it may open, instead of learning it from refusals (openenv_gate.SessionGate)
    app.add_api_route(
        CAPACITY_PATH,
        capacity,
        methods=["GET"],
        response_model=None,
        tags=["Environment Info"],
        summary="How many sessions the server allows and holds",
    )
    return app


def _listen(host: str, port: int) -> socket.socket:
    if not 0 <= port <= 65535:
        raise ValueError(f"--port: expected 0..65535, got {port}")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family)
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise ValueError(
                f"--port {port}: already in use on {host} (pick another, or 0 for any free one)"
            ) from None
        raise ValueError(f"--host {host} --port {port}: cannot listen there: {exc}") from None


def _quiet_disconnects(app: Any) -> Any:
    """``app`` without the traceback openenv-core 0.3.0 logs for every client that closes its
    session: its handler closes a WebSocket the client has already closed, and catches only
    ``RuntimeError`` from that. The session was ended as the client asked (its env closed
    first), so nothing failed; any other error, and any disconnect off a WebSocket, still
    propagates."""
    from starlette.websockets import WebSocketDisconnect
    from uvicorn.protocols.utils import ClientDisconnected

    async def serve(scope: dict[str, Any], receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except (WebSocketDisconnect, ClientDisconnected):
            if scope.get("type") != "websocket":
                raise

    return serve
