"""Incremental chat-template tokenisation: the prompt once, then each observation appended as
the template wraps a user turn after an assistant turn — so the ids the policy saw are built
once and never re-tokenised (re-tokenising a multi-turn conversation silently changes ids
and breaks exactness; docs/design.md §2).

The template's own text (role headers, end-of-turn markers) is tokenised with special tokens;
the prompt's and observations' content is tokenised with special tokens split, so a tool's
output that prints ``<|im_end|>`` cannot forge a turn boundary.

A Hugging Face fast tokenizer switches special-token splitting with a flag on its shared Rust
tokenizer, so two episode threads encoding at once (one a template part, one content) can each
get the other's setting — observed as the same observation encoded to different ids in two
runs. Content is therefore encoded by a private copy of the Rust tokenizer whose flag is set
once (splitting on, no truncation or padding: exactly what the Hugging Face call does for
``split_special_tokens=True``), which no other call touches; it also skips the Python wrapper
around each call, which cost more than the encoding itself for an observation. Every other
tokenizer call, and content with a tokenizer that has no Rust backend, holds a lock.

Content that comes again is not encoded again: a group's episodes share their prompt, and
agents meet the same observations over and over (a format error's correction, "command not
found", an empty output). The last ``CACHED_TEXTS`` distinct texts of up to
``CACHED_TEXT_CHARS`` characters keep their ids (encoding is a pure function of the text);
longer ones, which rarely repeat, are encoded each time. Likewise the text of the last
``CACHED_TEXTS`` distinct actions of up to ``CACHED_ACTION_IDS`` ids: a group's samples of one
task, and a policy that has learnt a task, sample the same actions again (decoding costs more
than an instant tool's step).
"""

from __future__ import annotations

import copy
import functools
import threading
from collections.abc import Callable
from typing import Any

CACHED_TEXTS = 256
CACHED_TEXT_CHARS = 16_384
CACHED_ACTION_IDS = 1024

_USER, _ASSISTANT, _OBSERVATION = "\x00\x01U\x01\x00", "\x00\x01A\x01\x00", "\x00\x01O\x01\x00"


class ChatFormatError(ValueError):
    """The tokenizer has no usable chat template."""


class ChatFormat:
    """Token ids of an agent conversation under ``tokenizer``'s chat template.

    ``prompt_ids(instruction)`` ends with the generation prompt (the assistant header);
    ``observation_ids(text)`` is what follows an action: the rest of the assistant turn after
    its end-of-turn token (which the policy samples itself and which ends its action), the
    user turn holding ``text``, and the next generation prompt. ``stop_ids`` end an action.
    """

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ChatFormatError(
                f"{getattr(tokenizer, 'name_or_path', 'tokenizer')}: no chat_template; a policy "
                "agent needs one to wrap prompts and observations"
            )
        self.tokenizer = tokenizer
        self._lock = threading.Lock()
        self._encode_content = _content_encoder(tokenizer, self._lock)
        self._cached_content = functools.lru_cache(CACHED_TEXTS)(self._encode_content)
        self._cached_text = functools.lru_cache(CACHED_TEXTS)(self._decode)
        render = tokenizer.apply_chat_template
        opening = render(
            [{"role": "user", "content": _USER}], tokenize=False, add_generation_prompt=True
        )
        self._prompt_head, self._prompt_tail = _split(opening, _USER)
        three = render(
            [
                {"role": "user", "content": _USER},
                {"role": "assistant", "content": _ASSISTANT},
                {"role": "user", "content": _OBSERVATION},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        between = three[three.index(_ASSISTANT) + len(_ASSISTANT) :]
        head, self._observation_tail = _split(between, _OBSERVATION)
        end_of_turn = _end_of_turn_token(tokenizer, head)
        self._observation_head = head[len(end_of_turn) :]
        self.end_of_turn_id = int(tokenizer.convert_tokens_to_ids(end_of_turn))
        self._templates = {  # the template's four fixed texts, tokenised once
            text: self._encode_template(text)
            for text in (
                self._prompt_head,
                self._prompt_tail,
                self._observation_head,
                self._observation_tail,
            )
        }
        stops = {self.end_of_turn_id, tokenizer.eos_token_id}
        self.stop_ids = tuple(sorted(i for i in stops if isinstance(i, int)))

    def prompt_ids(self, instruction: str) -> tuple[int, ...]:
        return (
            self._template(self._prompt_head)
            + self.content_ids(instruction)
            + self._template(self._prompt_tail)
        )

    def observation_ids(self, observation: str) -> tuple[int, ...]:
        return (
            self._template(self._observation_head)
            + self.content_ids(observation)
            + self._template(self._observation_tail)
        )

    def action_text(self, token_ids: tuple[int, ...]) -> str:
        """The text of sampled ids for the env (special tokens such as the stop id dropped)."""
        if len(token_ids) <= CACHED_ACTION_IDS:
            return self._cached_text(tuple(token_ids))
        return self._decode(token_ids)

    def _decode(self, token_ids: tuple[int, ...]) -> str:
        with self._lock:
            return self.tokenizer.decode(list(token_ids), skip_special_tokens=True)

    def _template(self, text: str) -> tuple[int, ...]:
        return self._templates[text]

    def _encode_template(self, text: str) -> tuple[int, ...]:
        if not text:
            return ()
        with self._lock:
            return tuple(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def content_ids(self, text: str) -> tuple[int, ...]:
        """Ids of message content, special-token strings in it split as plain text."""
        if not text:
            return ()
        if len(text) <= CACHED_TEXT_CHARS:
            return self._cached_content(text)
        return self._encode_content(text)


def _content_encoder(tokenizer: Any, lock: threading.Lock) -> Callable[[str], tuple[int, ...]]:
    """Content text -> ids with special-token strings split as plain text: a private copy of
    a fast tokenizer's Rust backend (see the module docstring), else the tokenizer's own call
    under ``lock``."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:

        def encode_locked(text: str) -> tuple[int, ...]:
            with lock:
                encoded = tokenizer(text, add_special_tokens=False, split_special_tokens=True)
            return tuple(encoded["input_ids"])

        return encode_locked
    with lock:
        content = copy.deepcopy(backend)
    content.no_truncation()
    content.no_padding()
    content.encode_special_tokens = True
    return lambda text: tuple(content.encode(text, add_special_tokens=False).ids)


def _end_of_turn_token(tokenizer: Any, after_assistant: str) -> str:
    """The special token that ends an assistant turn (the policy samples it, ending its
    action): the eos token, or the longest special token the template puts there."""
    special = sorted(set(tokenizer.all_special_tokens) | {tokenizer.eos_token or ""}, key=len)
    for token in reversed(special):
        if token and after_assistant.startswith(token):
            return token
    raise ChatFormatError(
        f"chat template: an assistant turn ends with {after_assistant[:20]!r}, not a special "
        "token; cannot tell where a sampled action ends"
    )


def _split(text: str, sentinel: str) -> tuple[str, str]:
    if text.count(sentinel) != 1:
        raise ChatFormatError("chat template: could not locate a message's content in its output")
    head, tail = text.split(sentinel)
    return head, tail
