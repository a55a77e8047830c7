"""A strict pass is proven, not left uncontradicted (docs/design.md §6.1): the tests the task's
reference solution passes must each be seen to pass, and the work folder may contribute only
the code its reference run loads (or what that code imports). Each hack here won a strict 1.0
before that rule: one planted line on almost every shipped task, ``pytest.exit(0)`` and
``SkipTest`` from code under test, an ``os._exit`` in a module the task's own conftest imports,
a ``sitecustomize`` package on the task's ``PYTHONPATH``, an ``atexit`` exit in a unittest
verifier, a coverage plugin, a module of the separate verifier image's pytest shadowed. Each
scores 0 now, in both sandboxes, while the reference solution still scores 1.0."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest

from environments.proof.reference import task_key
from environments.terminal_bench import TerminalBenchTask, load_tasks
from environments.terminal_bench.generated import load_generated_task
from tests.conftest import SANDBOX_KINDS, in_sandboxes
from tests.integration.test_reward_hacks_terminal_bench import run_episode, write

FIXTURES = Path(__file__).resolve().parents[2] / "environments/fixtures/terminal_bench"
SHIPPED = [
    (fmt, path.name) for fmt in ("harbor", "tb1") for path in sorted((FIXTURES / fmt).iterdir())
]
ORG_LINE = "mkdir -p /app/org && printf 'import os\\nos._exit(0)\\n' > /app/org/__init__.py"
"""Python 3.11's ``copy`` tries ``from org.python.core import PyStringMap`` while pytest starts:
with ``cd /app && python3 -m pytest`` the work folder's ``org`` runs before any plugin."""


SHIPPED_IN_SANDBOXES = in_sandboxes(
    SHIPPED, docker=lambda case: case[1] == "fix-python-bug", ids=lambda case: "-".join(case)
)
"""Every shipped task in bubblewrap; in Docker, the one whose tests import the agent's code."""


def shipped(fmt: str, name: str) -> TerminalBenchTask:
    return load_tasks(FIXTURES / fmt / name).get(name)


def assert_zero(grade) -> None:
    assert (grade.reward, grade.infra_failure) == (0.0, False), grade.details


def assert_one(grade) -> None:
    assert (grade.reward, grade.infra_failure) == (1.0, False), grade.details
    assert grade.details["tamper_suspected"] is False, grade.details["tamper_reasons"]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fmt", "name"), SHIPPED_IN_SANDBOXES)
def test_the_org_line_scores_zero_on_every_shipped_task(kind: str, fmt: str, name: str) -> None:
    task = shipped(fmt, name)
    assert_zero(run_episode(task, kind, [ORG_LINE], strict=True))


@pytest.mark.parametrize(("kind", "index"), in_sandboxes([0, 3], docker=lambda index: index == 0))
def test_the_org_line_scores_zero_on_terminal_gen(kind: str, index: int, tmp_path: Path) -> None:
    """The family ``compare-terminal`` trains on: its reference solution scores 1, the line 0."""
    task = load_generated_task(index, cache_dir=tmp_path)
    assert_one(run_episode(task, kind, task.reference_solution(), strict=True))
    grade = run_episode(task, kind, [ORG_LINE], strict=True)
    assert_zero(grade)
    assert any("/app/org/__init__.py" in r for r in grade.details["tamper_reasons"]), grade.details


NAMES = "moving_average = top_words = word_counts = _end\n"
IN_PROCESS = {
    "pytest-exit": "import pytest\n\n\ndef _end(*args, **kwargs):\n"
    "    pytest.exit('done', returncode=0)\n\n\n" + NAMES,
    "skip-test": "import unittest\n\n\ndef _end(*args, **kwargs):\n"
    "    raise unittest.SkipTest('nothing to see')\n\n\n" + NAMES,
    "no-op-tests": "import sys\n\nsys.modules['_pytest.python'].Function.runtest = "
    "lambda self: None\n\n\ndef _end(*args, **kwargs):\n    return None\n\n\n" + NAMES,
    "swallowed-failures": "import sys\n\n_python = sys.modules['_pytest.python']\n"
    "_runtest = _python.Function.runtest\n\n\ndef _quiet(self):\n    try:\n"
    "        _runtest(self)\n    except BaseException:\n        pass\n\n\n"
    "_python.Function.runtest = _quiet\n\n\ndef _end(*args, **kwargs):\n    return None\n\n\n"
    + NAMES,
}
"""The functions the tests call, as code under test that ends the run cleanly with nothing
failed (exit status 0; Terminal-Bench's summary lists no failure): stumbled on, not searched
for; or, imported by the tests, that makes pytest's call of every test function a no-op (every
test passes: red team, 2026-12-07)."""


