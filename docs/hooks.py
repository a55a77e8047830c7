"""mkdocs hook: the reference pages that the code declares, generated at build time.

``<!-- generated: cli -->`` becomes every command's ``--help`` (argparse's own text, from
``thundersync.cli.build_parser``), and ``<!-- generated: config NAME -->`` a table of the
config class's fields (name, flag, type, default and the field's docstring, as
``thundersync.declared`` reads them for the command line). Nothing here is written by hand, so
the reference cannot drift from the flags: a renamed field is renamed on the page.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
import re
import sys
import typing
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "TrainConfig": ("thundersync.training.config", "train"),
    "WarmStartConfig": ("thundersync.training.warmstart", "warmstart"),
    "CompareConfig": ("harness.compare", "compare"),
    "EvalConfig": ("harness.eval_config", "eval"),
}
"""The config classes a page may name: where each is declared, and the command it configures."""

MARKER = re.compile(r"<!-- generated: (cli|config (\w+)) -->")


def on_page_markdown(markdown: str, page, config, files) -> str:  # noqa: ARG001 (mkdocs API)
    return MARKER.sub(
        lambda m: cli_reference() if m.group(1) == "cli" else table(m.group(2)), markdown
    )


def _importable() -> None:
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))


def cli_reference() -> str:
    """Each subcommand's help as argparse prints it, at a fixed width."""
    _importable()
    os.environ["COLUMNS"] = "100"  # argparse's formatter reads the width from here
    from thundersync.cli import build_parser

    parser = build_parser()
    sub = _subcommands(parser)
    parts = ["## thundersync", "", "```text", parser.format_help().rstrip(), "```", ""]
    for name, command in sub.items():
        parts += [
            f"## thundersync {name}",
            "",
            "```text",
            command.format_help().rstrip(),
            "```",
            "",
        ]
    return "\n".join(parts)


def _subcommands(parser) -> dict:
    (sub,) = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    return dict(sub.choices)


def _flags(command: str) -> dict[str, str]:
    """Each option's destination in ``thundersync command``, and its flags as argparse has them."""
    from thundersync.cli import build_parser

    parser = _subcommands(build_parser())[command]
    return {a.dest: ", ".join(a.option_strings) for a in parser._actions if a.option_strings}


def table(name: str) -> str:
    """One row per field of the config class ``name``, its flag read from the command's parser
    ("–": a field set otherwise, by a config file or by the command itself)."""
    _importable()
    from thundersync.declared import field_help

    module_name, command = CONFIGS[name]
    cls = getattr(importlib.import_module(module_name), name)
    flags = _flags(command)
    helps = field_help(cls)
    hints = typing.get_type_hints(cls, include_extras=True)
    rows = ["| field | flag | type | default | meaning |", "|---|---|---|---|---|"]
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            default = repr(f.default)
        elif f.default_factory is not dataclasses.MISSING:
            default = repr(f.default_factory())
        else:
            default = "(required)"
        cells = [
            f"`{f.name}`",
            _flag(flags, f.name),
            f"`{_type_name(hints[f.name])}`",
            f"`{default}`",
            helps.get(f.name, ""),
        ]
        rows.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(rows)


def _flag(flags: dict[str, str], field: str) -> str:
    for dest in (field, field.removesuffix("s"), field.removeprefix("num_")):
        if dest in flags:
            return f"`{flags[dest]}`"
    return "–"


def _type_name(hint) -> str:
    """``Annotated[float, Field(gt=0)]`` as ``float (> 0)``, ``Literal['a', 'b']`` as
    ``'a' | 'b'``: what a reader needs, not typing's repr."""
    origin = typing.get_origin(hint)
    if origin is typing.Annotated:
        from thundersync.declared import OneOf

        base, *meta = typing.get_args(hint)
        registered = [m for m in meta if isinstance(m, OneOf)]
        if registered:  # a registry's names (the sandbox engines): as a Literal reads
            return " | ".join(repr(n) for n in registered[0].names())
        bounds = []
        for m in meta:
            for attr in getattr(m, "metadata", [m]):
                for key, sign in (("gt", ">"), ("ge", ">="), ("lt", "<"), ("le", "<=")):
                    value = getattr(attr, key, None)
                    if value is not None:
                        bounds.append(f"{sign} {value}")
        name = _type_name(base)
        return f"{name} ({', '.join(bounds)})" if bounds else name
    if origin is typing.Literal:
        return " | ".join(repr(a) for a in typing.get_args(hint))
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        return " | ".join(_type_name(a) for a in typing.get_args(hint))
    if hint is type(None):
        return "None"
    if origin is not None:
        args = ", ".join(_type_name(a) for a in typing.get_args(hint))
        return f"{getattr(origin, '__name__', str(origin))}[{args}]"
    return getattr(hint, "__name__", str(hint))
