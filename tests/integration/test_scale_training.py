"""``thundersync train`` scaled out: data-parallel learner ranks (``--learner-ranks``) and Ray
workers (``--backend ray``) give the single local learner's update — bitwise with
``--deterministic`` — and a killed run resumes with nothing left running."""

from __future__ import annotations

import shutil

import pytest
import torch

from tests.integration.training_kit import SMALL, final_weights, final_weights_of, metrics, train

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]


def test_two_learner_ranks_give_the_single_learners_weights_bitwise(warm_model, tmp_path):
    args = ["--model", str(warm_model), "--steps", "2", "--deterministic", "--seed", "3",
            "--tasks-per-step", "3", *SMALL[2:]]  # fmt: skip
    train(tmp_path / "one", "--mode", "sync", *args)
    train(tmp_path / "two", "--mode", "streaming", "--learner-ranks", "2", *args)
    a, b = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    initial = final_weights_of(warm_model)
    assert any(not torch.equal(a[k], initial[k]) for k in a), "training changed nothing"
    assert all(torch.equal(a[k], b[k]) for k in a)
    local = 0
    for single, parallel in zip(metrics(tmp_path / "one"), metrics(tmp_path / "two")):
        learned = parallel["learner"]
        assert learned["world_size"] == 2 and learned["rank"] == 0
        assert learned["num_trajectories"] == single["learner"]["num_trajectories"]
        local += learned["local_num_trajectories"]
    # six groups over two ranks (by stable_rank, s0-g0 is rank 1's): each rank trained some
    total = sum(m["learner"]["num_trajectories"] for m in metrics(tmp_path / "one"))
    assert 0 < local < total
    assert not list((tmp_path / "two").glob(".learner-group-*"))
