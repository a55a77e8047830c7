"""``thundersync train``: resolve the config, run the mode, end cleanly on every path."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path
from typing import Any

from thundersync.cli_output import HelpFormatter, Progress
from thundersync.declared import check_values
from thundersync.protocol.strict_json import dumps_refusing
from thundersync.training.checks import check_inputs, with_model_folders
from thundersync.training.config import TrainConfig
from thundersync.training.config_files import (
    add_config_flags,
    load_config_file,
    load_saved_config,
    resolve_config,
)
from thundersync.training.run_folder import clear_run_folder, run_folder_problem


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train",
        help="train a policy on an env in sync, async or streaming mode",
        description="Train a policy on an env. Every TrainConfig field is a flag; --config "
        "FILE (JSON or TOML) sets any of them, flags override the file, and the resolved "
        "config is written to OUT/config.json.",
        epilog="Each step prints one line: 'reward mean' is the mean reward of the step's "
        "scored episodes (infra failures excluded); 'solved' the fraction of them with "
        "reward >= 1, the env's full credit (metrics.jsonl: reward_mean, accuracy; equal when "
        "rewards are 0 or 1); 'wall-clock' the step's time, with engine and learner busy "
        "time inside it, and tools and grading as means per episode (episodes run them "
        "concurrently). Steps count from 1 everywhere: step N is the N-th optimizer step, "
        "checkpoints/step-00000N holds the weights after it.",
    )
    parser.add_argument("--config", default=None, help="JSON or TOML file of config fields")
    parser.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint "
        "(its config.json is the base; flags still override)",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the run in --out: remove what a run wrote there first (refused when "
        "the folder holds anything else); without it or --resume, a folder holding a run "
        "is refused",
    )
    add_config_flags(parser)
    parser.set_defaults(func=run_train_command)


def run_train_command(args: argparse.Namespace) -> int:
    """0 when every step ran; 1 when a worker failed, the backend is unusable or a step would
    make the gradient or the parameters non-finite; 2 on a bad config, an ``--out`` holding
    another run (without ``--resume`` or ``--overwrite``: ``run_folder``) or (``--resume``) a
    damaged or tampered checkpoint, or one holding another step's state; 130 on Ctrl-C."""
    try:
        base = load_config_file(args.config) if args.config else {}
        check_values(TrainConfig, base, f"{args.config}: config field")
        if args.resume:
            out = Path(args.out or base.get("out") or "runs/train")
            saved = out / "config.json"
            if not saved.is_file():
                raise ValueError(
                    f"--resume: {out} holds no run (no config.json); leave out "
                    "--resume to start a new run there"
                )
            base = {**load_saved_config(saved), **base}
        config = with_model_folders(resolve_config(args, base))
        problem = run_folder_problem(
            config.out,
            resume=args.resume,
            overwrite=args.overwrite,
            keep=(config.model, config.teacher),
        )
        if problem:
            raise ValueError(problem)
        check_inputs(config)
        dumps_refusing(config.to_dict(), what="config")  # config.json must be strict JSON
        if args.resume:
            from thundersync.training.checkpoint import check_resumable

            check_resumable(Path(config.out) / "checkpoints")
    except (ValueError, TypeError) as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2
    if args.overwrite and clear_run_folder(config.out):  # every check passed: replace it now
        print(f"train: --overwrite: removed what a run wrote in {config.out}", file=sys.stderr)
    # after the checks: the run's modules import torch and transformers (seconds), which a
    # refused config need not wait for
    from thundersync.protocol.errors import ThunderSyncError
    from thundersync.training.trainer import Trainer
    from thundersync.training.worker_pool import WorkerError
    from thundersync.training.workers import BackendError

    # Ctrl-C stops the run cleanly even where SIGINT was inherited ignored (a job started in
    # the background of a script): Python only raises KeyboardInterrupt if it was not.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for warning in config.warnings():  # also kept in the run's config.json
        print(f"train: warning: {warning}", file=sys.stderr, flush=True)
    try:
        with (
            Progress("train", config.steps, "steps") as progress,
            Trainer(config, resume=args.resume, progress=progress) as trainer,
        ):
            if trainer.start_step:
                progress.say(f"resuming after step {trainer.start_step} from {trainer.model_dir}")
            history = trainer.mode.run(trainer)
    except (WorkerError, BackendError, ThunderSyncError) as exc:
        # ThunderSyncError: a step that would make the parameters (or the gradient)
        # non-finite stops the run; its checkpoints hold only finite parameters.
        print(f"train: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"train: interrupted; {resume_hint(config)}", file=sys.stderr)
        return 130
    last = history[-1] if history else None
    summary = (
        "no steps to run"
        if last is None
        else (
            f"{len(history)} step(s), last reward {last['reward_mean']:.3f}, "
            f"run folder {config.out}"
        )
    )
    print(f"train: done: {summary}")
    return 0


WARMSTART_FLAGS = (
    "env",
    "env_kwargs",
    "num_demos",
    "steps",
    "bias_steps",
    "corrupt_fraction",
    "hidden_size",
    "num_layers",
    "lr",
    "seed",
    "arch",
    "sandbox",
    "device",
)
"""The WarmStartConfig fields that are flags (their help: the fields' docstrings)."""


def add_warmstart_parser(sub: Any) -> None:
    parser = sub.add_parser(
        "warmstart",
        help="build a tiny model and tokenizer for an env and fine-tune it on its oracle's play",
        description="Build a tiny model and tokenizer for an env and fine-tune it on its "
        "oracle's play (demonstrations run in the env's sandbox), so that RL on a CPU has a "
        "policy that can already use the tools. Then, on purpose, bias it: --bias-steps on a "
        "mixture where --corrupt-fraction of the demonstrations answer without the tools, so "
        "it mostly guesses and solves a minority of tasks, leaving RL a decision to learn "
        "(--bias-steps 0: a plain imitation of the oracle). The model is written to a "
        "temporary folder beside --out and renamed to --out at the end: an interrupted run "
        "leaves no --out. Progress goes to stderr (a line every few seconds in a pipe).",
        formatter_class=HelpFormatter,
    )
    from thundersync.declared import add_flags
    from thundersync.training.warmstart import WarmStartConfig

    parser.add_argument("--out", required=True, help="checkpoint folder to write")
    add_flags(parser, WarmStartConfig, WARMSTART_FLAGS)
    parser.add_argument(
        "--threads",
        default=None,
        metavar="N",
        help="torch threads for fine-tuning (it runs alone; default: the "
        f"machine's cores, {os.cpu_count() or 1})",
    )
    parser.set_defaults(func=_run_warmstart)


def resume_hint(config: TrainConfig) -> str:
    """How to continue an interrupted run, and from where: ``--resume`` starts after the
    newest checkpoint, redoing the steps after it."""
    from thundersync.training.checkpoint import list_checkpoints

    found = list_checkpoints(Path(config.out) / "checkpoints")
    if not found:
        return "continue with --resume: it starts from the beginning (no checkpoint yet)"
    return (
        f"continue with --resume: it starts after {found[-1].name} (the steps after it are redone)"
    )


def _run_warmstart(args: Any) -> int:
    import time

    import torch

    from thundersync.cli_output import started as first_line_out
    from thundersync.declared import PositiveInt, parse_flag
    from thundersync.training.checks import device_problem, folder_problem
    from thundersync.training.warmstart import WarmStartConfig, describe, out_problem, warm_start

    try:
        given = {
            name: parse_flag(WarmStartConfig, name, getattr(args, name))
            for name in WARMSTART_FLAGS
            if getattr(args, name) is not None
        }
        config = WarmStartConfig(**given)
        threads = os.cpu_count() or 1
        if args.threads is not None:
            from pydantic import TypeAdapter, ValidationError

            try:
                threads = TypeAdapter(PositiveInt).validate_strings(args.threads)
            except ValidationError:
                raise ValueError(f"--threads: expected an int >= 1, got {args.threads!r}") from None
        from environments.registry import require_env

        require_env(config.env)
        problem = device_problem(config.device)
        if problem:
            raise ValueError(f"--device: {problem}")
        problem = folder_problem(args.out) or out_problem(args.out)
        if problem:
            raise ValueError(f"--out: {problem}")
    except ValueError as exc:
        print(f"warmstart: error: {exc}", file=sys.stderr)
        return 2
    torch.set_num_threads(threads)
    started = time.monotonic()
    print(f"warmstart: building {describe(config)}", flush=True)
    first_line_out()
    with PhaseProgress("demonstrations", config.num_demos) as progress:
        out = warm_start(config, args.out, progress=progress)
    bias = (
        f"biased on purpose (--corrupt-fraction {config.corrupt_fraction:g}, "
        f"--bias-steps {config.bias_steps})"
        if config.bias_steps and config.corrupt_fraction
        else "an imitation of the oracle"
    )
    print(f"warmstart: done in {time.monotonic() - started:.0f} s: {out} ({bias})")
    return 0


class PhaseProgress:
    """The warm start's progress, one ``cli_output.Progress`` per phase (demonstrations,
    fine-tuning, ...): a bar on a terminal, a line every few seconds in a pipe. A phase's
    bar stays up until the next phase starts, so the work between two phases (training the
    tokenizer, building the model) is not silent either. Called as ``progress(phase, done,
    total)`` from any thread."""

    def __init__(self, phase: str, total: int, stream: Any = None) -> None:
        import threading

        self.stream = stream
        self._lock = threading.Lock()
        self._phase, self._bar = phase, self._open(phase, total)

    def _open(self, phase: str, total: int, quiet_since: float | None = None) -> Any:
        from thundersync.cli_output import Progress

        unit = "steps" if "fine-tuning" in phase else "episodes" if "demo" in phase else "built"
        return Progress(
            f"warmstart: {phase}", total, unit, stream=self.stream, quiet_since=quiet_since
        ).__enter__()

    def __call__(self, phase: str, done: int, total: int) -> None:
        with self._lock:
            if phase != self._phase:  # the next phase's lines keep the interval
                self._bar.__exit__(None, None, None)
                quiet_since = self._bar.last_line_at
                self._phase, self._bar = phase, self._open(phase, total, quiet_since)
            if done > self._bar.done:
                self._bar.advance(done - self._bar.done)

    def __enter__(self) -> PhaseProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        with self._lock:
            self._bar.__exit__(None, None, None)
