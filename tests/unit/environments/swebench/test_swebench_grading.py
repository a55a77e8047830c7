"""Grading from logs agrees with swebench's own get_eval_report on the official Verified rows."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

from environments.swebench import load_instances
from environments.swebench.grading import grade_log, make_spec, patch_paths
from environments.swebench.snapshot import START_MARKER
from environments.tasks import TaskList

REPO_ROOT = Path(__file__).resolve().parents[4]
DATA = Path(os.environ.get("THUNDERSYNC_SWEBENCH_DATA", REPO_ROOT.parent / "shared/data/swebench"))
VERIFIED = DATA / "SWE-bench_Verified.test.parquet"
LITE = DATA / "SWE-bench_Lite.test.parquet"

# the first Verified instance (by id) of each log parser that has PASS_TO_PASS tests
SAMPLE = {
    "astropy__astropy-12907": "parse_log_astropy",
    "django__django-10097": "parse_log_django",
    "matplotlib__matplotlib-13989": "parse_log_matplotlib",
    "mwaskom__seaborn-3069": "parse_log_seaborn",
    "pallets__flask-5014": "parse_log_flask",
    "psf__requests-1142": "parse_log_requests",
    "pydata__xarray-2905": "parse_log_xarray",
    "pylint-dev__pylint-4970": "parse_log_pylint",
    "pytest-dev__pytest-10051": "parse_log_pytest",
    "scikit-learn__scikit-learn-10297": "parse_log_scikit",
    "sphinx-doc__sphinx-10323": "parse_log_sphinx",
    "sympy__sympy-11618": "parse_log_sympy",
}


@pytest.fixture(scope="module")
def verified() -> TaskList:
    if not VERIFIED.exists():
        pytest.skip(f"{VERIFIED} absent")
    return load_instances(VERIFIED)


@pytest.fixture(scope="module")
def verified_rows() -> dict[str, dict]:
    if not VERIFIED.exists():
        pytest.skip(f"{VERIFIED} absent")
    import pyarrow.parquet as pq

    return {r["instance_id"]: r for r in pq.read_table(VERIFIED).to_pylist()}


def status_line(parser: str, test_id: str, passed: bool) -> str:
    """One test's result line, in the format ``parser`` reads."""
    if parser == "parse_log_django":
        return f"{test_id} ... {'ok' if passed else 'FAIL'}"
    if parser == "parse_log_sympy":
        return f"{test_id} {'ok' if passed else 'F'}"
    return f"PASSED {test_id}" if passed else f"FAILED {test_id} - AssertionError: boom"


def synthetic_log(row: dict, failing: set[str], *, exit_code: int | None = None) -> str:
    """A log shaped like the eval script's output: every F2P and P2P test passes except
    ``failing``; the exit code line is the anti-spoofing record."""
    tests = json.loads(row["FAIL_TO_PASS"]) + json.loads(row["PASS_TO_PASS"])
    lines = [status_line(row["log_parser"], t, t not in failing) for t in tests]
    code = (1 if failing else 0) if exit_code is None else exit_code
    return (
        "+ git apply -v -\nApplied patch cleanly.\n+ : '>>>>> Start Test Output'\n"
        + "\n".join(lines)
        + f"\n+ SWEBENCH_TEST_EXIT_CODE={code}\n+ : '>>>>> End Test Output'\n"
        f"+ echo '>>>>> Test Exit Code: {code}'\n>>>>> Test Exit Code: {code}\n"
    )


def swebench_resolved(row: dict, log: str) -> bool:
    """The official verdict, straight from swebench on the raw parquet row."""
    from swebench.harness.grading import get_eval_report
    from swebench.harness.utils import make_test_spec

    with tempfile.NamedTemporaryFile("w", suffix=".log") as f:
        f.write(log)
        f.flush()
        pred = {"instance_id": row["instance_id"], "model_patch": "x", "model_name_or_path": "m"}
        report = get_eval_report(make_test_spec(row), pred, f.name, include_tests_status=False)
    return report[row["instance_id"]]["resolved"]


@pytest.mark.parametrize("instance_id", sorted(SAMPLE))
def test_grade_agrees_with_swebench_on_verified_logs(
    verified: TaskList, verified_rows: dict[str, dict], instance_id: str
) -> None:
    row = verified_rows[instance_id]
    assert row["log_parser"] == SAMPLE[instance_id]
    instance = verified.get(instance_id).instance
    f2p, p2p = json.loads(row["FAIL_TO_PASS"]), json.loads(row["PASS_TO_PASS"])
    scenarios = [
        ("all pass", set(), True),
        ("one F2P fails", {f2p[0]}, False),
        ("one P2P fails", {p2p[-1]}, False),
    ]
    for name, failing, expected in scenarios:
        log = synthetic_log(row, failing)
        grade = grade_log(instance, log)
        assert swebench_resolved(row, log) is expected, name
        assert grade.reward == (1.0 if expected else 0.0), name
        assert not grade.infra_failure, name
        assert grade.details["resolved"] is expected


