"""The text space of a shell env's observations and actions: any Unicode string up to a length."""

from __future__ import annotations

import functools
import string
from typing import Any

import numpy as np
from gymnasium import spaces

MAX_ACTION_CHARS = 100_000
MAX_OBSERVATION_CHARS = 1_000_000


class UnicodeText(spaces.Text):
    """Any Unicode string of at most ``max_length`` characters (the empty string included).

    ``spaces.Text`` only contains strings over its charset (alphanumerics by default), which
    rejects shell commands and tool output. ``contains`` here accepts every ``str``; ``sample``
    draws printable ASCII strings of at most ``sample_max_length`` characters.
    """

    def __init__(
        self, max_length: int, *, sample_max_length: int = 64, seed: int | None = None
    ) -> None:
        if not isinstance(max_length, int | np.integer) or max_length < 0:
            raise ValueError(f"UnicodeText: max_length must be an integer >= 0, got {max_length!r}")
        # Text.__init__ builds its charset tables (a 100-entry index) for every instance, ~0.1
        # ms, and every env makes two spaces: the envs an agent loop starts per episode would
        # spend more on that than on their episode. The tables are never mutated, so they are
        # built once and shared; each space keeps its own RNG (Space.__init__).
        vars(self).update(_printable_tables())
        self.max_length = int(max_length)
        spaces.Space.__init__(self, dtype=str, seed=seed)
        self.sample_max_length = min(sample_max_length, self.max_length)

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        if mask is None and probability is None:
            length = int(self.np_random.integers(0, self.sample_max_length + 1))
            return super().sample(mask=(length, None))
        return super().sample(mask=mask, probability=probability)

    def __repr__(self) -> str:
        return f"UnicodeText({self.max_length})"


@functools.cache
def _printable_tables() -> dict[str, Any]:
    """The attributes ``spaces.Text.__init__`` sets for printable ASCII from length 0, less
    those of ``spaces.Space`` (the RNG): what ``UnicodeText`` shares."""
    prototype = spaces.Text(1, min_length=0, charset=string.printable)
    own = vars(spaces.Space(dtype=str))
    return {name: value for name, value in vars(prototype).items() if name not in own}
