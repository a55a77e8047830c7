"""``thundersync train``: resolve the config, run the mode, end cleanly on every path."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from thundersync.training.config import add_config_flags, load_config_file, resolve_config


def add_train_parser(sub: argparse._SubParsersAction) -> None:
    parser = sub.add_parser(
        "train",
        help="train a policy on an env in sync, async or streaming mode",
        description="Train a policy on an env. Every TrainConfig field is a flag; --config "
        "FILE (JSON or TOML) sets any of them, flags override the file, and the resolved "
        "config is written to OUT/config.json.",
    )
    parser.add_argument("--config", default=None, help="JSON or TOML file of config fields")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out from its last checkpoint "
                             "(its config.json is the base; flags still override)")  # fmt: skip
    add_config_flags(parser)
    parser.set_defaults(func=run_train_command)


def run_train_command(args: argparse.Namespace) -> int:
    """0 when every step ran; 1 when a worker failed; 2 on a bad config; 130 on Ctrl-C."""
    try:
        base = load_config_file(args.config) if args.config else {}
        if args.resume:
            out = Path(args.out or base.get("out") or "runs/train")
            saved = out / "config.json"
            if saved.is_file():
                base = {**json.loads(saved.read_text()), **base}
        config = resolve_config(args, base)
    except (ValueError, TypeError) as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 2
    from thundersync.training.modes import mode_runner
    from thundersync.training.trainer import Trainer, WorkerError

    try:
        with Trainer(config, resume=args.resume) as trainer:
            if trainer.start_step:
                print(f"train: resuming after step {trainer.start_step} from {trainer.model_dir}")
            history = mode_runner(config.mode)(trainer)
    except WorkerError as exc:
        print(f"train: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("train: interrupted; continue with --resume", file=sys.stderr)
        return 130
    last = history[-1] if history else None
    summary = (
        "no steps to run"
        if last is None
        else (f"{len(history)} step(s), last reward {last['reward_mean']}, run folder {config.out}")
    )
    print(f"train: done: {summary}")
    return 0
