"""``thundersync train`` scaled out: data-parallel learner ranks (``--learner-ranks``) and Ray
workers (``--backend ray``) give the single local learner's update — bitwise with
``--deterministic`` — and a killed run resumes with nothing left running."""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch

from tests.integration.training_kit import (
    SMALL,
    cmdline,
    descendants,
    final_weights,
    final_weights_of,
    kill_worker,
    metrics,
    noisy_copy,
    spawned_workers,
    start_until_first_checkpoint,
    train,
    wait_gone,
)

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]


needs_ray = pytest.mark.skipif(importlib.util.find_spec("ray") is None, reason="ray missing")


@pytest.fixture(scope="module")
def single_run(warm_model, tmp_path_factory) -> tuple[Path, list[str]]:
    """One local learner, sync, --deterministic: the run the scaled-out ones must equal. Seed 0
    draws groups whose rewards differ at the first step (seed 3 stopped doing so when the toy
    envs held out a split), so the update is not zero."""
    args = [
        "--model",
        str(warm_model),
        "--steps",
        "2",
        "--deterministic",
        "--seed",
        "0",
        "--tasks-per-step",
        "3",
        *SMALL[2:],
    ]
    out = tmp_path_factory.mktemp("single") / "run"
    train(out, "--mode", "sync", *args)
    return out, args


def same_weights(a: Path, b: Path) -> bool:
    x, y = final_weights(a), final_weights(b)
    return all(torch.equal(x[k], y[k]) for k in x)


def test_two_learner_ranks_give_the_single_learners_weights_bitwise(
    warm_model, single_run, tmp_path
):
    one, args = single_run
    two = tmp_path / "two"
    train(two, "--mode", "streaming", "--learner-ranks", "2", *args)
    a, initial = final_weights(one), final_weights_of(warm_model)
    assert any(not torch.equal(a[k], initial[k]) for k in a), "training changed nothing"
    assert same_weights(one, two)
    local = 0
    for single, parallel in zip(metrics(one), metrics(two)):
        learned = parallel["learner"]
        assert learned["world_size"] == 2 and learned["rank"] == 0
        assert learned["num_trajectories"] == single["learner"]["num_trajectories"]
        local += learned["local_num_trajectories"]
    # six groups over two ranks (by stable_rank, s0-g0 is rank 1's): each rank trained some
    total = sum(m["learner"]["num_trajectories"] for m in metrics(one))
    assert 0 < local < total
    assert not list(two.glob(".learner-group-*"))


def test_opd_with_two_learner_ranks_gives_the_single_learners_weights_bitwise(warm_model, tmp_path):
    """On-policy distillation (teacher scores reach the rank that owns the episode) with
    two ranks in streaming mode, against one learner in sync mode; both --deterministic."""
    student = noisy_copy(warm_model, tmp_path / "student")
    args = [
        "--algo",
        "opd",
        "--model",
        str(student),
        "--teacher",
        str(warm_model),
        "--steps",
        "2",
        "--deterministic",
        "--seed",
        "4",
        "--tasks-per-step",
        "3",
        *SMALL[2:],
    ]
    train(tmp_path / "one", "--mode", "sync", *args)
    train(tmp_path / "two", "--mode", "streaming", "--learner-ranks", "2", *args)
    assert same_weights(tmp_path / "one", tmp_path / "two")
    records = metrics(tmp_path / "two")
    ranks = [m["learner"]["ranks"]["1"] for m in records]  # rank 1's own metrics, per step
    assert all(r["rank"] == 1 and r["world_size"] == 2 for r in ranks)
    assert sum(r["local_num_trajectories"] for r in ranks) > 0


def test_a_killed_learner_rank_stops_the_run_with_a_clear_message(warm_model, tmp_path):
    proc = start_until_first_checkpoint(
        tmp_path / "run",
        "--learner-ranks",
        "2",
        "--steps",
        "50",
        "--model",
        str(warm_model),
        *SMALL,
    )
    # rank 1: spawned before the rollout worker
    family, stderr = kill_worker(proc, lambda _: spawned_workers(proc.pid)[0])
    assert proc.returncode == 1, stderr
    assert "learner" in stderr and "--resume" in stderr and "Traceback" not in stderr
    wait_gone(family)


