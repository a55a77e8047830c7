"""Environment → events → learner: real toy episodes in bubblewrap feed a streaming and a sync
learner through one bus; streaming works while episodes still run, and both take the same
step."""

from __future__ import annotations

import shutil
import threading
from collections.abc import Sequence

import pytest
import torch

from environments.actions import format_action
from environments.agents import SUBMIT_ACTION, Action, Message
from environments.runner import EpisodeRunner
from environments.toy import ToySumEnv
from thundersync import GRPO, Learner
from thundersync import events as ev
from thundersync.models import load_model, load_tokenizer

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")


class HalfRightAgent:
    """Solves every other episode with the reference solution and gives up on the rest, so
    groups have rewards that differ; actions are tokenised by a real tokenizer."""

    policy_version = 0

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.episodes = 0
        self.solving = False
        self.lock = threading.Lock()

    def act(self, task, messages: Sequence[Message], *, episode_id: str) -> Action:
        done = sum(m.role == "assistant" for m in messages)
        if done == 0:
            with self.lock:
                self.solving = self.episodes % 2 == 0
                self.episodes += 1
        commands = task.reference_solution() if self.solving else []
        text = format_action(commands[done]) if done < len(commands) else SUBMIT_ACTION
        ids = self.encode_observation(text)
        return Action(text=text, token_ids=ids, logprobs=(-1.0,) * len(ids))

    def encode_prompt(self, text: str) -> tuple[int, ...]:
        return self.encode_observation(text)

    def encode_observation(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer(text)["input_ids"])


def test_toy_episodes_stream_into_the_learner_and_match_sync(tiny_model_dirs):
    model = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)
    tokenizer = load_tokenizer(tiny_model_dirs["gpt2"])
    bus = ev.EventBus()
    log: list[ev.Event] = []
    learners = [
        Learner(
            model,
            GRPO(),
            torch.optim.SGD(model.parameters(), lr=0.0),
            streaming=s,
            max_grad_norm=None,
            publish=log.append,
        )
        for s in (True, False)
    ]
    bus.subscribe(log.append)
    for learner in learners:
        bus.subscribe(learner.consume)
    runner = EpisodeRunner(ToySumEnv, HalfRightAgent(tokenizer), bus, max_concurrency=1)
    results = runner.run_groups([None, None], group_size=4, seed=3)

    rewards = [r.reward for group in results for r in group]
    assert sorted(set(rewards)) == [0.0, 1.0] and not any(
        r.infra_failure for g in results for r in g
    )
    # Streaming did gradient work before the rollout finished: a GradientComputed precedes
    # the last RewardReady on the bus.
    kinds = [type(e).__name__ for e in log]
    last_reward = len(kinds) - 1 - kinds[::-1].index("RewardReady")
    assert "GradientComputed" in kinds[:last_reward]
    # Both learners share the model, so each step's gradient is read from .grad at once.
    stream, sync = (step_grad(learner, model) for learner in learners)
    assert float(stream.norm()) > 0
    assert float((stream - sync).norm()) <= 1e-12 * float(sync.norm())


def step_grad(learner: Learner, model) -> torch.Tensor:
    """Step, then the gradient the optimizer saw (SGD lr 0, no clipping: model unchanged)."""
    learner.step()
    return torch.cat([p.grad.reshape(-1) for p in model.parameters() if p.requires_grad])
