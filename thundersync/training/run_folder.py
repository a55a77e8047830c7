"""A run folder is created once: what is in a folder, whether a run may start there, and what
``--overwrite`` may remove.

A new run in a folder holding another run mixes the two (the new ``config.json`` beside the
old checkpoints, and checkpoint pruning keeping "the two newest", the old run's, over the new
run's own), so a folder holding a run is refused unless the command says what to do with it:
``--resume`` continues it, ``--overwrite`` replaces it. ``--overwrite`` removes only what a run
(or a command reading a run: ``timeline``, ``export``) writes, and refuses a folder that holds
anything else, as ``warmstart`` refuses an ``--out`` holding what a warm model does not: a
folder with other files is not a run folder, and its ``config.json`` or ``checkpoints/`` may
be someone's own. Everything here runs before any work starts, so a refused command has
changed nothing.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

RUN_RECORDS = ("config.json", "metrics.jsonl", "events.jsonl", "spans.jsonl", "trajectories.jsonl")
"""Files whose presence shows that a run started in the folder (``Telemetry`` writes them)."""

CHECKPOINTS = "checkpoints"

RUN_WRITES = frozenset(
    {
        *RUN_RECORDS,
        CHECKPOINTS,
        "init-model",  # the tiny model a run without --model builds
        "requested-config.json",  # what compare asks its train process for
        "tensorboard",  # --tensorboard
        "wandb",  # --wandb (offline, in the run folder)
        "timeline.png",  # thundersync timeline's default output
        "atif",  # thundersync export's default output
    }
)
"""Every top-level name a run, or a command reading it, writes in its run folder."""

HIDDEN_PREFIXES = (".learner-group-", ".write-probe-")
"""Hidden files a run leaves when killed: the learner ranks' rendezvous, the writable probe."""

RUN_CONFIG_KEYS = frozenset({"env", "mode", "steps", "out"})
"""Keys every run's config.json has had: a config.json without them is someone else's file."""


@dataclass(slots=True)
class Contents:
    """What a folder holds, sorted into what a run wrote and what it did not."""

    folder: Path
    records: list[str] = field(default_factory=list)
    """Run records (``RUN_RECORDS``) and checkpoints: the folder holds a run."""
    checkpoints: list[str] = field(default_factory=list)
    """The names of the run's checkpoints (``step-NNNNNN``)."""
    ours: list[Path] = field(default_factory=list)
    """Every entry a run wrote (what ``--overwrite`` removes)."""
    foreign: list[str] = field(default_factory=list)
    """Entries a run does not write (a config.json that is not a run's counts here)."""

    @property
    def holds_run(self) -> bool:
        return bool(self.records)

    def described(self) -> str:
        """The run, in a few words: its checkpoints, else its records."""
        if self.checkpoints:
            shown = ", ".join(self.checkpoints[-3:])
            more = f"{len(self.checkpoints) - 3} more and " if len(self.checkpoints) > 3 else ""
            return f"a run (checkpoints {more}{shown})"
        return f"a run ({', '.join(self.records[:3])})"

    def foreign_described(self) -> str:
        shown = ", ".join(self.foreign[:3]) + (", ..." if len(self.foreign) > 3 else "")
        return f"files a run does not write ({shown})"


def survey(folder: str | Path) -> Contents:
    """What ``folder`` holds (nothing when it does not exist)."""
    contents = Contents(Path(folder))
    if not contents.folder.is_dir():
        return contents
    for entry in sorted(contents.folder.iterdir(), key=lambda p: p.name):
        name = entry.name
        if name.startswith(HIDDEN_PREFIXES):
            contents.ours.append(entry)
        elif name == "config.json" and not _is_run_config(entry):
            contents.foreign.append(name)
        elif name == CHECKPOINTS:
            _survey_checkpoints(entry, contents)
        elif name in RUN_WRITES:
            contents.ours.append(entry)
            if name in RUN_RECORDS:
                contents.records.append(name)
        else:
            contents.foreign.append(name + ("/" if entry.is_dir() else ""))
    return contents


