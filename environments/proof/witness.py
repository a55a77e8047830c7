"""Strict grading's witness of the verifier's run, and the proof of a pass (docs/design.md §6.1).

The code under test runs inside the verifier's test process: ``from calc import add`` imports
the agent's module into pytest, and Python's own start-up imports whatever the work folder
names like a module it looks for (``copy`` tries ``org.python.core``). Such code can end the
process with ``os._exit(0)``, call ``pytest.exit(returncode=0)``, raise ``SkipTest`` so that
nothing fails, or print a passing summary: a verdict read from an exit status, a reward file
or a summary is then a pass that nothing proves.

So strict grading watches the run from the interpreter's start. Its folder (beside the
verifier's log folder, outside the work folder) holds ``sitecustomize.py`` and the witness
``_thundersync_witness.py``; the folder goes first on ``PYTHONPATH``, so every Python process of
the run starts the witness before the work folder is on its import path, and pytest loads the
witness as a plugin (``-p``). It records each process's start, each code file the process loads
from the work folder and which code asked for it, and each pytest session's and unittest run's
tests, outcome by outcome (``Observation``).

A pass is then proven against the task's *reference run* (``reference.py``: the reference
solution graded the same way, once per task): a full pass needs every test the reference
solution passes to be seen passing (its call phase passed, not skipped, xfailed, errored or
missing) in sessions that started and finished under the watch; and the work folder may
contribute only the code files the reference run loads from it, or what that code itself
imports. Anything else it contributes (``org/__init__.py`` imported by ``copy``; an
``iniconfig.py`` imported by pytest) is tampering.

What it cannot see (code written against it, in the same process: it can forge records) and
which tasks qualify: docs/design.md §6.1, principle 4."""

from __future__ import annotations

import ast
import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from environments.proof.watch import SENTINEL, Witness
from environments.sandboxes.protocol import Sandbox, own

VERSION = 13
"""Bumped whenever what the witness records or the proof's rule changes (cached reference
runs are keyed by it)."""
MAX_RECORD_FILES = 256
"""Python processes a verifier run may start before its records are too many to read."""
MAX_RECORD_BYTES = 4 * 1024 * 1024
"""Bytes of records read in all; a run that wrote more hides what it did in the flood."""
_CHUNK = 48 * 1024
"""Bytes per read: below the sandbox's output limit."""
_MAX_LINE = 16 * 1024
_LISTED = re.compile(r" *([0-9]{1,18}) ([^/\n]+\.proc)")
"""A line of ``observe``'s listing: a record file's size and name, as the witness names them."""
PASSED = "passed"


_SOURCES = (
    *(".c", ".h", ".cc", ".cpp", ".cxx", ".hpp", ".hh", ".m", ".mm", ".s", ".asm", ".f90"),
    *(".js", ".mjs", ".cjs", ".ts", ".tsx", ".jsx", ".go", ".rs", ".java", ".kt", ".scala"),
    *(".rb", ".pl", ".php", ".lua", ".swift", ".cs", ".r", ".jl", ".hs", ".ml", ".zig"),
    *(".sh", ".bash", ".zsh", ".sql", ".css", ".vue"),
)
"""Source files of other languages: a test reading one (a scan of the agent's ``*.c`` for
``system(``) reads the agent's work, which an honest fix may change (red team, 2026-12-07)."""


def _conftest(path: str) -> bool:
    return PurePosixPath(path).name == "conftest.py"


