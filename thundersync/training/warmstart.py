"""Warm start: a tiny model and tokenizer built for an env and fine-tuned on its oracle's play.

RL from a random model learns nothing in a CPU budget, and an action that never appears in
the warm-start data is never discovered by GRPO. So the kit plays each drawn task's
``reference_solution()`` in the real sandbox, recording the conversation (instruction, each
action, each observation), trains a byte-level BPE tokenizer on those texts (short token
sequences), builds a tiny Llama-style model and fine-tunes it on the actions with the same
chat-template token ids the policy agent will use, in two phases: ``steps`` on the oracle's
play (the model learns to use the tools and copy their outputs), then ``bias_steps`` on a
mixture where ``corrupt_fraction`` of the demonstrations skip straight to the last command
with its numbers redrawn (answering without the tools). The warm model can use the tools but
mostly does not, so it solves a minority of tasks and RL has a decision to learn (the tasks
are drawn fresh each time, so guessing rarely pays).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from thundersync.declared import (
    DOCSTRINGS,
    Device,
    Fraction,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Sandbox,
    Seed,
    Text,
    check_fields,
)
from thundersync.training.chat import ChatFormat
from thundersync.training.demonstrations import Demo, Progress, collect_demos, no_progress


@dataclass(frozen=True, slots=True)
class WarmStartConfig:
    """How to build and fine-tune the warm model."""

    __pydantic_config__ = DOCSTRINGS

    env: Text = "thundersync/ToySum-v0"
    """Env whose drawn tasks' reference solutions are the demonstrations."""
    env_kwargs: dict[str, Any] | None = None
    """Keyword arguments for ``gymnasium.make``."""
    sandbox: Sandbox = "bwrap"
    """Where the demonstrations run (they are real episodes)."""
    num_demos: PositiveInt = 256
    """Demonstrations of the oracle's play (one drawn task each)."""
    steps: PositiveInt = 600
    """Fine-tuning steps on the oracle's play."""
    corrupt_fraction: Fraction = 0.85
    """In the second phase, the fraction of demonstrations that skip to the last command
    with its numbers redrawn."""
    bias_steps: NonNegativeInt = 60
    """Then fine-tuning steps on a mixture where ``corrupt_fraction`` of the demonstrations
    answer without the tools (0: none)."""
    lr: PositiveFloat = 3e-3
    """Fine-tuning learning rate (AdamW)."""
    arch: Literal["llama", "qwen3", "gpt2"] = "llama"
    """Model family of ``thundersync.models.tiny_config`` (llama, qwen3, gpt2; GPT-2 runs every
    op in the parameters' dtype, so float64 updates can be compared to 1e-12)."""
    hidden_size: PositiveInt = 64
    """Model width (a multiple of ``num_heads``)."""
    num_layers: PositiveInt = 2
    """Model depth."""
    num_heads: PositiveInt = 2
    """Attention heads."""
    vocab_size: PositiveInt = 400
    """Tokenizer size (byte alphabet + special tokens + BPE merges of the demo texts)."""
    max_positions: PositiveInt = 512
    """The model's context window."""
    seed: Seed = 0
    """Seeds the task draws, the corruption and the initialisation."""
    device: Device = "cpu"
    """Where the fine-tuning computes (cpu, cuda or cuda:N); the model is saved from there."""

    def __post_init__(self) -> None:
        check_fields(self)  # types and ranges, as the annotations declare
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"config field 'hidden_size': expected a multiple of num_heads "
                f"({self.num_heads}), got {self.hidden_size}"
            )


BUILD_PHASE = "tokenizer and model"
"""The phase between the demonstrations and fine-tuning: training the tokenizer, building the
model."""


MODEL_FILES = frozenset(
    {
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "tokenizer_config.json",
        "special_tokens_map.json",
        "chat_template.jinja",
    }
)
"""What a warm model folder holds: an --out holding only these (a previous warm start) is
replaced; one holding anything else is refused."""


def out_problem(out_dir: str | Path) -> str | None:
    """Why ``out_dir`` cannot receive the warm model (it holds files a warm start did not
    write, which replacing it would delete), or None."""
    out = Path(out_dir)
    if not out.is_dir():
        return None
    others = sorted(p.name for p in out.iterdir() if p.name not in MODEL_FILES)
    if others:
        shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
        return (
            f"{out} exists and holds what a warm model does not ({shown}); choose "
            "another folder or remove it"
        )
    return None


def describe(config: WarmStartConfig) -> str:
    """What the warm model is, in a sentence or two (printed by the command)."""
    made = (
        f"a tiny {config.arch} model (hidden {config.hidden_size}, {config.num_layers} "
        f"layers) and tokenizer for {config.env}, fine-tuned for {config.steps} steps on "
        f"{config.num_demos} oracle demonstrations"
    )
    if not config.bias_steps or not config.corrupt_fraction:
        return made + "; an imitation of the oracle (no bias phase)"
    return (
        made + f", then {config.bias_steps} steps on a mixture where "
        f"{config.corrupt_fraction:.0%} answer without the tools (--corrupt-fraction). "
        "Biased on purpose: it can use the tools but mostly guesses, so it solves a "
        "minority of tasks and RL has a decision to learn (--bias-steps 0: no bias)"
    )


