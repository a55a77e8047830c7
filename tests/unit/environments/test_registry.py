"""Registry: built-in ids, environments.register, and plugin discovery via entry points."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import gymnasium as gym
import pytest

from environments import list_envs, load_plugins, register
from environments.core import ShellEnv
from environments.registry import episode_envs

ROOT = Path(__file__).resolve().parents[3]
PLUGIN_DIR = ROOT / "tests" / "fixtures" / "plugin_env"
PLUGIN_ID = "demoplugin/Greet-v0"


@pytest.fixture
def plugin_on_path(monkeypatch):
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    load_plugins(reload=True)
    yield


def test_builtin_envs_are_registered_with_lazy_entry_points():
    envs = {env.id: env.entry_point for env in list_envs()}
    for env_id in (
        "thundersync/ToySum-v0",
        "thundersync/ToyChain-v0",
        "thundersync/SWEBench-v0",
        "thundersync/TerminalBench-v0",
    ):
        assert env_id in envs
        assert ":" in envs[env_id]
    assert envs["thundersync/ToySum-v0"] == "environments.toy:ToySumEnv"


def test_register_adds_an_env_that_gymnasium_makes():
    register("thundersync/TestRegistered-v0", "environments.toy:ToyChainEnv", max_hops=1)
    assert "thundersync/TestRegistered-v0" in {env.id for env in list_envs()}
    env = gym.make("thundersync/TestRegistered-v0")
    assert isinstance(env.unwrapped, ShellEnv)
    assert env.unwrapped.task_kwargs == {"max_hops": 1}
    env.close()


@pytest.mark.parametrize("bad_id", ["NoNamespace-v0", "thundersync/NoVersion", "a/b/c-v0"])
def test_register_rejects_malformed_ids(bad_id):
    with pytest.raises(ValueError, match="expected 'namespace/Name-vN'"):
        register(bad_id, "environments.toy:ToySumEnv")


def test_register_rejects_a_non_lazy_entry_point():
    with pytest.raises(ValueError, match="expected 'module:Class'"):
        register("thundersync/Bad-v0", "environments.toy.ToySumEnv")


def test_plugin_env_is_discovered_listed_and_made(plugin_on_path):
    envs = {env.id: env.entry_point for env in list_envs()}
    assert envs[PLUGIN_ID] == "thundersync_demo_plugin.env:GreetEnv"
    env = gym.make(PLUGIN_ID)
    obs, info = env.reset(seed=0)
    assert obs.startswith("Write hello") and not info["infra_failure"]
    env.step("```bash\necho hello > greeting.txt\n```")
    _, reward, terminated, _, _ = env.step("```bash\nsubmit\n```")
    assert terminated and reward == 1.0
    env.close()


def test_thundersync_envs_cli_lists_the_plugin():
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(PLUGIN_DIR), str(ROOT)]))
    proc = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "envs", "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    listed = {item["id"]: item["entry_point"] for item in json.loads(proc.stdout)}
    assert listed[PLUGIN_ID] == "thundersync_demo_plugin.env:GreetEnv"
    assert listed["thundersync/ToySum-v0"] == "environments.toy:ToySumEnv"


def test_a_failing_plugin_is_warned_about_not_fatal(tmp_path, monkeypatch):
    dist = tmp_path / "broken_plugin-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-plugin\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[thundersync.envs]\nbroken = no_such_module:go\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.warns(UserWarning, match="env plugin 'broken'"):
        load_plugins(reload=True)
    assert "thundersync/ToySum-v0" in {env.id for env in list_envs()}


class _OffSpaceEnv(gym.Env):
    """Breaks the API: its observations are not in its observation space."""

    observation_space = gym.spaces.Discrete(2)
    action_space = gym.spaces.Discrete(2)

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        return 7, {}

    def step(self, action):
        return 7, 0.0, True, False, {}


def test_episode_envs_checks_the_first_env_against_the_api_and_not_every_episode():
    gym.register("testonly/OffSpace-v0", entry_point=_OffSpaceEnv)
    try:
        make = episode_envs("testonly/OffSpace-v0")
        with pytest.warns(UserWarning, match="observation"):
            make().reset(seed=0)
        for _ in range(3):  # later episodes' envs skip the check (and its cost)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                env = make()
                env.reset(seed=0)
                env.step(0)
    finally:
        gym.registry.pop("testonly/OffSpace-v0")


def test_episode_envs_leaves_a_checker_the_registration_turned_off_off():
    gym.register("testonly/Unchecked-v0", entry_point=_OffSpaceEnv, disable_env_checker=True)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(2):
                episode_envs("testonly/Unchecked-v0")().reset(seed=0)
    finally:
        gym.registry.pop("testonly/Unchecked-v0")


# --- an env's keywords, and where its episodes are graded --------------------------------------


def test_a_misspelt_env_keyword_names_the_envs_keywords_and_the_closest(tmp_path):
    """``{"tool": "python"}`` for ToySum's ``tools``: the error listed the task's keywords
    only (num_keys, max_value), so the keyword meant was nowhere in it."""
    from environments.registry import task_source

    with pytest.raises(ValueError) as caught:
        task_source("thundersync/ToySum-v0", tool="python")
    message = str(caught.value)
    assert "'tool'" in message and "did you mean 'tools'?" in message, message
    assert "tools" in message.split("env keywords:")[1] and "num_keys" in message, message
    task_source("thundersync/ToySum-v0", tools="python", num_keys=3)  # the right ones pass


def test_train_names_the_env_keyword_a_typo_meant(tmp_path, capsys):
    from thundersync.cli import main

    code = main(
        ["train", "--env", "thundersync/ToySum-v0", "--env-kwargs", '{"tool": "python"}']
        + ["--steps", "1", "--out", str(tmp_path / "run")]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "did you mean 'tools'?" in err[0], err


@pytest.mark.parametrize(
    "env_id, kwargs, place",
    [
        ("thundersync/ToySum-v0", {"sandbox": "bwrap"}, "in the bwrap sandbox"),
        ("thundersync/ToySum-v0", {"sandbox": "bwrap", "tools": "python"}, "in this process"),
        (
            "openenv/Remote-v0",
            {"sandbox": "bwrap", "url": "http://127.0.0.1:9"},
            "by the server at http://127.0.0.1:9",
        ),
    ],
)
def test_where_an_envs_episodes_are_graded_is_said_as_it_is(env_id, kwargs, place):
    """A remote OpenEnv env is graded on its server, ToySum with in-process tools in this
    process: neither "in the bwrap sandbox", which is what ``train`` said of both."""
    from environments.registry import grading_place

    env = gym.make(env_id, disable_env_checker=True, **kwargs)
    try:
        assert grading_place(env, kwargs["sandbox"]) == place
    finally:
        env.close()
