"""A compose task's sidecar in Harbor's collection phase and mid-episode (issue 37), in Docker:
a ``[[verifier.collect]]`` hook with ``service = "kv"`` runs in the kv container (``sh -c``,
as Harbor runs a sidecar's hook) and an ``artifacts`` entry of that service is copied out of
it into the episode's folder, listed ``ok`` in ``manifest.json`` (both were skipped: nothing
reached a service's container); a sidecar that dies during the episode scores 0 quoting its
last log lines, bounded (the agent's requests reach it: never an excluded infrastructure
failure), never a grade of a verifier that could not reach it."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import pytest

from environments.agents import OracleAgent
from environments.core import ShellEnv
from environments.runner import EpisodeRunner
from environments.sandboxes.compose import LOG_CHARS
from environments.terminal_bench import load_tasks
from tests.integration.test_harbor_compose import labelled, play, ubuntu_alias, variant

pytestmark = pytest.mark.docker
__all__ = ["ubuntu_alias"]  # the alias fixture, autouse here too

SIDECAR_COLLECTION = """network_mode = "no-network"

[[verifier.collect]]
service = "kv"
command = "mkdir -p /srv/snapshot && echo $0 > /srv/snapshot/shell.txt"

[[verifier.collect]]
service = "kv"
command = '''python3 -c "import urllib.request as u
a = u.urlopen('http://localhost:8000/answer').read().decode().strip()
print(a)" > /srv/snapshot/answer.txt'''
timeout_sec = 30.0

[[verifier.collect]]
service = "kv"
command = "echo the kv hook fails; exit 4"

[[artifacts]]
source = "/srv/snapshot"
service = "kv"

[[artifacts]]
source = "/srv/server.py"
service = "kv"
destination = "kv/server.py"
"""


def test_a_sidecars_hooks_and_artifacts_reach_the_episodes_folder(tmp_path: Path) -> None:
    folder = variant(tmp_path, toml=SIDECAR_COLLECTION)
    task = load_tasks(folder).get("compose-sidecar")
    out = tmp_path / "artifacts"
    runner = EpisodeRunner(
        lambda: ShellEnv([task], sandbox="docker", strict_grading=False, artifacts_dir=out),
        OracleAgent(),
        lambda e: None,
    )
    with pytest.warns(UserWarning, match="collect hook 'echo the kv hook fails; exit 4' exited 4"):
        result = runner.run_episode(task)
    assert (result.reward, result.infra_failure) == (1.0, False), result.details
    (episode,) = out.iterdir()
    # the hook ran in kv after the agent's turn: it read the answer the oracle posted to kv
    assert (episode / "srv/snapshot/answer.txt").read_text() == "sidecar-7f3a91\n"
    assert (episode / "srv/snapshot/shell.txt").read_text() == "sh\n"
    assert "serve_forever" in (episode / "kv/server.py").read_text()  # kv's file, not main's
    manifest = json.loads((episode / "manifest.json").read_text())
    assert [(e["source"], e["service"], e["type"], e["status"]) for e in manifest] == [
        ("/logs/artifacts", "main", "directory", "empty"),
        ("/srv/snapshot", "kv", "directory", "ok"),
        ("/srv/server.py", "kv", "file", "ok"),
    ]
    for kind in ("container", "volume"):
        assert labelled(kind, os.getpid()) == []


CRASHING_KV = '''"""kv as the fixture serves it, except that it dies on the answer: its
process ends with a last log line and code 7 before it replies."""

import http.server
import os
import sys

NOISE = "x" * 20000


class Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = {"/health": "ok", "/secret": os.environ["KV_SECRET"]}.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write((body or "not found").encode() + b"\\n")

    def do_POST(self) -> None:  # noqa: N802
        print(NOISE, flush=True)
        print("kv crashed: disk-on-fire-31", flush=True)
        sys.stdout.flush()
        os._exit(7)


http.server.ThreadingHTTPServer(("", 8000), Handler).serve_forever()
'''


def test_a_sidecar_that_dies_mid_episode_scores_zero_quoting_its_logs(tmp_path: Path) -> None:
    """The agent's requests crashed it (here the oracle's, a service with a bug): the episode
    scores 0, never excluded from training as an infrastructure failure would be."""
    folder = variant(tmp_path)
    (folder / "environment" / "kv" / "server.py").write_text(CRASHING_KV)
    task = load_tasks(folder).get("compose-sidecar")
    for strict in (False, True):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            result = play(task, OracleAgent(), strict=strict)
        assert (result.reward, result.infra_failure) == (0.0, False), result.details
        error = str(result.details["agent_failure"])
        assert "service kv stopped: it exited (code 7) during the episode" in error, error
        assert "disk-on-fire-31" in error
        assert len(error) < LOG_CHARS + 1000  # a 20,000-character log line is cut
    for kind in ("container", "volume"):
        assert labelled(kind, os.getpid()) == []
