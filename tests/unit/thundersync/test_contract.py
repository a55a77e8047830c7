"""A training mode's terms with the learner (``thundersync.core.contract``): the strategy table
of docs/design.md §4 stated here on its own, the version window each contract accepts, the
objectives it refuses, and the public flags naming the same contracts."""

from __future__ import annotations

import pytest
import torch

from thundersync import GRPO, OPD, Learner, StaleTokenError
from thundersync import events as ev
from thundersync.core.contract import BoundedStaleness, OnBatch, Streaming, contract_for
from thundersync.training.modes import choose_mode

# (contract, objective, deterministic, early_start) -> the strategy class the design names
TABLE = [
    (OnBatch(), GRPO(), False, False, "BatchGRPO"),
    (OnBatch(), GRPO(), True, False, "CanonicalGRPO"),
    (OnBatch(), OPD(), False, False, "BatchOPD"),
    (OnBatch(), OPD(), True, False, "PiecewiseOPD"),
    (Streaming(), GRPO(), False, True, "StreamingGRPO"),
    (Streaming(), GRPO(), True, False, "CanonicalGRPO"),
    (Streaming(), OPD(), False, False, "PiecewiseOPD"),
    (BoundedStaleness(2), GRPO(), False, False, "OffPolicyGRPO"),
    (BoundedStaleness(2), GRPO(), True, False, "OffPolicyGRPO"),
]


@pytest.mark.parametrize(("contract", "objective", "deterministic", "early", "expected"), TABLE)
def test_each_contract_picks_the_strategy_the_design_names(
    contract, objective, deterministic, early, expected
):
    made = contract.strategy(objective, deterministic=deterministic, early_start=early)
    assert made.func.__name__ == expected
    assert made.keywords["objective"] is objective


@pytest.mark.parametrize(
    ("streaming", "max_staleness", "expected"),
    [(False, 0, OnBatch()), (True, 0, Streaming()), (False, 3, BoundedStaleness(3))],
)
def test_the_public_flags_name_the_contracts_the_modes_give(streaming, max_staleness, expected):
    assert contract_for(streaming=streaming, max_staleness=max_staleness) == expected
    mode = {OnBatch(): "sync", Streaming(): "streaming"}.get(expected, "async")
    assert choose_mode(mode, staleness=3).learner_contract() == expected


@pytest.mark.parametrize("bad", [-1, 1.5, True])
def test_flags_that_name_no_contract_are_refused(bad):
    with pytest.raises(ValueError, match="max_staleness"):
        contract_for(streaming=False, max_staleness=bad)
    with pytest.raises(ValueError, match="zero-staleness by definition"):
        contract_for(streaming=True, max_staleness=2)


def _learner(**options):
    model = torch.nn.Linear(2, 2)
    return Learner(model, GRPO(), torch.optim.SGD(model.parameters(), lr=0.1), **options)


def test_a_learner_built_from_a_contract_keeps_its_window():
    learner = _learner(contract=Streaming(), policy_version=4)
    assert learner.streaming and learner.max_staleness == 0
    stale = ev.EpisodeStarted(
        t=0.0,
        episode_id="g-e0",
        group_id="g",
        group_size=2,
        task_id="t",
        prompt_ids=(1,),
        policy_version=3,
    )
    with pytest.raises(StaleTokenError, match="zero staleness"):
        learner.consume(stale)
    assert _learner(contract=BoundedStaleness(2)).max_staleness == 2


def test_a_contract_and_the_flags_together_are_refused():
    with pytest.raises(ValueError, match="not both"):
        _learner(contract=OnBatch(), streaming=True)
    with pytest.raises(ValueError, match="OPD has no off-policy correction"):
        model = torch.nn.Linear(2, 2)
        Learner(model, OPD(), torch.optim.SGD(model.parameters(), lr=0.1), max_staleness=1)
