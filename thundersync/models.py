"""Tiny causal LMs built locally from a config, with a locally trained tokenizer (no hub)."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal, TypedDict

import torch

Arch = Literal["qwen3", "llama", "gpt2"]

CHAT_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call these tools, each call on its own as "
    '<tool_call>\n{"name": <tool>, "arguments": <JSON object>}\n</tool_call>:\n<tools>'
    "{% for tool in tools %}{{ '\\n' }}{{ tool | tojson }}{% endfor %}{{ '\\n' }}</tools>"
    "<|im_end|>\n"
    "{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n"
    "{% if m['content'] is string %}{{ m['content'] }}{% endif %}"
    "{% for call in m['tool_calls'] or [] %}"
    "{% set f = call['function'] if call['function'] is defined else call %}"
    "{% if not loop.first or m['content'] %}{{ '\\n' }}{% endif %}"
    '<tool_call>\n{"name": "{{ f[\'name\'] }}", "arguments": '
    "{% if f['arguments'] is string %}{{ f['arguments'] }}{% else %}{{ f['arguments'] | tojson }}"
    "{% endif %}}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML. With ``tools`` (TRL's ``GRPOTrainer`` passes its environment's), a system turn
lists them and an assistant turn's ``tool_calls`` render as ``<tool_call>`` JSON, as Qwen's
templates do; without them it renders exactly as it always has (the ids of every earlier run
stay what they were)."""
RESPONSE_TEMPLATE = {
    "defaults": {"role": "assistant"},
    "start_anchor": "<|im_start|>assistant\n",
    "fields": {
        "tool_calls": {
            "open": "<tool_call>",
            "close_pattern": r"</tool_call>\s*",
            "repeats": True,
            "content": "json",
            "transform": {"type": "function", "function": "{content}"},
        },
        "content": {"close_pattern": r"<\|im_end\|>\s*", "content": "text"},
    },
}
"""How a reply under ``CHAT_TEMPLATE`` parses back into content and tool calls
(transformers' ``response_template``, saved with the tokenizer): what TRL reads a sampled tool
call with."""
SPECIAL_TOKENS = ["<|pad|>", "<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = """\
You are an agent working in a terminal. Run one command per turn inside a ```bash block.
ls -la /workspace && cat README.md && grep -rn "def " src/ | head -n 20
python3 -m pytest -q tests/test_parser.py::test_roundtrip
git status && git diff && git log --oneline -n 5 && git apply fix.patch
sed -i 's/return a - b/return a + b/' calc.py && echo THUNDERSYNC_SUBMIT
lookup alpha -> 17, lookup beta -> 25, calc 17+25 -> 42, answer 42
The tests failed: AssertionError: expected 3, got 4. Traceback (most recent call last):
File "/testbed/src/module.py", line 12, in main: KeyError: 'name'
{"reward": 1.0, "metrics": {"accuracy": 0.5}} exit code 0, timed out after 30 s
"""


def train_tokenizer(texts: list[str] | None = None, *, vocab_size: int = 512):
    """A byte-level BPE tokenizer trained in well under a second, with a chat template that
    takes tools (``CHAT_TEMPLATE``, ``RESPONSE_TEMPLATE``: TRL's tool-calling trainers refuse
    a template without them).

    Byte-level means every string encodes (no unknown tokens) and decodes back exactly.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(texts or _CORPUS.splitlines() * 4, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        pad_token="<|pad|>",
        eos_token="<|im_end|>",
        padding_side="left",
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.response_template = RESPONSE_TEMPLATE
    return fast


class _TokenIds(TypedDict):
    """The vocabulary and special-token ids every tiny config shares."""

    vocab_size: int
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int


def tiny_config(
    arch: Arch,
    vocab_size: int,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int | None = None,
    max_positions: int = 2048,
):
    """A Hugging Face config for a tiny model of ``arch`` with dropout off.

    Dropout is off because a learner's gradient must be a function of the parameters and
    the data only (exactness compares two computations of the same gradient).
    """
    from transformers import GPT2Config, LlamaConfig, Qwen3Config

    heads = num_heads or max(2, hidden_size // 16)
    common = _TokenIds(vocab_size=vocab_size, bos_token_id=1, eos_token_id=3, pad_token_id=0)
    if arch == "gpt2":
        return GPT2Config(
            n_embd=hidden_size,
            n_layer=num_layers,
            n_head=heads,
            n_positions=max_positions,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            **common,
        )
    cls = Qwen3Config if arch == "qwen3" else LlamaConfig
    return cls(
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 2),
        head_dim=hidden_size // heads,
        max_position_embeddings=max_positions,
        attention_dropout=0.0,
        tie_word_embeddings=False,
        **common,
    )


def build_tiny_model(
    out_dir: str | Path,
    arch: Arch = "qwen3",
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    vocab_size: int = 512,
    seed: int = 0,
    texts: list[str] | None = None,
    num_heads: int | None = None,
    max_positions: int = 2048,
) -> Path:
    """Build a randomly initialised tiny model and its tokenizer into ``out_dir``.

    ``texts`` is the tokenizer's training corpus (default: a small shell/agent corpus); a
    task's own text gives short token sequences. The folder is an ordinary checkpoint:
    ``AutoModelForCausalLM.from_pretrained`` and ``AutoTokenizer.from_pretrained`` reload it,
    bit-identically.
    """
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out = Path(out_dir)
    tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
    config = tiny_config(
        arch,
        len(tokenizer),
        hidden_size=hidden_size,
        num_layers=num_layers,
        num_heads=num_heads,
        max_positions=max_positions,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config)
    model.eval()
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def deterministic_cuda(device: str | torch.device) -> None:
    """On a CUDA ``device``, make this process's kernels deterministic (bitwise the same
    results run after run): cuBLAS's fixed workspace and torch's deterministic algorithms
    (e.g. one key split in memory-efficient attention's backward instead of atomic adds).
    Call before the process's first CUDA work; nothing on the CPU, which is already."""

    if torch.device(device).type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)


def load_model(path: str | Path, *, dtype: torch.dtype = torch.float32):
    """Load a checkpoint folder as a causal LM in ``dtype``, in eval mode (dropout off)."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()

    folder = Path(path)
    if not (folder / "config.json").is_file():
        raise FileNotFoundError(f"{folder}: not a model checkpoint (no config.json)")
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype)
    model.eval()
    return model


HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
"""A Hugging Face hub model id, ``org/name``."""


def model_folder(value: str | Path, *, option: str = "--model") -> str:
    """The model folder ``value`` names: a folder as given, or a Hugging Face hub id
    (``Qwen/Qwen2.5-0.5B-Instruct``) resolved to its snapshot in the local cache
    (``HF_HOME``/``HF_HUB_CACHE``; ``refs/main``). Nothing is ever downloaded: a hub id not in
    the cache is a one-line ValueError naming ``option`` and the command that downloads it.
    Whether the folder holds a model (``config.json``) is the caller's check."""
    text = str(value)
    if Path(text).expanduser().exists() or not HUB_ID.fullmatch(text):
        return text
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError

    try:
        return snapshot_download(text, local_files_only=True)
    except (LocalEntryNotFoundError, HFValidationError, OSError) as exc:
        local = _missing_local_folder(text)
        if local:
            raise ValueError(f"{option} {text}: no such folder ({local})") from None
        cause = "" if isinstance(exc, LocalEntryNotFoundError) else f" ({type(exc).__name__})"
        raise ValueError(
            f"{option} {text}: no such folder, and no model {text} in the local Hugging Face "
            f"cache ({constants.HF_HUB_CACHE}){cause}; download it first with "
            f"`hf download {text}` (or `huggingface-cli download {text}`): ThunderSync never "
            "downloads"
        ) from None


def _missing_local_folder(text: str) -> str | None:
    """What is there instead, when ``text`` (``org/name`` in form) names a folder under an
    existing one (``runs/warm`` with ``runs/`` here): the user meant a local path, not a hub
    id. None when its first part is no folder here (then it reads as a hub id)."""
    parent = Path(text).expanduser().parent
    if not parent.is_dir():
        return None
    names = sorted(p.name for p in parent.iterdir() if p.is_dir() and not p.name.startswith("."))
    shown = ", ".join(names[:8]) + (", ..." if len(names) > 8 else "")
    return f"{parent}/ holds {shown}" if names else f"{parent}/ holds no folder"


def load_tokenizer(path: str | Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(Path(path))