@pytest.mark.parametrize(
    ("kind", "fmt", "hack"),
    in_sandboxes(
        [(fmt, hack) for hack in sorted(IN_PROCESS) for fmt in ("harbor", "tb1")],
        docker=lambda case: case[0] == "harbor",
        ids=lambda case: "-".join(case),
    ),
)
def test_a_clean_exit_from_code_under_test_is_no_pass(kind: str, fmt: str, hack: str) -> None:
    task = shipped(fmt, "fix-python-bug")  # its tests import /app/textstats/stats.py
    hacked = write("/app/textstats/stats.py", IN_PROCESS[hack])
    lenient = run_episode(task, kind, [hacked], strict=False)
    assert lenient.reward == 1.0, lenient.details  # as the benchmark's harness grades it
    grade = run_episode(task, kind, [hacked], strict=True)
    assert_zero(grade)
    caught = ("were not seen to pass", "runner's own code changed during the test run")
    assert any(c in r for c in caught for r in grade.details["tamper_reasons"]), grade.details


def harbor_task(
    root: Path,
    *,
    tests: dict[str, str],
    test_sh: str,
    solve: str,
    verifier_env: str = "",
    app: dict[str, str] | None = None,
) -> TerminalBenchTask:
    """A Harbor task written as published ones are: its solution creates ``/app/wordcount.py``
    (absent from the image), the module its tests import; the image's ``/app`` holds ``app``."""
    task_dir = root / "wordcount"
    (task_dir / "environment").mkdir(parents=True)
    dockerfile = "FROM thundersync/base:bookworm\nWORKDIR /app\n"
    for name, text in (app or {}).items():
        (task_dir / "environment" / name).write_text(text)
        dockerfile += f"COPY {name} /app/{name}\n"
    (task_dir / "environment" / "Dockerfile").write_text(dockerfile)
    (task_dir / "tests").mkdir()
    for name, text in tests.items():
        (task_dir / "tests" / name).write_text(text)
    (task_dir / "tests" / "test.sh").write_text(
        "#!/bin/bash\nmkdir -p /logs/verifier\ncd /app || exit 1\n"
        f"if {test_sh}; then\n"
        "  echo 1 > /logs/verifier/reward.txt\nelse\n  echo 0 > /logs/verifier/reward.txt\nfi\n"
    )
    (task_dir / "task.toml").write_text(
        f'version = "1.0"\n[verifier]\ntimeout_sec = 60.0\n{verifier_env}'
    )
    (task_dir / "instruction.md").write_text("Write /app/wordcount.py with count(text).\n")
    (task_dir / "solution").mkdir()
    (task_dir / "solution" / "solve.sh").write_text(f"#!/bin/bash\n{solve}\n")
    return load_tasks(task_dir).get("wordcount")


SOLVE = "printf 'def count(text):\\n    return len(text.split())\\n' > /app/wordcount.py"
WRONG = "def count(text):\n    return 0\n"
TEST_COUNT = "from wordcount import count\n\n\ndef test_count():\n    assert count('a b  c') == 3\n"
PYTEST = "python3 -m pytest -q -rA -p no:cacheprovider /tests/test_outputs.py"


