"""Strict grading's witness of the test run: started by the grader's sitecustomize in a real
pytest session on the host, and the grader's reading of its records. Code under test that
falsifies the run's outcome (exit 0 from an atexit hook, an early os._exit, removed records,
pytest.exit, SkipTest) contradicts or fails to prove a pass; an honest run, passing or failing,
does not."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from environments.proof import watch, witness
from environments.sandboxes.protocol import ExecResult

PASSING = "def test_ok():\n    assert True\n"
FAILING = "def test_add():\n    assert 1 + 1 == 3\n"
EXIT_ZERO_AT_EXIT = "import atexit, os\natexit.register(lambda: os._exit(0))\n" + FAILING
EXIT_AT_IMPORT = "import os\nos._exit(0)\n" + FAILING
REMOVES_RECORDS = (
    "import atexit, os, shutil\n"
    "atexit.register(lambda: (shutil.rmtree(os.environ['THUNDERSYNC_WITNESS']), os._exit(0)))\n"
    + FAILING
)


class HostShell:
    """Runs the grader's commands with bash on the host (the records are host files here)."""

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        done = subprocess.run(
            ["bash", "-c", cmd], capture_output=True, text=True, timeout=timeout, check=False
        )
        return ExecResult(done.stdout + done.stderr, done.returncode, False, 0.0)

    def upload(self, src: Path, dst: str) -> None:
        (shutil.copytree if src.is_dir() else shutil.copy)(src, dst)


def watched_run(
    tmp_path: Path, test_source: str, command: str = "-m pytest -q -p no:cacheprovider test_task.py"
) -> tuple[int, watch.Witness]:
    """Run pytest on one test file in a work folder as a strict verifier would (the witness
    started through the exports); its exit status and the witness."""
    shell = HostShell()
    work = tmp_path / "app"
    work.mkdir(exist_ok=True)
    seen = watch.prepare(shell, str(tmp_path / "logs" / "verifier"), str(work))
    (work / "test_task.py").write_text(test_source)
    done = subprocess.run(
        f"{seen.exports({})} && {sys.executable} {command}",
        shell=True,
        cwd=work,
        env={k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "PYTHONPATH"))},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, seen


def judged(seen: watch.Witness, shell: HostShell | None = None, **kwargs) -> list[str]:
    return witness.contradictions(
        witness.observe(shell or HostShell(), seen), workdir=seen.workdir, **kwargs
    )


def test_an_honest_passing_run_is_not_contradicted(tmp_path: Path) -> None:
    code, seen = watched_run(tmp_path, PASSING)
    assert code == 0
    assert judged(seen, full_pass=True) == []
    observed = witness.observe(HostShell(), seen)
    assert observed.passed() == {"pytest:test_task.py::test_ok"}
    assert "test_task.py" in observed.loads  # the test file itself, from the work folder


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (EXIT_ZERO_AT_EXIT, "finished with exit status 1"),
        (EXIT_AT_IMPORT, "ended before pytest finished it"),
        (REMOVES_RECORDS, "records of the test run were removed or changed"),
    ],
    ids=["atexit-exit-0", "os-exit-at-import", "records-removed"],
)
def test_a_run_the_code_under_test_falsified_contradicts_a_pass(
    tmp_path: Path, source: str, expected: str
) -> None:
    code, seen = watched_run(tmp_path, source)
    assert code == 0  # what a verifier reading the exit status would score as a pass
    reasons = judged(seen, full_pass=True)
    assert any(expected in reason for reason in reasons), reasons


def test_a_failing_session_does_not_contradict_partial_credit(tmp_path: Path) -> None:
    code, seen = watched_run(tmp_path, FAILING)
    assert code == 1
    assert judged(seen, full_pass=False) == []
    assert judged(seen, full_pass=True)


TWO_TESTS = PASSING + "\n\ndef test_two():\n    assert 2 == 2\n"


