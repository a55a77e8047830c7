"""The train and held-out splits: their names, the split rule of generated tasks, and the
tasks an evaluation scores from a source's split (``select_tasks``)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Any

import numpy as np

TRAIN = "train"
HELDOUT = "heldout"
SPLITS = (TRAIN, HELDOUT)


MAX_DRAWS = 10_000
"""Draws a ``GeneratedTasks`` makes for one task of a split before it gives up."""


def heldout_by_hash(task_id: str, heldout_every: int) -> bool:
    """The split rule of generated tasks: held out iff a hash of the id is 0 modulo
    ``heldout_every``."""
    digest = hashlib.sha256(f"heldout/{task_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") % heldout_every == 0


HELDOUT_STREAM = 0x4E1D0
"""Seeds held-out lists apart from the training draws' generators (a task's split is decided
by its content; this only keeps evaluation's generator from replaying a training one)."""


@dataclass(frozen=True, slots=True)
class Selection:
    """Tasks chosen for an evaluation: the tasks, the split they come from and, when that is
    not what was asked for, a one-line note saying why (printed and kept in the report)."""

    tasks: tuple[Any, ...]
    split: str
    note: str | None = None


def select_tasks(
    source: Any, num_tasks: int, *, seed: int = 0, split: str = HELDOUT, name: str | None = None
) -> Selection:
    """``num_tasks`` distinct tasks of ``source``'s ``split`` (``heldout`` by default), seeded:
    a seeded sample without replacement of a finite split (all of it when it is smaller,
    said in the note), distinct draws of a generated one. A source without that split gives
    its training tasks with a note saying so (naming the env as ``name``), never silently."""
    note = None
    if split not in source.splits():
        note = (
            f"{name or source.name} declares no {split.replace('heldout', 'held-out')} split: "
            "evaluating its training tasks (scores are not held-out)"
        )
        split = TRAIN
    rng = np.random.default_rng([seed, HELDOUT_STREAM])
    listed = source.tasks(split)
    if listed is not None:
        order = rng.permutation(len(listed))[:num_tasks]
        chosen = tuple(listed[int(i)] for i in order)
        if len(listed) < num_tasks:
            more = f"its {split} split has {len(listed)} task(s), fewer than the {num_tasks} asked"
            note = f"{note}; {more}" if note else more
        return Selection(chosen, split, note)
    chosen_by_id: dict[str, Any] = {}
    for _ in range(MAX_DRAWS):
        if len(chosen_by_id) == num_tasks:
            break
        task = source.draw(rng, split)
        chosen_by_id.setdefault(task.task_id, task)
    if len(chosen_by_id) < num_tasks:
        more = f"only {len(chosen_by_id)} distinct {split} task(s) in {MAX_DRAWS} draws"
        note = f"{note}; {more}" if note else more
    return Selection(tuple(chosen_by_id.values()), split, note)