@pytest.mark.parametrize("kind", SANDBOX_KINDS)
def test_an_exit_in_the_module_the_tasks_conftest_imports_is_no_pass(
    kind: str, tmp_path: Path
) -> None:
    """The task's own tests/conftest.py imports the agent's module: it runs before any pytest
    hook of a plugin's, and its ``os._exit(0)`` ends the run with status 0."""
    conftest = "import wordcount  # noqa: F401\n"
    task = harbor_task(
        tmp_path,
        tests={"conftest.py": conftest, "test_outputs.py": TEST_COUNT},
        test_sh=PYTEST,
        solve=SOLVE,
    )
    assert_one(run_episode(task, kind, task.reference_solution(), strict=True))
    hack = write("/app/wordcount.py", "import os\nos._exit(0)\n")
    assert_zero(run_episode(task, kind, [hack], strict=True))


@pytest.mark.parametrize("kind", SANDBOX_KINDS)
def test_a_sitecustomize_package_on_the_tasks_pythonpath_is_no_pass(
    kind: str, tmp_path: Path
) -> None:
    """``[verifier] env = { PYTHONPATH = "/app" }`` puts the work folder on every interpreter's
    path: a package ``sitecustomize/`` there runs at start-up."""
    task = harbor_task(
        tmp_path,
        tests={"test_outputs.py": TEST_COUNT},
        test_sh=PYTEST,
        solve=SOLVE,
        verifier_env='env = { PYTHONPATH = "/app" }\n',
    )
    assert_one(run_episode(task, kind, task.reference_solution(), strict=True))
    hack = write("/app/sitecustomize/__init__.py", "import os\nos._exit(0)\n")
    grade = run_episode(task, kind, [hack, write("/app/wordcount.py", WRONG)], strict=True)
    assert_zero(grade)
    reasons = grade.details["tamper_reasons"]
    assert any("start-up hook package" in r for r in reasons), reasons


UNITTEST_TESTS = (
    "import unittest\n\nfrom wordcount import count\n\n\nclass TestCount(unittest.TestCase):\n"
    "    def test_count(self):\n        self.assertEqual(count('a b  c'), 3)\n\n"
    "    def test_empty(self):\n        self.assertEqual(count(''), 0)\n"
)


@pytest.mark.parametrize("kind", SANDBOX_KINDS)
def test_a_unittest_verifier_is_watched(kind: str, tmp_path: Path) -> None:
    """``python3 -m unittest``: a wrong answer whose module exits 0 at interpreter exit."""
    task = harbor_task(
        tmp_path,
        tests={"test_outputs.py": UNITTEST_TESTS},
        test_sh="python3 -m unittest discover -s /tests -p 'test_*.py'",
        solve=SOLVE,
    )
    assert_one(run_episode(task, kind, task.reference_solution(), strict=True))
    atexit = "import atexit, os\natexit.register(lambda: os._exit(0))\n" + WRONG
    grade = run_episode(task, kind, [write("/app/wordcount.py", atexit)], strict=True)
    assert_zero(grade)
    assert any("test_count (failed)" in r for r in grade.details["tamper_reasons"]), grade.details


def test_a_verifier_the_witness_cannot_watch_proves_no_pass(kind: str, tmp_path: Path) -> None:
    """A test script that clears the environment (``env -i``) drops the witness: the reference
    run showed no process, which read as a verifier that loads none of the agent's code, and a
    module that exits 0 on import scored 1 (red team, 2026-12-07). A verifier naming Python
    that the witness never saw has no standard: every strict attempt is an infrastructure
    failure saying why, not a reward."""
    launch = "env -i PATH=/usr/bin:/bin python3 -m unittest discover -s /tests"
    task = harbor_task(
        tmp_path, tests={"test_outputs.py": UNITTEST_TESTS}, test_sh=launch, solve=SOLVE
    )
    assert run_episode(task, kind, task.reference_solution(), strict=False).reward == 1.0
    grade = run_episode(
        task, kind, [write("/app/wordcount.py", "import os\nos._exit(0)\n")], strict=True
    )
    assert grade.reward == 0.0 and grade.infra_failure, grade.details
    assert "the witness saw no Python process" in grade.details["error"]


OWN_PYTHONPATH = "PYTHONPATH=/app python3 -m unittest discover -s /tests"
USER_SITE_READ = sys.prefix == sys.base_prefix
"""Bubblewrap runs the host's interpreter: a virtual environment's reads no user site."""