@pytest.fixture(scope="module")
def standard(tmp_path_factory: pytest.TempPathFactory) -> witness.Reference:
    """The reference solution's run of ``TWO_TESTS``: its tests, its loads, and what the
    environment's plugins replace in the runners (Hypothesis's wrap, pytest's own)."""
    code, seen = watched_run(tmp_path_factory.mktemp("reference"), TWO_TESTS)
    assert code == 0
    reference = witness.observe(HostShell(), seen).reference()
    assert reference.tests == {"pytest:test_task.py::test_ok", "pytest:test_task.py::test_two"}
    assert reference.loads == {"test_task.py"}
    return reference


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "import pytest\n" + PASSING + "\n\ndef test_two():\n    pytest.exit('done', 0)\n",
            "pytest:test_task.py::test_two (not run)",
        ),
        ("import unittest\nraise unittest.SkipTest('no')\n" + TWO_TESTS, "2 of the 2 tests"),
        (
            "import pytest\n" + PASSING + "\n\n@pytest.mark.skip\ndef test_two():\n    pass\n",
            "pytest:test_task.py::test_two (setup-skipped)",
        ),
        (
            "import pytest\n" + PASSING + "\n\n@pytest.mark.xfail\ndef test_two():\n    assert 0\n",
            "pytest:test_task.py::test_two (xfailed)",
        ),
    ],
    ids=["pytest-exit-0", "skip-test", "skipped", "xfailed"],
)
def test_a_pass_the_reference_tests_were_not_seen_to_make_is_not_proven(
    tmp_path: Path, source: str, expected: str, standard: witness.Reference
) -> None:
    """No failure: the verifier's pass (exit status 0; 5, no test collected, where a module
    raised SkipTest: Terminal-Bench's parser counts no failure). Not every test the reference
    solution passes was seen passing, so it is not proven."""
    code, seen = watched_run(tmp_path, source)
    assert code in (0, 5)
    reasons = judged(seen, full_pass=True, reference=standard)
    assert any(expected in reason for reason in reasons), reasons
    if code == 0:  # the run alone is consistent: the proof decides
        assert judged(seen, full_pass=True) == []


def test_the_same_tests_passing_prove_the_pass(tmp_path: Path, standard: witness.Reference) -> None:
    code, seen = watched_run(tmp_path, TWO_TESTS)
    assert code == 0
    assert judged(seen, full_pass=True, reference=standard) == []


def test_a_module_python_imports_from_the_work_folder_at_start_is_seen(
    tmp_path: Path, standard: witness.Reference
) -> None:
    """``copy`` tries ``org.python.core`` while pytest starts: a work folder's ``org`` package
    runs before any plugin, and its ``os._exit(0)`` ends the run with status 0. The witness,
    started by the grader's sitecustomize, saw ``copy`` load it."""
    org = tmp_path / "app" / "org"
    org.mkdir(parents=True)
    (org / "__init__.py").write_text("import os\nos._exit(0)\n")
    code, seen = watched_run(tmp_path, FAILING)
    assert code == 0
    reasons = judged(seen, full_pass=True, reference=standard)
    loaded = [r for r in reasons if "org/__init__.py: the test run loaded it" in r]
    assert loaded and "copy.py" in loaded[0], reasons


def test_code_the_agents_own_modules_import_is_theirs(
    tmp_path: Path, standard: witness.Reference
) -> None:
    """A solution split into modules: ``calc`` (which the reference run loads) imports
    ``helpers``, which the reference run never loads. Asked for by the agent's own code, it is
    part of the solution, not tampering."""
    work = tmp_path / "app"
    work.mkdir()
    (work / "calc.py").write_text("from helpers import one\n")
    (work / "helpers.py").write_text("def one():\n    return 1\n")
    code, seen = watched_run(tmp_path, "from calc import one\n" + TWO_TESTS)
    assert code == 0
    with_calc = replace(standard, loads=standard.loads | {"calc.py"})
    assert judged(seen, full_pass=True, reference=with_calc) == []
    assert "helpers.py" in witness.observe(HostShell(), seen).loads