def test_exit_code_anti_spoofing(verified: TaskList, verified_rows: dict) -> None:
    row = verified_rows["pallets__flask-5014"]
    spoofed = synthetic_log(row, set(), exit_code=1)
    assert swebench_resolved(row, spoofed) is False
    assert grade_log(verified.get("pallets__flask-5014").instance, spoofed).reward == 0.0


@pytest.mark.parametrize("path", [VERIFIED, LITE], ids=["verified", "lite"])
def test_make_test_spec_works_offline_on_every_official_row(path: Path) -> None:
    if not path.exists():
        pytest.skip(f"{path} absent")
    for task in load_instances(path):
        spec = make_spec(task.instance)
        assert spec.instance_id == task.task_id
        assert spec.image == task.sandbox_spec().image
        assert list(spec.FAIL_TO_PASS) == list(task.instance.fail_to_pass)
        # swebench's anti-spoofing line: the tests' exit status recorded before the end marker
        script = spec.eval_script
        assert "SWEBENCH_TEST_EXIT_CODE=$?" in script
        assert script.index("SWEBENCH_TEST_EXIT_CODE=$?") < script.index(">>>>> End Test Output")


def test_log_without_markers_is_an_infra_failure(verified: TaskList) -> None:
    grade = grade_log(verified.get("pallets__flask-5014").instance, "bash: conda: not found\n")
    assert grade.infra_failure and grade.reward == 0.0
    assert "did not reach the tests" in grade.details["error"]


@pytest.mark.parametrize("signature", ["Killed", "bash: fork: Cannot allocate memory"])
def test_a_run_the_agents_code_killed_is_its_zero_not_infra(
    verified: TaskList, signature: str
) -> None:
    """swebench's advisory classifier reads these as an environment fault; here a patch that
    exhausted memory caused them once the tests started, and excluding the episode would hide
    the failure from training."""
    log = f"{START_MARKER}\n{signature}\n"
    grade = grade_log(verified.get("pallets__flask-5014").instance, log)
    assert (grade.reward, grade.infra_failure) == (0.0, False)
    assert "out_of_memory" in grade.details["swebench_advisory"]


def test_timeout_is_the_agents_zero_not_infra(verified: TaskList) -> None:
    grade = grade_log(verified.get("pallets__flask-5014").instance, "", timed_out=True)
    assert grade.reward == 0.0 and not grade.infra_failure
    assert grade.details["timed_out"] is True


def test_test_patch_failure_blames_harness_unless_agent_touched_test_files(
    verified: TaskList, verified_rows: dict
) -> None:
    instance = verified.get("pallets__flask-5014").instance
    f2p = {"tests/test_blueprints.py::test_empty_name_not_allowed"}
    failed_apply = "error: patch failed: tests/test_blueprints.py:256\n" + synthetic_log(
        verified_rows["pallets__flask-5014"], f2p
    )
    harness = grade_log(instance, failed_apply, changed_files=["src/flask/blueprints.py"])
    assert harness.infra_failure
    agent = grade_log(instance, failed_apply, changed_files=["tests/test_blueprints.py"])
    assert not agent.infra_failure and agent.reward == 0.0


def test_patch_paths() -> None:
    patch = (
        "diff --git a/src/x.py b/src/x.py\n--- a/src/x.py\n+++ b/src/x.py\n"
        "diff --git a/tests/new.py b/tests/new.py\nnew file mode 100644\n--- /dev/null\n"
        "+++ b/tests/new.py\n"
    )
    assert patch_paths(patch) == {"src/x.py", "tests/new.py"}


@pytest.mark.parametrize(
    ("instance_id", "printed"),
    [
        ("pallets__flask-5014", ">>>>> Test Exit Code: " + "9" * 5000),
        ("django__django-10097", "ERROR:"),
    ],
    ids=["exit-code-of-5000-digits", "django-error-line-alone"],
)
def test_a_log_swebenchs_parser_cannot_read_is_flagged_for_the_control_run(
    verified: TaskList, verified_rows: dict, instance_id: str, printed: str
) -> None:
    """Lines the code under test prints that swebench's parsers raise on (``int()`` past
    Python's digit limit; Django's parser reading a second word): raised, the grade fell as an
    infrastructure failure whoever printed them (red team, 2026-12-07). Flagged instead, so
    that a control run on the base commit says whose it is (test_swebench_labels.py)."""
    log = synthetic_log(verified_rows[instance_id], set()).replace(
        "+ : '>>>>> Start Test Output'\n", f"+ : '>>>>> Start Test Output'\n{printed}\n"
    )
    grade = grade_log(verified.get(instance_id).instance, log)
    assert (grade.reward, grade.infra_failure) == (0.0, True)
    assert "swebench could not parse the eval log" in grade.details["error"]
