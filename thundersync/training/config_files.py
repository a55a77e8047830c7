"""A run's config as files and flags: the JSON or TOML config file, a run folder's
``config.json`` (the base of ``--resume``), one ``--flag`` per ``TrainConfig`` field, and their
resolution into a ``TrainConfig`` (flags over the file over the defaults)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from thundersync.declared import add_flags, parse_flag
from thundersync.protocol.documents import DocumentError, load_file
from thundersync.training.config import MAX_CONFIG_BYTES, RUN_NOTES, TrainConfig


def load_config_file(path: str | Path) -> dict[str, Any]:
    """The fields set by a JSON or TOML file; unknown keys are an error naming them (the
    values are checked when the TrainConfig is made)."""
    file = Path(path)
    kind = "toml" if file.suffix == ".toml" else "json"
    try:
        values = load_file(file, kind=kind, max_bytes=MAX_CONFIG_BYTES)
    except DocumentError as exc:
        raise DocumentError(file, f"not a readable JSON/TOML config: {exc.problem}") from None
    if not isinstance(values, dict):
        raise ValueError(f"{file}: expected a table of config fields")
    values = {k: v for k, v in values.items() if k not in RUN_NOTES}  # a run's config.json
    unknown = sorted(set(values) - {f.name for f in dataclasses.fields(TrainConfig)})
    if unknown:
        raise ValueError(f"{file}: unknown config field(s) {unknown}")
    return values


def load_saved_config(path: Path) -> dict[str, Any]:
    """A run folder's ``config.json`` (the base of ``--resume``), read bounded."""
    values = load_file(path, kind="json", max_bytes=MAX_CONFIG_BYTES)
    if not isinstance(values, dict):
        raise DocumentError(path, f"expected a JSON object, got {type(values).__name__}")
    return {k: v for k, v in values.items() if k not in RUN_NOTES}


def add_config_flags(parser: argparse.ArgumentParser, *, exclude: tuple[str, ...] = ()) -> None:
    """One ``--field`` per TrainConfig field but ``exclude`` (default: not given, so a file
    can set it); ``resolve_config`` checks the values."""
    add_flags(
        parser,
        TrainConfig,
        [f.name for f in dataclasses.fields(TrainConfig) if f.name not in exclude],
    )


def resolve_config(args: argparse.Namespace, base: dict[str, Any] | None = None) -> TrainConfig:
    """Defaults, then ``base`` (a config file or a resumed run's config.json), then flags;
    a ValueError naming the first bad value."""
    values = dict(base or {})
    for f in dataclasses.fields(TrainConfig):
        given = getattr(args, f.name, None)
        if given is not None:
            values[f.name] = parse_flag(TrainConfig, f.name, given)
    return TrainConfig(**values)


def json_object(text: str) -> dict[str, Any]:
    """An argparse type: a strict-JSON object (``--env-kwargs '{...}'`` and the like)."""
    from thundersync.declared import json_object as parse

    try:
        return parse(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("value: ")) from None
