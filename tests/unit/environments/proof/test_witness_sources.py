"""Where the reference run's tests come from, as the witness records it in a real run on the
host: the file a test's function lies in (a base class in a helper module, a script run as
``__main__``), the files its code reads (expected values), and a verifier that sets its own
``PYTHONPATH`` still watched through the grader's user site. Each was a strict 1.0 for a
failing attempt (red team, 2026-12-07)."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

from environments import work
from environments.proof import watch, witness
from tests.unit.environments.proof.test_witness import HostShell, watched_run

CASES = (
    "import unittest\n\nfrom calc import add\n\n\nclass CalcCases:\n"
    "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
)
TESTS = (
    "import unittest\n\nfrom cases import CalcCases\n\n\n"
    "class T(CalcCases, unittest.TestCase):\n    pass\n"
)
READS = (
    "import json\nimport pathlib\n\nfrom calc import add\n\n\ndef test_add():\n"
    "    expected = json.loads(pathlib.Path('expected.json').read_text())\n"
    "    assert add(2, 3) == expected['sum']\n\n\ndef test_more():\n"
    "    with open('more.json') as f:\n        assert add(1, 1) == json.load(f)['sum']\n"
)


def reference_of(
    tmp_path: Path, test_source: str, command: str, files: dict[str, str] | None = None
) -> witness.Reference:
    """The reference from an honest run of ``test_source`` (``test_task.py``) beside ``calc.py``
    and ``files``."""
    work = tmp_path / "app"
    work.mkdir(exist_ok=True)
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    for name, text in (files or {}).items():
        (work / name).write_text(text)
    code, seen = watched_run(tmp_path, test_source, command)
    assert code == 0
    return witness.observe(HostShell(), seen).reference()


def run_in_shell(tmp_path: Path, test_source: str, before: str, command: str) -> watch.Witness:
    """``test_task.py`` run by ``command`` in the work folder from a clean environment, with
    ``before`` (shell) ahead of the witness's exports; it must pass."""
    work = tmp_path / "app"
    seen = watch.prepare(HostShell(), str(tmp_path / "logs" / "verifier"), str(work))
    (work / "test_task.py").write_text(test_source)
    done = subprocess.run(
        f"{before} && {seen.exports({})} && {command}",
        shell=True,
        cwd=work,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return seen


def test_a_base_class_in_a_helper_module_makes_it_a_test_file(tmp_path: Path) -> None:
    """``tests.py`` holds no test code; ``cases.py``'s base class does. Emptying its assert
    scored 1: the test ids name ``test_task`` alone."""
    reference = reference_of(tmp_path, TESTS, "-m unittest test_task", {"cases.py": CASES})
    assert reference.tests == {"unittest:test_task.T.test_add"}
    assert reference.test_files() == {"cases.py", "test_task.py"}  # not calc.py, the code


def test_a_test_file_run_as_a_script_is_a_test_file(tmp_path: Path) -> None:
    """``python3 tests.py``: the ids fall under ``__main__``, which names no file."""
    source = (
        "import unittest\n\nfrom calc import add\n\n\nclass T(unittest.TestCase):\n"
        "    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n\n\n"
        "if __name__ == '__main__':\n    unittest.main()\n"
    )
    reference = reference_of(tmp_path, source, "test_task.py")
    assert reference.tests == {"unittest:__main__.T.test_add"}
    assert reference.test_files() == {"test_task.py"}


def test_the_expected_values_a_test_reads_are_test_files(tmp_path: Path) -> None:
    """A test that reads ``expected.json`` (through ``pathlib``: the reader is the innermost
    frame of the work folder's code); the module under test reads nothing of it."""
    command = "-m pytest -q -p no:cacheprovider test_task.py"
    data = {"expected.json": '{"sum": 5}', "more.json": '{"sum": 2}'}
    reference = reference_of(tmp_path, READS, command, data)
    assert ("expected.json", "test_task.py") in reference.reads  # through pathlib
    assert ("more.json", "test_task.py") in reference.reads  # open() in the test itself
    assert reference.test_files() == {"test_task.py", "expected.json", "more.json"}
    # what the reference solution itself writes is its work, not the tests'
    solved = witness.Reference(
        reference.tests,
        reference.loads,
        solution_changed=frozenset({"expected.json"}),
        defined=reference.defined,
        reads=reference.reads,
    )
    assert solved.test_files() == {"test_task.py", "more.json"}


HELPER_READS = (
    "from calc import add\nfrom helpers import settings\n\n\ndef test_add():\n"
    "    with open('expected.txt') as f:\n        assert add(2, 3) == int(f.read())\n"
    "    assert settings() == 'on'\n    assert 'system(' not in open('main.c').read()\n"
)


def test_what_the_test_code_reads_is_held_and_what_the_run_writes_is_not(
    tmp_path: Path,
) -> None:
    """Expected values the test reads, through a link too, are the task's (each scored 1
    changed: red team, 2026-12-07). What other code reads (a helper's or the code under
    test's configuration, which an honest fix may edit instead of the code), a source file
    the test scans (the agent's work), a file the run writes before reading it (its output,
    which an honest attempt may leave regenerated) and pytest's own reads (its
    configuration) are not."""
    work = tmp_path / "app"
    (work / "data").mkdir(parents=True)
    (work / "data" / "expected.txt").write_text("5\n")
    (work / "expected.txt").symlink_to("data/expected.txt")
    (work / "settings.cfg").write_text("on")
    (work / "main.c").write_text("int main(void) { return 0; }\n")
    (work / "stale.txt").write_text("old\n")
    (work / "pytest.ini").write_text("[pytest]\n")
    helpers = "def settings():\n    with open('settings.cfg') as f:\n        return f.read()\n"
    test = HELPER_READS + (
        "\n\ndef test_output():\n    with open('stale.txt', 'w') as f:\n        f.write('new')\n"
        "    with open('stale.txt') as f:\n        assert f.read() == 'new'\n"
    )
    command = "-m pytest -q -p no:cacheprovider test_task.py"
    reference = reference_of(tmp_path, test, command, {"helpers.py": helpers})
    assert {("settings.cfg", "helpers.py"), ("main.c", "test_task.py")} <= reference.reads
    assert reference.written == {"stale.txt"}
    assert reference.test_files() == {"test_task.py", "expected.txt", "data/expected.txt"}
    # what the test opened, by its name: the link's target is held, not read again by name
    assert set(reference.test_reads()) == {("expected.txt", "test_task.py")}


def test_a_non_code_file_a_test_id_names_is_held() -> None:
    """``pytest --doctest-glob='*.txt' checks.txt``: pytest itself reads the file its test id
    names (a runner's read, held for the id)."""
    reference = witness.Reference(
        frozenset({"pytest:checks.txt::checks.txt"}),
        frozenset(),
        reads=frozenset({("checks.txt", ""), ("pytest.ini", "")}),
    )
    assert reference.test_files() == {"checks.txt"}


def test_a_run_that_sets_its_own_pythonpath_is_still_watched(tmp_path: Path) -> None:
    """A ``Makefile`` recipe ``PYTHONPATH=src python3 -m unittest`` drops the grader's folder
    from the path; the grader's user site starts the witness, and the user site the run had
    is kept. (The system's interpreter: a virtual environment reads no user site.)"""
    python = getattr(sys, "_base_executable", sys.executable)
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    own_site = tmp_path / "own" / "lib" / version / "site-packages"
    own_site.mkdir(parents=True)
    (own_site / "users_package.py").write_text("VALUE = 7\n")
    source = (
        "import unittest\n\nimport users_package\n\n\nclass T(unittest.TestCase):\n"
        "    def test_ok(self):\n        self.assertEqual(users_package.VALUE, 7)\n"
    )
    (tmp_path / "app").mkdir()
    seen = run_in_shell(
        tmp_path,
        source,
        f"export PYTHONUSERBASE={tmp_path / 'own'}",
        f"PYTHONPATH=src {python} -m unittest test_task",
    )
    observed = witness.observe(HostShell(), seen)
    assert observed.processes == 1
    assert observed.passed() == {"unittest:test_task.T.test_ok"}


def test_the_reference_keeps_its_sources_through_the_cache() -> None:
    from environments.proof.reference import ReferenceRun

    reference = witness.Reference(
        frozenset({"unittest:__main__.T.test_add"}),
        frozenset({"calc.py"}),
        defined=frozenset({"tests.py"}),
        reads=frozenset({("expected.json", "tests.py"), ("out.json", "calc.py")}),
        written=frozenset({"out.json"}),
        contents=frozenset({("expected.json", "tests.py", "2:ab"), ("out.json", "calc.py", "")}),
    )
    back = ReferenceRun.from_json(ReferenceRun(reference).to_json()).reference
    assert back == reference
    assert back.test_files() == {"tests.py", "expected.json"}
    assert back.test_reads() == {("expected.json", "tests.py"): {"2:ab"}}


def test_what_a_test_reads_is_recorded_with_its_content_which_a_planted_hashlib_cannot_forge(
    tmp_path: Path,
) -> None:
    """Each read carries the file's size and SHA-256 as it was opened, computed by the
    standard library's ``hashlib`` even where the work folder, first on ``PYTHONPATH``, holds
    one of its own that would report the task's digest for any content."""
    work = tmp_path / "app"
    work.mkdir()
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (work / "expected.json").write_text('{"sum": 5}')
    (work / "hashlib.py").write_text(
        "class sha256:\n    def update(self, data):\n        pass\n\n"
        "    def hexdigest(self):\n        return 'forged'\n"
    )
    seen = run_in_shell(
        tmp_path,
        READS.split("\n\n\ndef test_more")[0] + "\n",
        f"export PYTHONPATH={work}",
        f"{sys.executable} -m pytest -q -p no:cacheprovider test_task.py",
    )
    digest = hashlib.sha256(b'{"sum": 5}').hexdigest()
    reference = witness.observe(HostShell(), seen).reference()
    assert reference.test_reads() == {("expected.json", "test_task.py"): {f"10:{digest}"}}


def test_a_file_changed_after_the_tests_read_it_contradicts_a_pass(tmp_path: Path) -> None:
    """A copy renamed over ``expected.json`` for the test's read and the file put back
    leaves its content as it was but not its status: the witness looks at each file it
    hashed again as the session ends (another process won that race 3 times in 5 against a
    hash taken by path before the open: red team, 2026-12-08). In the reference run such a
    file is the run's output."""
    work = tmp_path / "app"
    work.mkdir()
    (work / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (work / "expected.json").write_text('{"sum": 5}')
    swapped = READS.split("\n\n\ndef test_more")[0] + (
        "\n    import os, shutil\n    shutil.copy('expected.json', 'kept.json')\n"
        "    os.replace('kept.json', 'expected.json')\n"
    )
    code, seen = watched_run(tmp_path, swapped)
    assert code == 0
    observed = witness.observe(HostShell(), seen)
    assert observed.changed == {("expected.json", "test_task.py")}
    assert "expected.json" in observed.reference().written  # the run's own, there
    digest = hashlib.sha256(b'{"sum": 5}').hexdigest()
    standard = witness.Reference(
        observed.passed(),
        frozenset(observed.loads),
        defined=frozenset(observed.defined),
        reads=frozenset(observed.reads),
        contents=frozenset({("expected.json", "test_task.py", f"10:{digest}")}),
    )
    assert observed.contents >= standard.contents  # the same content was read
    reasons = witness.contradictions(
        observed, full_pass=True, reference=standard, workdir=str(work)
    )
    assert any("changed on disk while the tests ran" in r for r in reasons), reasons


def test_what_the_run_made_before_its_tests_read_it_is_its_output() -> None:
    """A file the tests read with other content than the work folder held as they began (or
    none there) is the run's output: a report a shell script writes and a test removes, one
    that names the date (each made the reference solution's own tests \"read other content\":
    red team, 2026-12-08). A file too large to hash is judged by nothing here."""
    observed = witness.Observation(
        contents={
            ("expected.json", "test_task.py", "2:aa"),
            ("config/active.json", "test_task.py", "2:aa"),
            ("report.txt", "test_task.py", "3:bb"),
            ("huge.bin", "test_task.py", "9:"),
        }
    )
    tree = work.WorkTree(
        Path("unused.tar"),
        {
            "expected.json": work.Entry("file", "aa"),
            "config": work.Entry("dir", ""),
            "config/active.json": work.Entry("link", "/app/config/prod.json"),
            "config/prod.json": work.Entry("file", "aa"),
            "report.txt": work.Entry("file", "cc"),
        },
    )
    assert witness.outputs_read(observed, lambda p: tree.file_digest(p, "/app")) == {"report.txt"}
    assert tree.file_digest("config/active.json", "/srv") is None  # its target is elsewhere
