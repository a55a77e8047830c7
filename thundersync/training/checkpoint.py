"""Checkpoints: an ordinary Hugging Face model folder plus the trainer's state, written atomically.

``checkpoints/step-000003/`` holds the model (``save_pretrained``: loads with
``AutoModelForCausalLM.from_pretrained`` and vLLM; with ``--lora`` a PEFT adapter folder,
``adapter_config.json`` naming the base model's folder and the adapter's weights alone, which
``PeftModel.from_pretrained(base, folder)`` loads), its tokenizer, and ``trainer_state.pt``:
the optimizer state, the RNG states, the number of completed steps and the policy version.
It holds only tensors, numbers, strings and plain containers, and is read with
``torch.load(weights_only=True)``: a checkpoint folder may come from elsewhere, and a pickle
can run any code when loaded. A tampered or damaged file, or the state of another step than
its folder's name says, is a ``CheckpointError`` naming it, found by ``check_resumable``
before a resumed run starts anything.
A checkpoint is written to a hidden temporary folder and renamed into place, so a run killed
while saving leaves the previous checkpoint intact and no half-written one.
"""

from __future__ import annotations

import os
import pickle
import random
import re
import shutil
import zipfile
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import torch

from thundersync.protocol.documents import excerpt
from thundersync.protocol.errors import ThunderSyncError

if TYPE_CHECKING:
    from transformers import PreTrainedModel

STATE_FILE = "trainer_state.pt"
_PREFIX = "step-"
_KEYS = ("completed_steps", "policy_version", "optimizer", "rng")


class CheckpointError(ThunderSyncError, ValueError):
    """A trainer state file that cannot be loaded safely: damaged, or holding objects other
    than tensors and plain data (a pickle that could run code). The message names the file."""


def _numpy_globals() -> list[Any]:
    """What a state saved before the RNG states became plain data needs: numpy's state was an
    ndarray of uint32 (these rebuild an array and run nothing else)."""
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy 1.x
        from numpy.core.multiarray import _reconstruct  # type: ignore[no-redef]
    return [_reconstruct, np.ndarray, np.dtype, type(np.dtype(np.uint32))]


def save_checkpoint(
    folder: Path,
    model: torch.nn.Module,
    tokenizer: Any,
    optimizer: torch.optim.Optimizer,
    *,
    completed_steps: int,
    policy_version: int,
    keep: int,
) -> Path:
    """Write ``folder/step-{completed_steps:06d}`` and prune all but the ``keep`` newest."""
    final = folder / f"{_PREFIX}{completed_steps:06d}"
    tmp = folder / f".tmp-{_PREFIX}{completed_steps:06d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    cast("PreTrainedModel", model).save_pretrained(tmp)  # a Hugging Face model or PeftModel
    tokenizer.save_pretrained(tmp)
    state = {
        "completed_steps": completed_steps,
        "policy_version": policy_version,
        "optimizer": optimizer.state_dict(),
        "rng": {
            "python": random.getstate(),
            "numpy": _numpy_state(),
            "torch": torch.get_rng_state(),
        },
    }
    torch.save(state, tmp / STATE_FILE)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    for old in list_checkpoints(folder)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(folder: Path) -> list[Path]:
    """Complete checkpoints, oldest first."""
    if not folder.is_dir():
        return []
    found = [
        p for p in folder.iterdir() if p.name.startswith(_PREFIX) and (p / STATE_FILE).is_file()
    ]
    return sorted(found, key=lambda p: p.name)


def _numpy_state() -> dict[str, Any]:
    """numpy's global RNG state as plain data (its ``get_state`` holds an ndarray)."""
    state = np.random.get_state()
    if not isinstance(state, tuple):  # a global RNG of another bit generator than MT19937
        raise TypeError(f"numpy's global RNG state is {state.get('bit_generator')!r}, not MT19937")
    name, keys, pos, has_gauss, cached_gaussian = state
    return {
        "name": name,
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached_gaussian),
    }


