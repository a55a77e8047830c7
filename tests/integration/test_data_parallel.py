"""The data-parallel learner (``thundersync.core.data_parallel``) against one learner on the batch.

Two ranks are spawned once for the module (``torch.multiprocessing``, a gloo process group
over a file in the test's temporary folder), each with one torch thread. For every case both
ranks get the same random batch and keep their own groups; each rank records its update
after one step (SGD, lr 1, clipping on: Δθ is the clipped gradient), and what it would have
stepped had it skipped the all-reduce (a plain ``Learner`` on its own groups). Rank 0 also
runs the single-rank ``Learner`` on the whole batch, with the same thread count, so that a
deterministic comparison is about the reduction alone.
"""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from thundersync import GRPO, OPD

WORLD_SIZE = 2
LIMIT_S = 240.0

# name: (objective, learner options, arrival)
CASES = {
    "grpo-seq-mean": (GRPO(), {}, "interleaved"),
    "grpo-token-mean": (GRPO(loss_agg="token-mean"), {}, "interleaved"),
    "dr-grpo-no-std": (
        GRPO(loss_agg="seq-mean-token-sum-norm", scale_by_std=False),
        {},
        "interleaved",
    ),
    "grpo-streaming": (GRPO(loss_agg="token-mean"), {"streaming": True}, "shuffled"),
    "dr-grpo-streaming": (
        GRPO(scale_by_std=False),
        {"streaming": True, "early_start": True},
        "interleaved",
    ),
    "dynamic-max-groups-streaming": (
        GRPO(dynamic_sampling=True, max_groups=3),
        {"streaming": True},
        "interleaved",
    ),
    "opd-sync": (OPD(), {}, "interleaved"),
    "opd-streaming": (
        OPD(granularity="turn", loss_agg="seq-mean-token-sum-norm"),
        {"streaming": True},
        "shuffled",
    ),
    "grpo-deterministic-streaming": (
        GRPO(),
        {"deterministic": True, "streaming": True, "assign": "alternate"},
        "shuffled",
    ),
    "dr-grpo-deterministic": (GRPO(scale_by_std=False), {"deterministic": True}, "interleaved"),
    "opd-deterministic": (
        OPD(granularity="turn"),
        {"deterministic": True, "streaming": True},
        "interleaved",
    ),
}
SEED = 4


def alternate(group_id: str) -> int:
    """A caller-given assignment: random_batch's groups g0, g1, … alternate between the ranks,
    so the ranks' groups interleave in canonical order (a sum of per-rank sums would then
    not be the single learner's sum, bitwise)."""
    return int(group_id[1:]) % WORLD_SIZE


def _flat(model: torch.nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1).clone() for p in model.parameters()])


def _update(model_dir: str, learner_cls, objective, options, events, **extra):
    """Δθ after one step of ``learner_cls`` on ``events``, and the step's metrics."""
    from thundersync.models import load_model

    model = load_model(model_dir, dtype=torch.float64)
    before = _flat(model)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    learner = learner_cls(model, objective, opt, max_grad_norm=1.0, **options, **extra)
    for event in events:
        learner.consume(event)
    metrics = learner.step()
    return _flat(model) - before, metrics


