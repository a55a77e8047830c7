"""``thundersync eval``: run an agent on every task of a suite and report per-task rewards.

Every task runs ``k`` times through ``EpisodeRunner`` (so the run produces the same events as
training does; ``--out`` keeps them in ``events.jsonl``). A task's reward is the mean over its
attempts that did not hit an infrastructure failure; a task whose every attempt failed that
way has reward None and is left out of the suite's mean (the report says how many were, as
tasks and as attempts). A non-finite reward from a grader is reported as null with a reason
and scored 0 in the means: a broken grade must never raise a score.

Nothing passes vacuously (docs/design.md §8): the sandbox's prerequisites are checked before
any task runs (exit 2 naming the fix), and a run in which no attempt ran, or every attempt was
an infrastructure failure, exits 1. The summary is the last line; ``--json`` and
``results.json`` are strict JSON.

SIGINT (Ctrl-C) and SIGTERM cancel the run: every live sandbox is closed at once (killing its
command), the attempts cut short are infrastructure failures, and the partial report (with
``"interrupted": "SIGINT"``) is written before the command exits with 128 + the signal.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import shutil
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from thundersync.cli_output import Progress, fit, plain_table, print_verdict, strict_json
from thundersync.events import EventBus, JsonlSink, RewardReady, reset_clock
from thundersync.types import Trajectory

PREREQUISITE_TIMEOUT_S = 30.0
"""Seconds the sandbox trial run may take before the sandbox counts as broken."""


@dataclass(frozen=True, slots=True)
class EvalConfig:
    """What one ``thundersync eval`` run did (written to ``config.json``)."""

    suite: str
    """A registered suite name or a path to a folder/file of tasks."""
    agent: str
    """``oracle`` (runs each task's reference solution) or ``nop`` (submits at once)."""
    sandbox: str
    """``bwrap`` or ``docker``."""
    k: int
    """Attempts per task."""
    concurrency: int
    """Episodes running at once."""
    seed: int = 0
    """Seeds each episode's reset."""
    strict: bool = False
    """Strict grading (``--strict``; ``environments.tasks.GradingContext.strict``)."""
    image_aliases: tuple[str, ...] = ()
    """``--image-alias PUBLIC=LOCAL`` pairs (``environments.sandboxes.image_build``)."""


def _fail(message: str) -> int:
    print(f"eval: error: {message}", file=sys.stderr)
    return 2


def sandbox_problem(kind: str) -> str | None:
    """Why sandboxes of ``kind`` cannot run on this machine (with the fix), or None when a
    trial sandbox ran ``true``."""
    if kind == "docker":
        from environments.sandboxes import docker_available

        if not docker_available():
            return (
                "--sandbox docker: no Docker daemon answers (start dockerd, or use --sandbox bwrap)"
            )
        return None
    from environments.sandboxes import SandboxError, SandboxSpec, bwrap

    if shutil.which(bwrap.BWRAP) is None:
        return (
            f"--sandbox bwrap: bubblewrap ({bwrap.BWRAP}) is not installed: "
            "apt-get install bubblewrap, or use --sandbox docker"
        )
    try:
        with bwrap.BwrapSandbox(SandboxSpec()) as sandbox:
            result = sandbox.execute("true", timeout=PREREQUISITE_TIMEOUT_S)
    except SandboxError as exc:
        reason = (str(exc).strip().splitlines() or ["no output"])[-1]
        return (
            f"--sandbox bwrap: bubblewrap is installed but cannot start a sandbox here "
            f"({reason}); it needs user namespaces (or root), or use --sandbox docker"
        )
    if result.exit_code != 0:
        shown = "timed out" if result.timed_out else f"exit code {result.exit_code}"
        return (
            f"--sandbox bwrap: a trial sandbox failed to run `true` ({shown}); use --sandbox docker"
        )
    return None


def run_eval_command(args: argparse.Namespace) -> int:
    """Run the command: 0 when attempts were scored (whatever the rewards), 1 when no attempt
    ran or every attempt was an infrastructure failure, 2 on bad input or prerequisites."""
    if args.k < 1 or args.concurrency < 1:
        return _fail(f"-k and --concurrency must be >= 1, got {args.k} and {args.concurrency}")
    from environments.sandboxes.image_build import parse_image_aliases, use_image_aliases
    from environments.suites import UnknownSuiteError, resolve_suite
    from environments.tasks import TaskFormatError

    try:
        use_image_aliases(parse_image_aliases(args.image_alias, "--image-alias"))
    except ValueError as exc:
        return _fail(str(exc))
    try:
        tasks = list(resolve_suite(args.suite))
    except (UnknownSuiteError, TaskFormatError) as exc:
        return _fail(str(exc))
    if not tasks:
        return _fail(f"suite {args.suite!r} has no tasks")
    problem = sandbox_problem(args.sandbox)
    if problem is not None:
        return _fail(problem)
    config = EvalConfig(
        args.suite, args.agent, args.sandbox, args.k, args.concurrency,
        strict=args.strict, image_aliases=tuple(args.image_alias),
    )  # fmt: skip
    out = Path(args.out) if args.out else None
    groups, signum = _run(config, tasks, out)
    report = build_report(config, groups)
    if signum is not None:
        report["interrupted"] = signal.Signals(signum).name
    text = strict_json(report)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "config.json").write_text(strict_json(dataclasses.asdict(config)) + "\n")
        (out / "results.json").write_text(text + "\n")
    if args.json:
        print(text)
    else:
        print("\n".join(report_table(report)))
    code, line = summary(report)
    if signum is not None:
        code, line = 128 + signum, f"eval: INTERRUPTED by {report['interrupted']}: " + line
    print_verdict(line, to_stderr=args.json)
    return code


