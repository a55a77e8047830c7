"""Config declared once: a frozen dataclass whose annotations carry each field's type and range.

A config class (``TrainConfig``, ``CompareConfig``, ``WarmStartConfig``, ``EvalConfig``, the
objectives ``GRPO``/``OPD``) annotates every field with its type and its range, e.g.
``lr: Annotated[float, Field(gt=0, allow_inf_nan=False)]``, ``mode: Literal[...]``. From that
one declaration pydantic (v2) builds one strict validator per class (``fields_adapter``) that

- checks every construction (``check_fields`` in ``__post_init__``): a config file's values,
  a resumed run's ``config.json`` and ``dataclasses.replace`` alike; strict, so a string is
  not a bool, a bool or a float is not an int, and no float is NaN or infinite;
- converts command-line strings (``parse_flag``: "3" for an int, "1e-4" for a float);
- gives each flag its help text (the field's docstring, read by pydantic's
  ``use_attribute_docstrings``) and the choices of a ``Literal`` (``choices``).

A problem is one ``ValueError`` line naming the field (or flag), what it should be and the
value given.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import re
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, ConfigDict, Field, TypeAdapter, ValidationError
from typing_extensions import TypedDict

from thundersync.protocol.documents import MAX_DEPTH, DocumentError, check_depth, excerpt

DOCSTRINGS = ConfigDict(use_attribute_docstrings=True)
"""Set as ``__pydantic_config__`` of a config class: its field docstrings become help texts."""

# --- the shared declarations (TrainConfig, eval and compare use the same) ---------------------

PositiveInt = Annotated[int, Field(ge=1)]
NonNegativeInt = Annotated[int, Field(ge=0)]
Seed = Annotated[int, Field(ge=0, lt=2**63)]
"""A seed numpy and torch both take."""
PositiveFloat = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegativeFloat = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Fraction = Annotated[float, Field(ge=0, le=1, allow_inf_nan=False)]
Text = Annotated[str, Field(min_length=1)]


@dataclasses.dataclass(frozen=True)
class OneOf:
    """A str field whose values a registry names, read when a value is checked or a flag made
    (``Sandbox``: the sandbox engines, an installed package's too); it checks like a
    ``Literal`` (the same message) and gives its flag's choices (``choices``)."""

    names: typing.Callable[[], tuple[str, ...]]

    def __call__(self, value: str) -> str:
        names = self.names()
        if value not in names:
            quoted = [repr(n) for n in names]
            either = f"{', '.join(quoted[:-1])} or {quoted[-1]}" if len(quoted) > 1 else quoted[0]
            raise ValueError(f"Input should be {either}")
        return value


def _sandbox_engines() -> tuple[str, ...]:
    from environments.sandboxes.engines import engine_names

    return engine_names()


_SANDBOXES = OneOf(_sandbox_engines)
Sandbox = Annotated[str, AfterValidator(_SANDBOXES), _SANDBOXES]
"""A sandbox engine's name (``environments.sandboxes.engines``)."""


def _device(value: str) -> str:
    if re.fullmatch(r"cpu|cuda(:\d+)?", value) is None:
        raise ValueError("expected cpu, cuda or cuda:N")
    return value


Device = Annotated[str, AfterValidator(_device)]
"""cpu, cuda or cuda:N (whether the GPUs are here is checked where the run starts)."""


# --- the validator of a class ---------------------------------------------------------------


@functools.cache
def fields_adapter(cls: type) -> TypeAdapter:
    """One strict validator of ``cls``'s fields (a TypedDict of its annotations)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    names = [f.name for f in dataclasses.fields(cls)]
    fields = {n: hints[n] for n in names}
    # A TypedDict made at run time from the class's annotations: no static type to check.
    table = TypedDict(f"{cls.__name__}Fields", fields, total=False)  # type: ignore[misc]
    table.__pydantic_config__ = ConfigDict(strict=True, extra="forbid")  # type: ignore[attr-defined]
    return TypeAdapter(table)


def check_fields(
    obj: Any, label: str = "config field", flags: dict[str, str] | None = None
) -> None:
    """Validate every field of the dataclass instance ``obj`` (call it in ``__post_init__``);
    fields are set to their validated values (an int given for a float becomes a float).
    A ValueError ``<label> 'name': <problem>, got <value>`` (or ``--flag: ...`` when ``flags``
    maps the field to its flag)."""
    values = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
    try:
        kind: type = type(obj)
        checked = fields_adapter(kind).validate_python(values)
    except ValidationError as exc:
        raise ValueError(describe(exc, values, label, flags)) from None
    for name, value in checked.items():
        if value is not values[name] and not isinstance(value, dict | list | tuple):
            object.__setattr__(obj, name, value)


def check_values(cls: type, values: dict[str, Any], label: str = "config field") -> None:
    """Check some of ``cls``'s fields given as a dict (a config file's), before they are
    merged with others: a ValueError ``<label> 'name': ...`` naming the first bad one."""
    try:
        fields_adapter(cls).validate_python(values)
    except ValidationError as exc:
        raise ValueError(describe(exc, values, label)) from None


def describe(
    exc: ValidationError,
    values: dict[str, Any],
    label: str = "config field",
    flags: dict[str, str] | None = None,
) -> str:
    """The first problem of ``exc`` as one line naming the field and the value."""
    error = exc.errors(include_url=False)[0]
    loc = error["loc"]
    name = str(loc[0]) if loc else "?"
    message = error["msg"].removeprefix("Value error, ")
    message = message[:1].lower() + message[1:]
    where = f"{label} {name!r}" if not flags or name not in flags else flags[name]
    if len(loc) > 1:
        where += " at " + "".join(f"[{part!r}]" for part in loc[1:] if part != "[key]")
        value = error.get("input")
    else:
        value = values.get(name, error.get("input"))
    return f"{where}: {message}, got {value!r}"


# --- flags ------------------------------------------------------------------------------------


def choices(cls: type, name: str) -> tuple[Any, ...] | None:
    """The values a ``Literal`` or ``OneOf`` field takes (None for any other field)."""
    declared = typing.get_type_hints(cls, include_extras=True)[name]
    if typing.get_origin(declared) is Annotated:
        for extra in declared.__metadata__:
            if isinstance(extra, OneOf):
                return extra.names()
    hint = _strip(declared)
    return typing.get_args(hint) if typing.get_origin(hint) is Literal else None


def field_help(cls: type) -> dict[str, str]:
    """Each field's docstring (pydantic reads them: ``__pydantic_config__ = DOCSTRINGS``)."""
    return dict(_help(cls))