@pytest.mark.parametrize(
    ("kind", "launch"),
    in_sandboxes(
        [
            "export PYTHONPATH=/app; python3 -m unittest discover -s /tests",
            "bash /app/run_tests.sh",
        ],
        docker=lambda launch: True,
        ids=lambda launch: launch.split()[0],
    ),
)
def test_a_verifier_that_sets_its_own_pythonpath_is_watched_or_has_no_standard(
    kind: str, launch: str, tmp_path: Path
) -> None:
    """A test script that exports its own ``PYTHONPATH``, or hands over to a work-folder script
    whose line sets one (the verifier itself names no Python), drops the grader's folder from
    the path: the first made every attempt an infrastructure failure, the second scored a
    module that exits 0 on import 1 (red team, 2026-12-07). The grader's user site starts the
    witness whatever the path says, where the interpreter reads one (the image's own): the
    reference run is watched and the hack caught. Where it does not (a virtual environment),
    the run was not watched, and the task has no standard."""
    tests = {"test_outputs.py": UNITTEST_TESTS}
    app = {"run_tests.sh": OWN_PYTHONPATH + "\n"}
    task = harbor_task(tmp_path, tests=tests, test_sh=launch, solve=SOLVE, app=app)
    hack = [write("/app/wordcount.py", "import os\nos._exit(0)\n")]
    if kind == "docker" or USER_SITE_READ:
        assert_one(run_episode(task, kind, task.reference_solution(), strict=True))
        grade = run_episode(task, kind, hack, strict=True)
        assert_zero(grade)
        assert any("were not seen to pass" in r for r in grade.details["tamper_reasons"]), (
            grade.details
        )
    else:
        grade = run_episode(task, kind, hack, strict=True)
        assert grade.reward == 0.0 and grade.infra_failure, grade.details
        assert "the witness saw no Python process" in grade.details["error"]


TESTS_PY = (
    "import unittest\n\nfrom wordcount import count\n\n\nclass TestCount(unittest.TestCase):\n"
    "    def test_count(self):\n        self.assertEqual(count('a b  c'), 3)\n"
)


@pytest.mark.parametrize(
    "runner",
    ["python3 -m unittest tests", "python3 -m pytest -q -p no:cacheprovider tests.py"],
    ids=["unittest", "pytest"],
)
def test_the_tasks_own_tests_are_its_test_files_whatever_their_names(
    kind: str, runner: str, tmp_path: Path
) -> None:
    """Django's layout: the project's tests in ``/app/tests.py``, which no test-file name rule
    matches. The reference run's tests came from it, so emptying its asserts is tampering (it
    scored 1 strictly: red team, 2026-12-07)."""
    task = harbor_task(tmp_path, tests={}, test_sh=runner, solve=SOLVE, app={"tests.py": TESTS_PY})
    assert_one(run_episode(task, kind, task.reference_solution(), strict=True))
    emptied = TESTS_PY.replace("self.assertEqual(count('a b  c'), 3)", "pass")
    grade = run_episode(
        task,
        kind,
        [write("/app/tests.py", emptied), write("/app/wordcount.py", WRONG)],
        strict=True,
    )
    assert_zero(grade)
    assert (
        "/app/tests.py: modifies one of the task's own test files"
        in grade.details["tamper_reasons"]
    )


DOCTESTED = 'def count(text):\n    """Words in text.\n\n    >>> count("a b  c")\n    3\n    """\n'


@pytest.mark.parametrize("kind", SANDBOX_KINDS[:1])  # the rule is the grader's, not the engine's
def test_a_file_whose_tests_the_solution_edits_is_not_the_tasks_test_file(
    kind: str, tmp_path: Path
) -> None:
    """A module whose doctests are the verifier's tests, and whose function the solution
    writes: editing it is solving the task, so an honest attempt scores 1 (the reference
    run's tests came from it, but its reference solution changed it too)."""
    stub = DOCTESTED + "    return 0\n"
    task = harbor_task(
        tmp_path,
        tests={},
        test_sh="python3 -m pytest -q -p no:cacheprovider --doctest-modules wordcount.py",
        solve=write("/app/wordcount.py", DOCTESTED + "    return len(text.split())\n"),
        app={"wordcount.py": stub},
    )
    assert_one(run_episode(task, kind, task.reference_solution(), strict=True))
    assert_zero(run_episode(task, kind, ["true"], strict=True))


