"""The report of ``thundersync eval``: per-task rewards, pass@k, attempt counts, the table and
the one-line summary (docs/design.md §7)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import Any, TypedDict

from harness.eval_config import EvalConfig
from harness.passk import mean_pass_at_k
from thundersync.cli_output import WIDTH, fit, plain_table
from thundersync.protocol.types import Trajectory

NOTE_CHARS = 1000
"""The most of an outcome said under the table: every actionable message we write fits (the
unmapped-image one is 260); past it, a dumped log's first line is cut."""
PASS = 1.0 - 1e-9
"""An attempt passes (for pass@k) when its reward is 1: the task fully solved."""


class TaskRow(TypedDict):
    """One task of the report (``tasks``)."""

    task_id: str
    reward: float | None
    num_scored: int
    num_passed: int
    infra_failure: bool
    attempts: list[dict[str, Any]]


def build_report(config: EvalConfig, groups: Sequence[Sequence[Trajectory]]) -> dict[str, Any]:
    """The JSON report: ``mean_reward``; ``pass_at_k`` for every k' <= k (the unbiased
    estimator, over tasks with k' scored attempts); ``num_tasks`` and ``num_infra_failures``
    (tasks whose every attempt failed that way); ``num_attempts``,
    ``num_infra_failed_attempts`` and ``num_invalid_rewards`` (attempts); per task
    ``task_id``, ``reward``, ``num_scored``, ``num_passed``, ``infra_failure`` and the
    attempts; ``engine`` is the policy's (None for an agent without one). An attempt passes
    when its reward is 1 (the task fully solved)."""
    rows: list[TaskRow] = []
    for group in groups:
        scored = [_score(result) for result in group if not result.infra_failure]
        rows.append(
            TaskRow(
                task_id=group[0].task_id,
                reward=sum(scored) / len(scored) if scored else None,
                num_scored=len(scored),
                num_passed=sum(r >= PASS for r in scored),
                infra_failure=not scored,
                attempts=[_attempt(result) for result in group],
            )
        )
    outcomes = [[r >= PASS for r in (_score(a) for a in g if not a.infra_failure)] for g in groups]
    rewards = [row["reward"] for row in rows if row["reward"] is not None]
    attempts = [attempt for row in rows for attempt in row["attempts"]]
    return {
        "suite": config.suite,
        "agent": config.agent,
        "checkpoint": config.checkpoint,
        "engine": config.engine if config.agent == "policy" else None,
        "sandbox": config.sandbox,
        "strict": config.strict,
        "k": config.k,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "pass_at_k": {str(k): mean_pass_at_k(outcomes, k) for k in range(1, config.k + 1)},
        "num_tasks": len(rows),
        "num_infra_failures": sum(row["infra_failure"] for row in rows),
        "num_attempts": len(attempts),
        "num_infra_failed_attempts": sum(a["infra_failure"] for a in attempts),
        "num_invalid_rewards": sum(
            "reward_invalid" in a and not a["infra_failure"] for a in attempts
        ),
        "infra_failures_excluded_from_mean": True,
        "tasks": rows,
    }


def _reward(result: Trajectory) -> float:
    """The attempt's reward; every attempt in a report was graded."""
    if result.reward is None:
        raise ValueError(f"episode {result.episode_id}: in the report before it was graded")
    return result.reward


def _score(result: Trajectory) -> float:
    """The attempt's reward in the means: a non-finite one scores 0, so it cannot raise them."""
    reward = _reward(result)
    return reward if math.isfinite(reward) else 0.0


