"""The leaderboard's store: SQLite, append-only, schema-versioned (docs/design.md §7).

One row per evaluation or comparison, with what makes a result comparable and traceable: the
suite and its version (a hash of its task ids), the checkpoint or agent, a hash of the run's
configuration, the machine, and the metrics. Rows are never changed or removed: triggers
refuse UPDATE and DELETE, so a published number keeps its history.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from thundersync.protocol.strict_json import dumps_nulled, dumps_refusing

SCHEMA_VERSION = 1
DEFAULT_PATH = Path("runs") / "leaderboard.sqlite"
ENV_VAR = "THUNDERSYNC_LEADERBOARD"

_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    created_at TEXT NOT NULL,
    kind TEXT NOT NULL CHECK (kind IN ('eval', 'compare')),
    suite TEXT NOT NULL,
    suite_version TEXT NOT NULL,
    subject TEXT NOT NULL,
    checkpoint TEXT,
    config_hash TEXT NOT NULL,
    machine TEXT NOT NULL,
    metrics TEXT NOT NULL,
    config TEXT NOT NULL,
    artifacts TEXT NOT NULL
);
CREATE TRIGGER IF NOT EXISTS results_append_only_update BEFORE UPDATE ON results
BEGIN SELECT RAISE(ABORT, 'the leaderboard is append-only'); END;
CREATE TRIGGER IF NOT EXISTS results_append_only_delete BEFORE DELETE ON results
BEGIN SELECT RAISE(ABORT, 'the leaderboard is append-only'); END;
"""


class StoreError(RuntimeError):
    """The store file is not a leaderboard of a version this code reads."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One result. ``metrics`` for an eval: mean_reward, pass@k...; for a comparison: per
    mode its time to target and accuracy at budget (medians with CIs)."""

    kind: str
    suite: str
    suite_version: str
    subject: str
    """The agent, the checkpoint's name, or the comparison's modes."""
    metrics: dict[str, Any]
    config: dict[str, Any]
    checkpoint: str | None = None
    artifacts: dict[str, Any] = field(default_factory=dict)
    """Paths of plots and results files (rendered into the HTML page)."""
    created_at: str = ""
    machine: dict[str, Any] = field(default_factory=dict)
    id: int | None = None

    @property
    def config_hash(self) -> str:
        return config_hash(self.config)


def config_hash(config: dict[str, Any]) -> str:
    text = json.dumps(config, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def suite_version(task_ids: Iterable[str]) -> str:
    """A suite's version: a hash of its sorted task ids (same tasks, same version)."""
    return hashlib.sha256("\n".join(sorted(task_ids)).encode()).hexdigest()[:16]


def machine() -> dict[str, Any]:
    import torch

    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "torch": torch.__version__,
        "gpu": gpu,
    }


def default_path() -> Path:
    return Path(os.environ.get(ENV_VAR) or DEFAULT_PATH)


class Store:
    """An open leaderboard file (created on first use).

    Opening checks everything a later ``append`` or ``entries`` needs, so a command can open
    its store before any work and fail in one line (``StoreError``): the path is not a folder,
    the file is a SQLite database that passes ``PRAGMA quick_check`` (a truncated or garbage
    file does not), its schema version is one this code reads, and, unless
    ``read_only=True``, a write transaction can start (a read-only file or folder fails). A
    read-only store never creates or changes the file.
    """

    def __init__(self, path: str | Path | None = None, *, read_only: bool = False) -> None:
        self.path = Path(path) if path is not None else default_path()
        if self.path.is_dir():
            raise StoreError(f"{self.path}: is a folder, not a leaderboard file")
        try:
            if read_only:
                self._db = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True)
            else:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._db = sqlite3.connect(self.path)
        except (OSError, sqlite3.Error) as exc:
            raise StoreError(f"{self.path}: cannot open the leaderboard: {exc}") from exc
        try:
            self._check(read_only)
        except BaseException:
            self._db.close()
            raise

    def _check(self, read_only: bool) -> None:
        try:
            version = self._db.execute("PRAGMA user_version").fetchone()[0]
            check = self._db.execute("PRAGMA quick_check").fetchall()
        except sqlite3.DatabaseError as exc:
            raise StoreError(f"{self.path}: not a leaderboard database: {exc}") from exc
        if check != [("ok",)]:
            raise StoreError(
                f"{self.path}: a damaged leaderboard database (quick_check: {check[0][0]})"
            )
        if version not in (0, SCHEMA_VERSION):
            raise StoreError(
                f"{self.path}: leaderboard schema {version}, this ThunderSync "
                f"reads {SCHEMA_VERSION}"
            )
        if read_only:
            if version == 0:
                raise StoreError(f"{self.path}: not a leaderboard (no results table)")
            return
        try:
            self._db.executescript(_SCHEMA)
            self._db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
            self._db.commit()
            # Prove that a row can be appended: a write transaction, rolled back.
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("CREATE TABLE write_probe (x)")
            self._db.rollback()
        except sqlite3.Error as exc:
            raise StoreError(f"{self.path}: cannot write to the leaderboard: {exc}") from exc

    def append(self, entry: Entry) -> int:
        """Add a result; returns its id."""
        cursor = self._db.execute(
            "INSERT INTO results (created_at, kind, suite, suite_version, subject, checkpoint,"
            " config_hash, machine, metrics, config, artifacts) VALUES (?,?,?,?,?,?,?,?,?,?,?)",
            (
                entry.created_at or datetime.now(UTC).isoformat(timespec="seconds"),
                entry.kind,
                entry.suite,
                entry.suite_version,
                entry.subject,
                entry.checkpoint,
                entry.config_hash,
                dumps_nulled(entry.machine or machine()),
                dumps_refusing(entry.metrics, what="leaderboard metrics"),
                dumps_nulled(entry.config),
                dumps_nulled(entry.artifacts),
            ),
        )
        self._db.commit()
        if cursor.lastrowid is None:  # an INSERT always sets it
            raise sqlite3.DatabaseError("the leaderboard insert gave no row id")
        return cursor.lastrowid

    def entries(self, *, suite: str | None = None, kind: str | None = None) -> list[Entry]:
        query = "SELECT * FROM results WHERE 1=1"
        args: list[str] = []
        if suite is not None:
            query, args = query + " AND suite = ?", [*args, suite]
        if kind is not None:
            query, args = query + " AND kind = ?", [*args, kind]
        rows = self._db.execute(query + " ORDER BY id", args).fetchall()
        names = [d[0] for d in self._db.execute("SELECT * FROM results LIMIT 0").description]
        return [_entry(dict(zip(names, row))) for row in rows]

    def close(self) -> None:
        self._db.close()

    def __enter__(self) -> Store:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _entry(row: dict[str, Any]) -> Entry:
    return Entry(
        kind=row["kind"],
        suite=row["suite"],
        suite_version=row["suite_version"],
        subject=row["subject"],
        metrics=json.loads(row["metrics"]),
        config=json.loads(row["config"]),
        checkpoint=row["checkpoint"],
        artifacts=json.loads(row["artifacts"]),
        created_at=row["created_at"],
        machine=json.loads(row["machine"]),
        id=row["id"],
    )