@functools.cache
def _help(cls: type) -> tuple[tuple[str, str], ...]:
    schema = TypeAdapter(cls).json_schema()
    found = []
    for name, prop in schema.get("properties", {}).items():
        text = prop.get("description")
        if text:
            found.append((name, " ".join(text.split())))
    return tuple(found)


def flag_kind(cls: type, name: str) -> str:
    """bool, dict (JSON on the command line) or value (parsed from its string)."""
    hint = _strip(typing.get_type_hints(cls, include_extras=True)[name])
    if hint is bool:
        return "bool"
    if hint is dict or typing.get_origin(hint) is dict:
        return "dict"
    return "value"


def _strip(hint: Any) -> Any:
    """``Annotated[T, ...]`` and ``T | None`` to ``T``."""
    if typing.get_origin(hint) is Annotated:
        return _strip(typing.get_args(hint)[0])
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    if typing.get_origin(hint) in (typing.Union, types.UnionType) and len(args) == 1:
        return _strip(args[0])
    return hint


def add_flags(
    parser: argparse.ArgumentParser,
    cls: type,
    names: typing.Iterable[str],
    *,
    flags: dict[str, str] | None = None,
) -> None:
    """One option per field in ``names`` (``--field-name`` unless ``flags`` renames it), help
    from the field's docstring; the value is kept as given (``None`` when absent) and
    ``parse_flag`` turns it into the field's type, so a bad value is one line naming it."""
    docs = field_help(cls)
    defaults = {f.name: _default(f) for f in dataclasses.fields(cls)}
    for name in names:
        flag = (flags or {}).get(name) or "--" + name.replace("_", "-")
        help_text = f"{docs.get(name, '')} (default: {defaults[name]!r})"
        kind = flag_kind(cls, name)
        if kind == "bool":
            parser.add_argument(
                flag, dest=name, action=argparse.BooleanOptionalAction, default=None, help=help_text
            )
            continue
        values = choices(cls, name)
        metavar = (
            "{" + ",".join(map(str, values)) + "}"
            if values
            else ("JSON" if kind == "dict" else name.upper())
        )
        # a table that is off by default (None) turns on with its defaults as a bare flag
        bare: dict[str, Any] = {}
        if kind == "dict" and defaults[name] is None:
            bare = {"nargs": "?", "const": "{}"}
        parser.add_argument(flag, dest=name, default=None, metavar=metavar, help=help_text, **bare)


def parse_flag(cls: type, name: str, text: Any, flag: str | None = None) -> Any:
    """The value of field ``name`` given as the command-line string ``text`` (a JSON object
    for a dict field), checked against the field's declaration; a ValueError naming the flag."""
    flag = flag or "--" + name.replace("_", "-")
    if not isinstance(text, str):  # a bool flag, or a value a caller set
        return text
    if flag_kind(cls, name) == "dict":
        return json_object(text, flag)
    if _strip(typing.get_type_hints(cls, include_extras=True)[name]) is int and not (
        re.fullmatch(r"\s*[+-]?\d+\s*", text)
    ):  # pydantic would take "1.0" for 1: a flag's integer is written as one
        raise ValueError(f"{flag}: input should be a valid integer, got {text!r}")
    try:
        return fields_adapter(cls).validate_strings({name: text})[name]
    except ValidationError as exc:
        raise ValueError(describe(exc, {name: text}, flags={name: flag})) from None


def json_object(text: str, flag: str = "value") -> dict[str, Any]:
    """A strict-JSON object (no NaN or Infinity); a ValueError naming ``flag`` otherwise."""

    def refuse(constant: str) -> Any:
        raise ValueError(f"{constant} is not strict JSON")

    try:
        value = check_depth(json.loads(text, parse_constant=refuse), flag)
    except RecursionError:
        raise ValueError(f"{flag}: nested more than {MAX_DEPTH} levels deep") from None
    except DocumentError as exc:
        raise ValueError(f"{flag}: {exc.problem}") from None
    except ValueError as exc:
        raise ValueError(f"{flag}: expected a JSON object, got {excerpt(text)}: {exc}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{flag}: expected a JSON object, got {excerpt(text)}")
    return value


def non_finite(value: Any) -> str | None:
    """Where a NaN or infinite float hides in ``value`` (nested dicts/lists), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return ""
    items = (
        value.items()
        if isinstance(value, dict)
        else (enumerate(value) if isinstance(value, list | tuple) else ())
    )
    for key, item in items:
        inner = non_finite(item)
        if inner is not None:
            return f"[{key!r}]{inner}"
    return None


def _default(f: dataclasses.Field) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None
