"""Strict grading's second look at a SWE-bench tree: what the tests load, when they load it.

The audit of the agent's diff (``audit.py``) judges the patch before anything runs. But an
official eval script runs an install step (``python -m pip install -e .``) before the start
marker, and that step runs the repository's ``setup.py``, the agent's own if its patch holds
one: it can write a ``conftest.py`` that forces every test to pass, a ``.pth`` or
``sitecustomize.py`` start-up hook, a ``pytest11`` entry point, or a test section of a config
file, none of which the diff showed. So the tree is recorded twice:

- ``before``, in the fresh grading sandbox once the agent's patch is applied and before the
  eval script starts (no code of the agent's has run yet): ``record``;
- ``after``, by the eval script itself, just before the start marker (after the install step
  and the test patch, right before the test command), written to a file: ``with_audit``
  injects ``command`` there, so it runs inside the sandbox at the moment that matters.

``reasons`` compares them: what pytest would load and appeared or changed in between, other
than by the test patch, is tampering (``tamper_reasons``; strict grading scores it 0). What
is recorded, with a sha256 each: in the repository (``.git`` aside) every ``conftest.py``,
pytest or mixed config file (``pytest.ini``, ``tox.ini``, ``setup.cfg``, ``pyproject.toml``,
with their text, judged section by section as ``environments.tamper`` judges a diff),
``sitecustomize.py``/``usercustomize.py``, ``*.pth``, ``entry_points.txt``, and the modules and
packages at its root (a new one that shadows an importable module); in the test interpreter's
site folders the ``.pth`` files, start-up hooks and every distribution's ``entry_points.txt``.
A legitimate install rewrites some of these: an entry point file is judged by its ``pytest11``
section alone (a section no distribution had before), a ``.pth`` by its lines that run code
(``import ...``) other than those the site folders already had and setuptools' own editable
finder (``import __editable___NAME_finder; __editable___NAME_finder.install()``).

The recorder runs as ``python3 -I -S`` (falling back to ``python``): no environment variable,
user site, ``.pth`` file or ``sitecustomize`` of the agent's runs inside it, and it runs on
Python 3.5 (old SWE-bench environments). Its record is only evidence: code that ran at install
time could rewrite it afterwards, as in-process code can falsify anything of its process
(docs/design.md §6.1, principle 4); a record missing or unreadable once the tests started is
itself reported.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from environments.sandboxes.protocol import Sandbox, SandboxError
from environments.swebench.snapshot import START_MARKER
from environments.swebench.transfer import CommandFailed, read_text
from environments.tamper import (
    is_mixed_config,
    path_findings,
    pytest_config_sections_touched,
    registers_pytest_plugin,
    shadowing_findings,
)

RECORDER = r"""
import hashlib, json, os, site, stat, sys, sysconfig
TREE_NAMES = {"conftest.py", "pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml",
              "tox.ini", "setup.cfg", "pyproject.toml", "sitecustomize.py", "usercustomize.py",
              "entry_points.txt"}
TEXT_NAMES = {"tox.ini", "setup.cfg", "pyproject.toml", "entry_points.txt"}
SITE_NAMES = {"sitecustomize.py", "usercustomize.py"}
MODULE_SUFFIXES = (".py", ".pyc", ".so", ".pyd")
RUNNER = {"pytest", "_pytest", "pluggy", "py"}
MAX_ENTRIES, MAX_HASH, MAX_TEXT = 20000, 64 << 20, 256 << 10
root, out = sys.argv[1], sys.argv[2]
MAX_RECORD = int(sys.argv[3])
extra_sites = [a[5:] for a in sys.argv[4:] if a.startswith("site:")]
test_folders = [a[6:] for a in sys.argv[4:] if a.startswith("tests:")]
entries, dirs, truncated, recorded = {}, [], False, [0]

def walk(top):
    # os.walk's top-down walk without its recursion (Python before 3.12 recurses: a tree 1,000
    # folders deep stopped the recorder); a link to a folder is listed as a file
    stack = [top]
    while stack:
        folder = stack.pop()
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            continue
        subdirs, files = [], []
        for name in names:
            try:
                is_dir = stat.S_ISDIR(os.lstat(os.path.join(folder, name)).st_mode)
            except OSError:
                continue
            (subdirs if is_dir else files).append(name)
        yield folder, subdirs, files
        stack.extend(os.path.join(folder, name) for name in reversed(subdirs))

