"""``thundersync eval``: an agent (oracle, nop, or a checkpoint's policy) on every task of a suite
or on held-out tasks of a registered env, with per-task rewards and pass@k.

Every task runs ``k`` times through ``EpisodeRunner`` (so the run produces the same events as
training does; ``--out`` keeps them in ``events.jsonl``, in full — token ids and log-probs — in
``trajectories.jsonl`` (what ``thundersync export`` reads), each attempt's conversation and
grade in ``attempts.jsonl``). Attempts are named and seeded per task and sample, so the same
checkpoint, tasks and seed give the same episodes here and in ``thundersync compare``. A task's
reward is the mean over its attempts that did not hit an infrastructure failure; a task whose
every attempt failed that way has reward None and is left out of the suite's mean (the report
says how many were, as tasks and as attempts). A non-finite reward from a grader is reported as
null with a reason and scored 0 in the means: a broken grade must never raise a score.

Nothing passes vacuously (docs/design.md §8): the sandbox's prerequisites are checked before
any task runs (exit 2 naming the fix), and a run in which no attempt ran, or every attempt was
an infrastructure failure, exits 1. The summary is the last line; ``--json`` and
``results.json`` are strict JSON. Results are appended to the leaderboard unless
``--no-leaderboard``.

SIGINT (Ctrl-C) and SIGTERM cancel the run: every live sandbox is closed at once (killing its
command), the attempts cut short are infrastructure failures, and the partial report (with
``"interrupted": "SIGINT"``) is written before the command exits with 128 + the signal.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from harness.eval_checks import checkpoint_problem, output_problem, sandbox_problem
from harness.eval_config import EVAL_FLAGS, EvalConfig
from harness.eval_report import build_report, report_table, summary
from thundersync.cli_output import HelpFormatter, Progress, print_verdict, strict_json
from thundersync.declared import (
    parse_flag,
)
from thundersync.protocol.events import EventBus, JsonlSink, RewardReady, reset_clock
from thundersync.protocol.types import Trajectory
from thundersync.training.checks import device_problem, engine_problem
from thundersync.training.config_files import json_object


def add_eval_parser(sub: argparse._SubParsersAction) -> None:
    from environments.sandboxes.engines import DEFAULT_ENGINE, engine_names

    parser = sub.add_parser(
        "eval",
        help="run an agent or a checkpoint on every task of a suite or env",
        description="Run an agent (oracle, nop, or a checkpoint's policy) on every task of a "
        "suite, or on held-out tasks of a registered env. Exit 0: attempts were scored; "
        "1: no attempt ran or every attempt was an infrastructure failure; 2: bad input or "
        "a missing sandbox prerequisite; 128+N: cut short by signal N (partial report).",
        formatter_class=HelpFormatter,
    )
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument(
        "--suite",
        metavar="NAME|PATH",
        help="a registered suite (swebench-mini, tb1-mini, harbor-mini, "
        "toy-sum), a folder of Terminal-Bench/Harbor tasks, or SWE-bench "
        "rows (default: none; --suite or --env is required)",
    )
    source.add_argument(
        "--env",
        metavar="ID",
        help="a registered env id (plugins too): its "
        "held-out tasks (default: none; --suite or --env is required)",
    )
    parser.add_argument("--tasks", default=32, metavar="N", help="held-out tasks drawn from --env")
    parser.add_argument(
        "--env-kwargs",
        type=json_object,
        default={},
        metavar="JSON",
        help="keyword arguments for gymnasium.make(--env, ...)",
    )
    parser.add_argument(
        "--agent",
        choices=["oracle", "nop", "policy"],
        default=None,
        help="oracle runs each task's reference solution; nop submits at once; "
        "policy runs --checkpoint (default: policy with --checkpoint, "
        "else oracle)",
    )
    parser.add_argument(
        "--checkpoint",
        metavar="DIR",
        default=None,
        help="a Hugging Face checkpoint folder with a chat template (default: none: the "
        "oracle or nop agent)",
    )
    parser.add_argument(
        "--sandbox",
        choices=engine_names(),
        default=DEFAULT_ENGINE,
        help="where the agent's commands run",
    )
    parser.add_argument("-k", default=1, metavar="K", help="attempts per task (pass@1..k)")
    parser.add_argument(
        "--concurrency",
        default=None,
        metavar="N",
        help="episodes at once (default: 2, or 64 for a policy, whose engine batches them)",
    )
    parser.add_argument("--seed", default=0, metavar="N", help="seeds resets, draws and sampling")
    parser.add_argument("--max-new-tokens", default=48, metavar="N", help="per policy action")
    parser.add_argument("--temperature", default=1.0, metavar="T", help="policy sampling")
    parser.add_argument(
        "--device",
        default="cpu",
        metavar="DEV",
        help="where the policy's model computes: cpu, cuda or cuda:N",
    )
    parser.add_argument(
        "--engine",
        default=None,
        metavar="{hf,vllm}",
        help="the policy's engine, as train --engine: hf (transformers) or vllm (needs vLLM: "
        "`make test-vllm` builds .venv-vllm) (default: hf)",
    )
    parser.add_argument(
        "--dtype",
        default=None,
        metavar="{float32,float64,bfloat16}",
        help="the policy's parameter dtype (vllm: float32 or bfloat16) (default: float32)",
    )
    parser.add_argument(
        "--image-alias",
        action="append",
        default=[],
        metavar="PUBLIC=LOCAL",
        help="use the local image LOCAL where a task names the public image "
        "PUBLIC (repeatable; also $THUNDERSYNC_IMAGE_ALIASES), e.g. "
        "ubuntu:24.04=thundersync/base:bookworm",
    )
    parser.add_argument(
        "--strict",
        action="store_true",
        help="grade strictly, as training does: a fresh sandbox with only the "
        "agent's work, tampering scored 0 (default: as the benchmark's own "
        "harness, comparable numbers)",
    )
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="folder for config.json, events.jsonl, trajectories.jsonl, attempts.jsonl and "
        "results.json (default: write nothing)",
    )
    parser.add_argument(
        "--db",
        default=None,
        metavar="FILE",
        help="leaderboard file (default: $THUNDERSYNC_LEADERBOARD or runs/leaderboard.sqlite)",
    )
    parser.add_argument(
        "--no-leaderboard", action="store_true", help="do not append the result to the leaderboard"
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the JSON report on stdout; the summary goes to stderr",
    )
    parser.set_defaults(func=run_eval_command)


def _fail(message: str) -> int:
    print(f"eval: error: {message}", file=sys.stderr)
    return 2


def eval_config(args: argparse.Namespace) -> EvalConfig:
    """The run's config from the flags; ValueError naming a bad one."""
    agent = args.agent or ("policy" if args.checkpoint else "oracle")
    if agent == "policy" and not args.checkpoint:
        raise ValueError("--agent policy needs --checkpoint DIR (a model folder)")
    if args.checkpoint and agent != "policy":
        raise ValueError(f"--checkpoint runs the policy agent, not --agent {agent}")
    engine_flags = {"engine": args.engine, "dtype": args.dtype}
    for name, value in engine_flags.items():
        if value is not None and agent != "policy":
            raise ValueError(
                f"{EVAL_FLAGS[name]} sets the policy's engine; --agent {agent} runs none"
            )
    settings = {
        name: parse_flag(EvalConfig, name, value, EVAL_FLAGS[name])
        for name, value in engine_flags.items()
        if value is not None
    }
    if args.checkpoint:
        from thundersync.models import model_folder  # imports torch: only for a checkpoint

        args.checkpoint = model_folder(args.checkpoint, option="--checkpoint")
        problem = checkpoint_problem(args.checkpoint)
        if problem:
            raise ValueError(f"--checkpoint {args.checkpoint}: {problem}")
    problem = device_problem(args.device)
    if problem:
        raise ValueError(f"--device: {problem}")
    # the numeric flags as EvalConfig declares them (the types and ranges training's share)
    flags = {
        "k": "k",
        "concurrency": "concurrency",
        "seed": "seed",
        "num_tasks": "tasks",
        "max_new_tokens": "max_new_tokens",
        "temperature": "temperature",
    }
    given = {
        name: parse_flag(EvalConfig, name, getattr(args, attr), EVAL_FLAGS[name])
        for name, attr in flags.items()
        if getattr(args, attr) is not None
    }
    concurrency = given.pop("concurrency", None)
    if concurrency is None:
        concurrency = 64 if agent == "policy" else 2
    config = EvalConfig(
        args.suite or args.env,
        agent,
        args.sandbox,
        concurrency=concurrency,
        strict=args.strict,
        image_aliases=tuple(args.image_alias),
        checkpoint=args.checkpoint,
        env=args.env,
        env_kwargs=dict(args.env_kwargs),
        device=args.device,
        **settings,
        **given,
    )
    problem = engine_problem(config.engine)  # after the rules of its flags, as train's order
    if problem:
        raise ValueError(f"--engine: {problem}")
    return config


