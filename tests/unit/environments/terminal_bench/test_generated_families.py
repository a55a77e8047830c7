"""TerminalGen-v0 on a subset of its families (the ``families`` keyword): draws only those
families, a (family, index) pair is the same task as under every family, the held-out split
stays disjoint from training, bad subsets are one-line errors."""

from __future__ import annotations

from pathlib import Path

import gymnasium
import numpy as np
import pytest

import environments  # noqa: F401  (registers the built-in envs)
from environments.registry import task_source
from environments.tasks import HELDOUT, TRAIN, select_tasks
from environments.terminal_bench.families import FAMILY_NAMES, task_spec
from environments.terminal_bench.generated import load_generated_task
from tests.unit.environments.shell_fakes import SandboxMaker

ENV_ID = "thundersync/TerminalGen-v0"
SUBSET = ["max-number", "unique-words"]


def test_a_subset_draws_only_its_families(tmp_path: Path) -> None:
    source = task_source(ENV_ID, cache_dir=str(tmp_path), families=SUBSET)
    rng = np.random.default_rng(0)
    families = {
        source.draw(rng, split).task_id.split("-0")[0]
        for split in (TRAIN, HELDOUT)
        for _ in range(20)
    }
    assert families == {f"gen-{name}" for name in SUBSET}


def test_a_family_and_index_are_the_same_task_under_any_subset() -> None:
    for index in range(0, 200, 9):
        full = task_spec(index)
        alone = task_spec(index, (full.family,))
        assert full == alone
    for index in range(40):
        spec = task_spec(index, tuple(SUBSET))
        assert spec.family == SUBSET[index % 2] and spec.task_id.endswith(f"{index:06d}")


def test_the_subsets_splits_are_disjoint(tmp_path: Path) -> None:
    source = task_source(ENV_ID, cache_dir=str(tmp_path), families=SUBSET)
    rng = np.random.default_rng(1)
    train = {source.draw(rng, TRAIN).task_id for _ in range(60)}
    heldout = {t.task_id for t in select_tasks(source, 16, seed=0).tasks}
    assert len(heldout) == 16 and len(train) > 40 and not train & heldout
    assert all(source.is_heldout(t) for t in heldout)


def test_the_env_plays_a_subsets_task(tmp_path: Path) -> None:
    env = gymnasium.make(ENV_ID, cache_dir=str(tmp_path), families=SUBSET, sandbox=SandboxMaker())
    try:
        env.reset(seed=3)
        task = env.unwrapped.task
        index = int(task.task_id[-6:])
        spec = task_spec(index, tuple(SUBSET))
        assert task.reference_solution() == [spec.command, f"echo {spec.answer} > answer.txt"]
    finally:
        env.close()
    assert load_generated_task(index, cache_dir=tmp_path, families=tuple(SUBSET)) is not None


@pytest.mark.parametrize(
    "families", [[], ["max-number", "max-number"], ["no-such-family"], "max-number"]
)
def test_bad_subsets_are_one_line_errors(families: object) -> None:
    with pytest.raises(ValueError, match="families: expected"):
        gymnasium.make(ENV_ID, families=families)


def test_the_default_is_every_family() -> None:
    assert task_spec(5).family == FAMILY_NAMES[5]
