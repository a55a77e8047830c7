"""``thundersync eval``: run an agent on every task of a suite and report per-task rewards.

Every task runs ``k`` times through ``EpisodeRunner`` (so the run produces the same events as
training does; ``--out`` keeps them in ``events.jsonl``). A task's reward is the mean over its
attempts that did not hit an infrastructure failure; a task whose every attempt failed that
way has reward None and is left out of the suite's mean (the report says how many were).

SIGINT (Ctrl-C) and SIGTERM cancel the run: every live sandbox is closed at once (killing its
command), the attempts cut short are infrastructure failures, and the partial report (with
``"interrupted": "SIGINT"``) is written before the command exits with 128 + the signal.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import signal
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from thundersync.events import EventBus, JsonlSink, RewardReady, reset_clock
from thundersync.types import Trajectory


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
    Console(stderr=True).print(f"[bold red]error:[/] {message}", highlight=False, soft_wrap=True)
    return 2


def run_eval_command(args: argparse.Namespace) -> int:
    """Run the command; 0 when the run completed (whatever the rewards), 1 when no task was
    scored (every attempt an infrastructure failure), 2 on bad input, 128 + the signal when
    SIGINT or SIGTERM cut it short (the partial report is still written)."""
    if args.agent == "policy":
        return _fail(
            "--agent policy is not yet available: it needs the training issue "
            "(checkpoints and a rollout engine); use --agent oracle or nop"
        )
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
    if args.sandbox == "docker":
        from environments.sandboxes import docker_available

        if not docker_available():
            return _fail(
                "--sandbox docker: no Docker daemon answers (start dockerd, or use --sandbox bwrap)"
            )
    config = EvalConfig(
        args.suite, args.agent, args.sandbox, args.k, args.concurrency,
        strict=args.strict, image_aliases=tuple(args.image_alias),
    )  # fmt: skip
    out = Path(args.out) if args.out else None
    groups, signum = _run(config, tasks, out)
    report = build_report(config, groups)
    if signum is not None:
        report["interrupted"] = signal.Signals(signum).name
    if out is not None:
        (out / "config.json").write_text(json.dumps(dataclasses.asdict(config), indent=2) + "\n")
        (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        _print_report(report)
    if signum is not None:
        message = f"interrupted by {report['interrupted']}: the report is partial"
        Console(stderr=True).print(f"[bold red]eval:[/] {message}", highlight=False)
        return 128 + signum
    return 1 if report["num_infra_failures"] == report["num_tasks"] else 0


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
    columns = (
        TextColumn("eval {task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    try:
        with Progress(*columns, console=Console(stderr=True), transient=True) as progress:
            bar = progress.add_task(config.suite, total=len(tasks) * config.k)
            bus.subscribe(lambda e: progress.advance(bar) if isinstance(e, RewardReady) else None)
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
    """The JSON report: ``mean_reward``, and per task ``task_id``, ``reward``,
    ``infra_failure`` (every attempt failed that way) and the attempts."""
    rows = []
    for group in groups:
        scored = [result.reward for result in group if not result.infra_failure]
        rows.append(
            {
                "task_id": group[0].task_id,
                "reward": sum(scored) / len(scored) if scored else None,
                "infra_failure": not scored,
                "attempts": [_attempt(result) for result in group],
            }
        )
    rewards = [row["reward"] for row in rows if row["reward"] is not None]
    return {
        "suite": config.suite,
        "agent": config.agent,
        "sandbox": config.sandbox,
        "k": config.k,
        "mean_reward": sum(rewards) / len(rewards) if rewards else None,
        "num_tasks": len(rows),
        "num_infra_failures": sum(row["infra_failure"] for row in rows),
        "infra_failures_excluded_from_mean": True,
        "tasks": rows,
    }


def _attempt(result: Trajectory) -> dict[str, Any]:
    attempt: dict[str, Any] = {
        "episode_id": result.episode_id,
        "reward": result.reward,
        "infra_failure": result.infra_failure,
        "stop_reason": result.stop_reason,
        "num_turns": len(result.turns),
    }
    if "error" in result.details:
        attempt["error"] = str(result.details["error"])
    return attempt


def _print_report(report: dict) -> None:
    console = Console()
    table = Table(title=f"{report['suite']} · agent {report['agent']} · {report['sandbox']}")
    table.add_column("task")
    table.add_column("reward", justify="right")
    table.add_column("infra failure")
    for row in report["tasks"]:
        reward = "-" if row["reward"] is None else f"{row['reward']:.3f}"
        errors = [a["error"] for a in row["attempts"] if a["infra_failure"] and "error" in a]
        failure = ("yes: " + errors[0].splitlines()[0][:80]) if errors else "no"
        table.add_row(row["task_id"], reward, failure)
    console.print(table)
    mean = report["mean_reward"]
    scored = report["num_tasks"] - report["num_infra_failures"]
    console.print(
        f"mean reward: {'n/a' if mean is None else f'{mean:.3f}'} over {scored} task(s); "
        f"{report['num_infra_failures']} infrastructure failure(s), excluded from the mean",
        highlight=False,
        soft_wrap=True,
    )
    sys.stdout.flush()
