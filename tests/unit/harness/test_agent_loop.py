"""``benchmarks/agent_loop.py``'s split of the engine's idle time by what it waited on (the
loop, the target; the tools; nothing left to ask), checked against a brute-force reading of the
same timeline, and its timed envs."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def agent_loop():
    spec = importlib.util.spec_from_file_location(
        "agent_loop", ROOT / "benchmarks" / "agent_loop.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("agent_loop", module)
    spec.loader.exec_module(module)
    return module


def test_idle_splits_into_the_loops_the_tools_and_after_the_last_request(agent_loop):
    # Two episodes from t=0 to 4. Batches 0-1 and 2.5-3. Episode a asks once more (batch at
    # 2.5) after a tool 1-2, then waits on the loop 2-2.5. Episode b asks only once (its
    # horizon: the batch at 0): its grading 1-3.5 keeps nobody waiting.
    batches = [(0.0, 1.0), (2.5, 3.0)]
    in_env = [(1.0, 2.0)]  # pending episodes' env calls, cut at their horizons
    split = agent_loop.split_idle(0.0, 4.0, batches, in_env, horizons=[2.5, 0.0])
    assert split.tools == pytest.approx(1.0)  # 1-2: a in its tool, b asks no more
    assert split.loop == pytest.approx(0.5)  # 2-2.5: a out of its env, not yet in a batch
    assert split.done == pytest.approx(1.0)  # 3-4: nobody will ask again


def test_one_episode_out_of_its_env_charges_the_idle_engine_to_the_loop(agent_loop):
    # a in a tool 1-3 while b, back from its own at 1.2, waits until the batch at 3
    split = agent_loop.split_idle(
        0.0, 3.5, [(0.0, 1.0), (3.0, 3.5)], [(1.0, 3.0), (1.0, 1.2)], horizons=[3.0, 3.0]
    )
    assert (split.tools, split.loop, split.done) == pytest.approx((0.2, 1.8, 0.0))


spans = st.lists(
    st.tuples(st.integers(0, 40), st.integers(1, 10)).map(lambda t: (t[0], t[0] + t[1])),
    max_size=6,
)
episode = st.tuples(
    st.lists(st.tuples(st.integers(0, 8), st.integers(1, 8)), max_size=5), st.integers(0, 90)
)
"""One episode: its env calls as (gap before it, its length), one at a time, and its horizon
(when the batch of its last request started)."""


@given(batches=spans, episodes=st.lists(episode, max_size=4))
def test_the_split_agrees_with_a_brute_force_reading(agent_loop, batches, episodes):
    """Brute force: the timeline read at the middle of every half unit."""
    in_env, horizons = [], []
    for calls, horizon in episodes:
        t = 0
        for gap, length in calls:
            if t + gap < horizon:
                in_env.append((t + gap, min(t + gap + length, horizon)))
            t += gap + length
        horizons.append(horizon)
    expected = {"loop": 0.0, "tools": 0.0, "done": 0.0}
    for tick in range(2 * 100):
        t = tick / 2 + 0.25
        if any(a <= t < b for a, b in batches):
            continue
        pending = sum(t < horizon for horizon in horizons)
        inside = sum(a <= t < b for a, b in in_env)
        part = "done" if not pending else "tools" if inside >= pending else "loop"
        expected[part] += 0.5
    split = agent_loop.split_idle(0.0, 100.0, batches, in_env, horizons)
    assert (split.loop, split.tools, split.done) == pytest.approx(
        (expected["loop"], expected["tools"], expected["done"])
    )


def test_timed_envs_records_each_call_and_the_episode_it_belongs_to(agent_loop):
    calls = []

    class Env:
        def reset(self, seed=None, options=None):
            calls.append("reset")
            return "obs", {}

        def step(self, action):
            calls.append("step")
            raise RuntimeError("a crashing sandbox still records its span")

        def close(self):
            calls.append("close")

    in_env, seeds = [], {}
    make = agent_loop.timed_envs(Env, in_env, seeds)
    first, second = make(), make()
    second.reset(seed=7)
    first.reset(seed=3)
    with pytest.raises(RuntimeError):
        first.step("x")
    first.close()
    assert calls == ["reset", "reset", "step", "close"]
    assert seeds == {0: 3, 1: 7}
    assert [env for env, _, _ in in_env] == [0, 1, 1, 0, 0, 0]  # makes, resets, step, close
    assert all(a <= b for _, a, b in in_env)
