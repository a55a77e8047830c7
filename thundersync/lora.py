"""LoRA adapters (``peft``): the settings, adapter folders, the synced parameters, the KL reference.

With ``--lora`` the learner trains the adapter parameters only: the base model's weights are
frozen (``requires_grad`` off), so the learner's ``Policy.params``, its accumulators and the
optimizer state are adapter-sized, and the exact-streaming algebra is unchanged (a gradient
with respect to fewer parameters). GRPO's KL reference is the base model itself, run with
the adapters disabled (``BaseOfAdapter``): no second copy of the weights in memory.

An adapter folder is what ``PeftModel.save_pretrained`` writes (``adapter_config.json`` and
``adapter_model.safetensors``), whose ``base_model_name_or_path`` names the base model's
folder; ``thundersync.models.load_model`` loads one as base + adapter. Only the adapter moves
to the rollout engine after a step (``synced_parameters``).
"""

from __future__ import annotations

import json
import typing
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from thundersync.declared import DOCSTRINGS, PositiveInt, check_fields

ADAPTER_CONFIG = "adapter_config.json"
MARK = "lora_"
"""What the name of every adapter parameter holds (``...q_proj.lora_A.default.weight``)."""


@dataclass(frozen=True, slots=True)
class LoraSettings:
    """The ``lora`` table of a train config (``--lora '{"rank": 16}'``; ``--lora``: defaults)."""

    __pydantic_config__ = DOCSTRINGS

    rank: PositiveInt = 8
    """r: the rank of each adapter's A (r x in) and B (out x r)."""
    alpha: PositiveInt = 16
    """The adapter's output is scaled by alpha / rank."""
    dropout: float = 0.0
    """Dropout on the adapter's input: only 0 (the learner computes every gradient in eval
    mode, so that it is a function of the parameters and the data: dropout would do nothing)."""
    target_modules: tuple[str, ...] | None = None
    """Names of the linear layers that get adapters (e.g. ["q_proj", "v_proj"], or
    ["all-linear"]); None: peft's default for the architecture."""

    def __post_init__(self) -> None:
        check_fields(self, "config field 'lora':")
        if self.dropout != 0.0:
            raise ValueError(
                f"config field 'lora': dropout {self.dropout!r}: expected 0 (the learner "
                "computes gradients in eval mode, where dropout does nothing)"
            )

    @classmethod
    def from_table(cls, table: dict[str, Any]) -> LoraSettings:
        """The settings of a config's ``lora`` table; a ValueError naming an unknown key."""
        known = [f.name for f in fields(cls)]
        unknown = sorted(set(table) - set(known))
        if unknown:
            raise ValueError(f"config field 'lora': unknown key(s) {unknown}; it takes {known}")
        values = dict(table)
        if isinstance(values.get("target_modules"), list):
            values["target_modules"] = tuple(values["target_modules"])
        return cls(**values)

    def peft_config(self, *, init: bool | str = True) -> Any:
        """peft's ``LoraConfig`` (``init=False``: B random as well as A, which ``verify``
        uses so that every adapter parameter has a gradient)."""
        from peft import LoraConfig

        targets = list(self.target_modules) if self.target_modules else None
        if targets == ["all-linear"]:
            targets = "all-linear"  # type: ignore[assignment]
        return LoraConfig(
            r=self.rank,
            lora_alpha=self.alpha,
            lora_dropout=0.0,
            target_modules=targets,
            init_lora_weights=init,  # type: ignore[arg-type]
            task_type="CAUSAL_LM",
        )


def add_adapters(
    model: torch.nn.Module, settings: LoraSettings, *, seed: int, init: bool | str = True
) -> Any:
    """``model`` (modified in place) wrapped as a ``PeftModel`` with fresh adapters drawn from
    ``seed``; its base weights frozen, in eval mode."""
    from peft import get_peft_model

    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # peft asks a deprecated name
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")  # GPT-2's Conv1D: right
        torch.manual_seed(seed)
        peft_model = get_peft_model(
            typing.cast(Any, model), settings.peft_config(init=init), autocast_adapter_dtype=False
        )
    peft_model.eval()
    return peft_model


def is_adapter_folder(folder: str | Path) -> bool:
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def base_of_folder(folder: str | Path) -> str:
    """The base model an adapter folder names (``base_model_name_or_path``); a ValueError
    naming the file when it names none."""
    file = Path(folder) / ADAPTER_CONFIG
    try:
        base = json.loads(file.read_text()).get("base_model_name_or_path")
    except (OSError, ValueError, AttributeError) as exc:
        raise ValueError(f"{file}: not a readable adapter config ({exc})") from None
    if not isinstance(base, str) or not base:
        raise ValueError(f"{file}: base_model_name_or_path names no base model, got {base!r}")
    return base


def load_policy(folder: str | Path, *, dtype: torch.dtype) -> Any:
    """``thundersync.models.load_model``, or for an adapter folder its base model (the folder
    or hub id it names) with the adapter: trainable (the engine freezes its own copy), in
    the adapter's saved dtype (no upcast: the learner and the engine load the same bits)."""
    from thundersync.models import load_model, model_folder

    if not is_adapter_folder(folder):
        return load_model(folder, dtype=dtype)
    from peft import PeftModel

    base = load_model(model_folder(base_of_folder(folder), option=str(folder)), dtype=dtype)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)  # peft asks a deprecated name
        model = PeftModel.from_pretrained(
            typing.cast(Any, base), str(folder), is_trainable=True, autocast_adapter_dtype=False
        )
    model.eval()
    return model


def is_adapted(model: torch.nn.Module) -> bool:
    """Whether ``model`` carries LoRA adapters (a ``PeftModel``)."""
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


def synced_parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    """What reaches the rollout engine after a step, in ``named_parameters`` order: the
    adapter's parameters for an adapted model, every parameter otherwise."""
    if is_adapted(model):
        return [p for name, p in model.named_parameters() if MARK in name]
    return list(model.parameters())


class BaseOfAdapter(torch.nn.Module):
    """The base model under an adapted model, as a module of its own: its forward is the
    adapted model's with the adapters disabled (peft's ``disable_adapter()``), sharing every
    weight. GRPO's KL reference with ``--lora``; used without gradients."""

    adapted: Any

    def __init__(self, adapted: torch.nn.Module) -> None:
        super().__init__()
        object.__setattr__(self, "adapted", adapted)  # not a submodule: no second registration
        self.config = getattr(adapted, "config", None)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        with self.adapted.disable_adapter():
            return self.adapted(*args, **kwargs)

    def parameters(self, recurse: bool = True) -> Any:  # the dtype and device Policy reads
        return self.adapted.parameters(recurse)

    def get_input_embeddings(self) -> Any:
        return self.adapted.get_input_embeddings()

    def get_output_embeddings(self) -> Any:
        return self.adapted.get_output_embeddings()


def initial_adapter(
    out: Path, base: torch.nn.Module, tokenizer: Any, settings: LoraSettings, *, seed: int
) -> Path:
    """The run's starting adapter on ``base`` (modified in place), saved in ``out`` with the
    base's tokenizer, so the learner (every rank) and the rollout engine load the same one."""
    model = add_adapters(base, settings, seed=seed)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def adapter_numel(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in synced_parameters(model))