def _suffix_either(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether one of two non-empty paths (as parts) ends the other."""
    return bool(a and b) and (a[-len(b) :] == b or b[-len(a) :] == a)


@dataclass(frozen=True, slots=True)
class Reference:
    """What the task's reference solution's run showed: the tests it passes (``runner:test
    id``) and the code files (relative to the work folder) its test processes load from the
    work folder. No tests: the verifier runs none the witness can see (``unwatched``)."""

    tests: frozenset[str]
    loads: frozenset[str]
    replaced: frozenset[str] = frozenset()
    """The runners' members its run replaced by code outside the work folder or a runner's
    own file (``owner.member=module.function``): a plugin's or the runner's own, which the
    graded run may repeat."""
    solution_changed: frozenset[str] = frozenset()
    """The work folder's files the reference solution added, changed or deleted: solving the
    task edits them (a module whose doctests are the tests; tests the task asks for), so none
    is one of the task's test files."""
    defined: frozenset[str] = frozenset()
    """The work folder's files whose code its tests run as their test functions (a base
    class's methods in a helper module, a script run as ``__main__``)."""
    reads: frozenset[tuple[str, str]] = frozenset()
    """``(file, reader)``: the work folder's other files its test processes read, each with
    the file of the code that read it ("": the runner's own read, such as its configuration)."""
    written: frozenset[str] = frozenset()
    """The work folder's files its test processes wrote: the run's output, not the tests'."""
    contents: frozenset[tuple[str, str, str]] = frozenset()
    """``(file, reader, content)``: each of ``reads`` with what the file held as it was opened
    (its size and digest, as the witness's ``_content`` gives it)."""

    def test_files(self) -> frozenset[str]:
        """The work folder's files that hold the tests it passes, none the reference solution
        changes: the code files its test processes load that a test id names (pytest's
        ``path::name``, its path a suffix of the file's or the file's of it; unittest's
        ``module.Class.test``, its module's dotted name and the file's ending one another, so a
        package's ``__init__.py`` is none; a non-code file too, for ``--doctest-glob``), those
        whose code its tests run as their functions, and the other files the test code itself
        reads (these files, a ``conftest.py``, code outside the work folder such as
        ``/tests``; through a link, its target too), but for source files of other languages
        (a test that scans the agent's ``*.c`` reads its work) and what the run wrote itself
        (its output). The agent changing one changes the task's tests, whatever its name:
        Django's ``tests.py`` run by ``python -m unittest tests``, a base class's tests in
        ``cases.py``, ``python3 tests.py``, an ``expected.json`` read by the tests; each scored
        1 for a failing attempt (red teams, 2026-12-07). What the code under test reads (its
        configuration, a template, ``.env``) is its own: an honest fix may edit it instead of
        the code (red team, 2026-12-07). Code the tests merely call (an assertion helper, a
        constants module) is not held either: docs/grading.md."""
        return self._held()[0]

    def test_reads(self) -> dict[tuple[str, str], frozenset[str]]:
        """``(test file, reader)`` → the contents the test code (``reader``: a test file, a
        conftest, code outside the work folder) read there: the expectations a graded run's
        tests must read again, the same (``contradictions``)."""
        held, readers = self._held()
        seen: dict[tuple[str, str], set[str]] = {}
        for path, reader, content in self.contents:
            if path in held and reader in readers:
                seen.setdefault((path, reader), set()).add(content)
        return {read: frozenset(contents) for read, contents in seen.items()}

    def _held(self) -> tuple[frozenset[str], set[str]]:
        """``test_files``, and the test code that reads: those files, a conftest, code
        outside the work folder."""
        code = self._named() | self.defined
        readers = code | {r for _, r in self.reads if r.startswith("/") or _conftest(r)}
        data = {p for p, r in self.reads if r in readers and not p.endswith(_SOURCES)}
        return frozenset((code | data) - self.solution_changed - self.written), readers

    def _named(self) -> set[str]:
        held = set()
        for path in (self.loads | {path for path, _ in self.reads}) - self.solution_changed:
            whole = PurePosixPath(path).parts
            parts = tuple(PurePosixPath(path).with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            for test in self.tests:
                runner, _, test_id = test.partition(":")
                if runner == "pytest":
                    named = tuple(p for p in test_id.split("::", 1)[0].split("/") if p != "..")
                    if _suffix_either(whole, named):
                        held.add(path)
                        break
                elif _suffix_either(parts, tuple(test_id.split(".")[:-2])):
                    held.add(path)  # unittest's module.Class.test: the module's own file
                    break
        return held


@dataclass
class Observation:
    """What the witness recorded in one verifier run."""

    processes: int = 0
    loads: dict[str, set[str]] = field(default_factory=dict)
    """Code file (relative to the work folder) → the files of the code that loaded it."""
    sessions: dict[str, str] = field(default_factory=dict)
    """Session id → its runner (pytest, unittest)."""
    finished: dict[str, int | None] = field(default_factory=dict)
    """Session id → its exit status (0: every test passed; None: unreadable)."""
    outcomes: dict[str, list[str]] = field(default_factory=dict)
    """``runner:test id`` → each outcome recorded for it (a test may run in several sessions)."""
    tampered: dict[str, list[str]] = field(default_factory=dict)
    """Session id → the test runners' functions (pytest's, pluggy's, unittest's) that were
    replaced or given other code while it ran."""
    replaced: dict[str, list[str]] = field(default_factory=dict)
    """Session id → the runners' members replaced by code outside the work folder or a
    runner's own file (``owner.member=module.function``)."""
    described: dict[str, set[str]] = field(default_factory=dict)
    """A unittest test's one-line description (its docstring's first line) → the
    ``unittest:test id`` of each test it describes."""
    defined: set[str] = field(default_factory=set)
    """The work folder's files (relative) a test's function's code lies in."""
    reads: set[tuple[str, str]] = field(default_factory=set)
    """``(file, reader)``: a file other than code read (relative to the work folder) and the
    file of the code that read it (relative where in the work folder; "": the runner's own)."""
    written: set[str] = field(default_factory=set)
    """The work folder's files (relative) the run wrote."""
    contents: set[tuple[str, str, str]] = field(default_factory=set)
    """``(file, reader, content)``: each of ``reads`` by the name it was opened by (not a link's
    target) with what the file held as it was read."""
    changed: set[tuple[str, str]] = field(default_factory=set)
    """``(file, reader)``: the work folder's files read, then renamed, linked or written during
    the run after the reader last read them."""
    problem: str | None = None
    """Why the records cannot be trusted (removed, changed, too many): contradicts any pass."""
    work_changed: frozenset[str] = frozenset()
    """Set by the grader, not recorded: the graded work's files changed against the task's
    pristine work folder (for a reference run, ``Reference.solution_changed``)."""
    launcher: str | None = None
    """Set by the grader for a reference run: the Python launcher its verifier names, if any
    (with no Python process seen, the run was not watched)."""

    def passed(self) -> frozenset[str]:
        """Tests seen to pass: a passing call phase, and no failing record beside it."""
        return frozenset(
            test
            for test, seen in self.outcomes.items()
            if PASSED in seen and all(o == PASSED for o in seen)
        )

    def replacements(self) -> frozenset[str]:
        return frozenset(name for names in self.replaced.values() for name in names)

    def reference(self) -> Reference:
        return Reference(
            self.passed(),
            frozenset(self.loads),
            self.replacements(),
            self.work_changed,
            frozenset(self.defined),
            frozenset(self.reads),
            frozenset(self.written | {path for path, _ in self.changed}),
            frozenset(self.contents),
        )


def observe(sandbox: Sandbox, seen: Witness) -> Observation:
    """Read the records (bounded: ``MAX_RECORD_FILES`` files, ``MAX_RECORD_BYTES`` in all)."""
    records = shlex.quote(seen.records)
    listed = sandbox.execute(
        own(
            f"cd {records} && head -c 64 {SENTINEL} && echo && "
            'for f in *.proc; do if [ -f "$f" ] && [ ! -L "$f" ]; then '
            'printf "%s %s\\n" "$(wc -c < "$f")" "$f"; fi; done | head -n '
            f"{MAX_RECORD_FILES + 1}"
        ),
        timeout=60,
    )
    lines = listed.output.splitlines()
    if listed.exit_code != 0 or not lines or lines[0].strip() != seen.nonce:
        return Observation(
            problem=f"{seen.records}: the grader's records of the test run were removed or changed"
        )
    files: list[tuple[str, int]] = []
    for line in filter(None, lines[1:]):  # the sentinel's own newline ends in an empty line
        listed_file = _LISTED.fullmatch(line)
        if listed_file is None:  # a name no witness makes (a newline and '²' in it: red team)
            return Observation(problem=f"{seen.records}: a record's name is not the witness's")
        files.append((listed_file[2], int(listed_file[1])))
    if listed.truncated or len(files) > MAX_RECORD_FILES:
        return Observation(problem=f"{seen.records}: more records than the grader reads")
    if sum(size for _, size in files) > MAX_RECORD_BYTES:
        return Observation(problem=f"{seen.records}: more records than the grader reads")
    observation = Observation(processes=len(files))
    for name, size in files:
        text = _read(sandbox, f"{seen.records}/{name}", size)
        if text is None:
            return Observation(problem=f"{seen.records}: a record could not be read")
        for line in text.splitlines():
            _take(observation, line, seen.workdir)
    return observation


def _read(sandbox: Sandbox, path: str, size: int) -> str | None:
    parts = []
    for start in range(0, size, _CHUNK):
        shown = sandbox.execute(
            own(f"tail -c +{start + 1} {shlex.quote(path)} | head -c {_CHUNK}"), timeout=60
        )
        if shown.exit_code != 0 or shown.truncated:
            return None
        parts.append(shown.output)
    return "".join(parts)


def _take(observation: Observation, line: str, workdir: str) -> None:
    """One record line into the observation (a line that is no record is ignored)."""
    if len(line) > _MAX_LINE:
        return
    try:
        record = ast.literal_eval(line)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return  # TypeError: an unhashable key or member (`{[]: 0}`, red team)
    if not isinstance(record, tuple) or not record or not all(map(_plain, record)):
        return
    kind = record[0]
    if kind == "load" and len(record) == 3 and isinstance(record[1], str):
        relative = work_relative(record[1], workdir)
        if relative is not None:
            importer = record[2] if isinstance(record[2], str) else ""
            observation.loads.setdefault(relative, set()).add(importer)
    elif kind == "session" and len(record) == 3:
        observation.sessions[str(record[1])] = str(record[2])
    elif kind == "finish" and len(record) == 3:
        status = record[2] if isinstance(record[2], int) else None
        observation.finished[str(record[1])] = status
    elif kind == "tampered" and len(record) == 3 and isinstance(record[2], list):
        observation.tampered[str(record[1])] = [str(name) for name in record[2]]
    elif kind == "replaced" and len(record) == 3 and isinstance(record[2], list):
        observation.replaced[str(record[1])] = [str(name) for name in record[2]]
    elif kind == "describe" and len(record) == 4 and isinstance(record[3], str):
        observation.described.setdefault(record[3], set()).add(f"unittest:{record[2]}")
    elif kind == "test" and len(record) == 4:
        runner = observation.sessions.get(str(record[1]), "pytest")
        observation.outcomes.setdefault(f"{runner}:{record[3]}", []).append(str(record[2]))
    elif kind in ("defined", "wrote") and len(record) == 2 and isinstance(record[1], str):
        relative = work_relative(record[1], workdir)
        if relative is not None:
            (observation.defined if kind == "defined" else observation.written).add(relative)
    elif kind == "read" and len(record) in (4, 5) and all(isinstance(f, str) for f in record[1:]):
        path, reader = work_relative(record[1], workdir), record[2]
        if path is not None:
            reader = work_relative(reader, workdir) or reader
            observation.reads.add((path, reader))
            if len(record) == 4:  # by its name: what the test opened (a link's target is not)
                observation.contents.add((path, reader, record[3]))
    elif kind == "changed" and len(record) == 3 and all(isinstance(f, str) for f in record[1:]):
        path = work_relative(record[1], workdir)
        if path is not None:
            observation.changed.add((path, work_relative(record[2], workdir) or record[2]))


def _plain(value: object) -> bool:
    """A record's field as the witness writes it: text, a list of text, None, or an int of a
    process's range (a pid, an exit status). The code under test can append lines too: a
    15,000-digit literal made ``str()`` raise past Python's digit limit, which took the whole
    grade down as an infrastructure failure (red team, 2026-12-07)."""
    if isinstance(value, list):
        return all(isinstance(item, str) for item in value)
    if isinstance(value, int):
        return -(1 << 63) <= value < 1 << 63
    return value is None or isinstance(value, str)


def work_relative(path: str, workdir: str) -> str | None:
    """``path`` relative to the work folder, a bytecode cache's file named by its source
    (``__pycache__/calc.cpython-311.pyc`` → ``calc.py``); None outside it."""
    root = workdir.rstrip("/") or "/"
    full = posixpath.normpath(path)
    if not (full == root or full.startswith(root.rstrip("/") + "/")):
        return None
    relative = posixpath.relpath(full, root)
    folder, name = posixpath.split(relative)
    if posixpath.basename(folder) == "__pycache__" and name.endswith((".pyc", ".pyo")):
        source = name.split(".", 1)[0] + ".py"
        relative = posixpath.join(posixpath.dirname(folder), source)
    return relative


def _inside(path: str, workdir: str) -> bool:
    return work_relative(path, workdir) is not None if path else False


def contradictions(
    observation: Observation,
    *,
    full_pass: bool,
    reference: Reference | None = None,
    workdir: str = "/app",
    failing_sessions: bool = False,
) -> list[str]:
    """Why the records contradict a passing verdict (empty when they prove it). Without a
    ``reference`` (the reference run itself) only the run's own consistency is judged: every
    session finished, and, for a ``full_pass``, finished without failure (a verifier that gives
    partial credit runs failing sessions by design). ``failing_sessions``: a session may
    finish with failures even for a full pass (a SWE-bench run, whose verdict is its listed
    tests alone: tests that fail before and after the fix run beside them)."""
    if observation.problem:
        return [observation.problem]
    reasons = set()
    for sid, runner in observation.sessions.items():
        if sid not in observation.finished:
            reasons.add(
                f"a {runner} session of the test run ended before {runner} finished it (the "
                "process exited from inside the run: os._exit, a signal, a crash)"
            )
        elif full_pass and not failing_sessions and observation.finished[sid] != 0:
            reasons.add(
                f"a {runner} session of the test run finished with exit status "
                f"{observation.finished[sid]} (tests failed or errored), yet the verifier "
                "reported a pass"
            )
    for sid, names in observation.tampered.items():
        runner = observation.sessions.get(sid, "test")
        reasons.add(
            f"the {runner} runner's own code changed during the test run ({', '.join(names)}): "
            "code that makes a failing test pass"
        )
    if reference is None:
        return sorted(reasons)
    for sid, names in observation.replaced.items():
        unseen = sorted(name for name in names if name not in reference.replaced)
        if unseen:
            runner = observation.sessions.get(sid, "test")
            reasons.add(
                f"the {runner} runner's own code was replaced during the test run "
                f"({', '.join(unseen[:4])}), which the reference solution's run does not do: "
                "code that makes a failing test pass"
            )
    for relative, importers in sorted(observation.loads.items()):
        outside = sorted(i for i in importers if not _inside(i, workdir))
        if relative not in reference.loads and outside:
            reasons.add(
                f"{posixpath.join(workdir, relative)}: the test run loaded it from the work "
                f"folder (asked for by {outside[0] or 'the interpreter'}), which the reference "
                "solution's run does not: code the tests never asked for ran inside them"
            )
    reasons.update(_reread(observation, reference, workdir, full_pass=full_pass))
    if reference.tests:
        passed = observation.passed()
        missing = sorted(reference.tests - passed)
        if full_pass and missing:
            shown = ", ".join(_describe(t, observation) for t in missing[:3])
            more = f" and {len(missing) - 3} more" if len(missing) > 3 else ""
            reasons.add(
                f"{len(missing)} of the {len(reference.tests)} tests the reference solution "
                f"passes were not seen to pass: {shown}{more}"
            )
        elif not full_pass and not (reference.tests & passed):
            reasons.add(
                "none of the tests the reference solution passes was seen to pass, yet the "
                "verifier gave credit"
            )
    return sorted(reasons)


def outputs_read(observation: Observation, before: Callable[[str], str | None]) -> set[str]:
    """The files the run's code read with other content than the work folder held as the
    tests began (``before``: a file's sha256 then, or None): what the run made (a report a
    shell script writes, which a test reads and then removes; one that names the date), not
    the task's expectations, though no write of Python's showed it (red team, 2026-12-08)."""
    made = set()
    for path, _, content in observation.contents:
        digest = content.partition(":")[2]
        if digest and before(path) != digest:
            made.add(path)
    return made


def _reread(
    observation: Observation, reference: Reference, workdir: str, *, full_pass: bool
) -> set[str]:
    """Why the tests' reads of the task's files contradict a pass: the expectations the
    reference run's tests read (an ``expected.json``), read there with other content (the file
    rewritten for the run and put back, a link swapped), changed after the read (a copy renamed
    over it for the read by another process and the file put back), or, for a full pass, not
    read at all (``open`` redirected to a planted copy, a ``chdir`` to another folder: red
    team, 2026-12-07). A partial pass may stop before a read; the content it reads must still
    be the task's."""
    reasons = set()
    for (path, reader), contents in sorted(reference.test_reads().items()):
        seen = {c for p, r, c in observation.contents if (p, r) == (path, reader)}
        where, by = posixpath.join(workdir, path), posixpath.join(workdir, reader)
        if (path, reader) in observation.changed:
            reasons.add(
                f"{where}: changed on disk while the tests ran, after they read it (renamed, "
                "linked, written, or its mode or owner changed; the reference solution's run "
                "leaves it be): what they read cannot be known"
            )
        if seen - contents:
            reasons.add(
                f"{where}: the tests ({by}) read other content there than the reference "
                "solution's run read: expectations other than the task's"
            )
        elif full_pass and not seen:
            reasons.add(
                f"{where}: the reference solution's tests read it ({by}), the graded run's did "
                "not: their reads went elsewhere"
            )
    return reasons


def _describe(test: str, observation: Observation) -> str:
    seen = observation.outcomes.get(test)
    return f"{test} ({', '.join(sorted(set(seen))) if seen else 'not run'})"
