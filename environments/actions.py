"""The bash-tool action protocol: one fenced ```bash command per action, plus a submit word.

Like mini-swe-agent, an action is free text holding **exactly one** fenced block::

    I will look at the files first.
    ```bash
    ls -la
    ```

The command runs with ``bash -c`` in the task's sandbox; files persist between actions, shell
state (``cd``, variables) does not. Two ways to finish an episode:

- the block's whole command is the word ``submit``: the episode ends *without* a tool call;
- a command whose output starts with the line ``THUNDERSYNC_SUBMIT`` (e.g. ``echo
  THUNDERSYNC_SUBMIT``, or a task's own ``answer`` script): the command runs, then the episode
  ends.

Anything else (no block, two blocks, an empty block) is unparseable: the env answers with
``format_error_message`` and counts it toward its limit of consecutive format errors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

SUBMIT_WORD = "submit"
SUBMIT_MARKER = "THUNDERSYNC_SUBMIT"

_BLOCK = re.compile(r"```bash[ \t]*\r?\n(.*?)```", re.DOTALL)


class ActionFormatError(ValueError):
    """The action text does not hold exactly one non-empty ```bash block."""


@dataclass(frozen=True, slots=True)
class ShellAction:
    """A parsed action: the command to run, or a submission without a tool call."""

    command: str
    is_submit: bool = False


def parse_action(text: str) -> ShellAction:
    """Parse one action; raises ActionFormatError saying what was wrong."""
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1:
        raise ActionFormatError(f"expected exactly one ```bash block, found {len(blocks)}")
    command = blocks[0].strip()
    if not command:
        raise ActionFormatError("the ```bash block is empty")
    return ShellAction(command=command, is_submit=command == SUBMIT_WORD)


def format_action(command: str) -> str:
    """The canonical action text for ``command`` (what scripted and oracle agents emit)."""
    return f"```bash\n{command}\n```"


def is_submission_output(output: str) -> bool:
    """True when a command's output starts with the submit marker line."""
    return output.lstrip().splitlines()[:1] == [SUBMIT_MARKER]


def strip_submission_marker(output: str) -> str:
    """The output after the submit marker line (what the agent would have seen)."""
    lines = output.lstrip().splitlines(keepends=True)
    return "".join(lines[1:])


def format_error_message(problem: str) -> str:
    """The corrective observation for an unparseable action."""
    return (
        f"Format error: {problem}. Reply with exactly one command in a fenced block:\n"
        f"```bash\n<command>\n```\n"
        f"To finish, reply with:\n```bash\n{SUBMIT_WORD}\n```"
    )
