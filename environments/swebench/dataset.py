"""Load SWE-bench instances from local JSON/JSONL/parquet files, folders or the Hub."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from environments.swebench.instance import SNAPSHOT_ROOT_ENV, SWEBenchInstance, parse_instance
from environments.swebench.task import SWEBenchTask
from environments.tasks import TaskFormatError, TaskList
from thundersync.protocol.documents import DocumentError, load_json

DATA_SUFFIXES = (".json", ".jsonl", ".parquet")
_SIGNATURE_FIELDS = frozenset({"instance_id", "test_patch", "FAIL_TO_PASS"})


def load_instances(
    source: str | Path,
    *,
    split: str = "test",
    max_turns: int = 50,
    timeout_s: float = 120.0,
    snapshot_root: str | Path | None = None,
) -> TaskList:
    """Load and validate every instance of ``source``.

    ``source``: a local ``.json`` (a list of rows), ``.jsonl`` or ``.parquet`` file; a folder
    (every such file directly inside it); or else a Hugging Face dataset name, loaded with
    ``datasets.load_dataset(source, split=split)`` (the only path that may use the network).
    Raises TaskFormatError naming the file, the row, the instance and the field of the first
    bad row, or the duplicated instance id.

    A row's ``repo_snapshot`` must resolve, after following links, inside the folder of the
    file holding the row. ``snapshot_root`` (default: the environment variable
    ``THUNDERSYNC_SWEBENCH_SNAPSHOT_ROOT``, for callers such as the CLI) names one more
    folder it may resolve into; Hub rows, having no folder, may name snapshots only there.
    """
    path = Path(source)
    root = _snapshot_root(snapshot_root)
    named_rows: list[tuple[str, Path | None, Sequence[Any]]]  # (origin, base folder, rows)
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in DATA_SUFFIXES and p.is_file())
        if not files:
            raise TaskFormatError(path, "<folder>", f"no {'/'.join(DATA_SUFFIXES)} files")
        named_rows = [(str(f), f.parent, _read_rows(f)) for f in files]
        name = path.name
    elif path.suffix in DATA_SUFFIXES:
        if not path.is_file():
            raise TaskFormatError(path, "<file>", "no such file")
        named_rows = [(str(path), path.parent, _read_rows(path))]
        name = path.stem
    else:
        named_rows = [(str(source), None, _hub_rows(str(source), split))]
        name = str(source)
    instances: dict[str, SWEBenchInstance] = {}
    for origin, base_dir, rows in named_rows:
        for index, row in enumerate(rows):
            instance = parse_instance(
                row, source=origin, index=index, base_dir=base_dir, snapshot_root=root
            )
            if instance.instance_id in instances:
                first = instances[instance.instance_id].source
                raise TaskFormatError(
                    origin,
                    "instance_id",
                    f"row {index}: duplicate instance id {instance.instance_id!r} "
                    f"(first in {first})",
                )
            instances[instance.instance_id] = instance
    tasks = tuple(
        SWEBenchTask(instance, max_turns=max_turns, timeout_s=timeout_s)
        for instance in instances.values()
    )
    return TaskList(name=name, tasks=tasks)


def _snapshot_root(value: str | Path | None) -> Path | None:
    if value is None:
        value = os.environ.get(SNAPSHOT_ROOT_ENV) or None
        origin = SNAPSHOT_ROOT_ENV
    else:
        origin = "snapshot_root"
    if value is None:
        return None
    root = Path(value)
    if not root.is_dir():
        raise TaskFormatError(root, origin, f"expected an existing folder, got {str(value)!r}")
    return root.resolve()


def looks_like_swebench(path: str | Path) -> bool:
    """Whether ``path`` is a SWE-bench instance file, or a folder holding one (cheap: reads
    only the first row's keys; never raises)."""
    path = Path(path)
    if path.is_dir():
        return any(looks_like_swebench(p) for p in sorted(path.iterdir()) if p.is_file())
    if path.suffix not in DATA_SUFFIXES or not path.is_file():
        return False
    try:
        return _first_row_keys(path) >= _SIGNATURE_FIELDS
    except (OSError, ValueError, ImportError):
        return False


def _read_rows(path: Path) -> Sequence[Any]:
    if path.suffix == ".parquet":
        return _parquet_rows(path)
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        rows = []
        for number, line in enumerate(text.splitlines(), start=1):
            if line.strip():
                rows.append(_json(path, line, f"line {number}"))
        return rows
    rows = _json(path, text, "<root>")
    if not isinstance(rows, list):
        raise TaskFormatError(path, "<root>", f"expected a list of rows, got {type(rows).__name__}")
    return rows


def _json(path: Path, text: str, where: str) -> Any:
    try:
        return load_json(text, path)
    except DocumentError as exc:
        raise TaskFormatError(path, where, exc.problem) from None


def _parquet_rows(path: Path) -> list[dict[str, Any]]:
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path).to_pylist()
    except (OSError, ValueError) as exc:
        raise TaskFormatError(path, "<file>", f"unreadable parquet: {exc}") from exc


def _hub_rows(name: str, split: str) -> list[Mapping[str, Any]]:
    import datasets

    return list(datasets.load_dataset(name, split=split))


def _first_row_keys(path: Path) -> set[str]:
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        return set(pq.read_schema(path).names)
    with path.open(encoding="utf-8") as f:
        if path.suffix == ".jsonl":
            first = next((line for line in f if line.strip()), "{}")
            row = _json(path, first, "line 1")
        else:
            rows = _json(path, f.read(), "<root>")
            row = rows[0] if isinstance(rows, list) and rows else {}
    return set(row) if isinstance(row, dict) else set()