@pytest.mark.ray
@needs_ray
def test_ray_workers_and_two_ranks_give_the_local_update_and_resume_after_kill_9(
    single_run, tmp_path
):
    """The same run with every worker a Ray actor (a private Ray head on loopback) and two
    learner ranks: bitwise the local single learner's weights; then killed with -9 after its
    first checkpoint, nothing of it (trainer, actors, Ray's own processes, its temporary
    folder) is left, and --resume under Ray ends on the same weights."""
    one, args = single_run
    ray_args = ["--mode", "streaming", "--backend", "ray", "--learner-ranks", "2", *args]
    before = ray_temporaries()
    out = tmp_path / "killed"
    proc = start_until_first_checkpoint(out, *ray_args)
    try:
        family = descendants(proc.pid)
        assert len(family) >= 5, "a Ray head, its workers and actors are running"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_gone(family)
    assert ray_temporaries() == before
    resumed = train(out, "--resume")
    assert "resuming after step 1" in resumed.stderr
    assert same_weights(one, out)
    assert [m["learner"]["world_size"] for m in metrics(out)] == [2, 2]
    assert ray_temporaries() == before
    assert not ray_processes(), "the resumed run left Ray processes behind"


def ray_temporaries() -> set[str]:
    import tempfile

    return {p.name for p in Path(tempfile.gettempdir()).glob("ts-ray-*")} | {
        p.name for p in Path(tempfile.gettempdir()).glob("ray")
    }


def ray_processes() -> list[int]:
    """Live processes of a private Ray head (their command lines name its ts-ray- folder)."""
    return [int(p) for p in filter(str.isdigit, os.listdir("/proc")) if b"ts-ray-" in cmdline(p)]


def parent_pid(pid: int) -> int | None:
    """The parent of ``pid`` (None once it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


@pytest.mark.ray
@needs_ray
def test_a_dead_rollout_actor_stops_a_ray_run_with_a_clear_message(warm_model, tmp_path):
    proc = start_until_first_checkpoint(
        tmp_path / "run", "--backend", "ray", "--steps", "50", "--model", str(warm_model), *SMALL
    )

    def the_rollout_actor(family: set[int]) -> int:
        # the only worker actor; a child it forked for a sandbox command bears its title until
        # that child execs (a window a loaded machine widens), so children of one are not it
        titled = {p for p in family if b"_WorkerActor" in cmdline(p)}
        (actor,) = [p for p in titled if parent_pid(p) not in titled]
        return actor

    family, stderr = kill_worker(proc, the_rollout_actor)
    assert proc.returncode == 1, stderr
    assert "thundersync-rollout exited" in stderr and "--resume" in stderr
    assert "Traceback" not in stderr
    wait_gone(family)
    assert not ray_processes()


@pytest.mark.ray
@needs_ray
def test_an_unreachable_ray_address_fails_at_once_with_one_line(tmp_path, monkeypatch):
    import socket

    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    done = train(tmp_path / "run", "--backend", "ray", "--steps", "1", check=False)
    assert done.returncode == 1
    assert "no Ray head answers at RAY_ADDRESS" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.ray
@needs_ray
def test_ray_workers_run_at_the_trainers_priority_not_at_rays_nice_15(tmp_path):
    """Ray starts workers at nice 15 by default; ours do the run's work, and at nice 15 they
    starved behind any busy process (a loaded machine took ten minutes for one Ray test)."""
    from thundersync.training.ray_backend import RayBackend

    backend = RayBackend(cpus_needed=1, gpus_needed=0, gpu_for_rollout=False, log=tmp_path / "l")
    try:
        started, output = backend.queue(), backend.queue()
        worker = backend.spawn("probe", started.put, "up", num_threads=1, output=output)
        assert started.get(timeout=300) == "up"  # the worker ran
        actors = [
            int(p)
            for p in filter(str.isdigit, os.listdir("/proc"))
            if cmdline(p).startswith((b"ray::_WorkerActor", b"ray::_QueueActor"))
        ]
        assert actors
        assert {pid: os.getpriority(os.PRIO_PROCESS, pid) for pid in actors} == dict.fromkeys(
            actors, os.getpriority(os.PRIO_PROCESS, 0)
        )
        backend.stop(worker, timeout_s=60)
    finally:
        backend.close()
    assert not ray_processes()