def warm_start(
    config: WarmStartConfig, out_dir: str | Path, progress: Progress = no_progress
) -> Path:
    """Build the tokenizer and model, fine-tune on the demonstrations, save to ``out_dir``.

    The model is built in a temporary folder beside ``out_dir`` and renamed to it at the end,
    so an interrupted or failed run leaves no folder that looks like a model (the temporary
    one is removed on every path out but a hard kill, and its name says it is partial)."""

    problem = out_problem(out_dir)
    if problem:
        raise ValueError(problem)
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        _build(config, partial, progress)
        _replace(partial, out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return out


def _build(config: WarmStartConfig, folder: Path, progress: Progress) -> None:
    from thundersync.models import build_tiny_model, load_model, load_tokenizer

    demos = collect_demos(config, corrupt_fraction=0.0, progress=progress)
    mixture = []
    if config.bias_steps:
        mixture = collect_demos(
            config,
            corrupt_fraction=config.corrupt_fraction,
            first=config.num_demos,
            progress=progress,
            phase="biased demonstrations",
        )
    texts = [text for demo in demos + mixture for _, text in demo]
    progress(BUILD_PHASE, 0, 1)  # training the tokenizer takes a while: name it
    build_tiny_model(
        folder,
        config.arch,
        hidden_size=config.hidden_size,
        num_layers=config.num_layers,
        vocab_size=config.vocab_size,
        seed=config.seed,
        texts=texts,
        num_heads=config.num_heads,
        max_positions=config.max_positions,
    )
    model, tokenizer = load_model(folder).to(config.device), load_tokenizer(folder)
    _fine_tune(
        model,
        _examples(demos, tokenizer, config),
        config.steps,
        config.lr,
        config.seed,
        progress=_phase(progress, "fine-tuning"),
    )
    if config.bias_steps:
        _fine_tune(
            model,
            _examples(mixture, tokenizer, config),
            config.bias_steps,
            config.lr / 3,
            config.seed + 1,
            progress=_phase(progress, "bias fine-tuning"),
        )
    model.save_pretrained(folder)


def _phase(progress: Progress, name: str) -> Callable[[int, int], None]:
    return lambda done, total: progress(name, done, total)


def _replace(partial: Path, out: Path) -> None:
    """Rename the finished ``partial`` folder to ``out``; a previous warm model there (only
    model files: ``out_problem``) is moved aside first and removed after."""

    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        os.replace(partial, out)  # rename(2) replaces an empty folder
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.replace(out, old / "model")
    os.replace(partial, out)
    shutil.rmtree(old, ignore_errors=True)


def _examples(demos: list[Demo], tokenizer: Any, config: WarmStartConfig) -> list:
    examples = [_tokenize(demo, tokenizer) for demo in demos]
    return [e for e in examples if len(e[0]) <= config.max_positions]


def _tokenize(demo: Demo, tokenizer: Any) -> tuple[list[int], list[bool]]:
    """Ids of the conversation as the policy agent builds them, and which are action tokens."""

    chat = ChatFormat(tokenizer)
    ids: list[int] = list(chat.prompt_ids(demo[0][1]))
    is_action = [False] * len(ids)
    for role, text in demo[1:]:
        if role == "assistant":
            piece = list(chat.content_ids(text)) + [chat.end_of_turn_id]
            is_action += [True] * len(piece)
        else:
            piece = list(chat.observation_ids(text))
            is_action += [False] * len(piece)
        ids += piece
    return ids, is_action


def _fine_tune(
    model: Any,
    examples: list[tuple[list[int], list[bool]]],
    steps: int,
    lr: float,
    seed: int,
    batch_size: int = 16,
    progress: Callable[[int, int], None] | None = None,
) -> None:
    """Cross-entropy on the action tokens only (the rest is context the policy is given)."""
    import torch

    rng = random.Random(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    for step in range(steps):
        if progress is not None:  # at 0 too: the phase is named before its first step ends
            progress(step, steps)
        batch = rng.sample(examples, min(batch_size, len(examples)))
        length = max(len(ids) for ids, _ in batch)
        ids_BL = torch.zeros((len(batch), length), dtype=torch.long, device=model.device)
        mask_BL = torch.zeros_like(ids_BL)
        target_BL = torch.full_like(ids_BL, -100)
        for b, (ids, is_action) in enumerate(batch):
            ids_BL[b, : len(ids)] = torch.tensor(ids)
            mask_BL[b, : len(ids)] = 1
            labels = [t if a else -100 for t, a in zip(ids, is_action)]
            target_BL[b, : len(ids) - 1] = torch.tensor(labels[1:])
        logits_BLV = model(input_ids=ids_BL, attention_mask=mask_BL).logits
        loss = torch.nn.functional.cross_entropy(
            logits_BLV.reshape(-1, logits_BLV.shape[-1]), target_BL.reshape(-1)
        )
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
    if progress is not None:
        progress(steps, steps)
    model.eval()
