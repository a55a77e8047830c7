"""Unified diffs as data: ``parse_patch`` reads a ``git diff`` or ``diff -u`` patch into one
``FileDiff`` per file (old and new path, hunks), with git's quoted and escaped path names, new
and deleted files, renames, and binary or mode-only changes (no hunks). The tamper rules
(``environments/tamper.py``) and SWE-bench grading read patches through it."""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = ["FileDiff", "Hunk", "parse_patch"]

_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


@dataclass(frozen=True, slots=True)
class Hunk:
    """One ``@@`` block of a unified diff; ``lines`` keep their `` ``/``+``/``-`` prefix."""

    old_start: int
    old_count: int
    lines: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class FileDiff:
    """One file of a unified diff: ``old_path`` is None for a new file, ``new_path`` for a
    deleted one; binary and mode-only changes have no hunks."""

    old_path: str | None
    new_path: str | None
    hunks: tuple[Hunk, ...] = ()
    binary: bool = False
    """git shows the change as binary data (``GIT binary patch``, ``Binary files ... differ``):
    a text file with a NUL byte in it is one, and its lines are in no hunk."""

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""


def parse_patch(patch: str) -> list[FileDiff]:
    """The files of a unified diff in git's format (quoted paths, renames, binary parts and
    plain ``---``/``+++`` diffs included); hunks are read by their line counts."""
    lines = patch.split("\n")
    diffs, index = [], 0
    while index < len(lines):
        line = lines[index]
        plain = (
            line.startswith("--- ")
            and lines[index + 1 : index + 2] != []
            and (lines[index + 1].startswith("+++ "))
        )
        if line.startswith("diff --git ") or plain:
            diff, index = _parse_file(lines, index)
            diffs.append(diff)
        else:
            index += 1
    return diffs


def _parse_file(lines: list[str], index: int) -> tuple[FileDiff, int]:
    first = lines[index].rstrip("\r")
    git_paths = _git_line_paths(first[len("diff --git ") :]) if first.startswith("diff") else None
    old = new = None
    saw_old = saw_new = binary = False
    if first.startswith("diff --git "):
        index += 1
    while index < len(lines) and not lines[index].startswith(("diff --git ", "@@ ")):
        line = lines[index].rstrip("\r")
        index += 1
        if line.startswith("--- "):
            old, saw_old = _side_path(line[4:], "a/"), True
        elif line.startswith("+++ "):
            new, saw_new = _side_path(line[4:], "b/"), True
            break
        elif line.startswith(("rename from ", "copy from ")):
            old, saw_old = _unquote(line.split(" from ", 1)[1]), True
        elif line.startswith(("rename to ", "copy to ")):
            new, saw_new = _unquote(line.split(" to ", 1)[1]), True
        elif line.startswith("new file mode"):
            saw_old = True
        elif line.startswith("deleted file mode"):
            saw_new = True
        elif line == "GIT binary patch" or (
            line.startswith("Binary files ") and line.endswith(" differ")
        ):
            binary = True
    if git_paths is not None:
        old = old if saw_old else git_paths[0]
        new = new if saw_new else git_paths[1]
    hunks = []
    while index < len(lines) and lines[index].startswith("@@ "):
        hunk, index = _parse_hunk(lines, index)
        hunks.append(hunk)
    return FileDiff(old, new, tuple(hunks), binary), index


def _parse_hunk(lines: list[str], index: int) -> tuple[Hunk, int]:
    match = _HUNK.match(lines[index])
    index += 1
    if match is None:
        return Hunk(0, 0, ()), index
    old_start, old_count = int(match[1]), int(match[2] if match[2] is not None else 1)
    left_old, left_new = old_count, int(match[4] if match[4] is not None else 1)
    body = []
    while index < len(lines) and (left_old > 0 or left_new > 0):
        line = lines[index]
        tag = line[:1]
        if tag in (" ", ""):
            left_old, left_new = left_old - 1, left_new - 1
        elif tag == "-":
            left_old -= 1
        elif tag == "+":
            left_new -= 1
        elif tag != "\\":
            break
        body.append(line)
        index += 1
    while index < len(lines) and lines[index].startswith("\\"):
        index += 1
    return Hunk(old_start, old_count, tuple(body)), index


def apply_hunks(old_text: str, diff: FileDiff) -> str | None:
    """The file's text after ``diff`` (its hunks applied to ``old_text``, line by line), or None
    where a hunk's context or removed lines are not those of ``old_text``."""
    old = old_text.splitlines()
    new: list[str] = []
    at = 0
    for hunk in diff.hunks:
        start = hunk.old_start if hunk.old_count == 0 else hunk.old_start - 1
        if start < at or start > len(old):
            return None
        new += old[at:start]
        at = start
        for line in hunk.lines:
            tag, text = line[:1], line[1:]
            if tag in (" ", "", "-"):
                if at >= len(old) or old[at] != text:
                    return None
                at += 1
                if tag != "-":
                    new.append(text)
            elif tag == "+":
                new.append(text)
    return "\n".join(new + old[at:]) + "\n"


def _side_path(text: str, prefix: str) -> str | None:
    text = text.rstrip("\t")
    if text == "/dev/null":
        return None
    path = _unquote(text)
    return path[len(prefix) :] if path.startswith(prefix) else path


def _git_line_paths(rest: str) -> tuple[str | None, str | None] | None:
    """The two paths of ``diff --git a/X b/Y`` (ambiguous with spaces: X == Y is assumed)."""
    if rest.startswith('"'):
        end = _quoted_end(rest)
        left, right = rest[: end + 1], rest[end + 2 :]
    else:
        half = (len(rest) - 1) // 2
        if rest[half : half + 1] == " " and rest[2:half] == rest[half + 3 :]:
            left, right = rest[:half], rest[half + 1 :]
        else:
            left, _, tail = rest.partition(" b/")
            right = "b/" + tail
    return _side_path(left, "a/"), _side_path(right, "b/")


def _quoted_end(text: str) -> int:
    index = 1
    while index < len(text) and text[index] != '"':
        index += 2 if text[index] == "\\" else 1
    return index


_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}


def _unquote(text: str) -> str:
    """A path as git prints it: C-quoted (octal bytes, ``\\n``...) when it has odd bytes."""
    if len(text) < 2 or not (text.startswith('"') and text.endswith('"')):
        return text
    out, body, index = bytearray(), text[1:-1], 0
    while index < len(body):
        char = body[index]
        if char == "\\" and re.fullmatch(r"[0-7]{3}", body[index + 1 : index + 4]):
            out.append(int(body[index + 1 : index + 4], 8))
            index += 4
        elif char == "\\" and body[index + 1 : index + 2] in _ESCAPES:
            out.append(_ESCAPES[body[index + 1]])
            index += 2
        else:
            out += char.encode()
            index += 1
    return out.decode("utf-8", errors="replace")