def add(key, path):
    global truncated
    if len(entries) >= MAX_ENTRIES or recorded[0] >= MAX_RECORD:
        truncated = True
        return
    try:
        if not os.path.lexists(path):
            return
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            entry = ["link:" + os.readlink(path), None]
        elif not stat.S_ISREG(info.st_mode):
            return
        else:
            digest, text, size = hashlib.sha256(), b"", 0
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
            with os.fdopen(fd, "rb") as handle:
                while size <= MAX_HASH:
                    chunk = handle.read(1 << 16)
                    if not chunk:
                        break
                    size += len(chunk)
                    digest.update(chunk)
                    if len(text) <= MAX_TEXT:
                        text += chunk[:MAX_TEXT + 1 - len(text)]
            name = os.path.basename(path)
            keep = name in TEXT_NAMES or name.endswith(".pth")
            if name == "entry_points.txt" and b"pytest11" not in text:
                keep = False
            entry = [digest.hexdigest(), text.decode("utf-8", "replace") if keep else None]
    except OSError as err:
        entry = ["error:" + str(err), None]
    entries[key] = entry
    # counted as written: JSON escapes a control character or a non-ASCII one in 6 bytes or
    # 12, so text counted raw let a record grow past what the grader reads
    recorded[0] += len(json.dumps(key)) + len(json.dumps(entry)) + 2

if os.path.isdir(root):
    for name in sorted(os.listdir(root)):
        path = os.path.join(root, name)
        if name.endswith(MODULE_SUFFIXES) and name not in TREE_NAMES:
            add(name, path)
        elif os.path.isfile(os.path.join(path, "__init__.py")):
            add(name + "/__init__.py", os.path.join(path, "__init__.py"))
    for folder, subdirs, files in walk(root):
        if folder == root and ".git" in subdirs:
            subdirs.remove(".git")
        subdirs.sort()
        for name in sorted(files):
            if name in TREE_NAMES or name.endswith(".pth"):
                path = os.path.join(folder, name)
                add(os.path.relpath(path, root), path)
    for tests in test_folders:
        for folder, subdirs, files in walk(os.path.join(root, tests)):
            subdirs.sort()
            for name in sorted(files):
                if name.endswith(".py"):
                    path = os.path.join(folder, name)
                    add(os.path.relpath(path, root), path)

prefixes = [sys.prefix, sys.exec_prefix]
here = os.path.dirname(os.path.abspath(sys.executable))
for candidate in (here, os.path.dirname(here)):
    if os.path.isfile(os.path.join(candidate, "pyvenv.cfg")):
        prefixes.append(candidate)
found = list(extra_sites)
try:
    found += site.getsitepackages(prefixes)
except Exception:
    pass
try:
    found.append(site.getusersitepackages())
except Exception:
    pass
for scheme_key in ("purelib", "platlib"):
    try:
        found.append(sysconfig.get_paths()[scheme_key])
    except Exception:
        pass
for folder in found:
    folder = os.path.realpath(folder)
    if folder in dirs or not os.path.isdir(folder):
        continue
    if folder == os.path.realpath(root) or folder.startswith(os.path.realpath(root) + os.sep):
        continue
    dirs.append(folder)
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith(".pth") or name in SITE_NAMES:
            add(path, path)
        elif name.endswith((".dist-info", ".egg-info")):
            add(os.path.join(path, "entry_points.txt"), os.path.join(path, "entry_points.txt"))
        elif name.endswith(".py") and name[:-3] in RUNNER:
            add(path, path)
        elif name in RUNNER and os.path.isdir(path) and not os.path.islink(path):
            for sub, subdirs, files in walk(path):
                subdirs[:] = sorted(d for d in subdirs if d != "__pycache__")
                for module in sorted(files):
                    if module.endswith(".py"):
                        add(os.path.join(sub, module), os.path.join(sub, module))

with open(out, "w") as handle:
    json.dump({"site_dirs": dirs, "entries": entries, "truncated": truncated}, handle)
