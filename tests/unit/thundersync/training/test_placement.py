"""Placement (``--placement``): the cores and GPUs each side gets, the refusals, the record."""

from __future__ import annotations

import json
import os
import threading

import pytest

from thundersync.training.config import TrainConfig
from thundersync.training.config_files import load_saved_config
from thundersync.training.placement import (
    Placement,
    apply,
    placement_problem,
    plan,
    split_cores,
    split_devices,
)


def config(**fields):
    return TrainConfig(**fields)


def test_colocated_shares_every_core_and_device():
    placed = plan(config(), cores=[0, 1, 2, 3])
    assert placed == Placement("colocated")
    assert placed.cores("learner") is None and placed.cores("rollout") is None


def test_disaggregated_gives_the_learner_its_cores_and_rollout_the_rest():
    placed = plan(config(placement="disaggregated"), cores=[2, 5, 7])
    assert placed.learner_cores == (2,) and placed.rollout_cores == (5, 7)
    two = plan(config(placement="disaggregated", learner_threads=2), cores=[0, 1, 2, 3])
    assert two.learner_cores == (0, 1) and two.rollout_cores == (2, 3)
    ranks = split_cores(
        "disaggregated", [0, 1, 2], learner_ranks=2, learner_threads=1, rollout_threads=1
    )
    assert ranks == ((0, 1), (2,))


@pytest.mark.parametrize(
    ("fields", "cores", "words"),
    [
        ({}, [0], "needs at least 2 cores"),
        ({"learner_threads": 2}, [0, 1], "needs at least 3 cores"),
        ({"rollout_threads": 2}, [0, 1], "fewer than rollout_threads 2"),
    ],
)
def test_impossible_core_splits_are_refused_in_one_line(fields, cores, words):
    with pytest.raises(ValueError, match=words) as caught:
        plan(config(placement="disaggregated", **fields), cores=cores)
    assert "\n" not in str(caught.value) and "--placement" in str(caught.value)


def test_gpus_split_into_the_learners_and_the_engines():
    assert split_devices("disaggregated", "cuda", 2, learner_ranks=1) == (
        ("cuda:0",),
        ("cuda:1",),
    )
    assert split_devices("disaggregated", "cuda", 4, learner_ranks=2) == (
        ("cuda:0", "cuda:1"),
        ("cuda:2", "cuda:3"),
    )
    assert split_devices("colocated", "cuda", 4, learner_ranks=1) == (None, None)
    assert split_devices("disaggregated", "cpu", 0, learner_ranks=1) == (None, None)
    with pytest.raises(ValueError, match="needs at least 2 GPUs.*1 visible"):
        split_devices("disaggregated", "cuda", 1, learner_ranks=1)
    with pytest.raises(ValueError, match="name --device cuda"):
        split_devices("disaggregated", "cuda:1", 2, learner_ranks=1)
    placed = plan(config(placement="disaggregated", device="cuda"), cores=[0, 1], gpus=3)
    assert placed.learner_devices == ("cuda:0",)
    assert placed.engine_devices == ("cuda:1", "cuda:2")


def test_ray_and_disaggregated_are_refused():
    problem = placement_problem(config(placement="disaggregated", backend="ray"))
    assert problem and "Ray places by resources" in problem


def test_the_placement_round_trips_through_config_json(tmp_path):
    c = config(placement="disaggregated")
    record = {**c.record(), "placed": plan(c, cores=[0, 1]).record()}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(record))
    loaded = load_saved_config(path)
    assert "placed" not in loaded  # the run's record, not a setting
    assert TrainConfig(**loaded) == c
    assert record["placed"]["learner_cores"] == [0] and record["placed"]["kind"] == "disaggregated"


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_apply_pins_the_thread_that_runs_the_learner():
    cores = sorted(os.sched_getaffinity(0))
    placed = plan(config(placement="disaggregated"), cores=cores)
    seen: dict[str, set[int]] = {}

    def learner() -> None:
        apply(placed, "learner")
        seen["learner"] = os.sched_getaffinity(0)
        child = threading.Thread(target=lambda: seen.update(child=os.sched_getaffinity(0)))
        child.start()
        child.join()

    thread = threading.Thread(target=learner)
    thread.start()
    thread.join()
    assert seen["learner"] == {cores[0]} == seen["child"]  # threads it starts inherit it
    assert os.sched_getaffinity(0) == set(cores)  # the test's own thread is untouched
    apply(Placement("colocated"), "learner")  # colocated: nothing pinned
    assert os.sched_getaffinity(0) == set(cores)


def test_the_check_before_work_refuses_one_core(monkeypatch):
    import thundersync.training.placement as placement

    monkeypatch.setattr(placement, "allowed_cores", lambda: [0])
    problem = placement_problem(config(placement="disaggregated"))
    assert problem and "needs at least 2 cores" in problem and "may use 1" in problem


def test_compare_results_record_the_placement(tmp_path):
    from harness.compare import CompareConfig
    from harness.compare_report import summarize
    from tests.unit.harness.test_compare_report import _run

    runs = [_run(tmp_path, mode, 0, 20.0) for mode in ("sync", "async-k1")]
    config = CompareConfig(
        train=TrainConfig(model=str(tmp_path), placement="disaggregated"),
        modes=("sync", "async-k1"),
        seeds=1,
        target=0.6,
        out=str(tmp_path / "out"),
        leaderboard=False,
    )
    results = summarize(runs, config, 0.1)
    assert results["placement"] == "disaggregated"
    assert results["config"]["train"]["placement"] == "disaggregated"