def test_a_test_reading_the_agents_source_as_data_loads_nothing(
    tmp_path: Path, standard: witness.Reference
) -> None:
    """A style check over every ``*.py`` of the work folder reads files the reference run
    never had: data, not code the test run executes."""
    work = tmp_path / "app"
    work.mkdir()
    (work / "extra_module.py").write_text("X = 1\n")
    source = (
        "import glob\n\n\ndef test_ok():\n"
        "    assert all(len(open(p).read()) >= 0 for p in glob.glob('*.py'))\n"
        "\n\ndef test_two():\n    pass\n"
    )
    code, seen = watched_run(tmp_path, source)
    assert code == 0
    assert "extra_module.py" not in witness.observe(HostShell(), seen).loads
    assert judged(seen, full_pass=True, reference=standard) == []


def test_a_unittest_run_is_watched_test_by_test(tmp_path: Path) -> None:
    """``python3 -m unittest``: an atexit hook turns a failing run's status into 0."""
    source = (
        "import atexit, os, unittest\natexit.register(lambda: os._exit(0))\n\n\n"
        'class T(unittest.TestCase):\n    def test_ok(self):\n        """Says what it checks.\n\n'
        '        More."""\n\n    def test_bad(self):\n        self.assertEqual(1, 2)\n'
    )
    code, seen = watched_run(tmp_path, source, "-m unittest test_task")
    assert code == 0
    observed = witness.observe(HostShell(), seen)
    assert observed.outcomes == {
        "unittest:test_task.T.test_ok": ["passed"],
        "unittest:test_task.T.test_bad": ["failed"],
    }
    # a verbose runner prints the docstring's first line for the name (SWE-bench's Django rows)
    assert observed.described == {"Says what it checks.": {"unittest:test_task.T.test_ok"}}
    standard = witness.Reference(frozenset(observed.outcomes), frozenset())
    reasons = judged(seen, full_pass=True, reference=standard)
    assert any("unittest:test_task.T.test_bad (failed)" in r for r in reasons), reasons


def test_the_task_pytest_options_are_kept() -> None:
    seen = watch.Witness("/logs/.thundersync-witness", "nonce")
    exports = seen.exports({"PYTEST_ADDOPTS": "-x --tb=short"})
    assert "PYTEST_ADDOPTS='-x --tb=short -p _thundersync_witness'" in exports
    # the witness's folder first: its sitecustomize starts before anything of the task's
    assert 'PYTHONPATH=/logs/.thundersync-witness/plugin"${PYTHONPATH:+:$PYTHONPATH}"' in exports


class TruncatingShell(HostShell):
    """As a sandbox answers when a flood of records overflows its output limit."""

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        done = super().execute(cmd, timeout)
        return ExecResult(done.output, done.exit_code, False, 0.0, truncated=True)


def test_records_too_many_to_read_contradict_a_pass(tmp_path: Path) -> None:
    """A failing session's record hidden among thousands of passing ones is not a pass."""
    code, seen = watched_run(tmp_path, PASSING)
    assert code == 0
    reasons = judged(seen, TruncatingShell(), full_pass=True)
    assert any("more records than the grader reads" in r for r in reasons), reasons


