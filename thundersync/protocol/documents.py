"""Bounded readers for the JSON, TOML and YAML documents users hand in, and bounded excerpts.

Task files, config files, instance files and command-line JSON come from outside. Read
naively, a few hundred bytes can take the process down: the stdlib parsers recurse once per
nesting level, so ``[[[[...]]]]`` 10,000 deep is a ``RecursionError`` traceback, and a YAML
alias bomb (9 anchors of 9 aliases each, 339 bytes) builds a structure that shares its nodes
but that anything walking it as a tree (``repr`` in an error message, ``json.dumps``) expands
to 9**9 nodes. So every document here is parsed with its nesting depth bounded
(``MAX_DEPTH``) and, for YAML, the size of the tree its aliases expand to bounded
(``MAX_YAML_NODES``) while it is composed, before anything is built from it. Aliases are kept
rather than refused: docker-compose files use anchors for shared settings, and with the bound
a walk of any document accepted costs no more than one of a plain file of that size.

Every failure is a ``DocumentError`` whose one-line message names the source (a file, or a
flag such as ``--env-kwargs``). ``excerpt`` is what an error message shows of a loaded value:
a bounded ``repr`` however large or deep the value.
"""

from __future__ import annotations

import functools
import json
import reprlib
import tomllib
from pathlib import Path
from typing import Any

from thundersync.protocol.errors import ThunderSyncError

MAX_DEPTH = 100
"""Nesting of lists and tables/mappings/objects, counted from the top-level value as 1. Real
task and config files nest fewer than 10 levels."""
MAX_YAML_NODES = 100_000
"""Nodes of a YAML document with its aliases expanded (what a walk of it visits). A task.yaml
holds a few dozen; a plain 1 MiB file of short scalars could hold more, but no task file does."""
MAX_EXCERPT_CHARS = 200
"""How much of a value an error message quotes."""

_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 80, 80
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 6


class DocumentError(ThunderSyncError, ValueError):
    """A document that cannot be read safely: malformed, nested too deep, or expanding past
    the bound. ``source`` names where it came from, ``problem`` what is wrong (one line)."""

    def __init__(self, source: object, problem: str) -> None:
        self.source = str(source)
        self.problem = problem
        super().__init__(f"{source}: {problem}")


def excerpt(value: object, limit: int = MAX_EXCERPT_CHARS) -> str:
    """A ``repr`` of ``value`` of at most ``limit`` characters, on one line: containers are
    cut after a few items and levels, so its cost does not grow with the value's size."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _one_line(err: BaseException) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= 2 * MAX_EXCERPT_CHARS else text[: 2 * MAX_EXCERPT_CHARS] + "..."


def _too_deep(source: object) -> DocumentError:
    return DocumentError(source, f"nested more than {MAX_DEPTH} levels deep")


def check_depth(value: Any, source: object) -> Any:
    """``value`` if its lists and dicts nest at most ``MAX_DEPTH`` deep (walked without
    recursion); DocumentError otherwise. TOML's dotted keys nest without recursing the parser."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            if depth > MAX_DEPTH:
                raise _too_deep(source)
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth + 1) for child in children)
    return value


def load_json(text: str, source: object) -> Any:
    """A JSON document, nested at most ``MAX_DEPTH`` deep."""
    try:
        value = json.loads(text)
    except RecursionError:
        raise _too_deep(source) from None
    except ValueError as err:  # JSONDecodeError, and ints past Python's digit limit
        raise DocumentError(source, f"expected valid JSON: {_one_line(err)}") from None
    return check_depth(value, source)


def load_toml(text: str, source: object) -> dict[str, Any]:
    """A TOML document, nested at most ``MAX_DEPTH`` deep."""
    try:
        value = tomllib.loads(text)
    except RecursionError:
        raise _too_deep(source) from None
    except ValueError as err:  # TOMLDecodeError, and ints past Python's digit limit
        raise DocumentError(source, f"expected valid TOML: {_one_line(err)}") from None
    return check_depth(value, source)


def load_yaml(text: str, source: object) -> Any:
    """A YAML document, safe-loaded (plain data only), nested at most ``MAX_DEPTH`` deep and
    expanding to at most ``MAX_YAML_NODES`` nodes with its aliases followed."""
    import yaml

    loader = _bounded_loader()(text, source)
    try:
        return loader.get_single_data()
    except DocumentError:
        raise
    except RecursionError:
        raise _too_deep(source) from None
    except (yaml.YAMLError, ValueError) as err:
        raise DocumentError(source, f"expected valid YAML: {_one_line(err)}") from None
    finally:
        loader.dispose()


@functools.cache
def _bounded_loader() -> type:
    """yaml's SafeLoader (pure Python: its composer can be hooked) counting, while the node
    graph is composed, the depth and the size of the tree it stands for. An alias counts as
    the whole subtree it refers to, so the count is what a walk of the result would visit."""
    import yaml

    class BoundedSafeLoader(yaml.SafeLoader):
        def __init__(self, text: str, source: object) -> None:
            super().__init__(text)
            self.source = source
            self._depth = 0  # nesting of the node being composed (the root is 1)
            self._deepest = 0  # deepest level reached inside it, aliases expanded
            self._nodes = 0  # nodes so far, aliases expanded
            self._measured: dict[int, tuple[int, int]] = {}  # id(node): (nodes, height)

        def compose_node(self, parent: Any, index: Any) -> Any:
            if self.check_event(yaml.AliasEvent):
                anchor = self.peek_event().anchor
                node = super().compose_node(parent, index)
                if id(node) not in self._measured:
                    raise DocumentError(
                        self.source, f"alias *{excerpt(anchor)} refers to a node that holds it"
                    )
                size, height = self._measured[id(node)]
                self._count(size, self._depth + height)
                return node
            entered, outer_deepest, before = self._depth + 1, self._deepest, self._nodes
            self._depth = self._deepest = entered
            self._count(1, entered)
            node = super().compose_node(parent, index)
            self._measured[id(node)] = (self._nodes - before, self._deepest - entered + 1)
            self._depth, self._deepest = entered - 1, max(outer_deepest, self._deepest)
            return node

        def _count(self, nodes: int, depth: int) -> None:
            self._nodes += nodes
            self._deepest = max(self._deepest, depth)
            if depth > MAX_DEPTH:
                raise _too_deep(self.source)
            if self._nodes > MAX_YAML_NODES:
                raise DocumentError(
                    self.source,
                    f"expands to more than {MAX_YAML_NODES} nodes with its aliases followed "
                    "(an alias bomb?)",
                )

    return BoundedSafeLoader


def load_file(path: str | Path, *, kind: str | None = None, max_bytes: int | None = None) -> Any:
    """The ``kind`` ("json", "toml" or "yaml") document in ``path``, read as UTF-8, at most
    ``max_bytes`` bytes when given. Without ``kind``, ``.toml`` is TOML, ``.yaml``/``.yml``
    YAML and anything else JSON."""
    file = Path(path)
    try:
        with open(file, "rb") as handle:
            data = handle.read(-1 if max_bytes is None else max_bytes + 1)
    except OSError as err:
        raise DocumentError(file, f"cannot read: {err.strerror or err}") from None
    if max_bytes is not None and len(data) > max_bytes:
        raise DocumentError(file, f"expected at most {max_bytes} bytes, got more")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise DocumentError(file, f"expected UTF-8 text: {err}") from None
    if kind is None:
        kind = {".toml": "toml", ".yaml": "yaml", ".yml": "yaml"}.get(file.suffix, "json")
    loaders = {"json": load_json, "toml": load_toml, "yaml": load_yaml}
    return loaders[kind](text, file)
