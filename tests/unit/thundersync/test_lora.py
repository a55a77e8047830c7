"""LoRA adapters (``thundersync.lora``): the learner trains and holds only the adapter, the
frozen base is the KL reference and stays bitwise unchanged, streaming equals sync bitwise on
adapters, an adapter folder reloads to the same log-probs, and the engine takes the adapter
alone."""

from __future__ import annotations

import pytest
import torch

from tests.unit.thundersync.learner_batches import informative_batch
from thundersync import GRPO, Learner
from thundersync.core.random_batches import BatchShape
from thundersync.models import load_model
from thundersync.verify import _adapted_pair, certify, variants

pytest.importorskip("peft")

from thundersync.lora import (  # noqa: E402
    BaseOfAdapter,
    LoraSettings,
    add_adapters,
    load_policy,
    synced_parameters,
)

CHEAP = BatchShape(max_groups=2, min_groups=2, max_group_size=3, max_turns=2, max_tokens=32)
SETTINGS = LoraSettings(rank=2, target_modules=("all-linear",))


def adapted(folder, *, dtype=torch.float64, init: bool | str = False):
    return add_adapters(load_model(folder, dtype=dtype), SETTINGS, seed=0, init=init)


def base_weights(model) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad}


def step(model, events, *, streaming: bool, deterministic: bool = True, lr: float = 0.1):
    trainable = [p for p in model.parameters() if p.requires_grad]
    learner = Learner(
        model,
        GRPO(kl_coef=0.1),
        torch.optim.SGD(trainable, lr=lr),
        streaming=streaming,
        deterministic=deterministic,
        reference=BaseOfAdapter(model),
        max_grad_norm=None,
    )
    for event in events:
        learner.consume(event)
    return learner, learner.step()


def test_settings_refuse_what_they_cannot_do_naming_the_field():
    with pytest.raises(ValueError, match=r"'lora'.*unknown key.*'rnk'"):
        LoraSettings.from_table({"rnk": 4})
    with pytest.raises(ValueError, match=r"'lora'.*dropout 0.1.*eval mode"):
        LoraSettings.from_table({"dropout": 0.1})
    with pytest.raises(ValueError, match=r"'lora'.*rank"):
        LoraSettings.from_table({"rank": 0})
    table = LoraSettings.from_table({"rank": 4, "target_modules": ["q_proj"]})
    assert (table.rank, table.target_modules) == (4, ("q_proj",))


def test_the_lora_flag_alone_means_the_defaults_and_a_toml_table_sets_them(tmp_path):
    import argparse

    from thundersync.training.config_files import (
        add_config_flags,
        load_config_file,
        resolve_config,
    )

    parser = argparse.ArgumentParser()
    add_config_flags(parser)
    assert resolve_config(parser.parse_args([])).lora is None  # full fine-tuning by default
    assert resolve_config(parser.parse_args(["--lora"])).lora == {}
    given = resolve_config(parser.parse_args(["--lora", '{"rank": 4}']))
    assert given.lora_settings() == LoraSettings(rank=4)
    file = tmp_path / "run.toml"
    file.write_text('[lora]\nrank = 16\ntarget_modules = ["q_proj", "v_proj"]\n')
    config = resolve_config(parser.parse_args([]), load_config_file(file))
    assert config.lora_settings() == LoraSettings(rank=16, target_modules=("q_proj", "v_proj"))


def test_engine_vllm_takes_lora():
    """vLLM serves the adapter as a LoRARequest per sync (tests/integration/test_vllm_engine.py
    checks it against the installed vLLM)."""
    from thundersync.training.config import TrainConfig

    assert TrainConfig(engine="vllm", lora={}).lora_settings() == LoraSettings()


def test_the_learner_trains_and_buffers_the_adapter_only_and_the_base_is_untouched(
    tiny_model_dirs,
):
    model = adapted(tiny_model_dirs["qwen3"])
    adapter = sum(p.numel() for p in synced_parameters(model))
    total = sum(p.numel() for p in model.parameters())
    assert 0 < adapter < total / 4
    before = base_weights(model)
    trained = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    learner, metrics = step(model, informative_batch(model), streaming=True, deterministic=False)
    assert learner.pool.numel == adapter  # each accumulator is adapter-sized
    assert 0 < metrics["peak_buffer_bytes"] <= 3 * adapter * 8
    after = base_weights(model)
    assert before.keys() == after.keys() and all(torch.equal(before[n], after[n]) for n in before)
    changed = [n for n, p in model.named_parameters() if p.requires_grad]
    assert any(not torch.equal(trained[n], dict(model.named_parameters())[n]) for n in changed)
    assert metrics["kl_reference"] is not None and metrics["kl_reference"] > 0


def test_the_reference_is_the_base_model_with_the_adapters_off(tiny_model_dirs):
    folder = tiny_model_dirs["qwen3"]
    model = adapted(folder)
    plain = load_model(folder, dtype=torch.float64)  # an independent copy of the base
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    with torch.no_grad():
        base = BaseOfAdapter(model)(input_ids=ids).logits
        with_adapter = model(input_ids=ids).logits
        expected = plain(input_ids=ids).logits
    assert torch.equal(base, expected)
    assert not torch.equal(with_adapter, expected)


def test_deterministic_streaming_equals_sync_bitwise_on_adapters(tiny_model_dirs):
    events = None
    grads = []
    for streaming in (False, True):
        model = adapted(tiny_model_dirs["gpt2"])
        events = events or informative_batch(model)
        step(model, events, streaming=streaming, lr=0.0)
        found = [p.grad for p in synced_parameters(model)]
        assert all(g is not None for g in found)
        grads.append(torch.cat([g.reshape(-1) for g in found if g is not None]))
    assert grads[0].abs().sum() > 0
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize(("arch", "name"), [("gpt2", "grpo-kl-k3"), ("qwen3", "opd-turn")])
def test_the_certificate_holds_on_adapters(tiny_model_dirs, arch, name):
    model = load_model(tiny_model_dirs[arch], dtype=torch.float64)
    label, model, reference = _adapted_pair(arch, model, seed=5)  # what verify --lora checks
    assert label == f"{arch}+lora" and isinstance(reference, BaseOfAdapter)
    bound = 1e-12 if arch == "gpt2" else 1e-6
    variant = next(v for v in variants("all") if v.name == name)
    result = certify(
        model, variant, trials=1, seed=5, deterministic=True, shape=CHEAP, reference=reference
    )
    assert result["ok"] and result["bitwise_equal_deterministic"], result
    assert not result["zero_gradient"] and result["max_rel_err_stream_vs_textbook"] <= bound


def test_an_adapter_folder_reloads_on_its_base_with_the_same_logprobs(tiny_model_dirs, tmp_path):
    from peft import PeftModel

    folder = tiny_model_dirs["qwen3"]
    model = adapted(folder, dtype=torch.float32, init=False)
    model.save_pretrained(tmp_path / "adapter")
    ids = torch.tensor([[1, 5, 9, 42, 7]])
    reloaded = load_policy(tmp_path / "adapter", dtype=torch.float32)
    by_peft = PeftModel.from_pretrained(load_model(folder), str(tmp_path / "adapter"))
    with torch.no_grad():
        expected = model(input_ids=ids).logits
        assert torch.equal(reloaded(input_ids=ids).logits, expected)
        assert torch.equal(by_peft(input_ids=ids).logits, expected)