"""
"""Records one tree (argv: the repository, the output file, the record's cap in bytes, then
``site:FOLDER`` for more site folders and ``tests:FOLDER`` for the task's test folders,
relative): Python 3.5, standard library only, nothing of the repository imported (it runs
from ``/``)."""

MAX_RECORD_BYTES = 24 << 20
"""Past this much JSON the recorder stops adding entries and marks the record truncated
(flagged: a change could hide past it). It counts the JSON as written: JSON escapes a
control character in 6 bytes, and counted raw, 24 MiB of such text made a record past
``transfer.MAX_READ_BYTES``, which the grader could not read: an infrastructure failure the
agent's files caused. The entry that crosses the cap adds at most 6 bytes for each of its
``MAX_TEXT`` bytes of text."""

_FINDER = re.compile(r"import (__editable___[A-Za-z0-9_]+_finder); \1\.install\(\)")
"""setuptools' own line in an editable install's ``.pth`` (PEP 660, its finder strategy)."""
_CONFIG_NAMES = frozenset({"pytest.ini", ".pytest.ini", "pytest.toml", ".pytest.toml"})
AFTER_SUFFIX = "stage after the eval script's install step"


@dataclass(frozen=True, slots=True)
class TreeRecord:
    """One recording: site folders scanned, and ``path -> (sha256 or link target, text)``
    (repository paths relative, site-folder paths absolute)."""

    site_dirs: tuple[str, ...] = ()
    entries: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    truncated: bool = False


TESTBED_VAR, RECORD_VAR = "THUNDERSYNC_TESTBED", "THUNDERSYNC_TREE_RECORD"
"""Set by the command that runs the eval script (``script_env``): where the injected lines
find the repository and write the record (paths the grader chose, not the script's text)."""


def command(
    testbed: str,
    out: str,
    site_dirs: Collection[str] = (),
    test_folders: Collection[str] = (),
    *,
    raw: bool = False,
) -> str:
    """Shell lines recording ``testbed`` (its ``test_folders``' modules too, and
    ``site_dirs`` beside the interpreter's own) into ``out``, quietly: ``set -x`` is paused
    around them, so the log shows none of it. ``raw``: ``testbed`` and ``out`` are shell
    words already (``injected``)."""
    paths = (testbed, out) if raw else (shlex.quote(testbed), shlex.quote(out))
    more = [str(MAX_RECORD_BYTES)]
    more += [f"site:{d}" for d in site_dirs] + [f"tests:{f}" for f in test_folders]
    args = " ".join([*paths, *(shlex.quote(a) for a in more)])
    code = shlex.quote(RECORDER)
    run = f"(cd / && {{ python3 -I -S -c {code} {args} || python -I -S -c {code} {args}; }})"
    return (
        '{ THUNDERSYNC_XTRACE="${-//[^x]/}"; set +x; } 2>/dev/null\n'
        f"{run} >/dev/null 2>&1\n"
        '{ [ -z "$THUNDERSYNC_XTRACE" ] || set -x; } 2>/dev/null\n'
    )


def injected(
    testbed: str, out: str, site_dirs: Collection[str] = (), test_folders: Collection[str] = ()
) -> str:
    """``command`` for the eval script: the paths come from ``script_env``'s variables (with
    ``testbed`` and ``out`` as defaults, so that ``set -u`` never stops the script)."""
    words = (f'"${{{TESTBED_VAR}:-{testbed}}}"', f'"${{{RECORD_VAR}:-{out}}}"')
    return command(*words, site_dirs, test_folders, raw=True)


def script_env(testbed: str, out: str) -> str:
    """``NAME=value`` words for the command running the eval script (see ``injected``)."""
    return f"{TESTBED_VAR}={shlex.quote(testbed)} {RECORD_VAR}={shlex.quote(out)}"


MARKER_LINE = f": '{START_MARKER}'"
"""How official eval scripts (and ``snapshot.make_eval_script``) print the start marker."""


def with_audit(script: str, lines: str) -> tuple[str, bool]:
    """``script`` with ``lines`` run just before its start marker line (after any install
    step and the test patch; right before the test command), and whether it was added: a
    script that prints the marker otherwise (never an official one) is left unchanged."""
    out, done = [], False
    for line in script.splitlines(keepends=True):
        if not done and line.strip() == MARKER_LINE:
            out.append(lines)
            done = True
        out.append(line)
    return "".join(out), done


def record(
    sandbox: Sandbox,
    testbed: str,
    out: str,
    *,
    chunk_bytes: int,
    test_folders: Collection[str] = (),
) -> TreeRecord:
    """Record the tree now, in a sandbox where no code of the agent's has run: any failure is
    the sandbox's (SandboxError)."""
    ran = sandbox.execute(command(testbed, out, (), test_folders), timeout=300)
    if ran.timed_out:
        raise SandboxError("recording the tree before the eval script timed out")
    try:
        parsed = parse(read_text(sandbox, out, chunk_bytes=chunk_bytes))
    except CommandFailed as err:
        raise SandboxError(f"recording the tree before the eval script failed: {err}") from err
    if parsed is None:
        raise SandboxError("recording the tree before the eval script gave no record")
    return parsed


def read_after(sandbox: Sandbox, out: str, *, chunk_bytes: int) -> TreeRecord | None:
    """The record the eval script left (None when it is missing or unreadable: code of the
    agent's ran since, so this is no failure of the sandbox's). SandboxError only when the
    engine fails."""
    try:
        return parse(read_text(sandbox, out, chunk_bytes=chunk_bytes))
    except CommandFailed:
        return None


def parse(text: str) -> TreeRecord | None:
    """A record from the recorder's JSON (None when it is not one)."""
    try:
        data = json.loads(text)
        entries = {
            str(path): (str(value[0]), None if value[1] is None else str(value[1]))
            for path, value in data["entries"].items()
        }
        return TreeRecord(tuple(map(str, data["site_dirs"])), entries, bool(data["truncated"]))
    except (ValueError, KeyError, TypeError, IndexError, AttributeError, RecursionError):
        return None


def reasons(
    before: TreeRecord,
    after: TreeRecord | None,
    *,
    task_paths: Collection[str] = (),
    test_folders: Collection[str] = (),
    modules: Collection[str] = (),
) -> list[str]:
    """``"<path>: <reason>"`` for what pytest loads that appeared or changed between the two
    records, ``task_paths`` (the test patch's files) aside; ``test_folders`` are the task's
    (``audit.task_test_folders``), ``modules`` the names the tests' interpreter imports (a
    new module at the repository's root shadowing one)."""
    if after is None:
        return [
            f"the tree record of the {AFTER_SUFFIX} is missing or unreadable (removed or "
            "rewritten by code that ran during the eval script)"
        ]
    found: list[str] = []
    if before.truncated or after.truncated:  # past the recorder's caps, a change could hide
        stage = (
            "once the agent's patch is applied" if before.truncated else f"at the {AFTER_SUFFIX}"
        )
        found.append(f"the tree holds more files or config text than the grader records {stage}")
    old_pth_lines = {
        line
        for path, (_, text) in before.entries.items()
        if path.endswith(".pth") and text is not None
        for line in _code_lines(text)
    }
    old_plugins = {
        _pytest11(text) for _, text in before.entries.values() if text and "pytest11" in text
    }
    new_root_modules = []
    for path, (digest, text) in sorted(after.entries.items()):
        old = before.entries.get(path)
        if (old is not None and old[0] == digest) or path in task_paths:
            continue
        name = PurePosixPath(path).name
        why = _why(path, name, text, None if old is None else old[1], old_pth_lines, old_plugins)
        if why is None and any(path.startswith(f"{f}/") for f in test_folders):
            why = "in the task's test folder (modules its tests load)"
        if why is None and _runner_module(path, after.site_dirs):
            why = "a module of the installed test runner (pytest, pluggy)"
        if why is not None:
            found.append(
                f"{path}: {why}, which appeared or changed during the eval script "
                "(after the audit of the agent's diff, which did not show it)"
            )
        elif old is None and "/" not in path.removesuffix("/__init__.py"):
            new_root_modules.append(path)
    shadows = shadowing_findings(
        new_root_modules,
        modules=modules,
        is_package=lambda folder: f"{folder}/__init__.py" in after.entries,
    )
    found += [
        f"{finding}; it appeared during the eval script (after the audit of the agent's diff)"
        for finding in shadows
    ]
    return found


def _why(
    path: str,
    name: str,
    text: str | None,
    old_text: str | None,
    old_pth_lines: set[str],
    old_plugins: set[str],
) -> str | None:
    """Why a new or changed entry changes how the tests run, or None when it does not."""
    if name == "entry_points.txt":
        section = _pytest11(text or "")
        if text and registers_pytest_plugin(text) and section not in old_plugins:
            return "registers a pytest plugin (entry point group pytest11)"
        return None
    if name.endswith(".pth"):
        if text is None or len(text) > 256 * 1024:
            return "a .pth start-up hook too large to judge"
        lines = [line for line in _code_lines(text) if line not in old_pth_lines]
        if any(not _FINDER.fullmatch(line) for line in lines):
            return "a .pth start-up hook that runs code in every interpreter"
        return None
    if is_mixed_config(name):
        if text is None or len(text) > 256 * 1024:
            return "a config file pytest reads, too large to judge"
        if pytest_config_sections_touched(old_text or "", text, name):
            return "changes a test section of a config file pytest reads"
        return None
    if (
        name == "conftest.py"
        or name in _CONFIG_NAMES
        or name
        in (
            "sitecustomize.py",
            "usercustomize.py",
        )
    ):
        findings = path_findings([path])
        return findings[0].reason if findings else "loaded by the test run"
    return None


_RUNNER = frozenset({"pytest", "_pytest", "pluggy", "py"})


def _runner_module(path: str, site_dirs: Collection[str]) -> bool:
    """Whether ``path`` is a module of the test runner's packages in a site folder (the
    recorder lists nothing else there that ends in ``.py`` but start-up hooks)."""
    for folder in site_dirs:
        if path.startswith(f"{folder}/"):
            top = path[len(folder) + 1 :].split("/", 1)[0]
            return top.removesuffix(".py") in _RUNNER
    return False


def _code_lines(text: str) -> list[str]:
    """The lines of a ``.pth`` file that ``site`` executes (``import`` followed by a space or
    tab), stripped."""
    return [line.strip() for line in text.splitlines() if line.startswith(("import ", "import\t"))]


def _pytest11(text: str) -> str:
    """The ``[pytest11]`` section of an entry point file, normalised ("" when none)."""
    section, lines = None, []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        if section == "pytest11" and line:
            lines.append(line)
    return "\n".join(sorted(lines))