def _survey_checkpoints(folder: Path, contents: Contents) -> None:
    """``checkpoints/`` is the run's when it holds only checkpoints (``step-NNNNNN``, and the
    hidden ``.tmp-step-...`` a killed save leaves)."""
    if not folder.is_dir():
        contents.foreign.append(CHECKPOINTS)
        return
    others = [p.name for p in folder.iterdir() if not p.name.startswith(("step-", ".tmp-step-"))]
    if others:
        contents.foreign.extend(f"{CHECKPOINTS}/{name}" for name in sorted(others))
        return
    contents.ours.append(folder)
    contents.checkpoints = sorted(p.name for p in folder.iterdir() if p.name.startswith("step-"))
    if contents.checkpoints:
        contents.records.append(CHECKPOINTS)


def _is_run_config(path: Path) -> bool:
    try:
        if path.stat().st_size > 1_000_000 or not path.is_file():
            return False
        values = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(values, dict) and values.keys() >= RUN_CONFIG_KEYS


def run_folder_problem(
    folder: str | Path,
    *,
    resume: bool = False,
    overwrite: bool = False,
    keep: tuple[str | Path | None, ...] = (),
    option: str = "--out",
) -> str | None:
    """Why a run may not start in ``folder`` (one line saying what to do instead), or None.

    A new run needs a folder holding no run; ``resume`` needs one holding a run (the caller
    checks its config.json and checkpoints); ``overwrite`` needs one holding nothing but what
    a run writes, none of it in ``keep`` (the run's own ``--model`` or ``--teacher``, which
    replacing the folder would delete). A ``config.json`` or ``checkpoints/`` that is not a
    run's is refused in every case: a run would write over it."""
    if resume and overwrite:
        return f"--resume continues the run in {folder}, --overwrite replaces it: give one"
    contents = survey(folder)
    where = f"{option} {folder}"
    collide = [
        name for name in contents.foreign if name.split("/")[0] in ("config.json", CHECKPOINTS)
    ]
    if collide:
        return (
            f"{where} holds {', '.join(collide[:3])}, not a run's, where a run writes its "
            f"own; choose another {option}"
        )
    if resume or not contents.holds_run:
        return None
    if not overwrite:
        return (
            f"{where} holds {contents.described()}: --resume to continue it, --overwrite "
            f"to replace it, or another {option}"
        )
    if contents.foreign:
        return (
            f"{where} holds {contents.described()} and {contents.foreign_described()}: "
            f"--overwrite removes only a run folder's own files; remove those or choose "
            f"another {option}"
        )
    return _kept_problem(contents, keep, where)


def _kept_problem(
    contents: Contents, keep: tuple[str | Path | None, ...], where: str
) -> str | None:
    """Why ``--overwrite`` may not remove the folder's run: an entry it would remove holds a
    path of ``keep`` (the model the new run trains, its teacher), or None."""
    for path in keep:
        if not path:
            continue
        target = Path(os.path.abspath(path))
        for entry in contents.ours:
            if target.is_relative_to(os.path.abspath(entry)):
                return (
                    f"{where}: --overwrite would remove {entry.name}, which holds {path}, a "
                    f"model this run needs; copy it elsewhere or choose another folder"
                )
    return None


def clear_run_folder(folder: str | Path) -> list[Path]:
    """Remove what a run wrote in ``folder`` (``--overwrite``, after ``run_folder_problem``);
    returns what was removed. The folder itself stays, and a folder holding anything a run
    does not write is left as it is (with a run in it, ``run_folder_problem`` refused it; without
    one there is nothing to replace, and its names may be someone's own)."""
    contents = survey(folder)
    if contents.foreign:
        return []
    removed = contents.ours
    for entry in removed:
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink(missing_ok=True)
    return removed
