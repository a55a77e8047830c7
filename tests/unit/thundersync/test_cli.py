"""The command line's parser: every option says its default, and no option is inert."""

from __future__ import annotations

import argparse

import pytest

from thundersync.cli import build_parser, main


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = build_parser()
    (action,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


@pytest.mark.parametrize("name", ["envs", "verify", "eval", "export"])
def test_every_option_shows_its_default_or_is_required(name):
    sub = subcommands()[name]
    formatter = sub._get_formatter()
    for action in sub._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        text = formatter._expand_help(action) if action.help else ""
        assert action.required or "(default: " in text, (
            f"thundersync {name} {'/'.join(action.option_strings)}: help {text!r} hides its default"
        )


def test_help_names_the_defaults_users_rely_on(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["verify", "--help"])
    assert exit_info.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "random batches per variant (>= 1) (default: 4)" in text
    assert "(default: two tiny models" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--agent", "policy"], "--agent policy needs --checkpoint"),
        (["--checkpoint", "some/dir"], "some/dir: no such folder"),
        (["--checkpoint", "some/dir", "--agent", "nop"], "runs the policy agent, not --agent nop"),
    ],
    ids=["policy-without-checkpoint", "checkpoint-not-a-model", "checkpoint-with-nop"],
)
def test_eval_refuses_a_policy_it_cannot_run(argv, message, capsys):
    assert main(["eval", "--suite", "toy-sum", *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-k", "0"], "-k: input should be greater than or equal to 1"),
        (["-k", "1.5"], "-k: input should be a valid integer"),
        (["--tasks", "0"], "--tasks: input should be greater than or equal to 1"),
        (["--concurrency", "0"], "--concurrency: input should be greater than or equal to 1"),
        (["--seed", "-1"], "--seed: input should be greater than or equal to 0"),
        (["--max-new-tokens", "0"], "--max-new-tokens: input should be greater than or equal to 1"),
        (["--temperature", "nan"], "--temperature: input should be a finite number"),
        (["--temperature", "-1"], "--temperature: input should be greater than or equal to 0"),
    ],
)
def test_eval_numbers_are_checked_as_training_checks_them(argv, message, capsys):
    assert main(["eval", "--suite", "toy-sum", "--agent", "nop", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"eval: error: {message}, got {argv[1]!r}"]


def test_version_names_the_installed_release(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out.strip() == f"thundersync {version('thundersync')}"


def test_every_subcommand_describes_itself_in_its_help():
    import argparse

    from thundersync.cli import build_parser

    (sub,) = [a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    missing = [name for name, parser in sub.choices.items() if not parser.description]
    assert missing == [] and {"warmstart", "leaderboard", "simulate", "timeline"} <= set(
        sub.choices
    )


def test_python_dash_m_thundersync_runs_the_command_line():
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "thundersync", "--version"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0 and done.stdout.startswith("thundersync "), done.stderr


def test_text_of_the_agents_that_utf_8_cannot_encode_prints_escaped():
    """A tamper reason naming a file of invalid UTF-8 holds a lone surrogate: under a UTF-8
    locale ``print`` raised on it after ``eval`` wrote its results, and the command lost its
    table, leaderboard row and exit status (red team, 2026-12-07). A command printing one
    prints it escaped and exits 0."""
    import os
    import subprocess
    import sys

    code = (
        "import argparse, sys\n"
        "from thundersync import cli\n"
        "def parser():\n"
        "    p = argparse.ArgumentParser()\n"
        "    p.set_defaults(func=lambda args: print('reason: /app/\\udcff/conftest.py'))\n"
        "    return p\n"
        "cli.build_parser = parser\n"
        "sys.argv = ['thundersync']\n"
        "sys.exit(cli.main())\n"
    )
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0, done.stderr
    assert "reason: /app/\\udcff/conftest.py" in done.stdout


def test_a_reader_that_closed_the_pipe_ends_the_command_quietly():
    """``thundersync simulate … | head`` closing the pipe early: exit 141 as a shell tool
    does, no traceback."""
    import os
    import subprocess
    import sys

    read, write = os.pipe()
    os.close(read)  # every write to the command's stdout fails with EPIPE
    try:
        done = subprocess.run(
            [sys.executable, "-m", "thundersync", "simulate", "--workload", "balanced"],
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=120,
        )
    finally:
        os.close(write)
    assert done.returncode == 141 and "Traceback" not in done.stderr, done.stderr


def test_envs_shows_names_that_look_like_markup_literally(monkeypatch, capsys):
    """A plugin names its envs: ``a[/b]`` must not crash the table nor ``[reverse]`` restyle it."""
    from environments.registry import RegisteredEnv

    listed = [RegisteredEnv("thundersync/a[/b]-v0", "plugin:[reverse]Env[/reverse]")]
    monkeypatch.setattr("environments.registry.list_envs", lambda: listed)
    assert main(["envs"]) == 0
    out = capsys.readouterr().out
    assert "thundersync/a[/b]-v0" in out and "plugin:[reverse]Env[/reverse]" in out, out


@pytest.mark.parametrize(
    "argv, suggestion",
    [
        (["train", "--stpes", "3"], "did you mean --steps?"),
        (["train", "--stpes=3"], "did you mean --steps?"),
        (["eval", "--suite", "toy-sum", "--tsks", "3"], "did you mean --tasks?"),
        (["trian"], "did you mean 'train'?"),
    ],
)
def test_a_misspelt_flag_or_command_gets_the_closest_one(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as exited:
        main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert exited.value.code == 2
    assert err[-1].startswith("thundersync") and err[-1].endswith(suggestion), err


def test_a_flag_nothing_resembles_gets_no_guess(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--zzzzzz", "1"])
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].endswith("unrecognized arguments: --zzzzzz 1"), err


def _hello_parser(sub: argparse._SubParsersAction) -> None:
    """A command an installed package adds (the entry point below names it)."""
    hello = sub.add_parser("hello", help="say hello", description="Say hello.")
    hello.set_defaults(func=lambda args: print("hello from a plugin") or 0)


def test_a_command_registered_as_an_entry_point_runs_beside_the_built_in_ones(monkeypatch, capsys):
    from importlib.metadata import EntryPoint, entry_points

    import thundersync.cli as cli

    plugin = EntryPoint("hello", f"{__name__}:_hello_parser", cli.COMMANDS)
    installed = list(entry_points(group=cli.COMMANDS))
    assert {"eval", "train", "compare", "leaderboard", "serve"} <= {e.name for e in installed}
    monkeypatch.setattr(cli, "entry_points", lambda group: [*installed, plugin])
    assert main(["hello"]) == 0
    assert capsys.readouterr().out == "hello from a plugin\n"
    names = list(subcommands())
    assert names[:9] == [
        "envs",
        "verify",
        "eval",
        "train",
        "warmstart",
        "compare",
        "leaderboard",
        "simulate",
        "timeline",
    ]
    assert "hello" in names


def test_without_the_installed_commands_the_command_line_says_how_to_install(monkeypatch):
    monkeypatch.setattr("thundersync.cli.entry_points", lambda group: [])
    with pytest.raises(SystemExit, match="pip install -e"):
        build_parser()
