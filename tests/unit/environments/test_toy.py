"""Toy envs: real tools in the sandbox, oracle solves, determinism, latency knob."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

from environments.actions import format_action
from environments.toy import (
    LatencyModel,
    ToyChainEnv,
    ToySumEnv,
    draw_chain_task,
    draw_sum_task,
    toy_sum_suite,
)
from tests.unit.environments.shell_fakes import SandboxMaker


def play(env, commands):
    result = None
    for command in commands:
        result = env.step(format_action(command))
        if result[2] or result[3]:
            break
    return result


@pytest.mark.parametrize("env_cls", [ToySumEnv, ToyChainEnv])
def test_oracle_solution_scores_one_through_the_real_tools(env_cls):
    env = env_cls(sandbox=SandboxMaker())
    for seed in range(3):
        env.reset(seed=seed)
        _, reward, terminated, _, info = play(env, env.task.reference_solution())
        assert terminated and reward == 1.0, info
    env.close()


def test_lookup_and_calc_run_in_the_sandbox():
    env = ToySumEnv(sandbox=SandboxMaker())
    env.reset(seed=3)
    key, value = env.task.table[0]
    assert env.step(format_action(f"lookup {key}"))[0] == f"{value}\n"
    assert env.step(format_action("calc 4+5"))[0] == "9\n"
    obs, *_ = env.step(format_action("lookup nosuchkey"))
    assert "unknown key nosuchkey" in obs and "[exit code 1]" in obs
    env.close()


def test_a_wrong_answer_scores_zero_and_skipping_answer_scores_zero():
    env = ToySumEnv(sandbox=SandboxMaker())
    env.reset(seed=4)
    wrong = int(env.task.answer) + 1
    assert play(env, [f"answer {wrong}"])[1] == 0.0
    env.reset(seed=4)
    assert play(env, ["submit"])[1] == 0.0
    env.close()


def test_tasks_are_redrawn_every_episode_and_deterministic_given_the_seed():
    a = draw_sum_task(np.random.default_rng(1))
    assert a == draw_sum_task(np.random.default_rng(1))
    assert a.table != draw_sum_task(np.random.default_rng(2)).table
    env = ToySumEnv(sandbox=SandboxMaker())
    first, _ = env.reset(seed=9)
    first_table = env.task.table
    env.reset()
    second_table = env.task.table
    again, _ = env.reset(seed=9)
    assert first == again and env.task.table == first_table
    assert second_table != first_table
    env.close()


def test_chain_length_varies():
    hops = {len(draw_chain_task(np.random.default_rng(s)).solution) - 1 for s in range(30)}
    assert hops == {1, 2, 3}


def test_latency_model_fixed_and_lognormal():
    rng = np.random.default_rng(0)
    assert LatencyModel(0.5).draw(rng) == 0.5
    assert LatencyModel().draw(rng) == 0.0
    draws = [LatencyModel(0.1, sigma=1.0, max_s=2.0).draw(rng) for _ in range(2000)]
    assert 0.08 < float(np.median(draws)) < 0.12 and max(draws) <= 2.0 and len(set(draws)) > 100


def test_tool_latency_adds_to_the_tool_duration():
    env = ToySumEnv(sandbox=SandboxMaker(), tool_latency_s=0.2)
    env.reset(seed=1)
    assert env.step(format_action("calc 1+1"))[4]["tool"]["duration_s"] >= 0.2
    env.close()


def test_grade_latency_is_drawn_per_episode_from_the_seed():
    env = ToySumEnv(sandbox=SandboxMaker(), grade_latency_s=0.01, grade_latency_sigma=1.0)
    delays = []
    for seed in (1, 1, 2):
        env.reset(seed=seed)
        delays.append(env.task.grade_delay_s)
    assert delays[0] == delays[1] != delays[2] and delays[0] > 0
    env.close()


def test_toy_sum_suite_is_fixed():
    suite = toy_sum_suite()
    assert len(suite) == 8 and [t.task_id for t in suite] == [t.task_id for t in toy_sum_suite()]
    assert len({t.task_id for t in suite}) == 8


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing")
def test_in_process_tools_answer_as_the_sandbox_scripts_do():
    """tools='python' is the same env without processes: the same observations, exit codes
    and rewards for the tools' commands, bad arguments included."""
    from environments.actions import format_action
    from environments.toy import ToySumEnv

    commands = [
        "lookup {key}",
        "lookup nokey",
        "lookup ../x",
        "calc 3+4",
        "calc 12-5*2",
        "calc 1/2",
        "calc",
        "answer {total}",
    ]
    outcomes = {}
    for tools in ("sandbox", "python"):
        env = ToySumEnv(tools=tools)
        env.reset(seed=3)
        task = env.unwrapped.task
        key, total = task.table[0][0], task.answer
        steps = []
        for command in commands:
            obs, reward, terminated, truncated, info = env.step(
                format_action(command.format(key=key, total=total))
            )
            steps.append((obs, reward, terminated, info["tool"]["exit_code"]))
        outcomes[tools] = steps
        env.close()
    assert outcomes["python"] == outcomes["sandbox"]
    assert outcomes["python"][-1][1:] == (1.0, True, 0)
    env = ToySumEnv(tools="python")
    env.reset(seed=3)
    obs, *_, info = env.step(format_action("ls /"))
    assert info["tool"]["exit_code"] == 127 and "command not found" in obs
    env.close()


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tool_latency_s": 1e308}, "tool_latency_s: expected a number in [0, 60]"),
        ({"tool_latency_s": float("nan")}, "tool_latency_s"),
        ({"grade_latency_s": -1.0}, "grade_latency_s"),
        ({"tool_latency_sigma": float("inf")}, "tool_latency_sigma"),
        ({"grade_latency_sigma": "1"}, "grade_latency_sigma"),
        ({"max_episode_s": 0}, "max_episode_s"),
        ({"max_format_errors": -1}, "max_format_errors"),
        ({"num_keys": 1000}, "num_keys: expected an integer in [2, 12]"),
        ({"max_value": True}, "max_value"),
    ],
)
def test_out_of_range_knobs_are_refused_when_the_env_is_made(kwargs, message):
    """A latency of 1e308 would make every tool call wait its cap, NaN would crash a worker's
    sleep mid-run: the env refuses them (and other knobs out of range) when it is made."""
    with pytest.raises(ValueError) as caught:
        ToySumEnv(tools="python", **kwargs)
    assert message in str(caught.value)
    with pytest.raises(ValueError):
        LatencyModel(median_s=float("nan"))
