"""OpenEnv both ways (thundersync/interop): ``thundersync serve``'s server played by openenv's
own client (ToySum and a plugin's env: the oracle scores 1, submitting at once 0, a closed
session leaves no sandbox), ``openenv/Remote-v0`` driven by our runner into our events, and
the one-line errors: an unknown env, bad kwargs, a port in use, a server that is down, silent
or answering off the wire. Every server listens on a free loopback port and is stopped by the
test that started it."""

from __future__ import annotations

import contextlib
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
from gymnasium.utils import seeding

pytest.importorskip("openenv", reason="the interop extra: pip install -e '.[interop]'")

from environments.actions import format_action  # noqa: E402
from environments.registry import load_plugins, task_source  # noqa: E402
from environments.runner import EpisodeRunner  # noqa: E402
from environments.sandboxes.bwrap import MARKER_PREFIX  # noqa: E402
from thundersync.cli import main  # noqa: E402
from thundersync.interop.openenv_env import ENV_ID, RemoteTask  # noqa: E402
from thundersync.interop.openenv_server import EnvServer  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
PLUGIN_DIR = ROOT / "tests" / "fixtures" / "plugin_env"
TOY = "thundersync/ToySum-v0"
SUBMIT = format_action("submit")

needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")


@contextlib.contextmanager
def served(env_id: str, env_kwargs: dict | None = None, **options) -> Iterator[EnvServer]:
    """``thundersync serve``'s server of ``env_id`` on a free loopback port, in a thread of
    this process, stopped (every session closed) on every path out."""
    server = EnvServer(env_id, env_kwargs, port=0, **options)
    thread = threading.Thread(target=server.run, name="openenv-server")
    thread.start()  # the socket already listens: a client may connect at once
    try:
        yield server
    finally:
        server.stop()
        thread.join(timeout=60)
        assert not thread.is_alive(), "the server did not stop"
    assert len(server.sessions) == 0


def client(server: EnvServer):
    from openenv.core.generic_client import GenericEnvClient

    return GenericEnvClient(base_url=server.url, message_timeout_s=120).sync()


def reference_task(env_id: str, seed: int, **kwargs):
    """The task ``gymnasium.make(env_id).reset(seed=seed)`` plays, drawn without an env or a
    server: the generator Gymnasium seeds ``np_random`` with, handed to the env's task source."""
    rng, _ = seeding.np_random(seed)
    return task_source(env_id, **kwargs).draw(rng)


def play(session, commands: list[str]):
    """Each command as one reply, then ``submit`` unless a command already ended it."""
    result = None
    for command in [*commands, "submit"]:
        result = session.step({"text": format_action(command)})
        if result.done:
            return result
    return result


@pytest.fixture
def sandbox_roots(tmp_path, monkeypatch) -> Path:
    """Sandboxes made in this test keep their roots here, so the test sees them go."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def roots(folder: Path) -> list[Path]:
    return list(folder.glob(f"{MARKER_PREFIX}*"))


# --- serve: an OpenEnv client plays our envs -------------------------------------------------


@needs_bwrap
def test_an_openenv_client_plays_toysum_oracle_one_nop_zero_and_its_sandbox_goes(sandbox_roots):
    task = reference_task(TOY, 7)
    with served(TOY) as server:
        with client(server) as session:
            first = session.reset(seed=7)
            assert first.observation["text"] == task.instruction
            assert first.observation["task_id"] == task.task_id
            assert (first.done, first.reward, first.observation["strict_grading"]) == (
                False,
                None,
                True,
            )
            assert len(roots(sandbox_roots)) == 1, "one session, one sandbox"
            oracle = play(session, task.reference_solution())
            assert (oracle.done, oracle.reward) == (True, 1.0)
            assert oracle.observation["termination_reason"] == "submitted"
            state = session.state()
            assert state["step_count"] == len(task.reference_solution())
            assert state["episode_id"] and state["task_id"] == task.task_id

            session.reset(seed=7)
            nop = session.step({"text": SUBMIT})
            assert (nop.done, nop.reward) == (True, 0.0)
        assert server.sessions.wait_for(0, timeout=60), "the closed session's env is still open"
        assert roots(sandbox_roots) == []
        left_open = client(server).connect()
        left_open.reset(seed=8)
        assert len(roots(sandbox_roots)) == 1
    try:
        assert roots(sandbox_roots) == [], "stopping the server removes a live session's sandbox"
    finally:
        left_open.close()


def http(method: str, url: str, body: dict | None = None) -> tuple[int, dict]:
    """The status and JSON body of one plain HTTP request (an error's too)."""
    import json
    import urllib.error
    import urllib.request

    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=120) as answer:
            status, text = answer.status, answer.read()
    except urllib.error.HTTPError as err:
        status, text = err.code, err.read()
    try:
        return status, json.loads(text)
    except ValueError:  # a plain-text error page
        return status, {"detail": text.decode(errors="replace")}


