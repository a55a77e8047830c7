"""One SWE-bench row, validated field by field into a typed instance."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.swebench.repository import check_snapshot
from environments.swebench.snapshot import END_MARKER, START_MARKER
from environments.tasks import TaskFormatError
from environments.unified_diff import parse_patch
from thundersync.protocol.documents import DocumentError, load_json

REQUIRED_TEXT_FIELDS = (
    "repo",
    "base_commit",
    "patch",
    "test_patch",
    "problem_statement",
    "eval_script",
    "log_parser",
    "eval_type",
)
OPTIONAL_TEXT_FIELDS = ("hints_text", "created_at", "environment_setup_commit")
SNAPSHOT_ROOT_ENV = "THUNDERSYNC_SWEBENCH_SNAPSHOT_ROOT"
"""Environment variable naming one more folder that ``repo_snapshot`` paths may resolve into
(what ``load_instances(snapshot_root=...)`` does, for callers such as the CLI)."""

_INSTANCE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.\-]*")
_COMMIT = re.compile(r"[0-9a-f]{40}")
_NAME = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(
    rf"(?:[A-Za-z0-9.-]+(?::[0-9]+)?/)?{_NAME}(?:/{_NAME})*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
"""A Docker image reference (``[registry/]name[:tag][@digest]``)."""

Fail = Callable[[str, str], TaskFormatError]


@dataclass(frozen=True, slots=True)
class SWEBenchInstance:
    """A validated SWE-bench instance (official schema, v5 fields included).

    ``fail_to_pass``/``pass_to_pass`` are decoded lists of test ids; ``image`` is the row's
    Docker image, or swebench's own naming when the row has none (empty for a snapshot
    instance without one); ``repo_snapshot`` is the resolved path of a local repository
    snapshot (the offline alternative to ``image``: a folder of plain files, a git repository
    or a git bundle file; ``environments.swebench.repository``); ``source`` is the file or
    dataset the row came from.
    """

    instance_id: str
    repo: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    version: str
    eval_script: str
    log_parser: str
    eval_type: str
    image: str
    hints_text: str = ""
    created_at: str = ""
    environment_setup_commit: str = ""
    repo_snapshot: Path | None = None
    source: str = ""

    def swebench_row(self) -> dict[str, Any]:
        """The row as ``swebench.harness.utils.make_test_spec`` expects it."""
        return {
            "instance_id": self.instance_id,
            "repo": self.repo,
            "version": self.version,
            "image": self.image,
            "eval_script": self.eval_script,
            "log_parser": self.log_parser,
            "eval_type": self.eval_type,
            "FAIL_TO_PASS": list(self.fail_to_pass),
            "PASS_TO_PASS": list(self.pass_to_pass),
        }


def official_image_name(instance_id: str) -> str:
    """The published image of an instance, as swebench names it (``__`` becomes ``_1776_``)."""
    from swebench.task.checks import expected_image

    return expected_image(instance_id)


def parse_instance(
    row: Mapping[str, Any],
    *,
    source: str,
    index: int,
    base_dir: Path | None,
    snapshot_root: Path | None = None,
) -> SWEBenchInstance:
    """Validate ``row`` (number ``index`` of ``source``); raise TaskFormatError naming the
    file, the row, the instance and the field on the first problem found.

    ``base_dir`` is the folder of the instance file (None for Hub rows): a relative
    ``repo_snapshot`` resolves against it, and the snapshot, after following links, must lie
    inside it or inside ``snapshot_root`` (a folder the caller trusts as well; Hub rows,
    having no folder, resolve a relative path against it).
    """
    if not isinstance(row, Mapping):
        raise TaskFormatError(source, f"row {index}", f"expected an object, got {_kind(row)}")
    instance_id = row.get("instance_id")
    if not isinstance(instance_id, str) or not _INSTANCE_ID.fullmatch(instance_id):
        raise TaskFormatError(
            source,
            "instance_id",
            f"row {index}: expected a non-empty id of letters, digits, '_', '.', '-', "
            f"got {instance_id!r}",
        )
    where = f"row {index}, instance {instance_id!r}"

    def fail(field_name: str, problem: str) -> TaskFormatError:
        return TaskFormatError(source, field_name, f"{where}: {problem}")

    texts = {name: _text(row, name, required=True, fail=fail) for name in REQUIRED_TEXT_FIELDS}
    texts |= {name: _text(row, name, required=False, fail=fail) for name in OPTIONAL_TEXT_FIELDS}
    if not _COMMIT.fullmatch(texts["base_commit"]):
        raise fail("base_commit", f"expected 40 hex digits, got {texts['base_commit']!r}")
    _check_grading_fields(texts, fail)
    version = row.get("version")
    if isinstance(version, bool) or not isinstance(version, str | int | float):
        raise fail("version", f"expected a string, got {_kind(version)}")
    image = row.get("image")
    if image is not None and (not isinstance(image, str) or not _IMAGE.fullmatch(image)):
        raise fail("image", f"expected a Docker image name, got {image!r}")
    _check_test_patch_paths(texts["test_patch"], fail)
    roots = tuple(p.resolve() for p in (base_dir, snapshot_root) if p is not None)
    anchor = base_dir if base_dir is not None else snapshot_root
    snapshot = _snapshot(row.get("repo_snapshot"), anchor, roots, fail)
    if snapshot is not None:
        try:
            check_snapshot(snapshot, texts["base_commit"], roots)
        except ValueError as exc:
            raise fail("repo_snapshot", str(exc)) from exc
    if not image:
        image = "" if snapshot is not None else official_image_name(instance_id)
    return SWEBenchInstance(
        instance_id=instance_id,
        fail_to_pass=_test_ids(row, "FAIL_TO_PASS", fail),
        pass_to_pass=_test_ids(row, "PASS_TO_PASS", fail),
        version=str(version),
        image=image,
        repo_snapshot=snapshot,
        source=source,
        **texts,
    )


def _check_grading_fields(texts: dict[str, str], fail: Fail) -> None:
    from swebench.harness.constants import EvalType
    from swebench.harness.log_parsers import PARSER_REGISTRY

    if texts["log_parser"] not in PARSER_REGISTRY:
        raise fail("log_parser", f"unknown parser {texts['log_parser']!r} (not in PARSER_REGISTRY)")
    eval_types = sorted(e.value for e in EvalType)
    if texts["eval_type"] not in eval_types:
        raise fail("eval_type", f"expected one of {eval_types}, got {texts['eval_type']!r}")
    for marker in (START_MARKER, END_MARKER):
        if marker not in texts["eval_script"]:
            raise fail("eval_script", f"the script does not print the {marker!r} marker")


def _text(row: Mapping[str, Any], name: str, *, required: bool, fail: Fail) -> str:
    if name not in row or row[name] is None:
        if required:
            raise fail(name, "missing field")
        return ""
    value = row[name]
    if not isinstance(value, str):
        raise fail(name, f"expected a string, got {_kind(value)}")
    if required and not value.strip():
        raise fail(name, "expected a non-empty string")
    return value


def _test_ids(row: Mapping[str, Any], name: str, fail: Fail) -> tuple[str, ...]:
    if name not in row or row[name] is None:
        raise fail(name, "missing field")
    value = row[name]
    if isinstance(value, str):
        try:
            value = load_json(value, name)
        except DocumentError as exc:
            raise fail(name, f"expected a JSON-encoded list of test ids: {exc.problem}") from None
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) for v in value):
        raise fail(name, f"expected a list of test-id strings, got {value!r:.200}")
    if name == "FAIL_TO_PASS" and not value:
        raise fail(name, "expected at least one test that the fix makes pass")
    return tuple(value)


def _snapshot(value: Any, anchor: Path | None, roots: tuple[Path, ...], fail: Fail) -> Path | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip() or "\0" in value:
        raise fail("repo_snapshot", f"expected a path, got {value!r}")
    widen = f"widen with load_instances(..., snapshot_root=FOLDER) or {SNAPSHOT_ROOT_ENV}=FOLDER"
    if not roots:
        raise fail("repo_snapshot", f"a row from a dataset without a folder has {value!r}: {widen}")
    path = Path(value)
    if not path.is_absolute() and anchor is not None:
        path = anchor / path
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise fail("repo_snapshot", f"no such folder or bundle file: {path}") from None
    if not any(real == root or root in real.parents for root in roots):
        inside = " or ".join(str(root) for root in roots)
        raise fail(
            "repo_snapshot",
            f"{value!r} resolves to {real}, outside {inside} (a row's files must lie in the "
            f"folder of the file holding it); {widen}",
        )
    return real


def is_repo_path(path: str) -> bool:
    """A normalised path inside the repository: relative, no ``..``, not in ``.git``, not an
    option (``-x``), one line."""
    parts = path.split("/")
    return (
        bool(path)
        and not path.startswith(("/", "-"))
        and posixpath.normpath(path) == path
        and ".." not in parts
        and ".git" not in parts
        and not any(c in path for c in "\0\n\r")
    )


def _check_test_patch_paths(test_patch: str, fail: Fail) -> None:
    for diff in parse_patch(test_patch):
        for path in (diff.old_path, diff.new_path):
            if path is not None and not is_repo_path(path):
                raise fail("test_patch", f"a path outside the repository: {path!r}")


def _kind(value: Any) -> str:
    return f"{type(value).__name__} {value!r:.80}"
