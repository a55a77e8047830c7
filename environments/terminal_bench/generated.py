"""A generated family of Harbor tasks (``thundersync/TerminalGen-v0``): file and text questions
with one numeric (or path) answer, played with real tool calls and graded by pytest.

Task ``index`` (0 .. ``num_tasks`` - 1) is a pure function of the index (``task_spec``): its
family is ``index % len(families)`` (``families``: every family unless the env is given a subset)
and its inputs (words, numbers, file names) are drawn from a
generator seeded by the index, so the same index is the same task on every machine. Families:

- ``count-lines``: lines of notes.txt that contain a word (``grep -c``);
- ``count-word``: occurrences of a word in notes.txt (``grep -o | wc -l``);
- ``first-line``: the line number where a word first appears (``grep -n -m1``);
- ``sum-column``: the sum of a column of data.csv (``awk``);
- ``count-files``: files of logs/ with an extension (``ls | wc -l``);
- ``unique-words``: distinct words of words.txt (``sort -u | wc -l``);
- ``max-number``: the largest number of numbers.txt (``sort -n | tail -1``);
- ``config-value``: a key's value in app.conf (``grep | cut``);
- ``find-file``: the one file of docs/ that holds a word (``grep -l``).

Each answer is unique by construction (no vocabulary word is a substring of another, the
maximum and the matching file are single) and written to /app/answer.txt; tests/ checks it.

A task is a Harbor folder as published (task.toml, instruction.md, environment/Dockerfile and
its files, tests/test.sh with tests/test_outputs.py, solution/solve.sh), written on first use
into a cache folder (``cache_dir``, default ``$TMPDIR/thundersync-terminal-gen-<version>``;
never the repository) and loaded with the Harbor loader, so grading is the loader's own
(strict in a fresh sandbox for training). The folder's solve.sh computes the answer as a
published solution does (the loader plays it packed into one command); the env's tasks
instead give as ``reference_solution()`` the two actions an agent would take: the inspecting
command, then ``echo ANSWER > answer.txt`` (what warm start imitates and the oracle agent
plays, and what warm start corrupts by redrawing the answer's digits).

The split is by task: a task is held-out iff a hash of its id is 0 modulo ``heldout_every``
(``environments.tasks.GeneratedTasks``), so training never draws a held-out task.
"""

from __future__ import annotations

import functools
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from environments.core import SandboxFactory, ShellEnv
from environments.splits import HELDOUT, MAX_DRAWS, SPLITS, TRAIN, heldout_by_hash
from environments.tasks import Task
from environments.terminal_bench.families import (
    ANSWER_FILE,
    FAMILY_NAMES,
    GENERATOR_VERSION,
    TaskSpec,
    check_families,
    task_id_of,
    task_spec,
)
from environments.terminal_bench.families import FAMILIES as FAMILIES  # tests import it
from environments.terminal_bench.families import WORDS as WORDS  # tests import it from here
from environments.terminal_bench.harbor import load_harbor_task
from environments.terminal_bench.task import TerminalBenchTask

CACHE_VARIABLE = "THUNDERSYNC_TERMINAL_GEN_CACHE"
"""Overrides the default cache folder (the ``cache_dir`` keyword wins over it)."""
DEFAULT_NUM_TASKS = 900
DEFAULT_HELDOUT_EVERY = 4
DEFAULT_MAX_TURNS = 6
MAX_NUM_TASKS = 1_000_000


# --- the Harbor folder ----------------------------------------------------------------------

_TASK_TOML = """version = "1.0"

[metadata]
author_name = "ThunderSync"
author_email = "thundersync@example.invalid"
difficulty = "easy"
category = "file-operations"
tags = ["generated", "{family}"]

[verifier]
timeout_sec = 60.0

[agent]
timeout_sec = 30.0

[environment]
build_timeout_sec = 60.0
cpus = 1
memory = "1G"
"""

_TEST_SH = """#!/bin/bash
# Verifier: runs the tests and writes the reward (1 when every test passes, else 0).
TEST_DIR="${TEST_DIR:-/tests}"
VERIFIER_DIR="${VERIFIER_DIR:-/logs/verifier}"
mkdir -p "$VERIFIER_DIR"
cd /app || exit 1
if python3 -m pytest -q -rA -p no:cacheprovider --rootdir="$TEST_DIR" --confcutdir="$TEST_DIR" \\
    "$TEST_DIR/test_outputs.py"; then
    echo 1 > "$VERIFIER_DIR/reward.txt"
else
    echo 0 > "$VERIFIER_DIR/reward.txt"
fi
"""

