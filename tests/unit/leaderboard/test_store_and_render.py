"""The leaderboard store is append-only and versioned; tables and the HTML page show its rows."""

from __future__ import annotations

import sqlite3

import pytest

from leaderboard.render import compare_rows, eval_rows, write_html
from leaderboard.store import (
    SCHEMA_VERSION,
    Entry,
    Store,
    StoreError,
    config_hash,
    suite_version,
)

MACHINE = {"host": "test"}


def eval_entry(subject: str, reward: float, suite: str = "toy-sum") -> Entry:
    metrics = {"mean_reward": reward, "pass@1": reward, "k": 1, "num_tasks": 8}
    return Entry(kind="eval", suite=suite, suite_version=suite_version(["a", "b"]),
                 subject=subject, metrics=metrics, config={"agent": subject},
                 machine=MACHINE)  # fmt: skip


def compare_entry(plot) -> Entry:
    stat = {"median": 12.5, "ci": [10.0, None], "per_seed": [10.0, 12.5, None]}
    modes = {"sync": {"time_to_target_s": stat, "accuracy_at_budget": stat,
                      "speedup_vs_sync": stat},
             "streaming": {"time_to_target_s": stat, "accuracy_at_budget": stat,
                           "speedup_vs_sync": stat}}  # fmt: skip
    return Entry(kind="compare", suite="thundersync/ToySum-v0", suite_version="v",
                 subject="sync,streaming", metrics={"modes": modes}, config={},
                 artifacts={"plots": [str(plot)]}, machine=MACHINE)  # fmt: skip


def test_rows_are_appended_filtered_and_never_changed(tmp_path):
    path = tmp_path / "lb.sqlite"
    with Store(path) as store:
        first = store.append(eval_entry("oracle", 1.0))
        store.append(eval_entry("nop", 0.0, suite="tb1-mini"))
    with Store(path) as store:
        assert [e.subject for e in store.entries()] == ["oracle", "nop"]
        assert [e.subject for e in store.entries(suite="tb1-mini")] == ["nop"]
        entry = store.entries()[0]
        assert entry.id == first and entry.config_hash == config_hash({"agent": "oracle"})
        assert entry.created_at and entry.machine == MACHINE
    db = sqlite3.connect(path)
    for statement in ("UPDATE results SET subject = 'x'", "DELETE FROM results"):
        with pytest.raises(sqlite3.DatabaseError, match="append-only"):
            db.execute(statement)
    assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_a_store_of_another_schema_or_not_a_database_is_refused(tmp_path):
    newer = tmp_path / "newer.sqlite"
    db = sqlite3.connect(newer)
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    db.commit()
    with pytest.raises(StoreError, match="schema"):
        Store(newer)
    junk = tmp_path / "junk.sqlite"
    junk.write_bytes(b"not sqlite at all" * 100)
    with pytest.raises(StoreError, match="not a leaderboard"):
        Store(junk)


def test_non_finite_metrics_are_refused():
    with pytest.raises(ValueError):
        Store(":memory:").append(eval_entry("bad", float("nan")))


def test_tables_sort_and_the_page_holds_rows_and_plots(tmp_path):
    plot = tmp_path / "accuracy_vs_time.png"
    plot.write_bytes(b"\x89PNG\r\n\x1a\n")
    entries = [eval_entry("nop", 0.0), eval_entry("oracle", 1.0), compare_entry(plot)]
    for i, e in enumerate(entries, 1):
        object.__setattr__(e, "id", i)
    assert [row[2] for row in eval_rows(entries)] == ["oracle", "nop"]
    rows = compare_rows(entries)
    assert [row[2] for row in rows] == ["sync", "streaming"]
    assert rows[0][3] == "12.5 [10.0, inf]"
    index = write_html(entries, tmp_path / "site")
    page = index.read_text()
    assert page.count("<tr>") == 1 + 2 + 1 + 2  # two headers, two evals, two modes
    assert (tmp_path / "site" / "plots" / "3" / "accuracy_vs_time.png").is_file()
    assert 'src="plots/3/accuracy_vs_time.png"' in page


def test_showing_a_leaderboard_that_does_not_exist_says_so_and_creates_nothing(tmp_path, capsys):
    from thundersync.cli import main

    missing = tmp_path / "not-here" / "lb.sqlite"
    assert main(["leaderboard", "--db", str(missing)]) == 0
    assert "no results yet" in capsys.readouterr().out
    assert not missing.parent.exists()