def _attempt(result: Trajectory) -> dict[str, Any]:
    attempt: dict[str, Any] = {
        "episode_id": result.episode_id,
        "reward": result.reward,
        "infra_failure": result.infra_failure,
        "stop_reason": result.stop_reason,
        "num_turns": len(result.turns),
    }
    if not math.isfinite(_reward(result)):
        attempt["reward"] = None
        attempt["reward_invalid"] = (
            f"non-finite reward ({result.reward!r}) of an infrastructure failure; not scored"
            if result.infra_failure
            else f"the grader returned a non-finite reward ({result.reward!r}); scored 0"
        )
    if "error" in result.details:
        attempt["error"] = str(result.details["error"])
    details = result.details
    if details.get("tamper_suspected"):
        attempt["tamper_suspected"] = True
        attempt["tamper_reasons"] = [str(r)[:300] for r in details.get("tamper_reasons", [])[:20]]
    for key in ("agent_failure", "reward_error"):
        if key in details:
            attempt[key] = str(details[key])[:500]
    if details.get("unwatched"):  # strict grading had no test to follow (docs/design.md §6.1)
        attempt["unwatched"] = True
    if not result.infra_failure and not _score(result) >= PASS:
        attempt["reason"] = shortfall(result)
    return attempt


def shortfall(result: Trajectory) -> str:
    """Why a scored attempt fell short of 1, in a line: what its grader recorded (a reason,
    tampering, a broken sandbox, a test run past its timeout, the failing tests, the answer
    against the expected one), and how the episode ended when the agent did not submit. A
    0 in a table without its reason reads as a policy that failed, whatever happened."""
    d = result.details
    if not math.isfinite(_reward(result)):
        return f"the grader returned a non-finite reward ({result.reward!r}); scored 0"
    if d.get("tamper_suspected"):
        first = next(iter(d.get("tamper_reasons") or []), "")
        why = f"tamper suspected: {first}" if first else "tamper suspected"
    else:
        why = next(
            (
                _line(d[key])
                for key in ("reason", "agent_failure", "reward_error", "error")
                if d.get(key)
            ),
            "",
        )
    if not why:
        why = _outcome(d) or f"graded {result.reward:g} (the grader gave no reason)"
    if result.stop_reason not in (None, "submitted", "error"):
        why += f"; {result.stop_reason}"
    return why


def _outcome(d: dict[str, Any]) -> str:
    """What the grader's details say of the outcome: the answer, the failing tests."""
    if "expected" in d:
        answer = d.get("answer")
        if answer is None or answer == "":
            return f"no answer (expected {d['expected']})"
        return f"answered {answer}, expected {d['expected']}"
    if d.get("timed_out"):
        return "the tests timed out"
    failing = [name for name, status in (d.get("tests") or {}).items() if status in _FAILING]
    for group in (d.get("tests_status") or {}).values():
        if isinstance(group, dict):
            failing += [str(name) for name in group.get("failure") or []]
    text = (
        f"failed: {', '.join(failing[:3])}{', ...' if len(failing) > 3 else ''}" if failing else ""
    )
    if d.get("resolved") is False:
        return "not resolved" + (f"; {text}" if text else "")
    if not text and isinstance(d.get("exit_code"), int) and d["exit_code"] != 0:
        return f"the tests exited {d['exit_code']}"
    return text


_FAILING = frozenset({"FAILED", "ERROR", "XPASS"})
"""A pytest summary's statuses of a failing test."""


def _line(value: Any) -> str:
    """The first non-empty line of a recorded message."""
    return next((line.strip() for line in str(value).splitlines() if line.strip()), "")


def summary(report: dict) -> tuple[int, str]:
    """(exit code, the one-line summary): 1 when nothing was scored because no attempt ran or
    every attempt was an infrastructure failure."""
    attempts, failed = report["num_attempts"], report["num_infra_failed_attempts"]
    if attempts == 0:
        return 1, "eval: FAILED: no attempt ran"
    if failed == attempts:
        errors = [a.get("error", "") for row in report["tasks"] for a in row["attempts"]]
        first = next((e.splitlines()[0] for e in errors if e.strip()), "no error recorded")
        return 1, f"eval: FAILED: all {attempts} attempts were infrastructure failures: {first}"
    mean = report["mean_reward"]
    scored = report["num_tasks"] - report["num_infra_failures"]
    line = (
        f"eval: mean reward {'n/a' if mean is None else f'{mean:.3f}'} over "
        f"{scored}/{report['num_tasks']} tasks; {failed}/{attempts} attempts infra-failed"
    )
    if report["num_invalid_rewards"]:
        line += f", {report['num_invalid_rewards']} non-finite"
    return 0, line


