"""Tiny models and tokenizers are built locally and reload as ordinary checkpoints."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from thundersync.models import load_model


@pytest.mark.parametrize("arch", ["gpt2", "qwen3", "llama"])
def test_tiny_checkpoint_reloads_bit_identically(tiny_model_dirs, arch):
    path = tiny_model_dirs[arch]
    a = AutoModelForCausalLM.from_pretrained(path).eval()
    b = load_model(path)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    assert torch.equal(a(input_ids=ids).logits, b(input_ids=ids).logits)
    assert not b.training


def test_tokenizer_round_trips_any_text_and_has_a_chat_template(tiny_model_dirs):
    tok = AutoTokenizer.from_pretrained(tiny_model_dirs["qwen3"])
    text = "ls -la /tmp && echo 'héllo wörld' ✓ \t\n"
    ids = tok(text)["input_ids"]
    assert ids and tok.decode(ids) == text
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
    )
    assert prompt.endswith("<|im_start|>assistant\n")
    assert tok.padding_side == "left" and tok.pad_token == "<|pad|>"


def test_load_model_names_a_folder_that_is_not_a_checkpoint(tmp_path):
    with pytest.raises(FileNotFoundError, match=str(tmp_path)):
        load_model(tmp_path)