def load_state(checkpoint: Path, *, mmap: bool = False) -> dict[str, Any]:
    """The trainer state of a checkpoint folder (optimizer, RNG, steps, version), loaded
    without running code; CheckpointError naming the file when it is damaged, holds anything
    but plain data, or lacks a field. ``mmap``: map tensors instead of reading them (a check)."""
    file = checkpoint / STATE_FILE
    try:
        with torch.serialization.safe_globals(_numpy_globals()):
            state = torch.load(file, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        reason = next((line for line in lines if "global" in line.lower()), lines[-1:] or [""])
        raise CheckpointError(
            f"{file}: refused: it holds objects other than tensors and plain data (a pickle "
            f"that could run code when loaded): {excerpt(reason)}"
        ) from None
    except (OSError, RuntimeError, EOFError, ValueError, zipfile.BadZipFile) as err:
        reason = " ".join(str(err).split()) or type(err).__name__
        raise CheckpointError(f"{file}: not a readable trainer state: {excerpt(reason)}") from None
    if not isinstance(state, dict) or any(key not in state for key in _KEYS):
        raise CheckpointError(f"{file}: expected a trainer state with fields {', '.join(_KEYS)}")
    _check_step(checkpoint, state, file)
    return state


def _check_step(checkpoint: Path, state: dict[str, Any], file: Path) -> None:
    """CheckpointError unless a ``step-N`` folder's state is the state after step N. Saving
    names the folder after the state, so a mismatch is a state copied in from another step:
    resumed, it would continue after the state's step from the folder's weights, redoing the
    updates between them (or skipping them) without a word."""
    match = re.fullmatch(rf"{_PREFIX}(\d+)", checkpoint.name)
    steps = state["completed_steps"]
    if match is None or (type(steps) is int and steps == int(match[1])):
        return
    raise CheckpointError(
        f"{file}: holds the trainer state after step {excerpt(steps)}, but its folder "
        f"{checkpoint.name} is the checkpoint after step {int(match[1])} (a state copied from "
        "another step?): resuming would redo or skip updates; restore the folder's own state "
        "or remove the folder"
    )


def check_resumable(folder: Path) -> Path | None:
    """The newest checkpoint under ``folder`` (None if there is none), after checking that
    its trainer state loads safely: a resumed run reports a damaged one before it starts."""
    found = list_checkpoints(folder)
    if found:
        load_state(found[-1], mmap=True)
    return found[-1] if found else None


def restore_rng(state: dict[str, Any]) -> None:
    rng = state["rng"]
    random.setstate(rng["python"])
    numpy_state = rng["numpy"]
    if isinstance(numpy_state, dict):
        keys = numpy_state["keys"].numpy().astype(np.uint32)
        numpy_state = (
            numpy_state["name"],
            keys,
            numpy_state["pos"],
            numpy_state["has_gauss"],
            numpy_state["cached_gaussian"],
        )
    np.random.set_state(numpy_state)
    torch.set_rng_state(rng["torch"])


def remove_temporaries(folder: Path) -> None:
    """Remove half-written checkpoints a killed run left behind."""
    if folder.is_dir():
        for p in folder.iterdir():
            if p.name.startswith(f".tmp-{_PREFIX}"):
                shutil.rmtree(p, ignore_errors=True)


class Checkpoints:
    """A run's ``checkpoints/`` folder: where a resumed run starts, when a step is saved
    (every ``every`` steps and after the last), and what to do after a failed step."""

    def __init__(self, folder: Path, *, every: int, last_step: int, keep: int) -> None:
        self.folder, self.every, self.last_step, self.keep = folder, every, last_step, keep

    def start(self, *, resume: bool) -> Path | None:
        """The checkpoint a run starts from (the newest when resuming, else None), once a
        killed run's half-written ones are removed."""
        remove_temporaries(self.folder)
        found = list_checkpoints(self.folder) if resume else []
        return found[-1] if found else None

    def is_due(self, completed_steps: int) -> bool:
        return completed_steps % self.every == 0 or completed_steps == self.last_step

    def save(
        self,
        model: torch.nn.Module,
        tokenizer: Any,
        optimizer: torch.optim.Optimizer,
        *,
        completed_steps: int,
        policy_version: int,
    ) -> Path:
        return save_checkpoint(
            self.folder,
            model,
            tokenizer,
            optimizer,
            completed_steps=completed_steps,
            policy_version=policy_version,
            keep=self.keep,
        )

    def after_failed_step(self) -> str:
        """What a user does after a step that would have made the parameters non-finite."""
        found = list_checkpoints(self.folder)
        if found:
            return f"the last good checkpoint is {found[-1]}: lower --lr and continue with --resume"
        return "no checkpoint yet: lower --lr and start again"
