"""Strict SWE-bench grading's proof of a pass, on records written as the witness writes them
(``environments/swebench/proof.py``): the standard from the gold run, test by test; what the
repository may contribute; why an instance has no standard. Real runs, in both sandboxes:
tests/integration/test_reward_hacks_swebench.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from environments.proof import witness
from environments.swebench import load_instances
from environments.swebench.proof import contradictions, reference_run, witness_id
from environments.tasks import Grade

FIXTURES = Path(__file__).resolve().parents[4] / "environments/fixtures/swebench"
INSTANCE = load_instances(FIXTURES).get("thundersync__intervals-1").instance
TESTS = [*INSTANCE.fail_to_pass, *INSTANCE.pass_to_pass]


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("tests/test_x.py::test_y[a b-1]", "pytest:tests/test_x.py::test_y[a b-1]"),
        ("tests/test_x.py::Case::test_y", "pytest:tests/test_x.py::Case::test_y"),
        (
            "test_ascii (auth_tests.test_validators.UsernameValidatorsTests)",
            "unittest:auth_tests.test_validators.UsernameValidatorsTests.test_ascii",
        ),
        (  # Python 3.11's unittest names the method twice
            "test_ascii (auth_tests.test_validators.UsernameValidatorsTests.test_ascii)",
            "unittest:auth_tests.test_validators.UsernameValidatorsTests.test_ascii",
        ),
        ("Named URLs should be reversible", None),  # a docstring Django printed instead
        ("test_issue_11617", None),  # sympy's own runner
    ],
)
def test_each_log_name_maps_to_the_witness_id_of_its_runner(name: str, expected: str | None):
    assert witness_id(name) == expected


def records(
    passed: list[str], *, finished: int | None = 0, loads: dict[str, set[str]] | None = None
) -> witness.Observation:
    """What the witness records for one pytest session that passed ``passed``, whose process
    loaded ``loads`` (work-folder path: the files of the code that asked for it)."""
    seen = witness.Observation(processes=1, sessions={"s": "pytest"}, loads=dict(loads or {}))
    if finished is not None:
        seen.finished["s"] = finished
    for test in passed:
        seen.outcomes[f"pytest:{test}"] = [witness.PASSED]
    return seen


PYTEST = "/usr/lib/python3/dist-packages/_pytest/assertion/rewrite.py"
GOLD = records(
    [*TESTS, "tests/test_ops.py::test_not_in_the_row"],
    loads={
        "intervals/ops.py": {"/testbed/intervals/__init__.py"},
        "intervals/__init__.py": {"/testbed/tests/test_ops.py"},
        "tests/test_ops.py": {PYTEST},
    },
)
RESOLVED = Grade(1.0, details={"resolved": True})


def standard() -> witness.Reference:
    run = reference_run(INSTANCE, RESOLVED, [], GOLD)
    assert run.error is None and run.reference is not None
    return run.reference


def test_the_standard_is_the_rows_tests_the_gold_run_was_seen_to_pass():
    assert standard().tests == {f"pytest:{t}" for t in TESTS}  # not the row's: not required


def test_a_run_that_passes_every_test_of_the_standard_proves_its_log():
    assert contradictions(GOLD, standard(), "/testbed") == []


def test_a_missing_test_or_an_unfinished_session_contradicts_a_resolved_log():
    missing = records(TESTS[1:], loads=GOLD.loads)
    found = contradictions(missing, standard(), "/testbed")
    assert len(found) == 1 and f"1 of the {len(TESTS)} tests" in found[0], found
    cut = records(TESTS, finished=None)
    assert any(
        "ended before pytest finished it" in r for r in contradictions(cut, standard(), "/testbed")
    )


def test_new_code_below_the_repositorys_own_folders_is_its_own_a_new_top_level_one_is_not():
    """A module the fix adds inside its package may be imported by anything (a doctest
    collector in site-packages); a new top-level package the interpreter imports was planted."""
    fix = replace(GOLD, loads={**GOLD.loads, "intervals/merging.py": {PYTEST}})
    assert contradictions(fix, standard(), "/testbed") == []
    planted = replace(
        GOLD, loads={**GOLD.loads, "org/__init__.py": {"/usr/lib/python3.11/copy.py"}}
    )
    found = contradictions(planted, standard(), "/testbed")
    assert len(found) == 1 and found[0].startswith(
        "/testbed/org/__init__.py: the test run loaded"
    ), found
    asked = replace(GOLD, loads={**GOLD.loads, "helpers.py": {"/testbed/intervals/ops.py"}})
    assert contradictions(asked, standard(), "/testbed") == []  # the repository's code asked


@pytest.mark.parametrize(
    ("gold", "flagged", "seen", "why"),
    [
        (RESOLVED, [], records([]), "unwatched"),
        (RESOLVED, [], records(TESTS, finished=None), "not one the witness can follow"),
        (RESOLVED, ["conftest.py: a conftest.py"], GOLD, "the audit flags its gold patch's run"),
        (
            Grade(0.0, details={"tests_status": {"FAIL_TO_PASS": {"failure": TESTS[:1]}}}),
            [],
            GOLD,
            f"does not resolve it strictly (1 tests failing: {TESTS[0]})",
        ),
    ],
    ids=["no-test-seen", "unfinished-session", "flagged", "not-resolved"],
)
def test_an_instance_without_a_standard_says_why(gold, flagged, seen, why):
    run = reference_run(INSTANCE, gold, flagged, seen)
    assert run.reference is None and why in str(run.error), run.error


def test_a_session_with_other_failing_tests_still_proves_the_listed_ones():
    """swebench resolves on the listed tests alone; other tests of the same files may fail
    before and after the fix (the session's exit status 1, in the gold run too)."""
    failing = records(TESTS, finished=1, loads=GOLD.loads)
    failing.outcomes["pytest:tests/test_ops.py::test_fails_at_base_and_gold"] = ["failed"]
    run = reference_run(INSTANCE, RESOLVED, [], failing)
    assert run.reference is not None and run.reference.tests == standard().tests, run.error
    assert contradictions(failing, standard(), "/testbed") == []


def test_a_docstring_printed_for_a_name_is_found_by_the_witnesss_description():
    """Django's runner prints a test's docstring line in place of its name; the witness
    records each unittest test's description, so that test is part of the standard too."""
    name, test = "Named URLs should be reversible", "unittest:urlpatterns.tests.T.test_named"
    instance = replace(INSTANCE, fail_to_pass=(name,), pass_to_pass=())
    seen = witness.Observation(processes=1, sessions={"s": "unittest"}, finished={"s": 0})
    seen.outcomes[test] = [witness.PASSED]
    seen.described[name] = {test}
    run = reference_run(instance, RESOLVED, [], seen)
    assert run.reference is not None and run.reference.tests == {test}, run.error
