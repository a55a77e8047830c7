"""Where a run's policy starts: its base model folder and the folder the learner loads first.

The base is ``--model``, or a tiny random model built in the run folder. Without ``--lora`` the
learner starts from the base (or a resumed run's last checkpoint); with it, from an adapter
folder: fresh adapters drawn from the run's seed on the base, saved once in the run folder
(``init-adapter/``), so every learner rank and the rollout engine load the same adapter
(``thundersync.lora``).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from thundersync.training.config import TrainConfig


def starting_point(
    config: TrainConfig, out: Path, found: Path | None, say: Callable[[str], None]
) -> tuple[str, str]:
    """(the base model's folder, the folder the learner and the engine load), absolute:
    workers (Ray actors) need not share the trainer's working directory."""
    base = os.path.abspath(config.model or _tiny_model(config, out, say))
    if found is not None:
        return base, os.path.abspath(found)
    settings = config.lora_settings()
    if settings is None:
        return base, base
    import torch

    from thundersync import lora
    from thundersync.models import load_model, load_tokenizer

    say(f"drawing LoRA adapters (rank {settings.rank}) for {base}")
    model = load_model(base, dtype=getattr(torch, config.dtype))
    folder = lora.initial_adapter(
        out / "init-adapter", model, load_tokenizer(base), settings, seed=config.seed
    )
    return base, os.path.abspath(folder)


def _tiny_model(config: TrainConfig, out: Path, say: Callable[[str], None]) -> Path:
    from thundersync.models import build_tiny_model

    folder = out / "init-model"
    if not (folder / "config.json").is_file():
        say(f"no --model given: building a tiny random model in {folder}")
        # vLLM's CPU attention needs a head_dim of 32 or more (the default tiny has 16).
        size, heads = (64, 2) if config.engine == "vllm" else (32, None)
        build_tiny_model(folder, seed=config.seed, hidden_size=size, num_heads=heads)
    return folder