@pytest.mark.parametrize(
    ("source", "command", "changed"),
    [
        (  # pytest: each test's failure swallowed, its function still called
            "import sys\n_python = sys.modules['_pytest.python']\n_run = _python.Function.runtest\n"
            "def _quiet(self):\n    try:\n        _run(self)\n    except Exception:\n        pass\n"
            "_python.Function.runtest = _quiet\n\n\n" + FAILING,
            "-m pytest -q -p no:cacheprovider test_task.py",
            "_pytest.python.Function.runtest",
        ),
        (  # unittest: an assertion made a no-op
            "import unittest\nunittest.TestCase.assertEqual = lambda *args, **kwargs: None\n\n\n"
            "class T(unittest.TestCase):\n    def test_add(self):\n"
            "        self.assertEqual(2, 3)\n",
            "-m unittest test_task",
            "unittest.case.TestCase.assertEqual",
        ),
        (  # the same, the wrapper carrying a forged __func__ (red team, third round)
            "import sys, shutil\n_python = sys.modules['_pytest.python']\n"
            "_run = _python.Function.runtest\n"
            "def _quiet(self):\n    try:\n        _run(self)\n    except Exception:\n        pass\n"
            "_quiet.__func__ = shutil.copy\n_python.Function.runtest = _quiet\n\n\n" + FAILING,
            "-m pytest -q -p no:cacheprovider test_task.py",
            "_pytest.python.Function.runtest",
        ),
        (  # a callable object passing for a function with a borrowed __code__
            "import sys, shutil\n_reports = sys.modules['_pytest.reports']\n"
            "_orig = _reports.TestReport.from_item_and_call\n"
            "class _Fake:\n    __code__ = shutil.copy.__code__\n"
            "    def __call__(self, cls, item, call):\n        rep = _orig(item, call)\n"
            "        rep.outcome, rep.longrepr = 'passed', None\n        return rep\n"
            "_reports.TestReport.from_item_and_call = classmethod(_Fake())\n\n\n" + FAILING,
            "-m pytest -q -p no:cacheprovider test_task.py",
            "_pytest.reports.TestReport.from_item_and_call",
        ),
        (  # the runner's own code object, given forged globals
            "import sys, types\nr = sys.modules['_pytest.runner']\n"
            "class _CI:\n    @staticmethod\n    def from_call(func, when, reraise=None):\n"
            "        def quiet():\n            try:\n                return func()\n"
            "            except AssertionError:\n                return None\n"
            "        return r.CallInfo.from_call(quiet, when=when, reraise=reraise)\n"
            "old = r.call_and_report\n"
            "new = types.FunctionType(old.__code__, dict(r.__dict__, CallInfo=_CI), "
            "old.__name__, old.__defaults__, old.__closure__)\n"
            "new.__kwdefaults__ = old.__kwdefaults__\nr.call_and_report = new\n\n\n" + FAILING,
            "-m pytest -q -p no:cacheprovider test_task.py",
            "_pytest.runner.call_and_report",
        ),
        (  # unittest: another runner function's code under forged globals reports success
            "import types, unittest.case as c\n"
            "g = dict(vars(c), getattr=lambda *a: None, "
            "warnings=types.SimpleNamespace(warn=lambda *a: None))\n"
            "c._addError = types.FunctionType(c._addSkip.__code__, g, '_addError')\n\n\n"
            "class T(c.TestCase):\n    def test_add(self):\n        self.assertEqual(2, 3)\n",
            "-m unittest test_task",
            "unittest.case._addError",
        ),
    ],
    ids=[
        "pytest-runtest-swallowed",
        "unittest-assert-no-op",
        "forged-func-attribute",
        "borrowed-code-attribute",
        "runner-code-forged-globals",
        "unittest-forged-globals",
    ],
)
def test_the_runners_code_replaced_from_the_work_folder_contradicts_a_pass(
    tmp_path: Path, source: str, command: str, changed: str
) -> None:
    """Code under test (here the test file itself) that replaces the runner's own functions
    makes a failing test pass; the replacement comes from the work folder, and is seen. The
    venv's own plugins replace some too (Hypothesis wraps ``FixtureFunctionMarker.__call__``),
    which the honest runs above show is not counted."""
    code, seen = watched_run(tmp_path, source, command)
    assert code == 0  # the run passed
    reasons = judged(seen, full_pass=True)
    assert any(f"runner's own code changed during the test run ({changed}" in r for r in reasons), (
        reasons
    )


