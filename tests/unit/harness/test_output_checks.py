"""eval, compare and leaderboard check their outputs (--db, --out) before any work: a bad one
is one line and exit 2, not a traceback after the whole run."""

from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

import harness.compare_command
import harness.eval
from leaderboard.store import Entry, Store
from thundersync.cli import main
from thundersync.cli_output import without_startup_lines

ROOT = Path(__file__).resolve().parents[3]


def good_store(path: Path) -> Path:
    with Store(path) as store:
        for i in range(40):  # a few pages, so that half of the file is a damaged database
            store.append(
                Entry(
                    kind="eval",
                    suite="toy-sum",
                    suite_version="v",
                    subject=f"a{i}",
                    metrics={"mean_reward": 1.0},
                    config={"pad": "x" * 300},
                    machine={"host": "h"},
                )
            )
    return path


def garbage(tmp: Path) -> Path:
    path = tmp / "garbage.sqlite"
    path.write_bytes(b"not a database at all\n" * 200)
    return path


def truncated(tmp: Path) -> Path:
    path = good_store(tmp / "truncated.sqlite")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    return path


def folder(tmp: Path) -> Path:
    path = tmp / "leaderboard.sqlite"
    path.mkdir()
    return path


def future(tmp: Path) -> Path:
    path = good_store(tmp / "future.sqlite")
    db = sqlite3.connect(path)
    db.execute("PRAGMA user_version = 99")
    db.commit()
    db.close()
    return path


BAD_STORES: dict[str, tuple[Callable[[Path], Path], str]] = {
    "garbage": (garbage, "not a leaderboard database"),
    "truncated": (truncated, "malformed|damaged"),
    "a folder": (folder, "is a folder"),
    "a future schema": (future, "schema 99"),
}


@pytest.fixture
def no_work(monkeypatch):
    """Any attempt, sandbox or training run fails the test: the check must come first."""

    def started(*args, **kwargs):
        raise AssertionError("work started before the outputs were checked")

    monkeypatch.setattr(harness.eval, "_run", started)
    monkeypatch.setattr(harness.eval, "sandbox_problem", lambda kind: None)
    monkeypatch.setattr(harness.compare_command, "run_compare", started)


def one_error_line(capsys, command: str) -> str:
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(f"{command}: error:"), captured.err
    return lines[0]


EVAL = ["eval", "--suite", "toy-sum", "--agent", "nop"]
COMPARE = ["compare", "--steps", "1", "--seeds", "1", "--eval-tasks", "1"]


@pytest.mark.parametrize("case", BAD_STORES, ids=str)
@pytest.mark.parametrize("argv", [EVAL, COMPARE], ids=["eval", "compare"])
def test_a_bad_db_is_refused_before_any_work(tmp_path, capsys, no_work, case, argv):
    make, expected = BAD_STORES[case]
    path = make(tmp_path)
    out = ["--out", str(tmp_path / "out")]
    assert main([*argv, *out, "--db", str(path)]) == 2
    line = one_error_line(capsys, argv[0])
    assert str(path) in line
    assert re.search(expected, line)


@pytest.mark.parametrize("argv", [EVAL, COMPARE], ids=["eval", "compare"])
def test_an_out_that_is_a_file_is_refused_before_any_work(tmp_path, capsys, no_work, argv):
    taken = tmp_path / "results.txt"
    taken.write_text("someone's file\n")
    assert main([*argv, "--out", str(taken), "--db", str(tmp_path / "lb.sqlite")]) == 2
    assert "results.txt: exists and is not a folder" in one_error_line(capsys, argv[0])
    assert taken.read_text() == "someone's file\n"


def test_leaderboard_refuses_a_folder_as_db_in_one_line(tmp_path, capsys):
    """It said "no results yet: ... does not exist" and exited 0."""
    assert main(["leaderboard", "--db", str(folder(tmp_path))]) == 2
    assert "is a folder" in one_error_line(capsys, "leaderboard")


def as_unprivileged(argv: list[str]) -> list[str]:
    """``argv`` run so that file permissions bind: as root, without the capability that
    overrides them (root writes a mode-0444 file otherwise)."""
    if os.geteuid() != 0:
        return argv
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: cannot make a file read-only")
    drop = "-dac_override,-dac_read_search"
    return ["setpriv", f"--bounding-set={drop}", f"--inh-caps={drop}", *argv]


def test_a_read_only_db_is_refused_by_eval_before_any_work_and_read_by_leaderboard(tmp_path):
    path = good_store(tmp_path / "read-only.sqlite")
    path.chmod(0o444)
    tmp_path.chmod(0o555)  # no journal can be created beside it either
    cli = [sys.executable, "-m", "thundersync.cli"]
    # A separate process, so no work can be stubbed out: the sandbox check (docker with no
    # daemon) would fail too, and the db must be refused before it.
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")}
    try:
        refused = subprocess.run(
            as_unprivileged([*cli, *EVAL, "--db", str(path), "--sandbox", "docker"]),
            capture_output=True,
            text=True,
            timeout=120,
            env={**env, "DOCKER_HOST": "unix:///nonexistent"},
        )
        shown = subprocess.run(
            as_unprivileged([*cli, "leaderboard", "--db", str(path)]),
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
        )
    finally:
        tmp_path.chmod(0o755)
    assert refused.returncode == 2, refused.stderr
    assert without_startup_lines(refused.stderr).strip().splitlines() == [
        f"eval: error: --db: {path}: cannot write to the leaderboard: attempt to write a "
        "readonly database"
    ]
    assert shown.returncode == 0, shown.stderr
    assert "40 result(s)" in shown.stdout
