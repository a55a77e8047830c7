"""Host-side workspace access: path mapping and copies that never follow the sandbox's links."""

from __future__ import annotations

import os
import sys
import tarfile
from pathlib import Path

import pytest

from environments.sandboxes import protocol
from environments.sandboxes.protocol import ExportTooLarge
from environments.sandboxes.workspace import archive_folder, copy_in, copy_out, host_path


@pytest.mark.parametrize(
    ("path", "rel"),
    [("/testbed", "."), ("/testbed/a/b.txt", "a/b.txt"), ("a/b.txt", "a/b.txt"), ("./x/../y", "y")],
)
def test_host_path_maps_inside_paths(tmp_path: Path, path: str, rel: str) -> None:
    assert host_path(tmp_path, "/testbed", path) == (tmp_path / rel if rel != "." else tmp_path)


@pytest.mark.parametrize("path", ["/etc/passwd", "../x", "/testbed/../etc", "/testbedx/y"])
def test_host_path_rejects_outside_paths(tmp_path: Path, path: str) -> None:
    with pytest.raises(ValueError, match="outside the workspace"):
        host_path(tmp_path, "/testbed", path)


def test_copy_in_replaces_a_planted_link_instead_of_following_it(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.write_text("original")
    (ws / "f").symlink_to(outside)
    src = tmp_path / "src"
    src.write_text("new")
    copy_in(src, ws / "f", None, root=ws)
    assert outside.read_text() == "original"
    assert (ws / "f").read_text() == "new" and not (ws / "f").is_symlink()


def test_copy_in_refuses_a_folder_link_leading_outside(tmp_path: Path) -> None:
    ws, outside = tmp_path / "ws", tmp_path / "outside"
    ws.mkdir()
    outside.mkdir()
    (ws / "evil").symlink_to(outside)
    src = tmp_path / "src"
    src.write_text("x")
    with pytest.raises(ValueError, match="outside the workspace"):
        copy_in(src, ws / "evil" / "f", None, root=ws)
    assert list(outside.iterdir()) == []


def test_copy_in_merges_folders_and_keeps_links_as_links(tmp_path: Path) -> None:
    src, ws = tmp_path / "src", tmp_path / "ws"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("a")
    (src / "link").symlink_to("sub/a.txt")
    (ws / "sub").mkdir(parents=True)
    (ws / "sub" / "old.txt").write_text("old")
    copy_in(src, ws, None)
    assert sorted(p.name for p in (ws / "sub").iterdir()) == ["a.txt", "old.txt"]
    assert os.readlink(ws / "link") == "sub/a.txt"


def test_copy_out_skips_fifos_and_refuses_links_outside(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / "d").mkdir(parents=True)
    (ws / "d" / "f").write_text("f")
    os.mkfifo(ws / "d" / "pipe")
    (ws / "out").symlink_to("/etc/hostname")
    copy_out(ws / "d", ws, tmp_path / "got")
    assert [p.name for p in (tmp_path / "got").iterdir()] == ["f"]
    with pytest.raises(ValueError, match="outside the workspace"):
        copy_out(ws / "out", ws, tmp_path / "leak")
    with pytest.raises(ValueError, match="not a regular file"):
        copy_out(ws / "d" / "pipe", ws, tmp_path / "pipe")
    assert not (tmp_path / "leak").exists()


def test_archive_folder_leaves_out_the_excluded_children_only(tmp_path: Path) -> None:
    work = tmp_path / "testbed"
    (work / ".git" / "objects").mkdir(parents=True)
    (work / ".git" / "objects" / "big").write_bytes(b"x" * 1000)
    (work / "sub" / ".git").mkdir(parents=True)
    (work / "sub" / ".git" / "keep").write_text("x")
    (work / "a.py").write_text("a")
    archive_folder(work, "testbed", tmp_path / "part.tar", exclude=(".git",))
    with tarfile.open(tmp_path / "part.tar") as archive:
        names = sorted(m.name for m in archive)
    assert names == [
        "testbed",
        "testbed/a.py",
        "testbed/sub",
        "testbed/sub/.git",
        "testbed/sub/.git/keep",
    ]


def test_archive_folder_takes_any_nesting_depth_in_name_order(tmp_path: Path) -> None:
    """An agent's 1200 nested folders once hit Python's recursion limit in the grader (here
    300 under a limit of 200)."""
    work = tmp_path / "app"
    deep = work / "/".join(["d"] * 300)
    deep.mkdir(parents=True)
    (deep / "leaf").write_text("x")
    (work / "b").write_text("b")
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(200)
    try:
        archive_folder(work, "app", tmp_path / "deep.tar")
    finally:
        sys.setrecursionlimit(limit)
    with tarfile.open(tmp_path / "deep.tar") as archive:
        names = [m.name for m in archive]
    assert names[:3] == ["app", "app/b", "app/d"]
    assert names[-1] == "app/" + "d/" * 300 + "leaf" and len(names) == 303


def test_archive_folder_stops_past_the_export_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sparse files take no disk where the agent made them, but their full size in an archive:
    past ``MAX_EXPORT_BYTES`` the export stops, as the agent's failure."""
    monkeypatch.setattr(protocol, "MAX_EXPORT_BYTES", 10_000)
    work = tmp_path / "app"
    work.mkdir()
    with open(work / "sparse", "wb") as handle:
        handle.truncate(6_000)
    (work / "sparse2").write_bytes(b"x" * 5_000)
    with pytest.raises(ExportTooLarge, match="over 10000 bytes"):
        archive_folder(work, "app", tmp_path / "big.tar")
    (work / "sparse2").unlink()
    archive_folder(work, "app", tmp_path / "ok.tar")
