"""Offline snapshots: reproducible base commits, official-shape eval scripts, fixture drift."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from environments.swebench import load_instances
from environments.swebench.grading import make_spec
from environments.swebench.snapshot import commit_script, make_eval_script, snapshot_commit

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURES = REPO_ROOT / "environments/fixtures/swebench"


def commit(repo: Path) -> str:
    out = subprocess.run(
        ["bash", "-c", commit_script()], cwd=repo, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_commit_depends_on_files_only(tmp_path: Path) -> None:
    hashes = []
    for name in ("a", "b"):
        repo = tmp_path / name
        repo.mkdir()
        (repo / "m.py").write_text("x = 1\n")
        if name == "b":
            (repo / "m.py").chmod(0o755)  # modes are not tracked
            time.sleep(1.1)  # nor is the wall clock
        hashes.append(commit(repo))
    assert hashes[0] == hashes[1] and len(hashes[0]) == 40
    (tmp_path / "a" / "m.py").write_text("x = 2\n")
    assert commit(tmp_path / "a") != hashes[0]


def test_shipped_base_commits_match_their_snapshots() -> None:
    tasks = list(load_instances(FIXTURES))
    assert len(tasks) >= 3
    for task in tasks:
        assert task.instance.repo_snapshot is not None
        assert snapshot_commit(task.instance.repo_snapshot) == task.instance.base_commit


def test_instances_jsonl_is_up_to_date() -> None:
    done = subprocess.run(
        [sys.executable, str(FIXTURES / "build_instances.py"), "--check"],
        cwd=REPO_ROOT,
        env={"PYTHONPATH": str(REPO_ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr


def test_shipped_rows_are_in_the_official_shape() -> None:
    for line in (FIXTURES / "instances.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert json.loads(row["FAIL_TO_PASS"]) and json.loads(row["PASS_TO_PASS"])
        assert row["log_parser"] == "parse_log_pytest" and row["eval_type"] == "pass_and_fail"
        assert f"git checkout {row['base_commit']} tests/" in row["eval_script"]
        assert "git apply -v - <<'EOF_114329324912'" in row["eval_script"]


def test_eval_script_gets_swebench_anti_spoofing() -> None:
    task = load_instances(FIXTURES).get("thundersync__csvline-1")
    script = make_spec(task.instance).eval_script
    lines = script.splitlines()
    end = lines.index(": '>>>>> End Test Output'")
    assert lines[end - 1] == "SWEBENCH_TEST_EXIT_CODE=$?"
    assert lines[end - 2].startswith("python3 -m pytest -rA")
    assert lines[end + 1] == 'echo ">>>>> Test Exit Code: $SWEBENCH_TEST_EXIT_CODE"'


def test_eval_script_refuses_a_patch_holding_its_delimiter() -> None:
    with pytest.raises(ValueError, match="EOF_114329324912"):
        make_eval_script(
            base_commit="a" * 40,
            test_patch="+EOF_114329324912\n",
            test_files=["tests/t.py"],
            test_command="pytest",
        )
