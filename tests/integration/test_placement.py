"""``train --placement disaggregated``: the learner on its own core, rollout on the rest, and
the same math — a deterministic run ends bitwise equal to a colocated one."""

from __future__ import annotations

import json
import os
import shutil

import pytest
import torch

from tests.integration.training_kit import SMALL, final_weights, token_events, train
from thundersync.training.workers import CONTEXT, WorkerFailed, spawn, stop

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
    pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores"),
]


def _report_affinity(out) -> None:
    out.put(sorted(os.sched_getaffinity(0)))


def test_a_worker_spawned_with_cores_runs_on_them():
    cores = sorted(os.sched_getaffinity(0))
    reports = CONTEXT.Queue()
    failed: object = CONTEXT.Queue()
    worker = spawn(
        "probe", _report_affinity, reports, num_threads=1, output=failed, cores=(cores[-1],)
    )
    try:
        assert reports.get(timeout=60) == [cores[-1]]
    finally:
        stop(worker, timeout_s=30)
    assert failed.empty() or not isinstance(failed.get_nowait(), WorkerFailed)


def test_disaggregated_trains_bitwise_as_colocated(warm_model, tmp_path):
    args = ["--model", str(warm_model), "--steps", "2", "--deterministic", "--seed", "0", *SMALL]
    train(tmp_path / "colocated", "--mode", "streaming", *args)
    train(tmp_path / "disaggregated", "--mode", "streaming", "--placement", "disaggregated", *args)
    placed = json.loads((tmp_path / "disaggregated" / "config.json").read_text())
    cores = sorted(os.sched_getaffinity(0))
    assert placed["placement"] == "disaggregated"
    assert placed["placed"]["learner_affinity"] == [cores[0]]  # the learner's own thread
    assert placed["placed"]["rollout_cores"] == cores[1:]
    colocated = json.loads((tmp_path / "colocated" / "config.json").read_text())
    assert colocated["placed"]["learner_affinity"] == cores
    assert token_events(tmp_path / "colocated") == token_events(tmp_path / "disaggregated")
    a, b = final_weights(tmp_path / "colocated"), final_weights(tmp_path / "disaggregated")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_an_in_process_run_gives_the_callers_thread_its_cores_back(warm_model, tmp_path):
    """``with Trainer(config)`` in a user's process (here ``main(["train", ...])``) pins the
    calling thread to the learner's core for the run, and not after it: a notebook's next run,
    or its own work, gets every core again."""
    from thundersync.cli import main

    before = os.sched_getaffinity(0)
    args = ["--model", str(warm_model), "--steps", "1", "--placement", "disaggregated", *SMALL]
    assert main(["train", "--out", str(tmp_path / "run"), *args]) == 0
    placed = json.loads((tmp_path / "run" / "config.json").read_text())["placed"]
    assert placed["learner_affinity"] == [min(before)]  # pinned during the run
    assert os.sched_getaffinity(0) == before
