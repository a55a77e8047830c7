"""Row validation: every malformed SWE-bench row raises TaskFormatError naming file and field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from environments.swebench import load_instances
from environments.swebench.instance import parse_instance
from environments.tasks import TaskFormatError

EVAL_SCRIPT = (
    "#!/bin/bash\nset -uxo pipefail\ncd /testbed\n: '>>>>> Start Test Output'\n"
    "python3 -m pytest -rA tests\n: '>>>>> End Test Output'\n"
)

_DROP = object()


def good_row(**changes: Any) -> dict[str, Any]:
    row: dict[str, Any] = {
        "instance_id": "octo__widget-7",
        "repo": "octo/widget",
        "base_commit": "a" * 40,
        "patch": "diff --git a/w.py b/w.py\n",
        "test_patch": "diff --git a/tests/test_w.py b/tests/test_w.py\n",
        "problem_statement": "widgets wobble",
        "hints_text": "",
        "created_at": "2026-01-01T00:00:00Z",
        "version": "1.0",
        "FAIL_TO_PASS": '["tests/test_w.py::test_wobble"]',
        "PASS_TO_PASS": "[]",
        "environment_setup_commit": "b" * 40,
        "eval_script": EVAL_SCRIPT,
        "log_parser": "parse_log_pytest",
        "eval_type": "pass_and_fail",
        "image": "swebench/sweb.eval.x86_64.octo_1776_widget-7:latest",
    }
    row.update(changes)
    return {k: v for k, v in row.items() if v is not _DROP}


MALFORMED = [
    ("missing patch", {"patch": _DROP}, "patch", "missing field"),
    ("missing test_patch", {"test_patch": _DROP}, "test_patch", "missing field"),
    ("missing FAIL_TO_PASS", {"FAIL_TO_PASS": _DROP}, "FAIL_TO_PASS", "missing field"),
    ("empty instance_id", {"instance_id": ""}, "instance_id", "non-empty id"),
    ("instance_id with a slash", {"instance_id": "a/b"}, "instance_id", "non-empty id"),
    ("repo not a string", {"repo": 7}, "repo", "expected a string"),
    ("empty problem statement", {"problem_statement": "  "}, "problem_statement", "non-empty"),
    ("short base_commit", {"base_commit": "abc123"}, "base_commit", "40 hex digits"),
    ("FAIL_TO_PASS not JSON", {"FAIL_TO_PASS": "[tests/x.py"}, "FAIL_TO_PASS", "JSON-encoded"),
    ("FAIL_TO_PASS of numbers", {"FAIL_TO_PASS": "[1, 2]"}, "FAIL_TO_PASS", "test-id strings"),
    ("FAIL_TO_PASS a dict", {"FAIL_TO_PASS": {"a": 1}}, "FAIL_TO_PASS", "test-id strings"),
    ("FAIL_TO_PASS empty", {"FAIL_TO_PASS": "[]"}, "FAIL_TO_PASS", "at least one test"),
    ("PASS_TO_PASS a string id", {"PASS_TO_PASS": '"t::x"'}, "PASS_TO_PASS", "test-id strings"),
    ("unknown log_parser", {"log_parser": "parse_log_nope"}, "log_parser", "unknown parser"),
    ("unknown eval_type", {"eval_type": "sometimes"}, "eval_type", "expected one of"),
    ("eval_script without markers", {"eval_script": "pytest\n"}, "eval_script", "marker"),
    ("version a list", {"version": ["1"]}, "version", "expected a string"),
    ("empty image", {"image": " "}, "image", "Docker image name"),
    ("image a path", {"image": "../../etc/passwd"}, "image", "Docker image name"),
    ("image with spaces", {"image": "a b:latest"}, "image", "Docker image name"),
    ("bad snapshot path", {"repo_snapshot": "repos/nowhere"}, "repo_snapshot", "no such folder"),
    ("snapshot not a string", {"repo_snapshot": 3}, "repo_snapshot", "expected a path"),
    (
        "test patch leaving the repo",
        {"test_patch": "--- a/../x\n+++ b/../x\n"},
        "test_patch",
        "outside the repository",
    ),
    (
        "test patch into .git",
        {"test_patch": "diff --git a/.git/config b/.git/config\n"},
        "test_patch",
        "outside the repository",
    ),
]


@pytest.mark.parametrize(
    ("changes", "field", "problem"),
    [case[1:] for case in MALFORMED],
    ids=[case[0] for case in MALFORMED],
)
def test_malformed_row_names_file_instance_and_field(
    tmp_path: Path, changes: dict[str, Any], field: str, problem: str
) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(good_row(**changes)) + "\n")
    with pytest.raises(TaskFormatError) as info:
        load_instances(path)
    assert info.value.path == str(path)
    assert info.value.field == field
    assert problem in str(info.value)
    if field != "instance_id":
        assert "octo__widget-7" in str(info.value)


def test_good_row_is_typed() -> None:
    instance = parse_instance(good_row(), source="rows.json", index=0, base_dir=None)
    assert instance.fail_to_pass == ("tests/test_w.py::test_wobble",)
    assert instance.pass_to_pass == ()
    assert instance.repo_snapshot is None


def test_lists_are_accepted_as_well_as_json_strings() -> None:
    row = good_row(FAIL_TO_PASS=["t::a", "t::b"], PASS_TO_PASS=("t::c",), version=3.1)
    instance = parse_instance(row, source="rows.json", index=0, base_dir=None)
    assert instance.fail_to_pass == ("t::a", "t::b")
    assert instance.pass_to_pass == ("t::c",)
    assert instance.version == "3.1"


def test_missing_image_gets_swebench_naming() -> None:
    row = good_row(image=_DROP, instance_id="pallets__flask-5014")
    instance = parse_instance(row, source="rows.json", index=0, base_dir=None)
    assert instance.image == "swebench/sweb.eval.x86_64.pallets_1776_flask-5014:latest"


def test_snapshot_resolves_relative_to_the_instance_file(tmp_path: Path) -> None:
    (tmp_path / "repos" / "w").mkdir(parents=True)
    row = good_row(repo_snapshot="repos/w", image=_DROP)
    instance = parse_instance(row, source="x.jsonl", index=0, base_dir=tmp_path)
    assert instance.repo_snapshot == (tmp_path / "repos" / "w").resolve()
    assert instance.image == ""


def test_row_that_is_not_an_object(tmp_path: Path) -> None:
    path = tmp_path / "rows.json"
    path.write_text(json.dumps([good_row(), ["not", "a", "row"]]))
    with pytest.raises(TaskFormatError, match=r"row 1.*expected an object"):
        load_instances(path)


# --- repo_snapshot stays inside the folder of the file holding the row ----------------------


def snapshot_rows(tmp_path: Path, snapshot: str) -> Path:
    """A rows file in ``tmp_path/rows`` whose one row names ``snapshot``."""
    (tmp_path / "rows" / "repos" / "w").mkdir(parents=True, exist_ok=True)
    path = tmp_path / "rows" / "rows.jsonl"
    path.write_text(json.dumps(good_row(repo_snapshot=snapshot, image=_DROP)) + "\n")
    return path


def assert_outside(error: TaskFormatError, path: Path) -> None:
    assert error.path == str(path) and error.field == "repo_snapshot"
    assert "row 0, instance 'octo__widget-7'" in str(error) and "outside" in str(error)
    assert "snapshot_root" in str(error)  # says how to widen it


@pytest.mark.parametrize("snapshot", ["/", "../../../root", "UP/etc", "repos/w/../../.."], ids=str)
def test_snapshot_outside_the_rows_folder_is_refused(tmp_path: Path, snapshot: str) -> None:
    """``/`` or ``../../../root`` would copy host files into the agent's sandbox."""
    nested = tmp_path / "a" / "b"
    (tmp_path / "root").mkdir()  # what ../../../root reaches from nested/rows
    up = "/".join([".."] * (len((nested / "rows").parts) - 1))
    path = snapshot_rows(nested, snapshot.replace("UP", up))
    with pytest.raises(TaskFormatError) as info:
        load_instances(path)
    assert_outside(info.value, path)