def test_the_runners_own_replacements_stand_where_the_runner_lives_in_the_work_folder(
    tmp_path: Path,
) -> None:
    """A rebuilt image may install pytest inside the work folder (``/testbed/.deps``); pytest's
    own ``legacypath`` then replaces ``Config._getini_unknown_type`` with code of the work
    folder, which is the runner's own and no contradiction (it failed Flask's gold run)."""
    import _pytest
    import pluggy

    deps = tmp_path / "app" / ".deps"
    deps.mkdir(parents=True)
    for package in (Path(_pytest.__file__).parent, Path(pluggy.__file__).parent):
        (deps / package.name).symlink_to(package, target_is_directory=True)
    (deps / "pytest").symlink_to(Path(pytest.__file__).parent, target_is_directory=True)
    run = (
        "-c \"import sys; sys.path.insert(0, '.deps'); import pytest; "
        "assert '/app/.deps/' in pytest.__file__; "
        "sys.exit(pytest.main(['-q', '-p', 'no:cacheprovider', 'test_task.py']))\""
    )
    code, seen = watched_run(tmp_path, PASSING, run)
    assert code == 0
    assert judged(seen, full_pass=True) == []


def test_a_runner_function_swapped_in_contradicts_a_pass_where_the_reference_run_differs(
    tmp_path: Path,
) -> None:
    """Code outside the work folder may replace the runners' members (a plugin's, pytest's
    own) where the reference solution's run does the same; another of the runner's own
    functions swapped in (the failure never reaches pytest's ``addFailure``) does not."""
    test = "class T(unittest.TestCase):\n    def test_add(self):\n        self.assertEqual(2, {})\n"
    honest = "import unittest\n\n\n" + test.format(2)
    (tmp_path / "reference").mkdir()
    code, seen = watched_run(tmp_path / "reference", honest)
    reference = witness.observe(HostShell(), seen).reference()
    assert code == 0 and reference.tests == {"pytest:test_task.py::T::test_add"}
    assert judged(seen, full_pass=True, reference=reference) == []  # the same replacements
    swapped = "import unittest, unittest.util\n"
    swapped += "unittest.case._addError = unittest.util._common_shorten_repr\n\n\n"
    (tmp_path / "hack").mkdir()
    code, seen = watched_run(tmp_path / "hack", swapped + test.format(3))
    assert code == 0  # the run passed
    assert judged(seen, full_pass=True) == []  # alone, code outside the work folder stands
    reasons = judged(seen, full_pass=True, reference=reference)
    assert any("unittest.case._addError=unittest.util._common_shorten_repr" in r for r in reasons)


def test_a_test_module_whose_class_was_changed_proves_no_call(tmp_path: Path) -> None:
    """Code under test that changes the test module's class hands pytest a no-op in place of
    the test function, and pytest_pyfunc_call is still called: the test is passed-unrun."""
    work = tmp_path / "app"
    work.mkdir()
    (work / "calc.py").write_text(
        "import sys, types\n"
        "def add(a, b):\n    return a + b\n"
        "class _M(types.ModuleType):\n"
        "    def __getattribute__(self, name):\n"
        "        if name.startswith('test_'):\n            return lambda *a, **k: None\n"
        "        return types.ModuleType.__getattribute__(self, name)\n"
        "f = sys._getframe(1)\n"
        "while not f.f_globals.get('__name__', '').startswith('test_'):\n    f = f.f_back\n"
        "sys.modules[f.f_globals['__name__']].__class__ = _M\n"
    )
    code, seen = watched_run(
        tmp_path, "from calc import add\n\n\ndef test_add():\n    assert add(1, 1) == 3\n"
    )
    assert code == 0  # the run passed
    observed = witness.observe(HostShell(), seen)
    assert observed.outcomes == {"pytest:test_task.py::test_add": ["passed-unrun"]}


