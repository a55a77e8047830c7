"""``thundersync train`` on a multi-step Harbor task (issue 37 item 2): the episode's reward
is the steps' aggregate, each step's reward reaches the run's events, and deterministic sync
and streaming end bitwise equal, as on one-step envs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.integration.training_kit import final_weights, final_weights_of, train
from thundersync.protocol.events import read_jsonl

TASK = Path(__file__).resolve().parents[1] / "fixtures" / "harbor-train" / "sum-two-steps"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]


def test_sync_and_streaming_train_bitwise_equal_on_a_multi_step_task(warm_model, tmp_path):
    env_kwargs = json.dumps({"suite": str(TASK), "max_turns": 6})
    args = ["--model", str(warm_model), "--env", "thundersync/TerminalBench-v0"]
    args += ["--env-kwargs", env_kwargs, "--sandbox", "bwrap", "--steps", "2", "--deterministic"]
    args += ["--seed", "0", "--tasks-per-step", "1", "--group-size", "4"]
    args += ["--max-new-tokens", "16", "--lr", "3e-3"]
    train(tmp_path / "sync", "--mode", "sync", *args)
    train(tmp_path / "streaming", "--mode", "streaming", *args)
    a, b = final_weights(tmp_path / "sync"), final_weights(tmp_path / "streaming")
    initial = final_weights_of(warm_model)
    assert any(not torch.equal(a[k], initial[k]) for k in a), "training changed nothing"
    assert all(torch.equal(a[k], b[k]) for k in a)

    records = read_jsonl(tmp_path / "sync" / "events.jsonl")
    rewards = [r for r in records if r["event"] == "RewardReady"]
    graded = [r for r in records if r["event"] == "EpisodeStepGraded"]  # each step, as graded
    assert len(graded) == sum(len(r["details"]["steps"]) for r in rewards)
    assert len(rewards) == 8
    assert any(len(r["details"]["steps"]) == 2 for r in rewards)  # a second step was played
    for record in rewards:
        steps = record["details"]["steps"]
        assert [s["name"] for s in steps] == ["01-sum", "02-sum"][: len(steps)]
        per_step = [s["reward"] for s in steps] + [0.0] * (2 - len(steps))
        assert record["reward"] == pytest.approx(sum(per_step) / 2)