def pass_at_k_line(report: dict) -> str | None:
    """The line "pass@1 x, pass@k y ..." with -k above 1 (an attempt passes with reward 1; unbiased,
    over the tasks with at least k scored attempts), else None."""
    k = report.get("k", 1)
    if k <= 1:
        return None
    values = report["pass_at_k"]
    shown = [(1, values.get("1")), (k, values.get(str(k)))]
    text = ", ".join(f"pass@{n} {'n/a' if v is None else f'{v:.3f}'}" for n, v in shown)
    return f"{text} (unbiased; an attempt passes with reward 1)"


def report_table(report: dict) -> list[str]:
    """Per task: the reward and its outcome (solved, why it fell short, or the first
    infrastructure error), in at most 80 columns. An outcome too long for its column is
    numbered and said whole once under the table: cut to the column, the unmapped-image error
    lost the ``--image-alias`` it names at its end."""
    several = report.get("k", 1) > 1  # then each task's passed/scored attempts too
    header = ["task", "reward", *(["passed"] if several else []), "outcome"]
    widths = [28, 6, 6, 34] if several else [28, 6, 42]
    notes: dict[str, int] = {}
    rows = []
    for row in report["tasks"]:
        reward = "-" if row["reward"] is None else f"{row['reward']:.3f}"
        passed = [f"{row['num_passed']}/{row['num_scored']}"] if several else []
        rows.append([row["task_id"], reward, *passed, _cell(_task_outcome(row), widths[-1], notes)])
    engine = f" ({report['engine']})" if report.get("engine") else ""
    title = f"{report['suite']} · agent {report['agent']}{engine} · {report['sandbox']}"
    lines = [fit(title), *plain_table(header, rows, widths)]
    for text, number in notes.items():
        said = text if len(text) <= NOTE_CHARS else fit(text, NOTE_CHARS) + " (--json: whole)"
        lines += textwrap.wrap(
            f"[{number}] {said}",
            WIDTH,
            subsequent_indent="    ",
            break_on_hyphens=False,
            break_long_words=True,
        )
    passing = pass_at_k_line(report)
    if passing:
        lines.append(passing)
    if report["num_infra_failed_attempts"] or report["num_invalid_rewards"]:
        lines.append(
            "infra-failed attempts are excluded from the means; non-finite rewards score 0"
        )
    return lines


def _task_outcome(row: dict) -> tuple[str, str]:
    """(label, text): ``solved``; an infrastructure failure and its first error; or why the
    task's first attempt short of 1 fell short."""
    attempts = row["attempts"]
    if row["infra_failure"]:
        errors = [_line(a.get("error", "")) for a in attempts if a["infra_failure"]]
        return "infra failure", next((e for e in errors if e), "no error recorded")
    short = [a for a in attempts if not a["infra_failure"] and "reason" in a]
    if not short:
        return "solved", ""
    return "", short[0]["reason"]


def _cell(outcome: tuple[str, str], width: int, notes: dict[str, int]) -> str:
    """The outcome as it fits ``width``, or its label and note number (the text is in
    ``notes``, numbered once however many tasks share it)."""
    label, text = outcome
    whole = f"{label}: {text}" if label and text else label or text
    if len(whole) <= width:
        return whole
    number = notes.setdefault(text, len(notes) + 1)
    head = f"{label} [{number}]" if label else f"[{number}]"
    room = width - len(head) - 1
    return f"{head} {fit(text, room)}" if room > 10 else head
