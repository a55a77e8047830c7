"""Harbor datasets on disk (issue 37 item 6): a folder with ``dataset.toml`` lists its tasks
in the manifest's order by package name, found beside it by ``[task] name`` or in Harbor's
package cache layout by digest; a package cache folder lists what it holds; a task cached in
two versions, a task the manifest names but the disk lacks, and a link out are refused."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from environments.suites import detect_format, resolve_suite
from environments.tasks import TaskFormatError
from environments.terminal_bench import load_tasks

ROOT = Path(__file__).resolve().parents[4]
DATASET = ROOT / "tests" / "fixtures" / "harbor-dataset"
CACHED = DATASET / "thundersync" / "word-count"
(WORD_COUNT,) = CACHED.iterdir()


def test_a_dataset_folder_lists_its_tasks_by_name_in_the_manifests_order() -> None:
    assert detect_format(DATASET) == "terminal_bench"
    suite = resolve_suite(str(DATASET))
    assert suite.name == "thundersync/mini-bench@0.1.0"
    assert [t.task_id for t in suite] == ["word-count", "greeting-file"]
    word_count = suite.get("word-count")
    assert word_count.path == WORD_COUNT  # the cache folder at the manifest's digest
    assert word_count.metadata["package"]["name"] == "thundersync/word-count"
    assert suite.get("greeting-file").path == DATASET / "greeting-file"


@pytest.mark.parametrize("folder", [DATASET / "thundersync", CACHED])
def test_a_package_cache_folder_lists_what_it_holds_by_name(folder: Path) -> None:
    assert detect_format(folder) == "terminal_bench"
    assert [t.task_id for t in load_tasks(folder)] == ["word-count"]


def _cache(tmp_path: Path) -> Path:
    packages = tmp_path / "tasks" / "packages"
    shutil.copytree(CACHED, packages / "thundersync" / "word-count")
    return packages


def test_harbors_whole_packages_folder_works_and_two_versions_are_refused(tmp_path: Path) -> None:
    packages = _cache(tmp_path)
    assert [t.task_id for t in load_tasks(packages)] == ["word-count"]
    shutil.copytree(WORD_COUNT, packages / "thundersync" / "word-count" / ("0" * 64))
    with pytest.raises(TaskFormatError, match=r"'word-count' is cached in 2 versions.*dataset"):
        load_tasks(packages)


def test_a_manifest_naming_a_task_the_disk_lacks_says_how_to_get_it(tmp_path: Path) -> None:
    packages = _cache(tmp_path)
    manifest = (DATASET / "dataset.toml").read_text()
    (packages / "dataset.toml").write_text(manifest)  # greeting-file is not in this cache
    with pytest.raises(TaskFormatError, match=r"tasks\[1\].*'thundersync/greeting-file' not found"):
        load_tasks(packages)
    (packages / "dataset.toml").write_text(manifest.replace("sha256:1b4", "sha256:xyz"))
    with pytest.raises(TaskFormatError, match=r"tasks\[0\]\.digest"):
        load_tasks(packages)


def test_harbors_export_layout_is_a_folder_of_task_folders(tmp_path: Path) -> None:
    export = tmp_path / "mini-bench"  # harbor download ... -o tmp_path, its default mode
    shutil.copytree(WORD_COUNT, export / "word-count")
    shutil.copytree(DATASET / "greeting-file", export / "greeting-file")
    (export / "metric.py").write_text("# a dataset-level file Harbor downloads beside them\n")
    assert [t.task_id for t in load_tasks(export)] == ["greeting-file", "word-count"]


def test_a_cached_task_linked_from_outside_the_dataset_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere"
    shutil.copytree(WORD_COUNT, outside)
    packages = tmp_path / "packages" / "thundersync" / "word-count"
    packages.mkdir(parents=True)
    (packages / WORD_COUNT.name).symlink_to(outside)
    with pytest.raises(TaskFormatError, match="outside"):
        load_tasks(tmp_path / "packages")
