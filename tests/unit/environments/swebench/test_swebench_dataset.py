"""Loading SWE-bench instances: the official Verified and Lite rows, every local format, the Hub."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from environments.swebench import (
    SWEBenchTask,
    load_instances,
    looks_like_swebench,
)
from environments.tasks import TaskFormatError, TaskList

REPO_ROOT = Path(__file__).resolve().parents[4]
DATA = Path(os.environ.get("THUNDERSYNC_SWEBENCH_DATA", REPO_ROOT.parent / "shared/data/swebench"))
VERIFIED = DATA / "SWE-bench_Verified.test.parquet"
LITE = DATA / "SWE-bench_Lite.test.parquet"
FIXTURES = REPO_ROOT / "environments/fixtures/swebench"

needs_verified = pytest.mark.skipif(not VERIFIED.exists(), reason=f"{VERIFIED} absent")
needs_lite = pytest.mark.skipif(not LITE.exists(), reason=f"{LITE} absent")


@pytest.fixture(scope="module")
def verified() -> TaskList:
    if not VERIFIED.exists():
        pytest.skip(f"{VERIFIED} absent")
    return load_instances(VERIFIED)


def official_rows(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


@needs_verified
def test_all_verified_rows_load_typed(verified: TaskList) -> None:
    assert len(verified) == 500
    rows = {row["instance_id"]: row for row in official_rows(VERIFIED)}
    for task in verified:
        instance = task.instance
        row = rows[task.task_id]
        assert instance.fail_to_pass == tuple(json.loads(row["FAIL_TO_PASS"]))
        assert instance.pass_to_pass == tuple(json.loads(row["PASS_TO_PASS"]))
        assert instance.fail_to_pass and all(isinstance(t, str) for t in instance.fail_to_pass)
        assert instance.eval_script == row["eval_script"]
        assert instance.repo_snapshot is None
        assert task.instruction.count(row["problem_statement"].strip()) == 1


@needs_lite
def test_all_lite_rows_load() -> None:
    lite = load_instances(LITE)
    assert len(lite) == 300
    assert lite.name == "SWE-bench_Lite.test"
    assert lite.get("django__django-11099").instance.repo == "django/django"


@needs_verified
@pytest.mark.parametrize(
    ("instance_id", "image"),
    [
        ("pallets__flask-5014", "swebench/sweb.eval.x86_64.pallets_1776_flask-5014:latest"),
        ("django__django-11099", "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"),
        ("astropy__astropy-12907", "swebench/sweb.eval.x86_64.astropy_1776_astropy-12907:latest"),
        ("sympy__sympy-20590", "swebench/sweb.eval.x86_64.sympy_1776_sympy-20590:latest"),
    ],
)
def test_official_image_naming(verified: TaskList, instance_id: str, image: str) -> None:
    task = verified.get(instance_id)
    spec = task.sandbox_spec()
    assert spec.image == image
    assert spec.workdir == "/testbed"
    assert spec.files is None


@needs_verified
def test_swebench_naming_matches_every_verified_row_image() -> None:
    from environments.swebench.instance import official_image_name

    for row in official_rows(VERIFIED):
        assert official_image_name(row["instance_id"]) == row["image"]


def write_rows(path: Path, rows: list[dict]) -> None:
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif path.suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)


def fixture_rows() -> list[dict]:
    lines = (FIXTURES / "instances.jsonl").read_text().splitlines()
    rows = [json.loads(line) for line in lines]
    for row in rows:
        row["repo_snapshot"] = str(FIXTURES / row["repo_snapshot"])
    return rows


@pytest.mark.parametrize("suffix", [".json", ".jsonl", ".parquet"])
def test_every_local_format_loads_the_same_instances(tmp_path: Path, suffix: str) -> None:
    path = tmp_path / f"rows{suffix}"
    write_rows(path, fixture_rows())
    loaded = load_instances(path, snapshot_root=FIXTURES)
    reference = load_instances(FIXTURES / "instances.jsonl")
    assert len(loaded) == len(reference) >= 3
    for got, want in zip(loaded, reference, strict=True):
        assert got.instance.source == str(path)
        assert replace(got.instance, source="") == replace(want.instance, source="")


def test_folder_loads_every_data_file(tmp_path: Path) -> None:
    rows = fixture_rows()
    write_rows(tmp_path / "a.jsonl", rows[:1])
    write_rows(tmp_path / "b.parquet", rows[1:])
    (tmp_path / "notes.md").write_text("not data")
    loaded = load_instances(tmp_path, snapshot_root=FIXTURES)
    assert sorted(t.task_id for t in loaded) == sorted(r["instance_id"] for r in rows)
    assert all(isinstance(t, SWEBenchTask) for t in loaded)


def test_shipped_fixture_folder_loads() -> None:
    loaded = load_instances(FIXTURES)
    assert len(loaded) >= 3
    for task in loaded:
        assert task.instance.repo_snapshot is not None
        assert task.instance.repo_snapshot.is_dir()


def test_duplicate_ids_across_files_name_both(tmp_path: Path) -> None:
    rows = fixture_rows()
    write_rows(tmp_path / "a.jsonl", rows[:1])
    write_rows(tmp_path / "b.json", rows[:1])
    with pytest.raises(TaskFormatError) as info:
        load_instances(tmp_path, snapshot_root=FIXTURES)
    assert info.value.field == "instance_id"
    assert info.value.path == str(tmp_path / "b.json")
    assert "duplicate" in str(info.value) and str(tmp_path / "a.jsonl") in str(info.value)


@pytest.mark.parametrize(
    ("name", "text", "field"),
    [
        ("bad.jsonl", '{"instance_id": "x"}\n{not json\n', "line 2"),
        ("bad.json", "{broken", "<root>"),
        ("obj.json", '{"instance_id": "x"}', "<root>"),
        ("bad.parquet", "not parquet at all", "<file>"),
    ],
)
def test_unreadable_files_name_the_file(tmp_path: Path, name: str, text: str, field: str) -> None:
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(TaskFormatError) as info:
        load_instances(path)
    assert info.value.path == str(path)
    assert info.value.field == field


def test_missing_file_and_empty_folder(tmp_path: Path) -> None:
    with pytest.raises(TaskFormatError, match="no such file"):
        load_instances(tmp_path / "absent.jsonl")
    with pytest.raises(TaskFormatError, match="no .json/.jsonl/.parquet files"):
        load_instances(tmp_path)


def test_hub_name_goes_through_datasets(monkeypatch: pytest.MonkeyPatch) -> None:
    import datasets

    calls = []

    def fake_load_dataset(name: str, split: str) -> list[dict]:
        calls.append((name, split))
        return fixture_rows()

    monkeypatch.setattr(datasets, "load_dataset", fake_load_dataset)
    loaded = load_instances("SWE-bench/SWE-bench_Verified", split="dev", snapshot_root=FIXTURES)
    assert calls == [("SWE-bench/SWE-bench_Verified", "dev")]
    assert loaded.name == "SWE-bench/SWE-bench_Verified" and len(loaded) == len(fixture_rows())


def test_looks_like_swebench(tmp_path: Path) -> None:
    assert looks_like_swebench(FIXTURES)
    assert looks_like_swebench(FIXTURES / "instances.jsonl")
    other = tmp_path / "tb"
    other.mkdir()
    (other / "task.yaml").write_text("instruction: hi\n")
    (other / "data.json").write_text('[{"name": "not swebench"}]')
    assert not looks_like_swebench(other)
    (tmp_path / "broken.jsonl").write_text("{nope")
    assert not looks_like_swebench(tmp_path / "broken.jsonl")
    if VERIFIED.exists():
        assert looks_like_swebench(VERIFIED)


@needs_verified
def test_reference_solutions_survive_the_action_protocol(verified: TaskList) -> None:
    """The oracle sends each command as a fenced action: none may be cut by a fence inside."""
    from environments.actions import format_action, parse_action

    for task in verified:
        for command in task.reference_solution():
            assert parse_action(format_action(command)).command == command.strip()


@pytest.mark.parametrize(
    ("name", "field"), [("deep.json", "<root>"), ("deep.jsonl", "line 2")], ids=["json", "jsonl"]
)
def test_an_instance_file_nested_10000_deep_is_a_one_line_error(
    tmp_path: Path, name: str, field: str
) -> None:
    deep = "[" * 10_000 + "]" * 10_000
    path = tmp_path / name
    path.write_text(deep if name.endswith(".json") else f'{{"instance_id": "x"}}\n{deep}\n')
    with pytest.raises(TaskFormatError, match="nested more than 100 levels deep") as info:
        load_instances(path)
    assert (info.value.path, info.value.field) == (str(path), field)
    assert "\n" not in str(info.value)