def run_eval_command(args: argparse.Namespace) -> int:
    """Run the command: 0 when attempts were scored (whatever the rewards), 1 when no attempt
    ran or every attempt was an infrastructure failure, 2 on bad input or prerequisites. The
    ``--image-alias`` mappings hold for this command only."""
    from environments.sandboxes.image_build import image_aliases_set, parse_image_aliases

    try:
        aliases = parse_image_aliases(args.image_alias, "--image-alias")
    except ValueError as exc:
        return _fail(str(exc))
    with image_aliases_set(aliases):
        return _run_eval_command(args)


def _run_eval_command(args: argparse.Namespace) -> int:
    from environments.suites import UnknownSuiteError
    from environments.tasks import TaskFormatError

    try:
        config = eval_config(args)
        artifacts = Path(args.out) / "artifacts" if args.out else None
        make_env, tasks, split, note = task_source(config, artifacts_dir=artifacts)
    except (ValueError, UnknownSuiteError, TaskFormatError) as exc:
        return _fail(str(exc))
    if note:
        print(f"eval: {note}", file=sys.stderr, flush=True)
    if not tasks:
        return _fail(f"suite {config.suite!r} has no tasks")
    problem = output_problem(args.out, args.db, leaderboard=not args.no_leaderboard)
    if problem is None and _needs_sandbox(make_env):
        problem = sandbox_problem(config.sandbox)
    if problem is not None:
        return _fail(problem)
    out = Path(args.out) if args.out else None
    groups, signum = _run(config, make_env, tasks, out)
    report = build_report(config, groups)
    if split is not None:
        report["split"] = split
        report["split_note"] = note
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
        if note:
            print(f"note: {note}")
    code, line = summary(report)
    if signum is not None:
        code, line = 128 + signum, f"eval: INTERRUPTED by {report['interrupted']}: " + line
    elif code == 0 and not args.no_leaderboard:
        record(report, config, [t.task_id for t in tasks], args.db)
    print_verdict(line, to_stderr=args.json)
    return code