@needs_bwrap
def test_http_requests_make_no_sandbox_outside_the_session_limit(sandbox_roots, monkeypatch):
    """openenv-core's HTTP routes /reset, /step and /state make an env per request, outside
    the limit its WebSocket sessions obey: ``--max-sessions 1`` ran five sandboxes for six
    concurrent POST /reset. serve answers them with an error naming the sessions instead, so
    while the one session allowed plays, six concurrent POST /reset make no env, a second
    session is refused as over capacity, and nothing is left once the session closes."""
    from websockets.sync.client import connect

    from thundersync.interop.openenv_session import Sessions

    alive: list[int] = []  # the envs alive after each one was made
    add = Sessions.add

    def counted(self, env) -> None:
        add(self, env)
        alive.append(len(self))

    monkeypatch.setattr(Sessions, "add", counted)
    with served(TOY, max_sessions=1) as server:
        with client(server) as session:
            session.reset(seed=7)
            assert len(roots(sandbox_roots)) == 1
            together = threading.Barrier(6)
            answers: list = [None] * 6

            def reset(i: int) -> None:
                together.wait()
                answers[i] = http("POST", f"{server.url}/reset", {"seed": i})

            threads = [threading.Thread(target=reset, args=(i,)) for i in range(6)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(timeout=120)
            answers += [
                http("POST", f"{server.url}/step", {"action": {"text": SUBMIT}}),
                http("GET", f"{server.url}/state"),
            ]
            for status, body in answers:
                assert status == 404 and "WebSocket session" in body["detail"], (status, body)
            _, schema = http("GET", f"{server.url}/openapi.json")  # openenv's production mode
            assert not {"/reset", "/step", "/state"} & set(schema["paths"])
            with connect(server.ws_url) as second:  # refused before it asks anything
                assert "Server at capacity: 1/1" in second.recv(timeout=120)
            assert len(roots(sandbox_roots)) == 1
            assert not session.step({"text": SUBMIT}).reward  # the session plays on
        assert server.sessions.wait_for(0, timeout=60)
    assert alive == [1], "one env (the session's) ever alive"
    assert roots(sandbox_roots) == []


@needs_bwrap
def test_a_plugin_env_is_served_without_code_of_its_own(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    load_plugins(reload=True)
    with served("demoplugin/Greet-v0") as server, client(server) as session:
        assert "hello" in session.reset(seed=0).observation["text"]
        assert play(session, ["echo hello > greeting.txt"]).reward == 1.0
        session.reset(seed=0)
        assert session.step({"text": SUBMIT}).reward == 0.0


@needs_bwrap
def test_a_reset_names_a_task_asks_lenient_grading_and_refuses_unknown_arguments():
    with served(TOY, {"tools": "python"}) as server, client(server) as session:
        lenient = session.reset(seed=1, strict_grading=False)
        assert lenient.observation["strict_grading"] is False
        with pytest.raises(RuntimeError, match="unknown argument.*'tusk_id'"):
            session.reset(seed=1, tusk_id="x")
        assert session.step({"text": SUBMIT}).done, "the refused reset left the episode on"
        with pytest.raises(RuntimeError, match="call reset"):
            session.step({"text": SUBMIT})


def test_serve_refuses_an_unknown_env_bad_kwargs_and_a_port_in_use_in_one_line(capsys):
    assert main(["serve", "--env", "nope/Nope-v0", "--port", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert "not a registered env" in err and "\n" not in err

    assert main(["serve", "--env", TOY, "--port", "0", "--env-kwargs", '{"bogus": 1}']) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("serve: error: --env-kwargs: cannot make") and "bogus" in err
    assert "\n" not in err

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["serve", "--env", TOY, "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip()
    assert f"--port {port}: already in use on 127.0.0.1" in err and "\n" not in err


# --- openenv/Remote-v0: an OpenEnv server in our runner --------------------------------------


class SeedOracle:
    """Plays a remote ToySum task's reference solution, found from its seed on this side."""

    policy_version = 0

    def act(self, task, messages, *, episode_id=""):
        from environments.agents import Action

        assert isinstance(task, RemoteTask)
        commands = reference_task(TOY, task.seed).reference_solution()
        index = sum(message.role == "assistant" for message in messages)
        command = commands[index] if index < len(commands) else "submit"
        return Action(text=format_action(command))

    def encode_prompt(self, text):
        return ()

    def encode_observation(self, text):
        return ()


@needs_bwrap
def test_the_remote_env_emits_our_events_with_the_servers_task_ids_and_rewards():
    with served(TOY, {"tools": "python"}) as server:
        events: list = []
        url = {"url": server.url}
        runner = EpisodeRunner(
            lambda: gym.make(ENV_ID, **url),
            SeedOracle(),
            events.append,
            tasks=task_source(ENV_ID, **url),
        )
        group = runner.run_group(None, 2, seed=3)
        seed = task_source(ENV_ID, **url).draw(np.random.default_rng(3)).seed
        expected = reference_task(TOY, seed)
        assert [t.reward for t in group] == [1.0, 1.0]
        assert [t.infra_failure for t in group] == [False, False]
        assert {t.task_id for t in group} == {expected.task_id}, "the server's id, not seed-N"
        kinds = [type(e).__name__ for e in events if e.episode_id == group[0].episode_id]
        turns = len(expected.reference_solution())
        assert kinds == [
            "EpisodeStarted",
            *["TurnCompleted", "ToolFinished"] * turns,
            "EpisodeCompleted",
            "RewardReady",
        ]
        assert server.sessions.wait_for(0, timeout=60)


def test_the_remote_env_needs_a_url():
    with pytest.raises(ValueError, match="env kwarg 'url' is required"):
        gym.make(ENV_ID)
    with pytest.raises(ValueError, match="expected an OpenEnv server's address"):
        gym.make(ENV_ID, url="127.0.0.1:8000")


def _episode_error(url: str, **kwargs) -> tuple[dict, tuple]:
    env = gym.make(ENV_ID, url=url, disable_env_checker=True, **kwargs)
    try:
        _, info = env.reset(seed=0)
        return info, env.step(SUBMIT)
    finally:
        env.close()


def test_a_server_that_is_down_is_an_infrastructure_failure_naming_it():
    with socket.create_server(("127.0.0.1", 0)) as gone:
        url = f"http://127.0.0.1:{gone.getsockname()[1]}"
    info, (_, reward, terminated, truncated, step_info) = _episode_error(url)
    assert info["infra_failure"] is True
    assert f"OpenEnv server {url}: reset failed: ConnectionError" in info["error"]
    assert (reward, terminated, truncated, step_info["infra_failure"]) == (0.0, False, True, True)


def test_a_silent_server_times_out_instead_of_hanging():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # listens, never answers
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        info, _ = _episode_error(url, connect_timeout_s=1.0)
    assert info["infra_failure"] is True and "timed out" in info["error"]


def test_a_server_answering_off_the_wire_is_named_as_such():
    import json

    from websockets.sync.server import serve

    def garbage(connection) -> None:
        for _ in connection:
            reply = {"type": "observation", "data": {"observation": {"output": 3}, "done": False}}
            connection.send(json.dumps(reply))

    with serve(garbage, "127.0.0.1", 0) as ws_server:
        thread = threading.Thread(target=ws_server.serve_forever)
        thread.start()
        try:
            url = f"http://127.0.0.1:{ws_server.socket.getsockname()[1]}"
            info, _ = _episode_error(url)
        finally:
            ws_server.shutdown()
            thread.join(timeout=30)
    assert info["infra_failure"] is True
    assert "reset answered no text field 'text'" in info["error"] and "'output': 3" in info["error"]


# --- sessions: the client opens no more than the server allows -------------------------------

TOOLS = {"tools": "python"}  # in-process tools: no sandbox needed


@pytest.fixture
def fresh_gates(monkeypatch):
    """Each test's servers get gates of their own (a port may be reused by a later server)."""
    from thundersync.interop import openenv_gate

    monkeypatch.setattr(openenv_gate, "_GATES", {}, raising=False)


def test_the_server_says_how_many_sessions_it_allows(fresh_gates):
    with served(TOY, TOOLS, max_sessions=3) as server:
        status, body = http("GET", server.url + "/capacity")
        assert (status, body) == (200, {"active_sessions": 0, "max_sessions": 3})
        assert task_source(ENV_ID, url=server.url).max_sessions() == 3


def _hold_then_wait(server, *, said: str, capsys) -> None:
    """One env holds the server's only session; a second one's reset waits for it instead of
    failing, and plays once the first closes. Said once on stderr."""
    from thundersync.interop.openenv_env import session_gate

    first = gym.make(ENV_ID, url=server.url)
    second = gym.make(ENV_ID, url=server.url)
    answers: list = []
    try:
        _, info = first.reset(seed=1)
        assert not info["infra_failure"], info
        waiting = threading.Thread(target=lambda: answers.append(second.reset(seed=2)))
        waiting.start()
        assert session_gate(server.url).wait_for_waiting(1, timeout=60), "it never waited"
        first.step(SUBMIT)
        first.close()  # the session is free: the second reset goes on
        waiting.join(timeout=60)
        (_, info), *_ = answers
        assert not info["infra_failure"], info
        assert second.step(SUBMIT)[4]["infra_failure"] is False
    finally:
        first.close()
        second.close()
    err = capsys.readouterr().err
    assert err.count("wait for a free session") == 1 and said in err, err


def test_an_episode_past_the_servers_sessions_waits_for_a_free_one(fresh_gates, capsys):
    """Issue 35: a session past ``serve --max-sessions`` was refused ("Server at capacity:
    8/8 sessions active"), which ended its episode as an infrastructure failure."""
    with served(TOY, TOOLS, max_sessions=1) as server:
        _hold_then_wait(server, said="allows 1 session at once", capsys=capsys)


def test_a_server_that_does_not_say_its_limit_is_waited_for_after_its_refusal(
    fresh_gates, monkeypatch, capsys
):
    """openenv's own servers have no ``/capacity``: their refusal names the limit, and the
    refused episode waits for a session of this process to close."""
    from thundersync.interop import openenv_gate

    monkeypatch.setattr(openenv_gate, "_ask_capacity", lambda url, timeout_s: None)
    with served(TOY, TOOLS, max_sessions=1) as server:
        _hold_then_wait(server, said="allows 1 session at once", capsys=capsys)
        assert openenv_gate.session_gate(server.url).limit == 1, "learnt from the refusal"


def test_a_closed_session_is_free_on_the_server_when_close_returns(fresh_gates):
    """Closing waits for the server to close the connection, which it does once the session
    is destroyed: the next session is not refused while the server is still closing."""
    with served(TOY, TOOLS, max_sessions=1) as server:
        for seed in range(3):
            env = gym.make(ENV_ID, url=server.url)
            _, info = env.reset(seed=seed)
            assert not info["infra_failure"], info
            env.close()
            assert len(server.sessions) == 0


def test_an_env_waiting_for_a_session_stops_when_interrupted(fresh_gates):
    from thundersync.interop.openenv_env import session_gate

    with served(TOY, TOOLS, max_sessions=1) as server:
        first = gym.make(ENV_ID, url=server.url)
        second = gym.make(ENV_ID, url=server.url)
        answers: list = []
        try:
            first.reset(seed=1)
            waiting = threading.Thread(target=lambda: answers.append(second.reset(seed=2)))
            waiting.start()
            assert session_gate(server.url).wait_for_waiting(1, timeout=60)
            second.unwrapped.interrupt("the run was cancelled")
            waiting.join(timeout=60)
            (_, info), *_ = answers
            assert info["infra_failure"] and "the run was cancelled" in info["error"], info
        finally:
            first.close()
            second.close()
        assert session_gate(server.url).held == 0
