"""A real policy's episodes out as ATIF and back: a ``train`` run's batches, and ``eval
--out`` with a tiny checkpoint on ToySum, ``export --format atif`` (each document validated by
the ``atif`` package), the import equal to the run's own ``trajectories.jsonl`` event for
event, and ``verify --trajectories`` certifying streaming == sync on them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

atif = pytest.importorskip("atif", reason="the interop extra: pip install -e '.[interop]'")

from thundersync import events as ev  # noqa: E402
from thundersync.interop.atif import load_atif  # noqa: E402

pytestmark = pytest.mark.slow


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "thundersync.cli", *args],
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_a_policy_evals_episodes_round_trip_and_certify(tiny_model_dirs, tmp_path):
    model, run, out = tiny_model_dirs["qwen3"], tmp_path / "eval", tmp_path / "atif"
    played = cli(
        *("eval", "--env", "thundersync/ToySum-v0", "--tasks", "2", "-k", "2"),
        *("--agent", "policy", "--checkpoint", str(model), "--max-new-tokens", "8"),
        *("--out", str(run), "--no-leaderboard"),
    )
    assert played.returncode == 0, played.stderr[-2000:]
    exported = cli("export", "--format", "atif", str(run), "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert exported.stdout.strip().splitlines()[-1] == "export: 4 episodes as ATIF-v1.8 documents"
    for file in sorted(out.glob("*.json")):
        doc = atif.Trajectory.model_validate_json(file.read_text())
        agent = [step for step in doc.steps if step.source == "agent"]
        assert agent and all(step.metrics.completion_token_ids for step in agent)
        assert doc.agent.model_name == str(model)
        assert doc.steps[0].message.startswith("Add the values")  # the prompt's text

    recorded = [
        ev.from_dict(json.loads(line))
        for line in (run / "trajectories.jsonl").read_text().splitlines()
    ]
    key = lambda e: (e.episode_id, type(e).__name__, getattr(e, "turn", -1))  # noqa: E731
    assert sorted(load_atif([out]), key=key) == sorted(recorded, key=key)

    # The tiny random policy solves nothing: every reward ties and GRPO's gradient is zero.
    # Give each group one success, as a grader of the user's own might.
    for file in out.glob("*-e0.json"):
        doc = json.loads(file.read_text())
        doc["extra"]["reward"] = 1.0
        file.write_text(json.dumps(doc))
    certified = cli("verify", "--trajectories", str(out), "--model", str(model), "--algo", "grpo")
    assert certified.returncode == 0, certified.stdout + certified.stderr[-2000:]
    assert "trajectories: 4 episodes, 2 groups (2 with unequal rewards)" in certified.stdout
    assert certified.stdout.strip().splitlines()[-1].startswith("verify: OK: 9 checks")


def test_a_train_runs_episodes_export_as_validated_documents_and_round_trip(warm_model, tmp_path):
    from tests.integration.training_kit import SMALL, token_events, train

    run, out = tmp_path / "run", tmp_path / "atif"
    train(run, "--mode", "streaming", "--model", str(warm_model), "--steps", "1", *SMALL)
    exported = cli("export", "--format", "atif", str(run), "--out", str(out))
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert exported.stdout.strip().splitlines()[-1] == "export: 8 episodes as ATIF-v1.8 documents"
    for file in sorted(out.glob("*.json")):
        doc = atif.Trajectory.model_validate_json(file.read_text())
        assert all(s.metrics.completion_token_ids for s in doc.steps if s.source == "agent")

    imported = load_atif([out])
    recorded = [
        ev.from_dict(json.loads(line))
        for line in (run / "trajectories.jsonl").read_text().splitlines()
    ]
    key = lambda e: (e.episode_id, type(e).__name__, getattr(e, "turn", -1))  # noqa: E731
    assert sorted(imported, key=key) == sorted(recorded, key=key)
    # the run's own summary record (events.jsonl, token counts) agrees turn for turn
    turns = sorted(
        (e.episode_id, e.turn, len(e.action_ids))
        for e in imported
        if isinstance(e, ev.TurnCompleted)
    )
    assert turns == token_events(run)
