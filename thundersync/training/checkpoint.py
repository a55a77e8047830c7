"""Checkpoints: an ordinary Hugging Face model folder plus the trainer's state, written atomically.

``checkpoints/step-000003/`` holds the model (``save_pretrained``: loads with
``AutoModelForCausalLM.from_pretrained`` and vLLM), its tokenizer, and ``trainer_state.pt``:
the optimizer state, the RNG states, the number of completed steps and the policy version.
A checkpoint is written to a hidden temporary folder and renamed into place, so a run killed
while saving leaves the previous checkpoint intact and no half-written one.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"
_PREFIX = "step-"


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
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    state = {
        "completed_steps": completed_steps,
        "policy_version": policy_version,
        "optimizer": optimizer.state_dict(),
        "rng": {
            "python": random.getstate(),
            "numpy": np.random.get_state(),
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


def load_state(checkpoint: Path) -> dict[str, Any]:
    """The trainer state of a checkpoint folder (optimizer, RNG, steps, version)."""
    return torch.load(checkpoint / STATE_FILE, map_location="cpu", weights_only=False)


def restore_rng(state: dict[str, Any]) -> None:
    rng = state["rng"]
    random.setstate(rng["python"])
    np.random.set_state(rng["numpy"])
    torch.set_rng_state(rng["torch"])


def remove_temporaries(folder: Path) -> None:
    """Remove half-written checkpoints a killed run left behind."""
    if folder.is_dir():
        for p in folder.iterdir():
            if p.name.startswith(f".tmp-{_PREFIX}"):
                shutil.rmtree(p, ignore_errors=True)