_TEST_OUTPUTS = '''"""Checks the one answer of the generated task {task_id} ({family})."""

from pathlib import Path

ANSWER = Path("/app/{answer_file}")
EXPECTED = {answer!r}


def test_answer_file_exists():
    assert ANSWER.is_file(), "write the answer to /app/{answer_file}"


def test_answer_is_correct():
    assert ANSWER.read_text().strip() == EXPECTED
'''

_SOLVE_SH = """#!/bin/bash
# Reference solution: compute the answer with the task's command and write it.
set -euo pipefail
cd /app
answer=$({command})
echo "$answer" > {answer_file}
"""


def write_task(spec: TaskSpec, task_dir: Path) -> Path:
    """Write ``spec`` as a Harbor task folder at ``task_dir`` (which must not exist)."""
    files = {
        "task.toml": _TASK_TOML.format(family=spec.family),
        "instruction.md": spec.instruction,
        "tests/test.sh": _TEST_SH,
        "tests/test_outputs.py": _TEST_OUTPUTS.format(
            task_id=spec.task_id, family=spec.family, answer=spec.answer, answer_file=ANSWER_FILE
        ),
        "solution/solve.sh": _SOLVE_SH.format(command=spec.command, answer_file=ANSWER_FILE),
    }
    copies = []
    for rel, text in spec.files:
        files[f"environment/{rel}"] = text
        top = rel.split("/", 1)[0]
        copy = f"COPY {top}/ /app/{top}/" if "/" in rel else f"COPY {rel} /app/{rel}"
        if copy not in copies:
            copies.append(copy)
    dockerfile = ["FROM thundersync/base:bookworm", "WORKDIR /app", *copies]
    files["environment/Dockerfile"] = "\n".join(dockerfile) + "\n"
    for rel, text in files.items():
        path = task_dir / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for script in ("tests/test.sh", "solution/solve.sh"):
        (task_dir / script).chmod(0o755)
    return task_dir


def default_cache_dir() -> Path:
    """``$THUNDERSYNC_TERMINAL_GEN_CACHE`` or a folder of the system's temporary folder."""
    configured = os.environ.get(CACHE_VARIABLE)
    if configured:
        return Path(configured)
    return Path(tempfile.gettempdir()) / f"thundersync-terminal-gen-v{GENERATOR_VERSION}"


def materialize(
    index: int,
    cache_dir: str | Path | None = None,
    families: tuple[str, ...] = FAMILY_NAMES,
) -> Path:
    """Task ``index``'s folder in the cache, written on first use. Written beside its final
    place and renamed into it, so a concurrent writer or an interrupted one never leaves a
    partial task where a reader looks (the first rename wins; the loser's copy is removed)."""
    spec = task_spec(index, families)
    root = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    final = root / spec.task_id
    if (final / "task.toml").is_file():
        return final
    root.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{spec.task_id}.partial-", dir=root))
    try:
        write_task(spec, partial / spec.task_id)
        try:
            os.replace(partial / spec.task_id, final)
        except OSError:
            if not (final / "task.toml").is_file():
                raise
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return final


def load_generated_task(
    index: int,
    *,
    cache_dir: str | Path | None = None,
    max_turns: int = DEFAULT_MAX_TURNS,
    families: tuple[str, ...] = FAMILY_NAMES,
) -> TerminalBenchTask:
    """Task ``index`` loaded by the Harbor loader, its reference solution the agent's two
    actions (inspect, then write the answer) rather than solve.sh packed into one command."""
    cache = None if cache_dir is None else str(cache_dir)
    return _load(int(index), cache, max_turns, check_families(families))


@functools.lru_cache(maxsize=4096)
def _load(
    index: int, cache_dir: str | None, max_turns: int, families: tuple[str, ...]
) -> TerminalBenchTask:
    task = load_harbor_task(materialize(index, cache_dir, families), max_turns=max_turns)
    spec = task_spec(index, families)
    commands = (spec.command, f"echo {spec.answer} > {ANSWER_FILE}")
    return replace(task, solution_script=None, solution_commands=commands)


# --- the env --------------------------------------------------------------------------------


def _check_int(name: str, value: Any, low: int, high: int) -> int:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | np.integer)
        or not (low <= value <= high)
    ):
        raise ValueError(f"{name}: expected an integer in {low}..{high}, got {value!r}")
    return int(value)