def _needs_sandbox(make_env: Callable[[], Any]) -> bool:
    """Whether the env's episodes run in the ``--sandbox`` engine (an env that is no
    ``ShellEnv`` is assumed to); ToySum with ``tools="python"`` runs none."""
    env = make_env()
    try:
        return getattr(env.unwrapped, "sandbox_kind", "") is not None
    finally:
        env.close()


def task_source(
    config: EvalConfig, *, artifacts_dir: Path | None = None
) -> tuple[Callable[[], Any], list[Any], str | None, str | None]:
    """The env factory, the tasks, their split and a note: a suite's tasks (no split), or
    ``num_tasks`` tasks of a registered env's held-out split (a plugin's envs included) drawn
    without making an env. An env without a held-out split is evaluated on its training tasks
    and the note says so; so it does when the split holds fewer tasks than asked. A suite's
    episodes keep the files their tasks declare (Harbor's ``artifacts``) in ``artifacts_dir``."""
    if config.env is None:
        from environments.core import ShellEnv
        from environments.suites import resolve_suite

        tasks = list(resolve_suite(config.suite))
        return (
            lambda: ShellEnv(
                tasks,
                sandbox=config.sandbox,
                strict_grading=config.strict,
                artifacts_dir=artifacts_dir,
            ),
            tasks,
            None,
            None,
        )
    import gymnasium

    from environments.registry import require_env
    from environments.tasks import TaskProtocolError
    from harness.policy_eval import eval_tasks

    env_id = config.env
    require_env(env_id)
    kwargs = {"sandbox": config.sandbox, "strict_grading": config.strict, **config.env_kwargs}

    def make_env() -> Any:
        return gymnasium.make(env_id, **kwargs)

    try:
        selection = eval_tasks(config.env, kwargs, config.num_tasks, seed=config.seed)
        make_env().close()  # the env's own keywords checked before any attempt
    except TaskProtocolError as exc:
        raise ValueError(f"--env {config.env}: {exc}") from exc
    except TypeError as exc:
        raise ValueError(
            f"--env {config.env}: cannot make it with sandbox= and strict_grading= ({exc})"
        ) from exc
    return make_env, list(selection.tasks), selection.split, selection.note


