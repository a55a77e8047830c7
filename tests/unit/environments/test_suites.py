"""Suites: registered names, format detection of folders, and clear errors."""

from __future__ import annotations

import json
import shutil

import pytest

from environments.core import ShellEnv
from environments.suites import (
    FIXTURES,
    SUITES,
    UnknownSuiteError,
    detect_format,
    make_suite_env,
    resolve_suite,
    resolve_suites,
)


def test_registered_names():
    assert {"swebench-mini", "tb1-mini", "harbor-mini", "toy-sum"} <= set(SUITES)
    assert len(resolve_suite("toy-sum")) == 8


def test_format_detection(tmp_path):
    (tmp_path / "tb" / "task-a").mkdir(parents=True)
    (tmp_path / "tb" / "task-a" / "task.yaml").write_text("instruction: x\n")
    (tmp_path / "harbor").mkdir()
    (tmp_path / "harbor" / "task.toml").write_text("")
    (tmp_path / "swe").mkdir()
    (tmp_path / "swe" / "rows.jsonl").write_text(json.dumps({"instance_id": "a"}) + "\n")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.md").write_text("hi")
    assert detect_format(tmp_path / "tb") == "terminal_bench"
    assert detect_format(tmp_path / "harbor") == "terminal_bench"
    assert detect_format(tmp_path / "swe") == "swebench"
    assert detect_format(tmp_path / "swe" / "rows.jsonl") == "swebench"
    assert detect_format(tmp_path / "other") is None
    assert detect_format(FIXTURES / "swebench") == "swebench"
    assert detect_format(FIXTURES / "terminal_bench" / "tb1") == "terminal_bench"


def test_unknown_names_and_unrecognised_folders_are_clear_errors(tmp_path):
    with pytest.raises(UnknownSuiteError, match="unknown suite 'nope'.*toy-sum"):
        resolve_suite("nope")
    with pytest.raises(UnknownSuiteError, match="unrecognised suite folder"):
        resolve_suite(tmp_path)


def test_combined_suites_reject_duplicate_task_ids():
    with pytest.raises(ValueError, match="appears twice"):
        resolve_suites(["toy-sum", "toy-sum"])


def test_make_suite_env_runs_over_the_suite():
    env = make_suite_env("toy-sum", sandbox="bwrap")
    assert isinstance(env, ShellEnv) and len(env.tasks) == 8


def test_a_suite_child_linking_out_of_the_suite_folder_is_refused_naming_it(tmp_path):
    from environments.tasks import TaskFormatError

    suite, outside = tmp_path / "suite", tmp_path / "elsewhere"
    shutil.copytree(FIXTURES / "terminal_bench" / "tb1" / "sales-report", suite / "sales-report")
    shutil.copytree(FIXTURES / "terminal_bench" / "tb1" / "sort-files", outside / "sort-files")
    (suite / "sort-files").symlink_to(outside / "sort-files")
    with pytest.raises(TaskFormatError, match="outside the suite folder") as info:
        resolve_suite(suite)
    assert info.value.path == str(suite / "sort-files") and info.value.field == "sort-files"
    (suite / "sort-files").unlink()
    (suite / "copy").symlink_to("sales-report")  # a link that stays inside still loads
    assert [task.task_id for task in resolve_suite(suite)] == ["copy", "sales-report"]