def test_symlink_leading_outside_is_refused(tmp_path: Path) -> None:
    (tmp_path / "secret").mkdir()
    path = snapshot_rows(tmp_path, "repos/link")
    (tmp_path / "rows" / "repos" / "link").symlink_to(tmp_path / "secret")
    with pytest.raises(TaskFormatError) as info:
        load_instances(path)
    assert_outside(info.value, path)
    assert str(tmp_path / "secret") in str(info.value)


def test_snapshot_root_widens_the_allowed_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared = tmp_path / "shared" / "w"
    shared.mkdir(parents=True)
    path = snapshot_rows(tmp_path, str(shared))
    with pytest.raises(TaskFormatError):
        load_instances(path)
    loaded = load_instances(path, snapshot_root=tmp_path / "shared")
    assert loaded.get("octo__widget-7").instance.repo_snapshot == shared.resolve()
    monkeypatch.setenv("THUNDERSYNC_SWEBENCH_SNAPSHOT_ROOT", str(tmp_path / "shared"))
    assert load_instances(path).get("octo__widget-7").instance.repo_snapshot == shared.resolve()
    with pytest.raises(TaskFormatError):  # a wider root for other folders only
        load_instances(snapshot_rows(tmp_path, "/"))
    monkeypatch.setenv("THUNDERSYNC_SWEBENCH_SNAPSHOT_ROOT", str(tmp_path / "absent"))
    with pytest.raises(TaskFormatError, match="THUNDERSYNC_SWEBENCH_SNAPSHOT_ROOT"):
        load_instances(path)


def test_hub_rows_name_snapshots_only_under_snapshot_root(tmp_path: Path) -> None:
    (tmp_path / "w").mkdir()
    row = good_row(repo_snapshot="w", image=_DROP)
    with pytest.raises(TaskFormatError, match="snapshot_root"):
        parse_instance(row, source="org/dataset", index=0, base_dir=None)
    instance = parse_instance(
        row, source="org/dataset", index=0, base_dir=None, snapshot_root=tmp_path
    )
    assert instance.repo_snapshot == (tmp_path / "w").resolve()


def test_instance_id_must_match_entirely() -> None:
    for bad in ("ok\n", "ok/..", "ok id", "ok\x00"):
        with pytest.raises(TaskFormatError, match="instance_id"):
            parse_instance(good_row(instance_id=bad), source="r.json", index=0, base_dir=None)
