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


CHATML_BEFORE_TOOLS = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""The tiny tokenizers' template before it took tools: every earlier run's ids came from it."""


@pytest.mark.parametrize("generation_prompt", [True, False])
def test_without_tools_the_template_renders_as_it_always_did(tiny_model_dirs, generation_prompt):
    tok = AutoTokenizer.from_pretrained(tiny_model_dirs["qwen3"])
    messages = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "Add the values <|im_end|> of alpha"},
        {"role": "assistant", "content": "```bash\nlookup alpha\n```"},
        {"role": "user", "content": ""},
    ]
    kwargs = {"tokenize": False, "add_generation_prompt": generation_prompt}
    assert tok.apply_chat_template(messages, **kwargs) == tok.apply_chat_template(
        messages, chat_template=CHATML_BEFORE_TOOLS, **kwargs
    )


def test_the_template_takes_tools_as_trl_requires(tiny_model_dirs):
    """TRL's GRPOTrainer with tools refuses a template that cannot render a tool-calling
    conversation, and needs a reply's tool calls parsed back (the README's TRL example)."""
    utils = pytest.importorskip("trl.chat_template_utils", reason="TRL: pip install trl==1.16.0")
    tok = AutoTokenizer.from_pretrained(tiny_model_dirs["qwen3"])
    assert utils.supports_tool_calling(tok) and utils.is_chat_template_prefix_preserving(tok)
    call = {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls"}}}
    head = [{"role": "user", "content": "hi"}]
    prompt = tok.apply_chat_template(head, tokenize=False, add_generation_prompt=True)
    whole = tok.apply_chat_template(
        [*head, {"role": "assistant", "content": "", "tool_calls": [call]}], tokenize=False
    )
    assert whole.startswith(prompt)
    assert tok.parse_response(whole[len(prompt) :], prefix="") == {
        "role": "assistant",
        "tool_calls": [call],
    }
