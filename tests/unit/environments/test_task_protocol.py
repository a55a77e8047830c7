"""The versioned Task protocol and task sources: a package written against protocol 1 still
scores (through its entry point), one that matches no version is refused when its env is
made; task sources draw by split without making an env, and held-out never meets training."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest

from environments import load_plugins
from environments.actions import format_action
from environments.core import ShellEnv
from environments.registry import task_source
from environments.tasks import (
    HELDOUT,
    PROTOCOL_VERSION,
    TRAIN,
    FixedTasks,
    GeneratedTasks,
    TaskProtocolError,
    TaskV1Adapter,
    as_current,
    select_tasks,
)
from environments.toy import ToySumEnv, draw_sum_task
from tests.unit.environments.shell_fakes import LocalSandbox

ROOT = Path(__file__).resolve().parents[3]
V1_PLUGIN = ROOT / "tests" / "fixtures" / "plugin_env_v1"
DEMO_PLUGIN = ROOT / "tests" / "fixtures" / "plugin_env"


@pytest.fixture
def v1_plugin(monkeypatch):
    monkeypatch.syspath_prepend(str(V1_PLUGIN))
    load_plugins(reload=True)
    yield


def _play(env_id: str, commands: list[str]) -> tuple[float, dict]:
    sandboxes: list[LocalSandbox] = []

    def make(spec):
        sandboxes.append(LocalSandbox(spec))
        return sandboxes[-1]

    env = gym.make(env_id, sandbox=make)
    try:
        _, info = env.reset(seed=0)
        assert not info["infra_failure"], info
        for command in commands:
            env.step(format_action(command))
        _, reward, terminated, _, info = env.step(format_action("submit"))
    finally:
        env.close()
    assert terminated
    return reward, info


@pytest.mark.parametrize("env_id", ["oldlab/CountLines-v0", "oldlab/CountLinesFresh-v0"])
def test_a_protocol_1_plugin_scores_through_its_entry_point_as_before(v1_plugin, env_id):
    """Before the adapter every attempt was an infrastructure failure (TypeError:
    sandbox_spec() takes 1 positional argument but 2 were given)."""
    reward, info = _play(env_id, ["wc -l < data.txt > answer.txt"])
    assert reward == 1.0 and not info["infra_failure"], info
    reward, info = _play(env_id, [])
    assert reward == 0.0 and not info["infra_failure"], info


def test_a_protocol_1_plugin_draws_adapted_tasks_from_its_source(v1_plugin):
    source = task_source("oldlab/CountLines-v0")
    task = source.draw(np.random.default_rng(0), TRAIN)
    assert isinstance(task, TaskV1Adapter) and task.task_id == "count-lines"
    assert source.splits() == (TRAIN,)


def test_a_plugin_matching_no_protocol_is_refused_when_its_env_is_made(v1_plugin):
    with pytest.raises(TaskProtocolError) as caught:
        gym.make("oldlab/Broken-v0")
    message = str(caught.value)
    assert "\n" not in message
    assert message == (
        "task 'broken' (oldlab.envs.Broken): grade(self) does not match Task "
        "protocol 1: expected grade(self, sandbox) (the version its sandbox_spec "
        "follows)"
    )
    with pytest.raises(TaskProtocolError, match="grade"):
        task_source("oldlab/Broken-v0")


@dataclass(frozen=True)
class _Declared:
    task_id: str = "declared"
    instruction: str = "x"
    max_turns: int = 1
    timeout_s: float = 1.0
    protocol_version: int = 3

    def sandbox_spec(self, kind): ...

    def setup(self, sandbox): ...

    def grade(self, sandbox, context): ...

    def reference_solution(self):
        return []


@dataclass(frozen=True)
class _NoVersion:
    task_id: str = "none"
    instruction: str = "x"
    max_turns: int = 1
    timeout_s: float = 1.0

    def sandbox_spec(self, kind, extra): ...

    def setup(self, sandbox): ...

    def grade(self, sandbox, context): ...

    def reference_solution(self):
        return []


def test_a_method_matching_no_version_names_both_signatures():
    with pytest.raises(TaskProtocolError) as caught:
        ShellEnv([_NoVersion()])
    assert str(caught.value).endswith(
        "sandbox_spec(self, kind, extra) does not match Task protocol 2: expected "
        "sandbox_spec(self, kind) (or sandbox_spec(self), protocol 1, served through an adapter)"
    )


def test_a_declared_version_this_thundersync_does_not_serve_is_refused():
    with pytest.raises(
        TaskProtocolError,
        match=r"declares protocol_version 3; this "
        r"ThunderSync serves Task protocol 1\.\.2",
    ):
        ShellEnv([_Declared()])


@dataclass(frozen=True)
class _DeclaredOne(_Declared):
    protocol_version: int = 1


def test_a_declared_version_is_checked_against_its_own_signatures():
    with pytest.raises(
        TaskProtocolError,
        match=r"sandbox_spec\(self, kind\) does not match "
        r"Task protocol 1: expected sandbox_spec\(self\)$",
    ):
        as_current(_DeclaredOne())


def test_current_tasks_pass_unchanged():
    task = draw_sum_task(np.random.default_rng(0))
    assert as_current(task) is task and PROTOCOL_VERSION == 2


def test_generated_splits_are_disjoint_and_training_never_draws_held_out():
    source = ToySumEnv.task_source(num_keys=2, max_value=3)  # a small space: collisions happen
    rng = np.random.default_rng(0)
    train = {source.draw(rng, TRAIN).task_id for _ in range(3000)}
    heldout = {t.task_id for t in select_tasks(source, 40, seed=0).tasks}
    assert len(heldout) == 40 and not train & heldout
    assert all(source.is_heldout(i) for i in heldout)
    assert not any(source.is_heldout(i) for i in train)
    # a seed stream alone would not do: plain draws meet the held-out ids
    plain = {draw_sum_task(rng, num_keys=2, max_value=3).task_id for _ in range(3000)}
    assert plain & heldout


def test_an_env_draws_training_tasks_from_its_source():
    env = ToySumEnv(tools="python")
    task = env.draw_task(np.random.default_rng(1))
    assert task == env.source.draw(np.random.default_rng(1), TRAIN)
    assert not env.source.is_heldout(task.task_id)


def test_select_tasks_says_when_there_is_no_held_out_split_and_never_repeats():
    tasks = tuple(draw_sum_task(np.random.default_rng(i)) for i in range(3))
    selection = select_tasks(FixedTasks("mine", tasks), 5, seed=0)
    assert selection.split == TRAIN
    assert sorted(t.task_id for t in selection.tasks) == sorted(t.task_id for t in tasks)
    assert selection.note == (
        "mine declares no held-out split: evaluating its training tasks "
        "(scores are not held-out); its train split has 3 task(s), fewer "
        "than the 5 asked"
    )
    held = FixedTasks("mine", tasks[:1], heldout=tasks[1:])
    chosen = select_tasks(held, 1, seed=0)
    assert chosen.split == HELDOUT and chosen.note is None and chosen.tasks[0] in tasks[1:]


def test_a_task_in_both_splits_is_refused():
    task = draw_sum_task(np.random.default_rng(0))
    with pytest.raises(ValueError, match="in both the training and the held-out split"):
        FixedTasks("mine", (task,), heldout=(task,))


def test_a_suite_is_its_own_split():
    source = task_source("thundersync/TerminalBench-v0")
    assert source.splits() == (TRAIN, HELDOUT)
    assert [t.task_id for t in source.tasks(HELDOUT)] == [t.task_id for t in source.tasks(TRAIN)]


def test_task_sources_make_no_env(monkeypatch):
    made = []
    monkeypatch.setattr(ShellEnv, "__init__", lambda *a, **k: made.append(a))
    for env_id in (
        "thundersync/ToySum-v0",
        "thundersync/ToyChain-v0",
        "thundersync/SWEBench-v0",
        "thundersync/TerminalBench-v0",
        "thundersync/TerminalGen-v0",
    ):
        task_source(env_id, sandbox="bwrap").draw(np.random.default_rng(0), TRAIN)
    assert made == []


def test_generated_tasks_refuse_an_unsplittable_generator():
    task = draw_sum_task(np.random.default_rng(0))
    source = GeneratedTasks("one", lambda rng: task)
    split = HELDOUT if not source.is_heldout(task.task_id) else TRAIN
    with pytest.raises(ValueError, match=f"no {split} task in 10000 draws"):
        source.draw(np.random.default_rng(0), split)


README = ROOT / "docs" / "guides" / "environments.md"  # the CountLines example, from README.md


def readme_task_class(protocol_line: str | None = None) -> type:
    """The README's own ``CountLines`` task (``@dataclass(frozen=True, slots=True)``), defined
    as the README writes it; ``protocol_line`` replaces its ``protocol_version`` line (or is
    added after ``timeout_s`` where the README has none)."""
    import re

    (block,) = [
        b
        for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)
        if "class CountLines:" in b
    ]
    source = block[: block.index("class CountLinesEnv")]
    assert "@dataclass(frozen=True, slots=True)" in source
    if protocol_line is not None:
        lines = [line for line in source.splitlines() if "protocol_version" not in line]
        at = next(i for i, line in enumerate(lines) if "timeout_s: float" in line) + 1
        source = "\n".join([*lines[:at], f"    {protocol_line}", *lines[at:]]) + "\n"
    import sys
    import types

    module = types.ModuleType("readme_example")  # dataclasses look the class's module up
    sys.modules[module.__name__] = module
    try:
        exec(compile(source, "README.md", "exec"), module.__dict__)  # noqa: S102 (README code)
    finally:
        del sys.modules[module.__name__]
    return module.CountLines


def test_the_readme_task_declares_its_protocol_version_as_a_slots_dataclass_field():
    """A ``protocol_version: int = 2`` field of a slots dataclass is a member descriptor on
    the class; the check read the class, not what an instance has, and refused the task with
    "declares protocol_version <member 'protocol_version' of 'CountLines' objects>"."""
    kind = readme_task_class()
    task = kind()
    assert task.protocol_version == 2  # the README's example says which version it implements
    assert as_current(task) is task
    ShellEnv([task], sandbox=LocalSandbox)


def test_every_instance_is_checked_by_the_version_it_has():
    """The check is per instance's value, not once per class: a slots dataclass instance made
    with another ``protocol_version`` is judged by that one."""
    kind = readme_task_class("protocol_version: int = 2")
    assert as_current(kind()) == kind()
    with pytest.raises(
        TaskProtocolError,
        match=r"declares protocol_version 3; this ThunderSync serves Task protocol 1\.\.2$",
    ):
        as_current(kind(protocol_version=3))
    with pytest.raises(TaskProtocolError, match=r"does not match Task protocol 1: expected"):
        as_current(kind(protocol_version=1))  # its methods are protocol 2's
    with pytest.raises(TaskProtocolError, match=r"declares protocol_version \[2\]"):
        as_current(kind(protocol_version=[2]))  # unhashable: refused, not a TypeError
