"""``thundersync eval``'s checks before any work: the sandbox runs here, the outputs can be
written, the checkpoint is a model the policy agent can run (each an answer naming the fix, or
None)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from leaderboard.store import Store, StoreError
from thundersync.protocol.documents import DocumentError

MODEL_FILES = ("config.json", "adapter_config.json")
"""What makes a folder a checkpoint the policy agent runs: a model, or a LoRA adapter (on the
base model its adapter_config.json names)."""


def sandbox_problem(kind: str) -> str | None:
    """Why sandboxes of ``kind`` cannot run on this machine (with the fix), or None: the
    engine's own prerequisite check (``environments.sandboxes.engines``)."""
    from environments.sandboxes import sandbox_engine

    return sandbox_engine(kind).check()


def output_problem(out: str | None, db: str | None, *, leaderboard: bool) -> str | None:
    """Why the run's outputs cannot be written (checked before any work), or None: ``out``
    must be a folder or creatable as one, and with ``leaderboard`` the store ``db`` (None:
    the default one) must open, have a schema this code reads, and take a write."""
    from thundersync.training.checks import folder_problem

    problem = folder_problem(out) if out is not None else None
    if problem is not None:
        return f"--out {problem}"
    if leaderboard:
        try:
            Store(db).close()
        except StoreError as exc:
            return f"--db: {exc}"
    return None


def checkpoint_problem(checkpoint: str | Path) -> str | None:
    """Why ``checkpoint`` is not a model folder the policy agent can run, or None: a run's
    step that rotation removed (with the checkpoints that exist), a run folder instead of one
    of its checkpoints, a folder without config.json (or a LoRA adapter's
    adapter_config.json), a tokenizer without a chat template."""

    from thundersync.training.checks import chat_template_problem

    folder = Path(checkpoint)
    kept = _kept_checkpoints(folder)
    if (folder / "checkpoints").is_dir():  # its config.json is the run's, not a model's
        return f"a run folder, not a model folder; its checkpoints: {', '.join(kept) or 'none'}" + (
            f" (e.g. --checkpoint {folder / 'checkpoints' / kept[-1]})" if kept else ""
        )
    if any((folder / name).is_file() for name in MODEL_FILES):
        problem = chat_template_problem(folder)
        return problem.removeprefix(f"{folder}: ") if problem else None
    if re.fullmatch(r"step-\d+", folder.name) and folder.parent.is_dir():
        run = folder.parent.parent
        kept = _kept_checkpoints(run)
        if not folder.exists():
            keep = _run_setting(run, "keep_checkpoints")
            why = (
                f"a run keeps its {keep} newest checkpoint(s) (--keep-checkpoints), older "
                "ones are removed"
                if keep
                else "removed or never written"
            )
            return f"no such checkpoint ({why}); {folder.parent} holds " + (
                ", ".join(kept) if kept else "none"
            )
    if not folder.exists():
        return "no such folder"
    return "not a model folder (no config.json)"


def _kept_checkpoints(run: Path) -> list[str]:
    """The names of a run folder's checkpoints that hold a model, oldest first."""
    folder = run / "checkpoints"
    if not folder.is_dir():
        return []
    return sorted(
        p.name for p in folder.glob("step-*") if any((p / f).is_file() for f in MODEL_FILES)
    )


def _run_setting(run: Path, name: str) -> Any:
    """A field of a run folder's config.json, or None where it cannot be read."""
    from thundersync.training.config_files import load_saved_config

    try:
        return load_saved_config(run / "config.json").get(name)
    except (DocumentError, OSError, ValueError):
        return None