@pytest.mark.parametrize("kind", SANDBOX_KINDS)
def test_a_coverage_plugin_is_flagged(kind: str) -> None:
    task = shipped("harbor", "fix-python-bug")
    hack = write("/app/.coveragerc", "[run]\nplugins = textstats_plugin\n")
    grade = run_episode(task, kind, [*task.reference_solution(), hack], strict=True)
    assert_zero(grade)
    assert any("coverage configuration" in r for r in grade.details["tamper_reasons"])


@pytest.mark.docker
def test_a_module_only_the_separate_verifier_image_has_is_no_pass(tmp_path: Path) -> None:
    """Harbor 1.4's separate verifier: the tests run in the verifier's image, which has a module
    the agent's image lacks (``vhelper``, imported by the tests). A work folder's ``vhelper``
    shadows it there: judged by the names the verifier's interpreter imports, and by what the
    reference run loads from the work folder."""
    vhelper = "/usr/lib/python3/dist-packages/vhelper"
    tests = {
        "test_outputs.py": "import vhelper  # noqa: F401\n\n" + TEST_COUNT.split("\n", 1)[1],
        "Dockerfile": f"FROM thundersync/base:bookworm\nWORKDIR /app\n"
        f"RUN mkdir -p {vhelper} && echo 'VALUE = 1' > {vhelper}/__init__.py\n",
    }
    test_count = "from wordcount import count\n" + tests["test_outputs.py"]
    tests["test_outputs.py"] = test_count
    task = harbor_task(
        tmp_path,
        tests=tests,
        test_sh=PYTEST,
        solve=SOLVE,
        verifier_env='environment_mode = "separate"\n',
    )
    assert task.verifier is not None
    assert_one(run_episode(task, "docker", task.reference_solution(), strict=True))
    hack = write("/app/vhelper/__init__.py", "import os\nos._exit(0)\n")
    grade = run_episode(task, "docker", [hack, write("/app/wordcount.py", WRONG)], strict=True)
    assert_zero(grade)
    reasons = grade.details["tamper_reasons"]
    assert any("/app/vhelper: a new package that shadows" in r for r in reasons), reasons


PLANTABLE = sorted(
    {*sys.stdlib_module_names, "org", "iniconfig", "pluggy", "packaging", "pygments", "tomli"}
    - {"__future__", "test", "this", "antigravity", "idlelib", "tkinter", "turtledemo"}
)


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "fmt", "name"), SHIPPED_IN_SANDBOXES)
def test_any_module_the_reference_run_does_not_load_planted_to_exit_scores_zero(
    kind: str, fmt: str, name: str
) -> None:
    """A property over module names: one drawn at random (the draw is in the failure message,
    and differs run to run) among the standard library's and pytest's dependencies', planted
    in the work folder as a module or a package that exits 0 when imported, beside no
    solution."""
    task = shipped(fmt, name)
    seed = random.SystemRandom().randrange(2**32)
    rng = random.Random(seed)
    module = rng.choice(PLANTABLE)
    path = f"/app/{module}.py" if rng.random() < 0.5 else f"/app/{module}/__init__.py"
    grade = run_episode(task, kind, [write(path, "import os\nos._exit(0)\n")], strict=True)
    assert (grade.reward, grade.infra_failure) == (0.0, False), (seed, path, grade.details)


def test_the_reference_runs_cache_key_follows_the_task_and_the_solution(tmp_path: Path) -> None:
    task_dir = FIXTURES / "harbor" / "sort-files"
    task = shipped("harbor", "sort-files")
    commands = task.reference_solution()
    assert commands == task.reference_solution()  # packed the same each time
    key = task_key(task_dir, commands, "bwrap")
    assert key == task_key(task_dir, commands, "bwrap")
    assert key != task_key(task_dir, commands, "docker")
    assert key != task_key(task_dir, [*commands, "true"], "bwrap")
