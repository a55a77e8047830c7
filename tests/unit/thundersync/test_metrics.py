"""Step metrics: the engine-vs-learner mismatch against an independent computation, and the
staleness histogram."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from tests.property import textbook
from thundersync import GRPO, OPD, Learner
from thundersync import events as ev
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model

SHAPE = BatchShape(
    max_groups=2,
    min_group_size=2,
    max_group_size=3,
    max_turns=3,
    max_tokens=40,
    infra_failure_rate=0.0,
)


@pytest.fixture(scope="module")
def model(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


def distinct_rewards(events: list[ev.Event]) -> list[ev.Event]:
    """Rewards 1, 2, 4, ... within each group: no reward is its group's mean, so every strategy
    runs a forward pass over every trained token."""
    rank: dict[str, int] = {}
    size: dict[str, int] = {}
    for e in events:
        if isinstance(e, ev.EpisodeStarted):
            rank[e.episode_id] = size.get(e.group_id, 0)
            size[e.group_id] = rank[e.episode_id] + 1
    return [
        dataclasses.replace(e, reward=2.0 ** rank[e.episode_id])
        if isinstance(e, ev.RewardReady)
        else e
        for e in events
    ]


CASES = {
    "sync": (GRPO(), {}),
    "streaming": (GRPO(), {"streaming": True}),
    "deterministic-streaming": (GRPO(), {"streaming": True, "deterministic": True}),
    "off-policy": (GRPO(), {"max_staleness": 1}),
    "opd-sync": (OPD(), {}),
    "opd-streaming-turns": (OPD(granularity="turn"), {"streaming": True}),
}


@pytest.mark.parametrize("objective,options", CASES.values(), ids=CASES.keys())
def test_mismatch_metrics_equal_an_independent_computation(model, objective, options):
    teacher = isinstance(objective, OPD)
    events = distinct_rewards(random_batch(5, model.config.vocab_size, SHAPE, teacher=teacher))
    learner = Learner(model, objective, torch.optim.SGD(model.parameters(), lr=0.0), **options)
    for e in events:
        learner.consume(e)
    metrics = learner.step()
    diffs = []
    with torch.no_grad():
        for ep in textbook.collect(events).values():
            lp = textbook.action_logprobs(model, ep)
            diffs.append(lp - torch.tensor(textbook.sampler_logprobs(ep), dtype=lp.dtype))
    d = torch.cat(diffs)
    assert metrics["num_compared_tokens"] == metrics["num_tokens"] == d.numel()
    assert metrics["logprob_mismatch_mean"] == pytest.approx(float(d.abs().mean()), rel=1e-9)
    assert metrics["logprob_mismatch_max"] == pytest.approx(float(d.abs().max()), rel=1e-9)
    k3 = torch.exp(d) - d - 1
    assert metrics["kl_sampler_learner"] == pytest.approx(float(k3.mean()), rel=1e-9)
    assert metrics["kl_sampler_learner"] > 0
    json.dumps(metrics)  # the StepFinished metrics go to events.jsonl


LOSS_CASES = {
    **{k: v for k, v in CASES.items() if k != "off-policy"},
    "sync-kl": (GRPO(kl_coef=0.1), {}),
    "streaming-kl": (GRPO(kl_coef=0.1, loss_agg="token-mean"), {"streaming": True}),
}


@pytest.mark.parametrize("objective,options", LOSS_CASES.values(), ids=LOSS_CASES.keys())
def test_loss_entropy_and_reference_kl_equal_an_independent_computation(
    model, tiny_model_dirs, objective, options
):
    """``loss`` is the batch loss whose gradient the step takes (the textbook's, ratio 1);
    ``neg_logprob_mean`` the mean −log π_learner of the sampled tokens; ``entropy_mean`` the
    mean exact entropy of π_learner at them; ``kl_reference`` the mean k3 estimate of
    KL(π_learner ‖ π_ref), present exactly when there is a reference."""
    teacher = isinstance(objective, OPD)
    events = distinct_rewards(random_batch(7, model.config.vocab_size, SHAPE, teacher=teacher))
    reference = None
    if getattr(objective, "kl_coef", 0.0):
        reference = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)
        with torch.no_grad():
            for i, p in enumerate(reference.parameters()):
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)) * 0.05)
    learner = Learner(
        model,
        objective,
        torch.optim.SGD(model.parameters(), lr=0.0),
        reference=reference,
        **options,
    )
    for e in events:
        learner.consume(e)
    metrics = learner.step()
    with torch.no_grad():
        expected = float(textbook.batch_loss(model, objective, events, reference))
        eps = textbook.collect(events).values()
        lp = torch.cat([textbook.action_logprobs(model, ep) for ep in eps])
        entropy = torch.cat([textbook.action_entropies(model, ep) for ep in eps])
        ref = [textbook.action_logprobs(reference, ep) for ep in eps] if reference else None
    assert metrics["loss"] == pytest.approx(expected, rel=1e-9, abs=1e-12)
    assert metrics["neg_logprob_mean"] == pytest.approx(float(-lp.mean()), rel=1e-9)
    assert metrics["entropy_mean"] == pytest.approx(float(entropy.mean()), rel=1e-9)
    assert metrics["entropy_mean"] != pytest.approx(metrics["neg_logprob_mean"], rel=1e-3)
    if ref is None:
        assert metrics["kl_reference"] is None
    else:
        r = torch.cat(ref) - lp
        assert metrics["kl_reference"] == pytest.approx(float((torch.exp(r) - r - 1).mean()))
        assert metrics["kl_reference"] > 0


def test_the_staleness_histogram_counts_action_tokens_by_versions_behind(model):
    events = random_batch(2, model.config.vocab_size, SHAPE, policy_version=3)
    turns = [e for e in events if isinstance(e, ev.TurnCompleted)]
    relabelled = {id(e): 3 + i % 3 for i, e in enumerate(turns)}  # versions 3, 4, 5
    events = [
        dataclasses.replace(e, policy_version=relabelled[id(e)]) if id(e) in relabelled else e
        for e in events
    ]
    learner = Learner(
        model,
        GRPO(),
        torch.optim.SGD(model.parameters(), lr=0.0),
        max_staleness=2,
        policy_version=5,
    )
    for e in events:
        learner.consume(e)
    metrics = learner.step()
    expected: dict[str, int] = {}
    for e in events:
        if isinstance(e, ev.TurnCompleted):
            key = str(5 - e.policy_version)
            expected[key] = expected.get(key, 0) + len(e.action_ids)
    assert metrics["staleness_histogram"] == expected
    assert metrics["max_staleness_seen"] == max(int(k) for k in expected) == 2
    assert sum(expected.values()) == metrics["num_tokens"]
