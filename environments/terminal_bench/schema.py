"""Typed field readers for task files: a bad value raises TaskFormatError naming file, field."""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from environments.tasks import TaskFormatError
from environments.terminal_bench import inputs
from thundersync.protocol.documents import excerpt

DIFFICULTIES = frozenset({"easy", "medium", "hard", "unknown"})
TASK_ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
"""Matched in full (``re.fullmatch``): ``$`` would let a trailing newline through."""
ENV_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""Environment variable names are shell names: they are exported by the grader's command."""
_MEMORY_PATTERN = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", re.IGNORECASE)
_MEMORY_UNIT_MB = {"": 1 / (1024 * 1024), "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024 * 1024}

MAX_TIMEOUT_S = 86_400.0
"""Every timeout (agent, verifier, build, solution step) is at most one day: a longer one is a
typo, and bubblewrap turns a timeout into a ``prlimit`` CPU limit, which rejects absurd values."""
MAX_MEMORY_MB = 1024 * 1024
"""Memory limits are at most 1 TiB."""
MAX_CPUS = 1024.0
"""CPU limits are at most 1024 cores."""


def check_mapping(path: Path, field: str, value: object) -> dict[str, Any]:
    """``value`` must be a table/mapping with string keys."""
    if not isinstance(value, Mapping) or not all(isinstance(k, str) for k in value):
        raise TaskFormatError(path, field, f"expected a mapping, got {type(value).__name__}")
    return dict(value)


def check_keys(
    path: Path, table: Mapping[str, Any], known: Iterable[str], *, prefix: str = "", strict: bool
) -> None:
    """Unknown keys are an error when ``strict`` (a typo would silently keep a default) and a
    warning otherwise (newer versions of a format add optional keys)."""
    unknown = sorted(set(table) - set(known))
    for key in unknown:
        name = f"{prefix}{key}"
        expected = ", ".join(sorted(known))
        if strict:
            raise TaskFormatError(path, name, f"unknown key; expected one of: {expected}")
        warnings.warn(f"{path}: field {name!r}: unknown key, ignored", UserWarning, stacklevel=3)


def read_text(path: Path, field: str, value: object) -> str:
    """A non-empty string (the instruction, a command)."""
    if not isinstance(value, str):
        raise TaskFormatError(path, field, f"expected a string, got {type(value).__name__}")
    if not value.strip():
        raise TaskFormatError(path, field, "expected a non-empty string, got an empty one")
    return value


def read_optional_str(path: Path, field: str, value: object, default: str) -> str:
    if value is None:
        return default
    if not isinstance(value, str):
        raise TaskFormatError(path, field, f"expected a string, got {excerpt(value)}")
    return value


def read_timeout(path: Path, field: str, value: object, default: float) -> float:
    """A positive number of seconds, at most ``MAX_TIMEOUT_S`` (booleans are not numbers here)."""
    return read_positive(path, field, value, default, maximum=MAX_TIMEOUT_S, unit=" of seconds")


def read_positive(
    path: Path, field: str, value: object, default: float, *, maximum: float, unit: str = ""
) -> float:
    """A finite number in (0, ``maximum``]; never a boolean, NaN or infinity."""
    if value is None:
        return default
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or not 0 < value <= maximum
    ):
        raise TaskFormatError(
            path,
            field,
            f"expected a positive number{unit} of at most {maximum:.0f}, got {excerpt(value)}",
        )
    return float(value)


def read_bool(path: Path, field: str, value: object, default: bool) -> bool:
    if value is None:
        return default
    if not isinstance(value, bool):
        raise TaskFormatError(path, field, f"expected true or false, got {excerpt(value)}")
    return value


def read_difficulty(path: Path, field: str, value: object) -> str:
    if value is None:
        return "unknown"
    if not isinstance(value, str) or value.lower() not in DIFFICULTIES:
        expected = ", ".join(sorted(DIFFICULTIES))
        raise TaskFormatError(path, field, f"expected one of {expected}, got {excerpt(value)}")
    return value.lower()


def read_tags(path: Path, field: str, value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise TaskFormatError(path, field, f"expected a list of strings, got {excerpt(value)}")
    for i, tag in enumerate(value):
        if not isinstance(tag, str):
            raise TaskFormatError(path, f"{field}[{i}]", f"expected a string, got {excerpt(tag)}")
    return tuple(value)


def read_env(path: Path, field: str, value: object) -> dict[str, str]:
    if value is None:
        return {}
    table = check_mapping(path, field, value)
    for key, item in table.items():
        if not ENV_KEY_PATTERN.fullmatch(key):
            raise TaskFormatError(
                path,
                f"{field}.{key}",
                "expected a variable name of letters, digits and '_' not starting with a digit",
            )
        if not isinstance(item, str) or "\0" in item:
            raise TaskFormatError(
                path, f"{field}.{key}", f"expected a string without NUL, got {excerpt(item)}"
            )
    return table


def read_memory_mb(path: Path, field: str, value: object) -> int | None:
    """A size such as ``"2G"`` or ``"512M"`` (bytes when unitless), in MiB."""
    if value is None:
        return None
    match = _MEMORY_PATTERN.fullmatch(value) if isinstance(value, str) else None
    if match is None:
        raise TaskFormatError(
            path, field, f"expected a size such as '2G' or '512M', got {excerpt(value)}"
        )
    size_mb = float(match.group(1)) * _MEMORY_UNIT_MB[match.group(2).upper()]
    if not 1 <= size_mb <= MAX_MEMORY_MB:
        raise TaskFormatError(
            path,
            field,
            f"expected between 1 MiB and {MAX_MEMORY_MB} MiB (1T), got {excerpt(value)}",
        )
    return int(size_mb)


def read_memory_number(path: Path, field: str, value: object) -> int:
    """A number of MiB (``memory_mb``), between 1 and ``MAX_MEMORY_MB``."""
    size_mb = read_positive(path, field, value, 0.0, maximum=MAX_MEMORY_MB, unit=" of MiB")
    if size_mb < 1:
        raise TaskFormatError(path, field, f"expected at least 1 MiB, got {excerpt(value)}")
    return int(size_mb)


def check_task_id(task_dir: Path) -> str:
    """The task id is its folder's name: a plain name, never a path."""
    name = task_dir.name
    if not TASK_ID_PATTERN.fullmatch(name):
        raise TaskFormatError(
            task_dir,
            "task_id",
            f"expected a folder name of letters, digits, '.', '_' or '-' (no path separators "
            f"or spaces), got {name!r}",
        )
    return name


def read_utf8(path: Path, field: str, *, limit: int = inputs.MAX_TASK_FILE_BYTES) -> str:
    """A task file's UTF-8 text, at most ``limit`` bytes (see ``inputs.read_text``)."""
    return inputs.read_text(path, field, limit=limit)


def read_instruction(path: Path, field: str, value: object) -> str:
    """A non-empty instruction of at most ``inputs.MAX_INSTRUCTION_BYTES`` bytes of UTF-8."""
    text = read_text(path, field, value)
    size = len(text.encode("utf-8"))
    if size > inputs.MAX_INSTRUCTION_BYTES:
        raise TaskFormatError(
            path,
            field,
            f"expected at most {inputs.MAX_INSTRUCTION_BYTES} bytes (64 KiB), got {size} bytes",
        )
    return text
