"""Command line (docs/design.md §8): ``envs`` and ``verify`` here, every other command from the
entry-point group ``thundersync.commands``, so the library never imports the packages above it."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import re
import signal
import sys
import threading
from collections.abc import Iterable, Sequence
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import Any, NoReturn

from thundersync.cli_output import HelpFormatter, Startup


def _cmd_envs(args: argparse.Namespace) -> int:
    from environments.registry import list_envs

    envs = list_envs()
    if args.json:
        print(json.dumps([{"id": e.id, "entry_point": e.entry_point} for e in envs], indent=2))
        return 0
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(title="registered environments")
    table.add_column("id")
    table.add_column("entry point")
    for env in envs:  # plugins name their envs: Text, so ``a[/b]`` is not read as markup
        table.add_row(Text(env.id), Text(env.entry_point))
    Console().print(table)
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    from thundersync.verify import run_verify_command

    return run_verify_command(args)


class Parser(argparse.ArgumentParser):
    """argparse's parser, with the closest flag or command suggested for one it does not know
    (``--stpes`` -> ``--steps``): Python 3.14 does this itself, 3.11 does not. Subcommand
    parsers are of this class too (``add_subparsers`` makes them of their parent's)."""

    def parse_args(self, args: Iterable[str] | None = None, namespace: Any = None) -> Any:
        parsed, extras = self.parse_known_args(args, namespace)
        if extras:
            command = self._subcommands().get(getattr(parsed, "command", None) or "")
            owner = command if command is not None else self
            message = f"unrecognized arguments: {' '.join(extras)}"
            owner.error(message + _guess(extras, _flags(owner)))
        return parsed

    def error(self, message: str) -> NoReturn:
        choice = re.match(r"argument command: invalid choice: '([^']*)'", message)
        if choice:
            near = difflib.get_close_matches(choice.group(1), list(self._subcommands()), n=1)
            message += f"; did you mean {near[0]!r}?" if near else ""
        super().error(message)

    def _subcommands(self) -> dict[str, argparse.ArgumentParser]:
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                return dict(action.choices)
        return {}


def _flags(parser: argparse.ArgumentParser) -> list[str]:
    return [flag for a in parser._actions for flag in a.option_strings if flag.startswith("--")]


def _guess(extras: Sequence[str], flags: list[str]) -> str:
    """``; did you mean --steps?`` for the first unknown flag that resembles one, else ""."""
    for word in extras:
        if word.startswith("--"):
            near = difflib.get_close_matches(word.split("=", 1)[0], flags, n=1)
            if near:
                return f"; did you mean {near[0]}?"
    return ""


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="thundersync",
        description="Exact gradient streaming for agentic RL.",
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    _add_envs(sub)
    _add_verify(sub)
    _add_others(sub)
    return parser


def _version() -> str:
    """The installed distribution's version (pyproject.toml's, once installed)."""

    try:
        return version("thundersync")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


COMMANDS = "thundersync.commands"
"""The entry-point group of subcommands: each entry names a function that adds its parser
(``add_eval_parser(sub)``). The library's own commands live in the packages above it
(``harness``, ``leaderboard``) and in ``thundersync``'s optional parts; this module names none
of them, so the library imports no package that uses it (docs/design.md §1). An installed
package can add a command the same way."""

ORDER = ("eval", "train", "warmstart", "compare", "leaderboard", "simulate", "timeline")
"""Where the built-in commands stand in ``--help`` (others follow, by name)."""


def _add_others(sub: argparse._SubParsersAction) -> None:
    """Subcommands registered in the entry-point group ``thundersync.commands`` (pyproject.toml);
    each module is light to import, so ``--help`` stays quick."""

    found = {entry.name: entry for entry in entry_points(group=COMMANDS)}
    if not found:
        raise SystemExit(
            f"thundersync: no subcommand is registered (entry-point group {COMMANDS}): "
            "the project is not installed; run `pip install -e .` in its folder"
        )
    rank = {name: i for i, name in enumerate(ORDER)}
    for name in sorted(found, key=lambda n: (rank.get(n, len(ORDER)), n)):
        found[name].load()(sub)


def _add_envs(sub: argparse._SubParsersAction) -> None:
    envs = sub.add_parser(
        "envs",
        help="list registered environments",
        formatter_class=HelpFormatter,
        description="List the registered environments: the built-in ones and every installed "
        "package's (entry point group thundersync.envs; a plugin appears once installed, "
        "e.g. pip install -e .).",
    )
    envs.add_argument("--json", action="store_true", help="print JSON")
    envs.set_defaults(func=_cmd_envs)


def _add_verify(sub: argparse._SubParsersAction) -> None:
    verify = sub.add_parser(
        "verify",
        help="certify streaming == sync on random batches",
        description="Certify that streaming takes the same step as sync on random batches. "
        "Exit 0: every check within its bound; 1: a violation; 2: bad input.",
        formatter_class=HelpFormatter,
    )
    verify.add_argument(
        "--algo", choices=["grpo", "opd", "all"], default="all", help="objective variants to check"
    )
    verify.add_argument(
        "--dtype",
        choices=["float64", "float32"],
        default="float64",
        help="dtype the model is loaded in (it decides the bound)",
    )
    verify.add_argument(
        "--trials", type=int, default=4, metavar="N", help="random batches per variant (>= 1)"
    )
    verify.add_argument(
        "--deterministic",
        action="store_true",
        help="also require deterministic sync and streaming to be bitwise equal",
    )
    verify.add_argument(
        "--lora",
        action="store_true",
        help="certify LoRA adapters (every linear layer, rank 4) trained on a frozen base, "
        "whose adapters-disabled self is the KL reference (needs the lora extra)",
    )
    verify.add_argument(
        "--model",
        default=None,
        metavar="DIR",
        help="checkpoint folder (default: two tiny models, GPT-2 and Qwen3 style, built locally)",
    )
    verify.add_argument(
        "--seed", type=int, default=0, metavar="N", help="seed of the random batches"
    )
    verify.add_argument(
        "--trajectories",
        default=None,
        metavar="DIR",
        help="certify on these ATIF trajectories (e.g. from thundersync export; one batch per "
        "policy version, --trials does not apply) instead of random batches; they need token "
        "ids and log-probs, and --model the checkpoint whose vocabulary they use "
        "(default: random batches)",
    )
    verify.add_argument(
        "--json",
        action="store_true",
        help="print a JSON report on stdout; the verdict goes to stderr",
    )
    verify.set_defaults(func=_cmd_verify)


def exit_on_sigterm() -> None:
    """Turn SIGTERM into SystemExit(143), so that ``finally`` blocks and context managers run
    and every sandbox of a terminated run is removed on the way out."""

    def terminate(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, terminate)


def printable_streams() -> None:
    """Standard output and error print what they cannot encode escaped: text of the agent's
    (a file name of invalid UTF-8 in a tamper reason) holds lone surrogates, and under a UTF-8
    locale ``print`` raised on them once ``eval`` had written its results, losing its table,
    its leaderboard row and its exit status (red team, 2026-12-07)."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="backslashreplace")


def main(argv: Sequence[str] | None = None) -> int:
    if argv is None:  # this process's own streams
        printable_streams()
    words = list(sys.argv[1:] if argv is None else argv)
    command = next((w for w in words if not w.startswith("-")), "thundersync")
    # A process's own command line (argv None) says, through a pipe, that it is starting;
    # a caller in the same process (argv given) has started long ago.
    with Startup(command) if argv is None else contextlib.nullcontext():
        args = build_parser().parse_args(words)
        exit_on_sigterm()
        try:
            return int(args.func(args) or 0)
        except KeyboardInterrupt:  # Ctrl-C outside a run that handles it: no traceback
            print("thundersync: interrupted", file=sys.stderr)
            return 128 + signal.SIGINT
        except BrokenPipeError:  # `| head` closed the pipe: stop quietly, as a shell tool does
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error
            return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