def _rank_main(rank: int, folder: str, model_dir: str, fail_rank: int | None) -> None:
    """One rank: every case, results saved to ``folder/rank<r>.pt``. Rank ``fail_rank``
    raises instead of stepping (the other then waits in the step's first collective)."""
    import torch.distributed as dist

    from thundersync import events as ev
    from thundersync.core.data_parallel import DataParallelLearner, stable_rank
    from thundersync.core.learner import Learner
    from thundersync.core.random_batches import BatchShape, random_batch

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo",
        init_method=f"file://{folder}/pg",
        rank=rank,
        world_size=WORLD_SIZE,
        timeout=timedelta(seconds=60),
    )
    try:
        shape = BatchShape(
            min_groups=4,
            max_groups=6,
            max_group_size=4,
            max_turns=3,
            max_tokens=48,
            infra_failure_rate=0.1,
        )
        results = {}
        for name, (objective, case_options, arrival) in CASES.items():
            options = dict(case_options)
            owner = alternate if options.pop("assign", None) else None
            events = random_batch(
                SEED, 512, shape, teacher=isinstance(objective, OPD), arrival=arrival
            )
            if rank == fail_rank:
                raise RuntimeError(f"rank {rank} fails on purpose")
            mine = {
                e.episode_id
                for e in events
                if isinstance(e, ev.EpisodeStarted)
                and (owner or (lambda g: stable_rank(g, WORLD_SIZE)))(e.group_id) == rank
            }
            update, metrics = _update(
                model_dir, DataParallelLearner, objective, options, events, assign=owner
            )
            own = [e for e in events if e.episode_id in mine]
            skipped, _ = _update(model_dir, Learner, objective, options, own)
            result = {"update": update, "skipped": skipped, "metrics": metrics}
            if rank == 0:
                result["single"], result["single_metrics"] = _update(
                    model_dir, Learner, objective, options, events
                )
            results[name] = result
        results["incomplete"] = _incomplete_then_complete(rank, model_dir, shape)
        torch.save(results, Path(folder) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def _incomplete_then_complete(rank: int, model_dir: str, shape) -> dict:
    """One reward of a rank-1 group is missing: ``step()`` raises on both ranks and changes
    nothing; once it arrives, the step is the single learner's."""
    from thundersync import IncompleteBatchError
    from thundersync import events as ev
    from thundersync.core.data_parallel import DataParallelLearner, stable_rank
    from thundersync.core.learner import Learner
    from thundersync.core.random_batches import random_batch
    from thundersync.models import load_model

    events = random_batch(SEED, 512, shape)
    group_of = {e.episode_id: e.group_id for e in events if isinstance(e, ev.EpisodeStarted)}
    late = next(
        e
        for e in events
        if isinstance(e, ev.RewardReady) and stable_rank(group_of[e.episode_id], WORLD_SIZE) == 1
    )
    model = load_model(model_dir, dtype=torch.float64)
    before = _flat(model)
    learner = DataParallelLearner(model, GRPO(), torch.optim.SGD(model.parameters(), lr=1.0))
    for event in events:
        if event is not late:
            learner.consume(event)
    try:
        learner.step()
        error = None
    except IncompleteBatchError as exc:
        error = str(exc)
    unchanged = torch.equal(_flat(model), before)
    learner.consume(late)
    learner.step()
    out = {"error": error, "unchanged": unchanged, "update": _flat(model) - before}
    if rank == 0:
        out["single"], _ = _update(model_dir, Learner, GRPO(), {}, events)
    return out


class RanksFailed(RuntimeError):
    """One or more ranks raised; the message holds every failed rank's traceback."""


def run_ranks(
    folder: Path, model_dir: Path, fail_rank: int | None = None, started: list | None = None
) -> None:
    """Spawn the ranks and wait for all of them to end; every process is stopped on every
    way out.  When ranks fail, every failed rank's traceback is reported: which rank's
    process exits first is a race (the rank that raised, or its peer whose collective then
    broke), so reporting only the first, as ``ProcessContext.join`` does, would not say
    reliably which rank failed.  ``started`` receives the processes (to check afterwards
    that none is alive)."""
    import pickle

    import torch.multiprocessing as mp

    context = mp.start_processes(
        _rank_main,
        args=(str(folder), str(model_dir), fail_rank),
        nprocs=WORLD_SIZE,
        join=False,
        start_method="spawn",
    )
    if started is not None:
        started.extend(context.processes)
    deadline = time.monotonic() + LIMIT_S
    try:
        for process in context.processes:
            process.join(max(0.0, deadline - time.monotonic()))
        if any(process.is_alive() for process in context.processes):
            raise TimeoutError(f"the ranks did not finish within {LIMIT_S} s")
        failures = []
        for rank, (process, error_file) in enumerate(
            zip(context.processes, context.error_files, strict=True)
        ):
            if process.exitcode == 0:
                continue
            path = Path(error_file)
            if path.exists() and path.stat().st_size:
                with path.open("rb") as fh:
                    failures.append(f"rank {rank}:\n{pickle.load(fh)}")
            else:
                failures.append(f"rank {rank}: exited with code {process.exitcode}")
        if failures:
            raise RanksFailed("\n".join(failures))
    finally:
        for process in context.processes:
            if process.is_alive():
                process.terminate()
        for process in context.processes:
            process.join(5)
            if process.is_alive():
                process.kill()
                process.join()
        for path in context.error_files:  # where a failed rank wrote its traceback
            Path(path).unlink(missing_ok=True)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    from thundersync.models import build_tiny_model

    folder = tmp_path_factory.mktemp("data-parallel")
    model_dir = build_tiny_model(folder / "gpt2", "gpt2")
    run_ranks(folder, model_dir)
    return model_dir, [torch.load(folder / f"rank{r}.pt") for r in range(WORLD_SIZE)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm()) / float(b.norm())


@pytest.mark.parametrize("name", sorted(CASES))
def test_two_ranks_step_as_one_learner_on_the_whole_batch(ranks, name):
    _, results = ranks
    first, second = results[0][name], results[1][name]
    single = first["single"]
    # The replicas stay equal, bitwise.
    assert torch.equal(first["update"], second["update"])
    # Both ranks trained on some of the batch, so skipping the all-reduce would show.
    assert first["metrics"]["local_num_trajectories"] > 0
    assert second["metrics"]["local_num_trajectories"] > 0
    for r in results:
        assert rel(r[name]["skipped"], single) > 1e-3
    # The whole batch's facts, as one learner sees them.
    for key in ("num_trajectories", "num_groups", "num_tokens", "denominator", "reward_mean"):
        assert first["metrics"][key] == first["single_metrics"][key], key
    if CASES[name][1].get("deterministic"):
        assert torch.equal(first["update"], single)
    else:
        assert rel(first["update"], single) <= 1e-12


def test_a_failing_rank_stops_both_and_is_reported(ranks, tmp_path_factory):
    """The harness itself: when one rank raises while the other waits (in the process
    group's set-up or a collective), the run ends with that rank's error and no process is
    left."""
    model_dir, _ = ranks
    started: list = []
    with pytest.raises(RanksFailed, match="rank 1 fails on purpose"):
        run_ranks(tmp_path_factory.mktemp("data-parallel-failure"), model_dir, 1, started)
    assert len(started) == WORLD_SIZE
    assert not any(process.is_alive() for process in started)


def test_an_incomplete_batch_raises_on_every_rank_and_the_step_can_follow(ranks):
    _, results = ranks
    first, second = results[0]["incomplete"], results[1]["incomplete"]
    assert second["error"] is not None and "no RewardReady yet" in second["error"]
    assert first["error"] is not None and first["error"].startswith("rank 1: ")
    assert first["unchanged"] and second["unchanged"]
    assert torch.equal(first["update"], second["update"])
    assert rel(first["update"], first["single"]) <= 1e-12