@dataclass(frozen=True, slots=True)
class GeneratedHarborTasks:
    """A ``TaskSource`` like ``GeneratedTasks``, over task indices: a draw picks an index,
    decides its split from the task id alone (``task_id_of``, the same hash rule) and writes
    and loads only the task it returns (``generate`` takes the index), so rejected draws cost
    nothing."""

    name: str
    generate: Callable[[int], Task]
    heldout_every: int = 16
    num_tasks: int = DEFAULT_NUM_TASKS
    families: tuple[str, ...] = FAMILY_NAMES

    def splits(self) -> tuple[str, ...]:
        return SPLITS

    def tasks(self, split: str = TRAIN) -> None:
        self._check_split(split)
        return None

    def is_heldout(self, task_id: str) -> bool:
        return heldout_by_hash(task_id, self.heldout_every)

    def _check_split(self, split: str) -> None:
        if split not in self.splits():
            raise ValueError(
                f"task source {self.name!r}: no split {split!r}; it has {list(self.splits())}"
            )

    def draw(self, rng: np.random.Generator, split: str = TRAIN) -> Task:
        self._check_split(split)
        want = split == HELDOUT
        for _ in range(MAX_DRAWS):
            index = int(rng.integers(self.num_tasks))
            if self.is_heldout(task_id_of(index, self.families)) == want:
                return self.generate(index)
        raise ValueError(f"task source {self.name!r}: no {split} task in {MAX_DRAWS} draws")


@functools.cache
def _source(
    num_tasks: int,
    heldout_every: int,
    max_turns: int,
    cache_dir: str | None,
    families: tuple[str, ...],
) -> GeneratedHarborTasks:
    def generate(index: int) -> TerminalBenchTask:
        return load_generated_task(
            index, cache_dir=cache_dir, max_turns=max_turns, families=families
        )

    return GeneratedHarborTasks(
        "TerminalGen",
        generate,
        heldout_every=heldout_every,
        num_tasks=num_tasks,
        families=families,
    )


def generated_source(
    *,
    num_tasks: int = DEFAULT_NUM_TASKS,
    heldout_every: int = DEFAULT_HELDOUT_EVERY,
    max_turns: int = DEFAULT_MAX_TURNS,
    cache_dir: str | Path | None = None,
    families: Any = None,
) -> GeneratedHarborTasks:
    """The family's tasks 0 .. ``num_tasks`` - 1 by split (one source per arguments);
    ``families`` a subset of the family names (None: all), task ``index`` of
    ``families[index % len(families)]``."""
    names = check_families(families)
    num_tasks = _check_int("num_tasks", num_tasks, len(names), MAX_NUM_TASKS)
    heldout_every = _check_int("heldout_every", heldout_every, 2, 1000)
    max_turns = _check_int("max_turns", max_turns, 2, 1000)
    cache = None if cache_dir is None else str(cache_dir)
    return _source(num_tasks, heldout_every, max_turns, cache, names)


_SOURCE_KEYWORDS = ("num_tasks", "heldout_every", "max_turns", "cache_dir", "families")


class GeneratedTerminalEnv(ShellEnv):
    """``thundersync/TerminalGen-v0``: the generated Harbor family (see the module docstring).

    Keyword arguments: ``num_tasks`` (default 900: tasks 0..899, a ``heldout_every``-th of them,
    default a quarter, held out), ``max_turns`` (default 6), ``cache_dir``, ``families`` (the
    family names drawn from, default all; task ``index`` is of ``families[index %
    len(families)]``), ``split`` (which
    split ``reset`` draws from when no task is given: ``"train"``, the default, or
    ``"heldout"``), ``sandbox``, ``max_episode_s``, ``max_format_errors``, ``strict_grading``.
    """

    @classmethod
    def task_source(cls, **kwargs: Any) -> GeneratedHarborTasks:
        return generated_source(**{k: v for k, v in kwargs.items() if k in _SOURCE_KEYWORDS})

    def __init__(
        self,
        *,
        sandbox: str | SandboxFactory = "bwrap",
        num_tasks: int = DEFAULT_NUM_TASKS,
        heldout_every: int = DEFAULT_HELDOUT_EVERY,
        max_turns: int = DEFAULT_MAX_TURNS,
        cache_dir: str | Path | None = None,
        families: Any = None,
        split: str = TRAIN,
        max_episode_s: float | None = None,
        max_format_errors: int = 3,
        strict_grading: bool = True,
    ) -> None:
        if split not in SPLITS:
            raise ValueError(f"split: expected one of {list(SPLITS)}, got {split!r}")
        source = generated_source(
            num_tasks=num_tasks,
            heldout_every=heldout_every,
            max_turns=max_turns,
            cache_dir=cache_dir,
            families=families,
        )
        super().__init__(
            source,
            sandbox=sandbox,
            max_turns=max_turns,
            max_episode_s=max_episode_s,
            max_format_errors=max_format_errors,
            strict_grading=strict_grading,
        )
        self.split = split

    def draw_task(self, rng: np.random.Generator) -> Task:
        """A task of the env's ``split`` drawn with ``rng``."""
        return self.source.draw(rng, self.split)
