"""The OPD teacher worker scores turn k as soon as action k is known, without waiting for turn
k's tool call to return (docs/design.md §3, on-policy distillation)."""

from __future__ import annotations

import queue
import threading

import pytest
import torch
from transformers import AutoModelForCausalLM

from thundersync import events as ev
from thundersync.training.control import Stop
from thundersync.training.teacher import teacher_main

EID = "0-g0-e0"


def reference(dirs, context: list[int], action: list[int]) -> list[float]:
    """log p(action | context) from one plain forward of the model as transformers loads it."""
    model = AutoModelForCausalLM.from_pretrained(dirs["gpt2"], torch_dtype=torch.float32)
    ids = torch.tensor([context + action])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0], dim=-1)
    return [logp[len(context) + i - 1, t].item() for i, t in enumerate(action)]


def test_the_teacher_scores_a_turn_before_its_observation_arrives(tiny_model_dirs):
    inbox: queue.Queue = queue.Queue()
    output: queue.Queue = queue.Queue()
    worker = threading.Thread(
        target=teacher_main,
        args=(str(tiny_model_dirs["gpt2"]), "float32", "cpu", False, inbox, output),
    )
    worker.start()
    try:
        inbox.put(
            ev.EpisodeStarted(
                episode_id=EID,
                group_id="0-g0",
                group_size=1,
                task_id="t",
                prompt_ids=(1, 2, 3),
                policy_version=0,
            )
        )
        inbox.put(
            ev.TurnCompleted(
                episode_id=EID,
                turn=0,
                action_ids=(4, 5),
                action_logprobs=(-1.0, -2.0),
                policy_version=0,
            )
        )
        # Turn 0's tool call is still "running": no ToolFinished has been sent.
        scored = output.get(timeout=120)
        assert isinstance(scored, ev.TeacherScored) and scored.turn == 0
        assert scored.teacher_logprobs == pytest.approx(
            reference(tiny_model_dirs, [1, 2, 3], [4, 5]), abs=1e-5
        )
        span = output.get(timeout=120)
        assert (span.name, span.turn) == ("teacher", 0)
        # Turn 1 needs turn 0's observation (its prompt holds it): nothing until it arrives.
        inbox.put(
            ev.TurnCompleted(
                episode_id=EID, turn=1, action_ids=(6,), action_logprobs=(-0.5,), policy_version=0
            )
        )
        inbox.put(
            ev.ToolFinished(
                episode_id=EID,
                turn=0,
                observation_ids=(7, 8),
                duration_s=0.3,
                exit_code=0,
                timed_out=False,
            )
        )
        scored = output.get(timeout=120)
        # Scored in the context that holds the observation (a plain forward, no KV cache).
        assert scored.turn == 1
        assert scored.teacher_logprobs == pytest.approx(
            reference(tiny_model_dirs, [1, 2, 3, 4, 5, 7, 8], [6]), abs=1e-5
        )
    finally:
        inbox.put(Stop())
        worker.join(timeout=120)
    assert not worker.is_alive()
