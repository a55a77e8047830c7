"""Agents: scripted, oracle and nop play, and the bash-tool action protocol they speak."""

from __future__ import annotations

import pytest

from environments.actions import (
    ActionFormatError,
    format_action,
    is_submission_output,
    parse_action,
)
from environments.agents import Message, NopAgent, OracleAgent, ScriptedAgent, make_agent
from tests.unit.environments.shell_fakes import FileTask


def conversation(num_actions: int) -> list[Message]:
    messages = [Message("user", "instruction")]
    for _ in range(num_actions):
        messages += [Message("assistant", "a"), Message("user", "o")]
    return messages


def test_parse_action_takes_exactly_one_bash_block():
    assert parse_action("thinking...\n```bash\nls -la\n```\n").command == "ls -la"
    assert parse_action(format_action("submit")).is_submit
    assert not parse_action(format_action("echo submit")).is_submit
    multi = parse_action("```bash\ncd x\ncat <<EOF\nhi\nEOF\n```")
    assert multi.command == "cd x\ncat <<EOF\nhi\nEOF"
    for bad in ["ls", "```bash\nls\n```\n```bash\npwd\n```", "```bash\n  \n```", "```sh\nls\n```"]:
        with pytest.raises(ActionFormatError):
            parse_action(bad)


def test_submission_output_is_recognised_only_on_the_first_line():
    assert is_submission_output("THUNDERSYNC_SUBMIT\nrest")
    assert not is_submission_output("before\nTHUNDERSYNC_SUBMIT")


def test_scripted_agent_plays_its_actions_then_submits():
    agent = ScriptedAgent(["one", "two"], tokenize=lambda t: (len(t),))
    task = FileTask()
    assert [agent.act(task, conversation(n)).text for n in range(3)] == [
        "one",
        "two",
        format_action("submit"),
    ]
    action = agent.act(task, conversation(0))
    assert action.token_ids == (3,) and action.logprobs == (0.0,)
    assert ScriptedAgent(["x"]).encode_observation("anything") == ()


def test_oracle_runs_the_reference_solution_then_submits():
    task = FileTask(expected="yes")
    agent = OracleAgent()
    assert parse_action(agent.act(task, conversation(0)).text).command == "echo yes > answer.txt"
    assert parse_action(agent.act(task, conversation(1)).text).is_submit


def test_nop_submits_immediately():
    assert parse_action(NopAgent().act(FileTask(), conversation(0)).text).is_submit


def test_make_agent_names_the_known_agents():
    assert isinstance(make_agent("oracle"), OracleAgent)
    with pytest.raises(ValueError, match="unknown agent 'policy'"):
        make_agent("policy")
