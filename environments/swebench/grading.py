"""Grade an eval log exactly as the official harness does: swebench's TestSpec and report."""

from __future__ import annotations

import re
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from environments.swebench.instance import SWEBenchInstance
from environments.swebench.snapshot import START_MARKER
from environments.tasks import Grade
from environments.unified_diff import parse_patch

MODEL_NAME = "thundersync"
LOG_TAIL_CHARS = 2000
_TEST_PATCH_FAILED = re.compile(
    r"^error: .*(patch failed|patch does not apply|already exists in working directory"
    r"|does not exist in index|corrupt patch|No valid patches in input)",
    re.MULTILINE,
)


def make_spec(instance: SWEBenchInstance) -> Any:
    """swebench's TestSpec for the instance. Its ``eval_script`` is the row's script with the
    anti-spoofing line added (the tests' own exit status echoed after the end marker)."""
    from swebench.harness.utils import make_test_spec

    return make_test_spec(instance.swebench_row())


def eval_report(instance: SWEBenchInstance, log: str, *, model_patch: str = "") -> dict[str, Any]:
    """swebench's ``get_eval_report`` on ``log``, for this instance only."""
    from swebench.harness.grading import get_eval_report

    with tempfile.TemporaryDirectory(prefix="swebench-log-") as tmp:
        log_path = Path(tmp) / "test_output.txt"
        log_path.write_text(log)
        report = get_eval_report(
            test_spec=make_spec(instance),
            prediction={
                "instance_id": instance.instance_id,
                "model_name_or_path": MODEL_NAME,
                "model_patch": model_patch,
            },
            test_log_path=str(log_path),
            include_tests_status=True,
        )
    return report[instance.instance_id]


def patch_paths(patch: str) -> set[str]:
    """The repository paths a unified diff touches (before and after renames)."""
    return {p for diff in parse_patch(patch) for p in (diff.old_path, diff.new_path) if p}


def grade_log(
    instance: SWEBenchInstance,
    log: str,
    *,
    changed_files: Iterable[str] = (),
    timed_out: bool = False,
) -> Grade:
    """Turn an eval log into a Grade: reward 1 iff swebench says resolved.

    Infrastructure failures (the script never reached the tests; the test patch did not
    apply although the agent left the test patch's files alone; swebench's parser raising on
    the log's text) are flagged, not scored; a
    log alone cannot say who caused them, so ``SWEBenchTask`` keeps the label only when a
    control run on the base commit fails too (``control.py``). A
    timeout is the agent's (its code may hang), as in the official harness, which scores it
    unresolved. So is a log that swebench's advisory classifier calls an environment fault
    (``infra_failure_reason``, kept in ``details["swebench_advisory"]``): it matches text such
    as ``Killed``, ``Cannot allocate memory`` or ``cannot open display``, which the agent's code
    prints or causes once the tests run (a patch that exhausts memory is killed), and an
    excluded episode would hide that failure from training (docs/design.md §6.1, principle 3).
    """
    tail = log[-LOG_TAIL_CHARS:]
    if timed_out:
        return Grade(0.0, details={"resolved": False, "timed_out": True, "log_tail": tail})
    if START_MARKER not in log:
        return _infra("the eval script did not reach the tests", tail)
    before_tests = log.split(START_MARKER, 1)[0]
    touched = sorted(set(changed_files) & patch_paths(instance.test_patch))
    if _TEST_PATCH_FAILED.search(before_tests):
        if not touched:
            return _infra("the test patch did not apply to the base commit", tail)
        # The instance's tests did not run as specified, so nothing was resolved, whatever
        # the log shows (swebench itself only looks for "applied patch" anywhere in it).
        problem = f"the test patch did not apply over the agent's changes to {touched}"
        return Grade(0.0, details={"resolved": False, "error": problem, "log_tail": tail})
    try:
        report = eval_report(instance, log, model_patch="\n".join(changed_files))
    except Exception as exc:  # noqa: BLE001 - swebench's parsers, on text the tests printed
        # a log its parser cannot read proves nothing, and raised, it was an infrastructure
        # failure whoever printed the text (an exit-code line of 5,000 digits, a Django line
        # `ERROR:` alone: red team, 2026-12-07); flagged, a control run decides whose it is
        problem = f"swebench could not parse the eval log: {type(exc).__name__}: {exc}"
        return _infra(problem[:500], tail)
    resolved = bool(report["resolved"])
    details = {
        "resolved": resolved,
        "patch_successfully_applied": report["patch_successfully_applied"],
        "tests_status": report.get("tests_status", {}),
        "log_tail": tail,
    }
    if not resolved and report.get("infra_failure"):
        details["swebench_advisory"] = f"environment fault? {report.get('infra_failure_reason')}"
    return Grade(1.0 if resolved else 0.0, details=details)


def _infra(problem: str, tail: str) -> Grade:
    return Grade(0.0, infra_failure=True, details={"error": problem, "log_tail": tail})
