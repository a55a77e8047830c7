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

import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from thundersync.declared import (
    DOCSTRINGS,
    Fraction,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Sandbox,
    Seed,
    Text,
    check_fields,
)


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

    def __post_init__(self) -> None:
        check_fields(self)  # types and ranges, as the annotations declare
        if self.hidden_size % self.num_heads:
            raise ValueError(f"config field 'hidden_size': expected a multiple of num_heads "
                             f"({self.num_heads}), got {self.hidden_size}")  # fmt: skip


Demo = list[tuple[str, str]]
"""(role, text) messages: the instruction, then alternating actions and observations."""


def collect_demos(config: WarmStartConfig, *, corrupt_fraction: float,
                  first: int = 0, num_threads: int = 8) -> list[Demo]:  # fmt: skip
    """Play ``num_demos`` drawn tasks' reference solutions (``corrupt_fraction`` of them
    corrupted) in a real env; a function of the config's seed only (threads just overlap
    sandboxes)."""
    from concurrent.futures import ThreadPoolExecutor

    indices = range(first, first + config.num_demos)
    with ThreadPoolExecutor(num_threads) as pool:
        return list(pool.map(lambda i: _demo(config, i, corrupt_fraction), indices))


def _demo(config: WarmStartConfig, index: int, corrupt_fraction: float) -> Demo:
    import gymnasium
    import numpy as np

    import environments  # noqa: F401  (registers the built-in envs)
    from environments.actions import format_action
    from environments.agents import SUBMIT_ACTION
    from environments.registry import task_source
    from environments.tasks import TRAIN

    rng = random.Random(f"{config.seed}/{index}")
    kwargs = {"sandbox": config.sandbox, **(config.env_kwargs or {})}
    task = task_source(config.env, **kwargs).draw(
        np.random.default_rng([config.seed, index]), TRAIN
    )
    env = gymnasium.make(config.env, **kwargs)  # made for the task
    try:
        commands = list(task.reference_solution())
        if rng.random() < corrupt_fraction and commands:
            commands = [_redraw_numbers(commands[-1], rng)]
        observation, _ = env.reset(seed=index, options={"task": task})
        demo: Demo = [("user", observation)]
        for action in [format_action(c) for c in commands] + [SUBMIT_ACTION]:
            observation, _, terminated, truncated, _ = env.step(action)
            demo.append(("assistant", action))
            if terminated or truncated:
                break
            demo.append(("user", observation))
        return demo
    finally:
        env.close()


def _redraw_numbers(command: str, rng: random.Random) -> str:
    return re.sub(r"\d+", lambda m: str(rng.randint(0, 10 ** len(m.group()) - 1)), command)


def warm_start(config: WarmStartConfig, out_dir: str | Path) -> Path:
    """Build the tokenizer and model, fine-tune on the demonstrations, save to ``out_dir``."""
    from thundersync.models import build_tiny_model, load_model, load_tokenizer

    demos = collect_demos(config, corrupt_fraction=0.0)
    mixture = []
    if config.bias_steps:
        mixture = collect_demos(config, corrupt_fraction=config.corrupt_fraction,
                                first=config.num_demos)  # fmt: skip
    out = Path(out_dir)
    texts = [text for demo in demos + mixture for _, text in demo]
    build_tiny_model(
        out, config.arch, hidden_size=config.hidden_size, num_layers=config.num_layers,
        vocab_size=config.vocab_size, seed=config.seed, texts=texts,
        num_heads=config.num_heads, max_positions=config.max_positions,
    )  # fmt: skip
    model, tokenizer = load_model(out), load_tokenizer(out)
    _fine_tune(model, _examples(demos, tokenizer, config), config.steps, config.lr, config.seed)
    if config.bias_steps:
        _fine_tune(model, _examples(mixture, tokenizer, config), config.bias_steps,
                   config.lr / 3, config.seed + 1)  # fmt: skip
    model.save_pretrained(out)
    return out


def _examples(demos: list[Demo], tokenizer: Any, config: WarmStartConfig) -> list:
    examples = [_tokenize(demo, tokenizer) for demo in demos]
    return [e for e in examples if len(e[0]) <= config.max_positions]


def _tokenize(demo: Demo, tokenizer: Any) -> tuple[list[int], list[bool]]:
    """Ids of the conversation as the policy agent builds them, and which are action tokens."""
    from thundersync.training.chat import ChatFormat

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


def _fine_tune(model: Any, examples: list[tuple[list[int], list[bool]]], steps: int,
               lr: float, seed: int, batch_size: int = 16) -> None:  # fmt: skip
    """Cross-entropy on the action tokens only (the rest is context the policy is given)."""
    import torch

    rng = random.Random(seed)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    for _ in range(steps):
        batch = rng.sample(examples, min(batch_size, len(examples)))
        length = max(len(ids) for ids, _ in batch)
        ids_BL = torch.zeros((len(batch), length), dtype=torch.long)
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
    model.eval()
