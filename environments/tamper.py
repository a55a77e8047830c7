"""Tamper detection: paths in an agent's work that change how tests run, not what they test.

A policy is optimised to find whatever raises its reward, so strict grading (docs/design.md
§6) flags an agent's work that touches test infrastructure: ``tamper_suspected`` in a grade's
``details`` (scored 0 in strict mode), with ``tamper_reasons`` saying which path and why, so a
training run can count them. Known exploits this covers: a ``conftest.py`` that forces every
test to pass (SWE-bench issue #631), a pytest plugin planted as a ``dist-info`` folder
(BenchFlow #1116), a ``pytest.py`` that shadows the real module, ``sitecustomize``/``.pth``
start-up hooks, shell rc files and git hooks that run before the tests.

Path rules only look at names; config files that hold more than test settings (``setup.cfg``,
``tox.ini``, ``pyproject.toml``) are flagged only when a changed line lies inside a test
section (``pytest_config_sections_touched``), since real fixes edit their other sections.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath

SHADOWED_MODULES = frozenset({"pytest", "_pytest", "unittest", "py", "pluggy", "conftest"})
"""Module names a test run imports: a file or package of that name in the agent's work
shadows the real one."""

_STARTUP_FILES = frozenset({"sitecustomize.py", "usercustomize.py"})
_PYTEST_ONLY_CONFIGS = frozenset({"pytest.ini", ".pytest.ini"})
_SHELL_RC = frozenset(
    {".bashrc", ".bash_profile", ".bash_login", ".profile", ".bash_logout", ".zshrc",
     ".zshenv", "bash.bashrc", "profile", "environment"}
)  # fmt: skip
_MIXED_CONFIGS = frozenset({"setup.cfg", "tox.ini", "pyproject.toml"})
_TEST_SECTION = re.compile(r"^\s*\[(tool:pytest|pytest|tool\.pytest[^\]]*|coverage:run)\]\s*$")
_ANY_SECTION = re.compile(r"^\s*\[[^\]]+\]\s*$")


@dataclass(frozen=True, slots=True)
class TamperFinding:
    """One suspicious path and why it is suspicious."""

    path: str
    reason: str

    def __str__(self) -> str:
        return f"{self.path}: {self.reason}"


def path_findings(paths: Iterable[str]) -> list[TamperFinding]:
    """Findings for paths (relative to the work folder or absolute) by name alone.

    Mixed config files (``setup.cfg``, ``tox.ini``, ``pyproject.toml``) are not judged here:
    pass their changed lines to ``pytest_config_sections_touched``.
    """
    findings = []
    for raw in paths:
        reason = _reason(PurePosixPath(raw))
        if reason is not None:
            findings.append(TamperFinding(raw, reason))
    return findings


def _reason(path: PurePosixPath) -> str | None:
    name, parts = path.name, path.parts
    if name == "conftest.py":
        return "a conftest.py outside the task's tests runs inside the test session"
    if path.stem in SHADOWED_MODULES and path.suffix in (".py", ".pyc", ".so", ""):
        return f"shadows the {path.stem!r} module the test run imports"
    if any(p in SHADOWED_MODULES for p in parts[:-1]):
        shadowed = next(p for p in parts[:-1] if p in SHADOWED_MODULES)
        return f"inside a package that shadows the {shadowed!r} module"
    if name in _STARTUP_FILES or path.suffix == ".pth":
        return "a Python start-up hook (runs in every interpreter, the test run's too)"
    if any(p.endswith((".dist-info", ".egg-info", ".egg-link")) for p in parts):
        return "package metadata: can register a pytest plugin (entry point pytest11)"
    if name in _PYTEST_ONLY_CONFIGS:
        return "pytest configuration (options, plugins, test selection)"
    if name in _SHELL_RC or "profile.d" in parts:
        return "a shell start-up file (runs before test scripts)"
    if ".git" in parts and ("hooks" in parts or name in ("config", "info")):
        return "git hooks or configuration (run during grading's git commands)"
    return None


def pytest_config_sections_touched(old_text: str, new_text: str) -> bool:
    """True when a line inside a test section of a mixed config file (``[tool:pytest]``,
    ``[pytest]``, ``[tool.pytest.ini_options]``, ``[coverage:run]``) differs between the two
    versions, or such a section was added or removed."""
    return _test_sections(old_text) != _test_sections(new_text)


def _test_sections(text: str) -> dict[str, list[str]]:
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if _ANY_SECTION.match(line):
            current = line.strip() if _TEST_SECTION.match(line) else None
            if current is not None:
                sections.setdefault(current, [])
            continue
        if current is not None and line.strip() and not line.lstrip().startswith(("#", ";")):
            sections[current].append(line.rstrip())
    return sections


def is_mixed_config(path: str) -> bool:
    """A config file that may hold test settings among others (judge it by its sections)."""
    return PurePosixPath(path).name in _MIXED_CONFIGS


# --- Content-aware rules (added for Terminal-Bench strict grading) ---------------------------
# Path rules alone flag every package metadata folder and every edit of a git config, which
# legitimate work produces (``pip install -e .`` writes an egg-info; agents set user.email).
# These look at the content, to flag only what can change how tests run.

GIT_COMMAND_KEYS = re.compile(
    r"^(core\.(fsmonitor|hookspath|pager|editor|sshcommand|askpass|gitproxy)|diff\.external|"
    r"sequence\.editor|uploadpack\.packobjectshook|include\.path|includeif\..*\.path|"
    r"alias\..*|pager\..*|.*\.(textconv|command|driver|clean|smudge|process|helper|program|"
    r"uploadpack|receivepack))$",
    re.IGNORECASE,
)
"""git configuration keys that run a program or pull in other configuration."""
_ENTRY_POINT_SECTION = re.compile(r"^\s*\[\s*pytest11\s*\]\s*$", re.MULTILINE)
_TEST_FILE_NAMES = re.compile(r"^(conftest\.py|test_.*\.py|.*_test\.py)$")


def registers_pytest_plugin(entry_points_text: str) -> bool:
    """True when a package's ``entry_points.txt`` declares a ``pytest11`` plugin, which pytest
    loads automatically (unless ``PYTEST_DISABLE_PLUGIN_AUTOLOAD`` is set)."""
    return bool(_ENTRY_POINT_SECTION.search(entry_points_text))


def git_config_command_keys(text: str) -> set[str]:
    """Keys of a git config file (``section.key`` or ``section.sub.key``, lower case) that make
    git run a program or read another file: hooks, fsmonitor, pagers, filters, aliases..."""
    keys: set[str] = set()
    section = ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        header = re.match(r'^\[\s*([^\s\]"]+)(?:\s+"([^"]*)")?\s*\]', line)
        if header:
            sub = f".{header.group(2)}" if header.group(2) is not None else ""
            section = f"{header.group(1)}{sub}".lower()
            line = line[header.end() :].strip()
            if not line:
                continue
        name = line.split("=", 1)[0].strip().lower()
        key = f"{section}.{name}" if section else name
        if GIT_COMMAND_KEYS.match(key):
            keys.add(key)
    return keys


def is_test_file(path: str) -> bool:
    """A file of the task's own tests by name: ``conftest.py``, ``test_*.py``, ``*_test.py``,
    or anything under a ``tests``/``test`` folder (data files included)."""
    parts = PurePosixPath(path).parts
    if not parts:
        return False
    return bool(_TEST_FILE_NAMES.match(parts[-1])) or any(
        p in ("tests", "test") for p in parts[:-1]
    )