def _run(
    config: EvalConfig, tasks: list[Any], out: Path | None
) -> tuple[list[list[Trajectory]], int | None]:
    """The groups of trajectories, and the signal that cancelled the run (None if none did)."""
    from environments.agents import make_agent
    from environments.core import ShellEnv
    from environments.runner import EpisodeRunner

    reset_clock()
    bus = EventBus()
    sink = None
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / "events.jsonl").unlink(missing_ok=True)
        sink = JsonlSink(out / "events.jsonl")
        bus.subscribe(sink)
    try:
        with Progress("eval", len(tasks) * config.k, "attempts") as progress:
            bus.subscribe(lambda e: progress.advance() if isinstance(e, RewardReady) else None)
            runner = EpisodeRunner(
                lambda: ShellEnv(tasks, sandbox=config.sandbox, strict_grading=config.strict),
                make_agent(config.agent),
                bus,
                max_concurrency=config.concurrency,
            )
            with runner.cancel_on_signals() as received:
                groups = runner.run_groups(tasks, config.k, seed=config.seed)
            return groups, (received[0] if received else None)
    finally:
        if sink is not None:
            sink.close()


def build_report(config: EvalConfig, groups: Sequence[Sequence[Trajectory]]) -> dict:
    """The JSON report: ``mean_reward``; ``num_tasks`` and ``num_infra_failures`` (tasks whose
    every attempt failed that way); ``num_attempts``, ``num_infra_failed_attempts`` and
    ``num_invalid_rewards`` (attempts); per task ``task_id``, ``reward``, ``infra_failure``
    and the attempts."""
    rows = []
    for group in groups:
        scored = [_score(result) for result in group if not result.infra_failure]
        rows.append(
            {
                "task_id": group[0].task_id,
                "reward": sum(scored) / len(scored) if scored else None,
                "infra_failure": not scored,
                "attempts": [_attempt(result) for result in group],
            }
        )
    rewards = [row["reward"] for row in rows if row["reward"] is not None]
    attempts = [attempt for row in rows for attempt in row["attempts"]]
    return {
        "suite": config.suite,
        "agent": config.agent,
        "sandbox": config.sandbox,
        "k": config.k,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
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


def _score(result: Trajectory) -> float:
    """The attempt's reward in the means: a non-finite one scores 0, so it cannot raise them."""
    return result.reward if math.isfinite(result.reward) else 0.0


def _attempt(result: Trajectory) -> dict[str, Any]:
    attempt: dict[str, Any] = {
        "episode_id": result.episode_id,
        "reward": result.reward,
        "infra_failure": result.infra_failure,
        "stop_reason": result.stop_reason,
        "num_turns": len(result.turns),
    }
    if not math.isfinite(result.reward):
        attempt["reward"] = None
        attempt["reward_invalid"] = (
            f"non-finite reward ({result.reward!r}) of an infrastructure failure; not scored"
            if result.infra_failure
            else f"the grader returned a non-finite reward ({result.reward!r}); scored 0"
        )
    if "error" in result.details:
        attempt["error"] = str(result.details["error"])
    return attempt


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


def report_table(report: dict) -> list[str]:
    """Per task: the reward and the first infrastructure error, in at most 80 columns."""
    header = ["task", "reward", "infra failure"]
    rows = []
    for row in report["tasks"]:
        reward = "-" if row["reward"] is None else f"{row['reward']:.3f}"
        errors = [a["error"] for a in row["attempts"] if a["infra_failure"] and "error" in a]
        failure = ("yes: " + errors[0].splitlines()[0]) if errors else "no"
        rows.append([row["task_id"], reward, failure])
    title = f"{report['suite']} · agent {report['agent']} · {report['sandbox']}"
    lines = [fit(title), *plain_table(header, rows, [28, 6, 42])]
    if report["num_infra_failed_attempts"] or report["num_invalid_rewards"]:
        lines.append(
            "infra-failed attempts are excluded from the means; non-finite rewards score 0"
        )
    return lines
