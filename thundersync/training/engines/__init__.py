"""Rollout engines behind one protocol (``protocol.Engine``): HF transformers and vLLM.

``build_engine`` is the one place an engine kind becomes an engine, for training's rollout
worker and for ``thundersync eval`` alike (torch and vLLM are imported only when it is called).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_engine(
    kind: str,
    model_dir: str | Path,
    *,
    dtype: str = "float32",
    device: str = "cpu",
    deterministic: bool = False,
    seed: int = 0,
) -> Any:
    """The engine ``kind`` (``hf`` or ``vllm``) on the checkpoint ``model_dir``, its parameters
    in ``dtype``; ``deterministic`` makes sampling batch-invariant. ``device`` places the HF
    engine; vLLM places itself (the device its build targets) and is seeded with ``seed``."""
    import torch

    torch_dtype = getattr(torch, dtype)
    if kind == "vllm":
        from thundersync.training.engines.vllm import VLLMEngine

        return VLLMEngine(model_dir, dtype=torch_dtype, batch_invariant=deterministic, seed=seed)
    if kind != "hf":
        raise ValueError(f"build_engine: engine {kind!r} is not 'hf' or 'vllm'")
    from thundersync.models import deterministic_cuda
    from thundersync.training.engines.hf import HFEngine

    if deterministic:
        deterministic_cuda(device)
    return HFEngine(model_dir, dtype=torch_dtype, device=device, batch_invariant=deterministic)