FORGES_RECORDS = (
    "import os\n"
    "with open(os.path.join(os.environ['THUNDERSYNC_WITNESS'], 'zz.proc'), 'a') as out:\n"
    "    out.write('(\"test\", 0x' + 'f' * 15000 + ', \"passed\", \"x\")\\n')\n"
    "    out.write('(\"tampered\", \"s\", [0x' + 'f' * 15000 + '])\\n')\n"
    '    out.write(\'("session", 1 << 4000, "pytest")\\n\')\n'
    "    out.write('{[]: 0}\\n')\n" + FAILING
)


def test_record_lines_the_code_under_test_forged_are_read_as_no_record(tmp_path: Path) -> None:
    """Fields no witness writes (a 15,000-digit int, a list of ints) and literals that cannot
    be built (an unhashable key) are no record: ``str()`` of such an int raised past Python's
    digit limit, ``literal_eval`` a TypeError, and each grade fell as an infrastructure
    failure (red team, 2026-12-07); the failing test is still seen failing."""
    code, seen = watched_run(tmp_path, FORGES_RECORDS)
    assert code == 1
    observed = witness.observe(HostShell(), seen)
    assert observed.outcomes == {"pytest:test_task.py::test_add": ["failed"]}
    assert not observed.tampered


ODD_RECORD_NAME = (
    "import os\n"
    "open(os.path.join(os.environ['THUNDERSYNC_WITNESS'], 'a\\n\\u00b2 b.proc'), 'w').close()\n"
    + PASSING
)


def test_a_record_name_no_witness_makes_is_no_listing(tmp_path: Path) -> None:
    """A file named with a newline and '²' split the grader's listing into a line whose size
    ``str.isdigit()`` took and ``int()`` refused: an infrastructure failure (red team,
    2026-12-07). The records are then no proof of anything."""
    code, seen = watched_run(tmp_path, ODD_RECORD_NAME)
    assert code == 0
    observed = witness.observe(HostShell(), seen)
    assert observed.problem is not None and "not the witness's" in observed.problem
    assert any("not the witness's" in r for r in judged(seen, full_pass=True))


def test_the_work_folders_test_files_are_those_its_reference_tests_came_from() -> None:
    """A loaded file is a test file when a passing test's id names it: pytest by path (from
    any rootdir), unittest by dotted module; the module under test is not one."""
    reference = witness.Reference(
        tests=frozenset(
            {
                "unittest:tests.TestCount.test_count",
                "pytest:../app/src/check_words.py::test_words",
                "pytest:/tests/test_outputs.py::test_outputs",
            }
        ),
        loads=frozenset({"tests.py", "wordcount.py", "src/check_words.py", "outputs.py"}),
    )
    assert reference.test_files() == {"tests.py", "src/check_words.py"}
    # a package's tests module, not the package: an honest solution may edit its __init__.py
    # (red team, 2026-12-07); nor a file the reference solution itself edits
    package = witness.Reference(
        tests=frozenset({"unittest:shop.tests.ShopTests.test_discount"}),
        loads=frozenset({"shop/__init__.py", "shop/tests.py", "shop/core.py"}),
    )
    assert package.test_files() == {"shop/tests.py"}
    edited = witness.Reference(package.tests, package.loads, solution_changed=package.loads)
    assert edited.test_files() == frozenset()


@pytest.mark.parametrize(
    ("name", "text", "named"),
    [
        ("test.sh", "export PYTHONPATH=/app; python3 -m unittest tests\n", "python3"),
        ("test.sh", "cd /app && uv run pytest -q\n", "uv"),
        ("test.sh", "env -i /usr/bin/python3.11 -I check\n", "python3.11"),
        ("check.py", "print(1)\n", "check.py"),
        ("test.sh", "grep -q hello /app/out.txt # a pipeline, detox, anaconda\n", None),
    ],
)
def test_a_verifier_naming_python_is_told_from_one_that_does_not(
    name: str, text: str, named: str | None
) -> None:
    assert watch.python_named(name, text) == named
