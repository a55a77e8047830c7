"""The generated Harbor family (thundersync/TerminalGen-v0): determinism, one answer per task
checked against an independent reading of its files, disjoint splits, loader validity."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import gymnasium
import numpy as np
import pytest

import environments  # noqa: F401  (registers the built-in envs)
from environments.registry import list_envs, task_source
from environments.tasks import HELDOUT, TRAIN, select_tasks
from environments.terminal_bench import load_tasks
from environments.terminal_bench.generated import (
    FAMILIES,
    GENERATOR_VERSION,
    WORDS,
    default_cache_dir,
    generated_source,
    load_generated_task,
    materialize,
    task_spec,
)
from tests.unit.environments.shell_fakes import SandboxMaker

ENV_ID = "thundersync/TerminalGen-v0"
NUM = 900


def _digest(folder: Path) -> str:
    h = hashlib.sha256()
    for path in sorted(folder.rglob("*")):
        if path.is_file():
            h.update(path.relative_to(folder).as_posix().encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


PINNED = "a32278f8c4c7c47101f09c2588795d3f2952c4593f69be3fefb29d55cbf334bd"
"""Digest of every fifth task of version 1: the same on every machine and interpreter (hash
seeds vary between pytest runs). A change of the generator's output must bump
GENERATOR_VERSION, which names the cache folder, and this digest with it."""


def test_a_task_is_a_pure_function_of_its_index(tmp_path: Path) -> None:
    a = materialize(17, tmp_path / "a")
    b = materialize(17, tmp_path / "b")
    assert _digest(a) == _digest(b)
    h = hashlib.sha256()
    for i in range(0, NUM, 5):
        s = task_spec(i)
        h.update(repr((s.task_id, s.instruction, s.files, s.command, s.answer)).encode())
    assert (GENERATOR_VERSION, h.hexdigest()) == ("1", PINNED)


def test_hundreds_of_distinct_tasks_in_every_family() -> None:
    specs = [task_spec(i) for i in range(NUM)]
    contents = {(s.instruction, s.files) for s in specs}
    assert len(contents) == NUM
    by_family = {name: sum(s.family == name for s in specs) for name, _ in FAMILIES}
    assert set(by_family.values()) == {NUM // len(FAMILIES)}


def test_no_vocabulary_word_is_inside_another() -> None:
    assert not [(a, b) for a in WORDS for b in WORDS if a != b and a in b]


def _reference_answers(family: str, instruction: str, files: dict[str, str]) -> list[str]:
    """Every answer the files allow, read independently of the generator."""
    word = re.search(r"the word (\w+)", instruction)
    if family in ("count-lines", "count-word", "first-line"):
        lines = [line.split() for line in files["notes.txt"].splitlines()]
        if family == "count-lines":
            return [str(sum(word[1] in line for line in lines))]
        if family == "count-word":
            return [str(sum(line.count(word[1]) for line in lines))]
        return [str(n) for n, line in enumerate(lines, 1) if word[1] in line][:1]
    if family == "sum-column":
        column = int(re.search(r"column (\d+)", instruction)[1])
        rows = [row.split(",") for row in files["data.csv"].splitlines()]
        return [str(sum(int(row[column - 1]) for row in rows))]
    if family == "count-files":
        extension = re.search(r"extension (\.\w+)", instruction)[1]
        return [str(sum(name.endswith(extension) for name in files))]
    if family == "unique-words":
        return [str(len(set(files["words.txt"].split())))]
    if family == "max-number":
        numbers = [int(n) for n in files["numbers.txt"].split()]
        return [str(n) for n in numbers if n == max(numbers)]  # one entry iff the max is unique
    if family == "config-value":
        key = re.search(r"value of (\w+)", instruction)[1]
        pairs = [line.split("=") for line in files["app.conf"].splitlines()]
        return [value for k, value in pairs if k == key]
    if family == "find-file":
        return [name for name, text in files.items() if word[1] in text.split()]
    raise AssertionError(f"unknown family {family}")


def test_every_answer_is_the_one_the_files_allow() -> None:
    for index in range(0, NUM, 7):
        spec = task_spec(index)
        assert _reference_answers(spec.family, spec.instruction, dict(spec.files)) == [
            spec.answer
        ], spec.task_id


def test_splits_are_disjoint_and_training_never_draws_a_held_out_task(tmp_path: Path) -> None:
    source = generated_source(num_tasks=NUM, cache_dir=tmp_path)
    rng = np.random.default_rng(0)
    train = {source.draw(rng, TRAIN).task_id for _ in range(80)}
    heldout = {t.task_id for t in select_tasks(source, 20, seed=0).tasks}
    assert len(heldout) == 20 and len(train) > 60
    assert not train & heldout
    every = {task_spec(i).task_id for i in range(NUM)}
    marked = {task_id for task_id in every if source.is_heldout(task_id)}
    assert heldout <= marked and not train & marked
    assert 0.15 < len(marked) / NUM < 0.35  # a quarter by default


def test_the_harbor_loader_accepts_every_family(tmp_path: Path) -> None:
    for index in range(len(FAMILIES)):
        materialize(index, tmp_path)
    tasks = load_tasks(tmp_path)
    assert len(tasks) == len(FAMILIES)
    for task in tasks:
        spec = task_spec(int(task.task_id[-6:]))
        assert task.format == "harbor" and task.task_id == spec.task_id
        assert task.instruction == spec.instruction
        assert task.needs_docker_reason is None  # bubblewrap runs it
        assert task.environment.workdir == "/app"
        uploaded = {rel for _, rel in task.test_uploads()}
        assert uploaded == {"test.sh", "test_outputs.py"}
        assert spec.answer in (task.tests_dir / "test_outputs.py").read_text()
        assert task.solution_script is not None and task.solution_script.name == "solve.sh"


def test_the_env_task_plays_inspect_then_answer(tmp_path: Path) -> None:
    task = load_generated_task(3, cache_dir=tmp_path)
    spec = task_spec(3)
    assert task.reference_solution() == [spec.command, f"echo {spec.answer} > answer.txt"]
    assert task.max_turns == 6


def test_the_env_is_registered_and_draws_from_the_split_asked(tmp_path: Path) -> None:
    assert ENV_ID in {env.id for env in list_envs()}
    source = task_source(ENV_ID, cache_dir=str(tmp_path))
    assert source.splits() == (TRAIN, HELDOUT)
    for split in (TRAIN, HELDOUT):
        env = gymnasium.make(ENV_ID, split=split, cache_dir=str(tmp_path), sandbox=SandboxMaker())
        try:
            for seed in range(5):
                env.reset(seed=seed)
                task_id = env.unwrapped.task.task_id
                assert source.is_heldout(task_id) == (split == HELDOUT)
        finally:
            env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"split": "test"}, "split: expected one of"),
        ({"num_tasks": 3}, "num_tasks: expected an integer in 9.."),
        ({"heldout_every": 1}, "heldout_every"),
        ({"max_turns": "six"}, "max_turns"),
    ],
)
def test_bad_keywords_are_one_line_errors(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        gymnasium.make(ENV_ID, **kwargs)


def test_a_negative_index_is_refused() -> None:
    with pytest.raises(ValueError, match="task index: expected an integer >= 0, got -1"):
        task_spec(-1)


def test_the_cache_is_outside_the_repository(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THUNDERSYNC_TERMINAL_GEN_CACHE", raising=False)
    repo = Path(__file__).resolve().parents[4]
    assert repo not in default_cache_dir().resolve().parents
    monkeypatch.setenv("THUNDERSYNC_TERMINAL_GEN_CACHE", "/somewhere/else")
    assert default_cache_dir() == Path("/somewhere/else")