def _run(
    config: EvalConfig, make_env: Callable[[], Any], tasks: list[Any], out: Path | None
) -> tuple[list[list[Trajectory]], int | None]:
    """The groups of trajectories, and the signal that cancelled the run (None if none did)."""
    from environments.runner import EpisodeRunner
    from harness.policy_eval import Transcripts, run_attempts

    reset_clock()
    bus = EventBus()
    sinks: list[JsonlSink] = []
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        for name, lossless in (("events.jsonl", False), ("trajectories.jsonl", True)):
            (out / name).unlink(missing_ok=True)  # token ids in full: the ATIF export's source
            sinks.append(JsonlSink(out / name, lossless=lossless))
            bus.subscribe(sinks[-1])
    try:
        with (
            _agent(config) as (agent, batcher),
            Progress("eval", len(tasks) * config.k, "attempts") as progress,
        ):
            bus.subscribe(lambda e: progress.advance() if isinstance(e, RewardReady) else None)
            transcripts = Transcripts(agent)
            runner = EpisodeRunner(make_env, transcripts, bus, max_concurrency=config.concurrency)
            with runner.cancel_on_signals() as received:
                groups = run_attempts(
                    runner,
                    tasks,
                    config.k,
                    concurrency=config.concurrency,
                    batcher=batcher,
                )
            if out is not None:
                transcripts.write(out / "attempts.jsonl", groups)
            return groups, (received[0] if received else None)
    finally:
        for sink in sinks:
            sink.close()


@contextlib.contextmanager
def _agent(config: EvalConfig) -> Any:
    """The agent, and the batcher of its engine (None for agents without one)."""
    if config.agent != "policy":
        from environments.agents import make_agent

        yield make_agent(config.agent), None
        return
    from harness.policy_eval import PolicyEvaluator

    if config.checkpoint is None:  # eval_config refuses it first
        raise ValueError("--agent policy needs --checkpoint DIR (a model folder)")
    with PolicyEvaluator(
        config.checkpoint,
        seed=config.seed,
        concurrency=config.concurrency,
        max_new_tokens=config.max_new_tokens,
        temperature=config.temperature,
        device=config.device,
        engine=config.engine,
        dtype=config.dtype,
    ) as evaluator:
        yield evaluator.agent, evaluator.batcher


def record(report: dict[str, Any], config: EvalConfig, task_ids: list[str], db: str | None) -> None:
    """Append the result to the leaderboard."""
    from leaderboard.store import Entry, Store, suite_version

    keys = ("mean_reward", "k", "num_tasks", "num_attempts", "num_infra_failed_attempts", "strict")
    metrics = {key: report[key] for key in keys}
    metrics.update({f"pass@{k}": v for k, v in report["pass_at_k"].items()})
    subject = Path(config.checkpoint).name if config.checkpoint else config.agent
    entry = Entry(
        kind="eval",
        suite=config.suite,
        suite_version=suite_version(task_ids),
        subject=subject,
        metrics=metrics,
        config=dataclasses.asdict(config),
        checkpoint=config.checkpoint,
    )
    with Store(db) as store:
        entry_id = store.append(entry)
    print(f"eval: leaderboard row #{entry_id} in {store.path}", file=sys.stderr)
