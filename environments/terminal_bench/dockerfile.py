"""Reads a task's Dockerfile and decides whether bubblewrap can reproduce it without a build."""

from __future__ import annotations

import json
import posixpath
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from environments.sandboxes.host_view import validate_workdir
from environments.tasks import TaskFormatError
from environments.terminal_bench import inputs

BASE_IMAGE = "thundersync/base:bookworm"
DEFAULT_WORKDIR = "/app"
_IGNORED = frozenset(
    {"CMD", "ENTRYPOINT", "LABEL", "EXPOSE", "VOLUME", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER"}
)
_BUILD_ONLY = frozenset({"ADD", "USER", "ARG", "ONBUILD", "SHELL"})
_KNOWN = _IGNORED | _BUILD_ONLY | {"FROM", "WORKDIR", "ENV", "COPY", "RUN"}


@dataclass(frozen=True, slots=True)
class Copy:
    """One ``COPY``: host sources (inside the build context) to a path relative to the workspace."""

    sources: tuple[Path, ...]
    dest: str
    dest_is_dir: bool


@dataclass(frozen=True, slots=True)
class RunStep:
    """One ``RUN`` in shell form and the WORKDIR it runs in."""

    command: str
    cwd: str


@dataclass(frozen=True, slots=True)
class DockerfilePlan:
    """What a Dockerfile does, as far as bubblewrap is concerned."""

    path: Path
    workdir: str
    base_image: str = BASE_IMAGE
    """The ``FROM`` image as written; bubblewrap runs the plan when it is, or is aliased to,
    ``BASE_IMAGE`` (``environments.sandboxes.image_build``)."""
    env: dict[str, str] = field(default_factory=dict)
    copies: tuple[Copy, ...] = ()
    run_steps: tuple[RunStep, ...] = ()
    build_step: str | None = None
    """The first line that only ``docker build`` can do (None: bubblewrap can run it)."""
    test_copies: tuple[Copy, ...] = ()
    """``COPY`` into the tests folder (``read_dockerfile``'s ``tests_dir``), destinations
    relative to it: the grader uploads these files with the tests (a verifier image's)."""


def _logical_lines(path: Path, text: str) -> list[tuple[int, str]]:
    """Instruction lines with continuations joined and comments dropped, with line numbers."""
    lines: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(text.splitlines(), start=1):
        stripped = raw.strip()
        if not pending and (not stripped or stripped.startswith("#")):
            continue
        if pending and stripped.startswith("#"):
            continue
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        lines.append((start, " ".join(p for p in pending if p)))
        pending = []
    if pending:
        raise TaskFormatError(path, f"line {start}", "expected a line after the trailing '\\'")
    return lines


def _parse_env(path: Path, number: int, args: str) -> dict[str, str]:
    try:
        words = shlex.split(args)
    except ValueError as err:
        raise TaskFormatError(path, f"line {number} ENV", f"unbalanced quotes: {err}") from err
    if words and "=" not in words[0]:
        if len(words) < 2:
            raise TaskFormatError(path, f"line {number} ENV", "expected 'ENV KEY=value'")
        return {words[0]: args.split(None, 1)[1].strip()}
    pairs: dict[str, str] = {}
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or not key:
            raise TaskFormatError(path, f"line {number} ENV", f"expected KEY=value, got {word!r}")
        pairs[key] = value
    return pairs


def _copy_words(path: Path, number: int, args: str) -> list[str]:
    if args.startswith("["):
        try:
            words = json.loads(args)
        except json.JSONDecodeError as err:
            raise TaskFormatError(path, f"line {number} COPY", f"invalid JSON form: {err}") from err
    else:
        try:
            words = shlex.split(args)
        except ValueError as err:
            raise TaskFormatError(path, f"line {number} COPY", f"unbalanced quotes: {err}") from err
    if not isinstance(words, list) or len(words) < 2 or not all(isinstance(w, str) for w in words):
        raise TaskFormatError(path, f"line {number} COPY", "expected 'COPY <src>... <dest>'")
    return words


def _resolve_sources(path: Path, number: int, context: Path, patterns: list[str]) -> list[Path]:
    sources: list[Path] = []
    root = context.resolve()
    for pattern in patterns:
        relative = posixpath.normpath(pattern).lstrip("/")
        if relative == ".." or relative.startswith("../"):
            raise TaskFormatError(
                path, f"line {number} COPY", f"source {pattern!r} is outside the build context"
            )
        try:
            matches = [context] if relative == "." else sorted(context.glob(relative))
        except (ValueError, NotImplementedError, OSError) as err:
            raise TaskFormatError(
                path, f"line {number} COPY", f"invalid source pattern {pattern!r}: {err}"
            ) from err
        if not matches:
            raise TaskFormatError(
                path, f"line {number} COPY", f"source {pattern!r} not found in {context}"
            )
        for match in matches:
            if not match.resolve().is_relative_to(root):
                raise TaskFormatError(
                    path, f"line {number} COPY", f"source {pattern!r} is outside the build context"
                )
        sources.extend(matches)
    return sources


@dataclass(slots=True)
class _State:
    workdir: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    copies: list[tuple[int, list[str], str, str | None]] = field(default_factory=list)
    runs: list[RunStep] = field(default_factory=list)
    build_step: str | None = None
    num_from: int = 0
    base_image: str = BASE_IMAGE


def _apply(state: _State, path: Path, number: int, keyword: str, args: str) -> None:
    where = f"line {number} ({keyword} {args})"[:160]
    if keyword == "FROM":
        state.num_from += 1
        words = [w for w in args.split() if not w.startswith("--")]
        if not words:
            raise TaskFormatError(path, f"line {number} FROM", "expected an image name")
        if state.num_from > 1:
            state.build_step = state.build_step or f"{where}: a multi-stage build"
        else:
            state.base_image = words[0]
    elif keyword == "WORKDIR":
        target = posixpath.normpath(posixpath.join(state.workdir or "/", args.strip()))
        state.workdir = target
    elif keyword == "ENV":
        state.env.update(_parse_env(path, number, args))
    elif keyword == "COPY":
        words = _copy_words(path, number, args)
        flags = [w for w in words if w.startswith("--")]
        if any(not f.startswith(("--chown", "--chmod")) for f in flags):
            state.build_step = state.build_step or f"{where}: COPY with {flags}"
        if any(f.startswith("--from") for f in flags):
            return
        plain = [w for w in words if not w.startswith("--")]
        if len(plain) < 2:
            raise TaskFormatError(
                path, f"line {number} COPY", "expected 'COPY [--flags] <src>... <dest>'"
            )
        state.copies.append((number, plain[:-1], plain[-1], state.workdir))
    elif keyword == "RUN":
        if args.startswith("[") or "<<" in args:
            state.build_step = state.build_step or f"{where}: RUN in exec or heredoc form"
        state.runs.append(RunStep(command=args, cwd=state.workdir or "/"))
    elif keyword in _BUILD_ONLY:
        state.build_step = state.build_step or f"{where}: {keyword}"


def _is_below(target: str, folder: str) -> bool:
    return target == folder or target.startswith(folder.rstrip("/") + "/")


def _plan_copy(
    path: Path, context: Path, entry: tuple[int, list[str], str, str | None], root: str
) -> Copy:
    """The COPY of ``entry`` with its destination relative to ``root`` (a folder it lies in)."""
    number, patterns, dest, cwd = entry
    target = posixpath.normpath(posixpath.join(cwd or "/", dest))
    sources = _resolve_sources(path, number, context, patterns)
    is_dir = dest.endswith("/") or dest in (".", "./") or len(sources) > 1 or target == root
    return Copy(tuple(sources), posixpath.relpath(target, root), is_dir)


def read_dockerfile(path: Path, context: Path, *, tests_dir: str | None = None) -> DockerfilePlan:
    """Parse ``path`` (built from ``context``) into a plan; malformed files raise.

    ``tests_dir`` (a Harbor verifier image's ``tests/Dockerfile``: ``/tests``): ``COPY`` into
    that folder goes to ``test_copies``, which the grader uploads with the tests, instead of
    being a build step.

    The bubblewrap rule (also in environments/fixtures/terminal_bench/README.md): a Dockerfile runs
    without Docker when it has one ``FROM`` of ``thundersync/base:bookworm`` or of an image
    aliased to it (``--image-alias ubuntu:24.04=thundersync/base:bookworm``; the alias is looked
    up when the sandbox is made, see ``TaskEnvironment``) and otherwise only

    - ``WORKDIR`` (the last one is the workspace: not ``/``, outside the system folders and the
      interpreter's, as ``environments.sandboxes.host_view.validate_workdir`` checks),
    - ``ENV`` (becomes the sandbox's environment),
    - ``COPY`` from the build context to a path inside the workspace (``--chown``/``--chmod``
      ignored): the files are staged on the host and copied into the workspace,
    - ``RUN`` in shell form: replayed in the workspace, in order, by the task's ``setup``; a step
      that fails there (it installs packages, writes outside the workspace...) raises
      NeedsDockerError with the step and its output,
    - ``CMD``, ``ENTRYPOINT``, ``LABEL``, ``EXPOSE``, ``VOLUME``, ``STOPSIGNAL``, ``HEALTHCHECK``
      (ignored: the sandbox runs one command at a time).

    Anything else (``ADD``, ``USER``, ``ARG``, multi-stage builds, ``COPY``
    outside the workspace, ``RUN`` heredocs or exec form...) is a build step: bubblewrap refuses the
    task with NeedsDockerError naming the line, and Docker builds the Dockerfile as it is.
    """
    if not path.is_file():
        raise TaskFormatError(path, "Dockerfile", "expected a Dockerfile, found none")
    state = _State()
    text = inputs.read_text(path, "Dockerfile", errors="replace")
    for number, line in _logical_lines(path, text):
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword not in _KNOWN:
            raise TaskFormatError(path, f"line {number}", f"unknown instruction {keyword!r}")
        if state.num_from == 0 and keyword not in ("FROM", "ARG"):
            raise TaskFormatError(path, "FROM", f"expected FROM before line {number} ({keyword})")
        try:
            _apply(state, path, number, keyword, args.strip())
        except TaskFormatError:
            raise
        except (ValueError, IndexError, TypeError) as err:
            raise TaskFormatError(path, f"line {number} {keyword}", f"cannot parse: {err}") from err
    if state.num_from == 0:
        raise TaskFormatError(path, "FROM", "expected a FROM instruction, found none")
    workdir = state.workdir or DEFAULT_WORKDIR
    build_step = state.build_step
    if workdir == "/":
        build_step = build_step or "WORKDIR /: the workspace cannot be the root folder"
    try:
        validate_workdir(workdir)
    except ValueError as err:
        build_step = build_step or f"WORKDIR {workdir}: bubblewrap cannot use it: {err}"
    copies: list[Copy] = []
    test_copies: list[Copy] = []
    for entry in state.copies:
        target = posixpath.normpath(posixpath.join(entry[3] or "/", entry[2]))
        if tests_dir is not None and _is_below(target, tests_dir):
            test_copies.append(_plan_copy(path, context, entry, tests_dir))
        elif _is_below(target, workdir):
            copies.append(_plan_copy(path, context, entry, workdir))
        else:
            where = f"line {entry[0]}: COPY to {target}, outside the workspace {workdir}"
            build_step = build_step or where
    return DockerfilePlan(
        path=path,
        workdir=workdir,
        base_image=state.base_image,
        env=state.env,
        copies=tuple(copies),
        run_steps=tuple(state.runs),
        build_step=build_step,
        test_copies=tuple(test_copies),
    )
