"""The leaderboard store is append-only and versioned; tables and the HTML page show its rows."""

from __future__ import annotations

import dataclasses
import sqlite3

import pytest

from leaderboard.render import COMPARE_COLUMNS, compare_rows, eval_rows, write_html
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
    return Entry(
        kind="eval",
        suite=suite,
        suite_version=suite_version(["a", "b"]),
        subject=subject,
        metrics=metrics,
        config={"agent": subject},
        machine=MACHINE,
    )


def compare_entry(plot) -> Entry:
    stat = {"median": 12.5, "ci": [10.0, None], "per_seed": [10.0, 12.5, None]}
    modes = {
        "sync": {"time_to_target_s": stat, "accuracy_at_budget": stat, "speedup_vs_sync": stat},
        "streaming": {
            "time_to_target_s": stat,
            "accuracy_at_budget": stat,
            "speedup_vs_sync": stat,
        },
    }
    return Entry(
        kind="compare",
        suite="thundersync/ToySum-v0",
        suite_version="v",
        subject="sync,streaming",
        metrics={"modes": modes},
        config={},
        artifacts={"plots": [str(plot)]},
        machine=MACHINE,
    )


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
    assert rows[0][4] == "12.5 [10.0, inf]"
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


def test_an_unknown_sort_key_is_refused_with_the_valid_ones(tmp_path, capsys):
    from thundersync.cli import main

    assert main(["leaderboard", "--db", str(tmp_path / "lb.sqlite"), "--sort", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("leaderboard: error: --sort 'nosuch': expected")
    assert "mean_reward" in err[0] and "time_to_target_s" in err[0]
    assert main(["leaderboard", "--db", str(tmp_path / "lb.sqlite"), "--sort", "pass@3"]) == 0


def test_rows_show_strict_the_run_of_a_checkpoint_and_the_comparison_settings(tmp_path):
    entry = eval_entry("step-000004", 0.5)
    entry = Entry(
        **{
            **{f: getattr(entry, f) for f in entry.__dataclass_fields__},
            "checkpoint": "runs/compare/runs/streaming-seed0/checkpoints/step-000004",
            "metrics": {**entry.metrics, "strict": True},
        }
    )
    (row,) = eval_rows([entry])
    assert row[2] == "streaming-seed0/step-000004" and row[9] == "yes"
    (old,) = eval_rows([eval_entry("oracle", 1.0)])  # a row from before: no strict recorded
    assert old[2] == "oracle" and old[9] == "-"
    plot = tmp_path / "p.png"
    compare = compare_entry(plot)
    compare = Entry(
        **{
            **{f: getattr(compare, f) for f in compare.__dataclass_fields__},
            "metrics": {**compare.metrics, "target": 0.6, "budget_s": 40.0},
            "config": {"train": {"steps": 12}},
        }
    )
    rows = compare_rows([compare])
    assert [r[8:11] for r in rows] == [["12", "0.60", "40.0"]] * 2


def test_time_to_target_sorts_the_fastest_first_and_never_last():
    def stat(median):
        return {"median": median, "ci": [median, median], "per_seed": [median]}

    modes = {
        "sync": {"time_to_target_s": stat(20.0)},
        "async": {"time_to_target_s": stat(None)},
        "streaming": {"time_to_target_s": stat(13.0)},
    }
    entry = Entry(
        kind="compare",
        suite="e",
        suite_version="v",
        subject="s",
        metrics={"modes": modes},
        config={},
    )
    assert [r[2] for r in compare_rows([entry], "time_to_target_s")] == [
        "streaming",
        "sync",
        "async",
    ]


MARKUP = ("a[/b]", "[reverse]x[/reverse]", "[i]m[/i]")
"""Names that rich would read as markup: a closing tag that closes nothing (a MarkupError),
and styles that would restyle the table."""


def test_names_that_look_like_markup_are_shown_literally(tmp_path, capsys):
    """The store is append-only, so a row named like markup stays: if rendering it crashed,
    the leaderboard would crash from then on."""
    from thundersync.cli import main

    compare = dataclasses.replace(compare_entry(tmp_path / "plot.png"), suite=MARKUP[0])
    compare.metrics["modes"] = {MARKUP[2]: compare.metrics["modes"]["sync"]}
    with Store(tmp_path / "lb.sqlite") as store:
        store.append(eval_entry(MARKUP[1], 1.0, suite=MARKUP[0]))
        store.append(compare)
    assert main(["leaderboard", "--db", str(tmp_path / "lb.sqlite")]) == 0
    out = capsys.readouterr().out
    evaluation, comparison = (line for line in out.splitlines() if MARKUP[0] in line)
    assert MARKUP[1] in evaluation and MARKUP[2] in comparison, out


def _stat(median):
    return {"median": median, "ci": [median, median], "per_seed": [median, median, median]}


def _comparison(suite: str, speedups: dict, times: dict, sandbox: str = "bwrap") -> Entry:
    modes = {
        name: {
            "time_to_target_s": _stat(times[name]),
            "accuracy_at_budget": _stat(0.5),
            "speedup_vs_sync": _stat(speed),
        }
        for name, speed in speedups.items()
    }
    train = {"steps": 12, "sandbox": sandbox, "engine": "hf", "device": "cpu"}
    return Entry(
        kind="compare",
        suite=suite,
        suite_version="v",
        subject=",".join(modes),
        metrics={"modes": modes, "target": 0.6, "budget_s": 40.0},
        config={"train": train},
        machine=MACHINE,
    )


LONG_ENV = "thundersync/TerminalGen-v0-with-a-long-plugin-name"


def _store(tmp_path) -> str:
    """Two comparisons: the first never reached its target (no speed-up in any mode), the
    second did, in bwrap; and two evaluations of one agent, in bwrap and in Docker."""
    db = tmp_path / "lb.sqlite"
    with Store(db) as store:
        store.append(
            _comparison(
                LONG_ENV,
                {"sync": None, "async-k1": None, "streaming": None},
                {"sync": None, "async-k1": None, "streaming": None},
            )
        )
        store.append(
            _comparison(
                "thundersync/ToySum-v0",
                {"sync": 1.0, "async-k1": 0.3, "streaming": 1.22},
                {"sync": 6.7, "async-k1": 21.9, "streaming": 6.0},
                sandbox="docker",
            )
        )
        for sandbox in ("bwrap", "docker"):
            entry = eval_entry("oracle", 1.0, suite="tb1-mini")
            entry = dataclasses.replace(entry, config={"agent": "oracle", "sandbox": sandbox})
            store.append(entry)
    return str(db)


def _table_rows(out: str, title: str) -> list[str]:
    """The data rows of the rich table titled ``title`` (its lines that start with │ and hold
    a row number)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip() or (line.strip() and line.strip()[0] not in "┏┃┡│└"):
            break
        cells = [c.strip() for c in line.strip("│┃ ").split("│")]
        if line.startswith("│") and cells[0].isdigit():
            rows.append(line)
    return rows


def test_html_also_prints_the_tables(tmp_path, capsys):
    """The README's first hour shows `leaderboard --html` printing the terminal tables and
    then where the page went."""
    from thundersync.cli import main

    db = _store(tmp_path)
    assert main(["leaderboard", "--db", db, "--html", str(tmp_path / "site")]) == 0
    out = capsys.readouterr().out
    assert "evaluations" in out and "comparisons" in out
    assert _table_rows(out, "evaluations") and _table_rows(out, "comparisons")
    assert out.rstrip().splitlines()[-1] == (
        f"leaderboard: 4 result(s) from {db}; page written to {tmp_path / 'site' / 'index.html'}"
    )


def test_rows_name_their_sandbox_and_engine_and_env_names_are_whole(tmp_path, capsys):
    from thundersync.cli import main

    assert main(["leaderboard", "--db", _store(tmp_path)]) == 0
    out = capsys.readouterr().out
    evaluations = _table_rows(out, "evaluations")
    assert len(evaluations) == 2
    assert "bwrap" in evaluations[0] and "docker" in evaluations[1]
    assert "bwrap" not in evaluations[1] and "docker" not in evaluations[0]
    comparisons = _table_rows(out, "comparisons")
    assert all("hf" in row for row in comparisons)
    assert sum(LONG_ENV in row for row in comparisons) == 3, out


def test_sorting_by_speed_up_ranks_every_comparison_and_never_comes_last(tmp_path, capsys):
    from thundersync.cli import main

    assert main(["leaderboard", "--db", _store(tmp_path), "--sort", "speedup_vs_sync"]) == 0
    rows = _table_rows(capsys.readouterr().out, "comparisons")
    modes = [[c.strip() for c in row.strip("│ ").split("│")][2] for row in rows]
    assert modes[:3] == ["streaming", "sync", "async-k1"], rows
    assert all("never" in row for row in rows[3:]) and len(rows) == 6


def test_a_speed_up_over_a_sync_that_never_reached_the_target_is_not_never():
    entry = _comparison("e", {"sync": None, "streaming": None}, {"sync": None, "streaming": 9.0})
    rows = {row[2]: row for row in compare_rows([entry])}
    speed = COMPARE_COLUMNS.index("speed-up vs sync (per seed)")
    assert rows["sync"][speed] == "never" and rows["streaming"][speed].startswith("∞")
