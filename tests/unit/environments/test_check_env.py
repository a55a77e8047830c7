"""Gymnasium's check_env over every registered env (built-in and plugins), with defaults."""

from __future__ import annotations

import contextlib
import importlib.util
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import gymnasium as gym
import pytest
from gymnasium.utils.env_checker import check_env

from environments import list_envs, load_plugins

PLUGIN_DIR = Path(__file__).resolve().parents[2] / "fixtures" / "plugin_env"
NEEDS_LOADER = {
    "thundersync/SWEBench-v0": "environments.swebench",
    "thundersync/TerminalBench-v0": "environments.terminal_bench",
}


def _all_env_ids() -> list[str]:
    import sys

    sys.path.insert(0, str(PLUGIN_DIR))
    try:
        load_plugins(reload=True)
        return [env.id for env in list_envs()]
    finally:
        sys.path.remove(str(PLUGIN_DIR))


ENV_IDS = _all_env_ids()


def test_the_plugin_and_builtin_envs_are_all_checked():
    assert {"thundersync/ToySum-v0", "thundersync/ToyChain-v0", "demoplugin/Greet-v0"} <= set(
        ENV_IDS
    )


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
@pytest.mark.parametrize("env_id", ENV_IDS)
def test_check_env(env_id, monkeypatch):
    loader = NEEDS_LOADER.get(env_id)
    if loader is not None and importlib.util.find_spec(loader) is None:
        pytest.skip(f"{loader} has not landed yet")
    monkeypatch.syspath_prepend(str(PLUGIN_DIR))
    with _served_for(env_id) as kwargs:
        _check(env_id, kwargs)


@contextlib.contextmanager
def _served_for(env_id: str) -> Iterator[dict[str, Any]]:
    """The kwargs an env needs beyond its defaults: the remote env is checked against a
    served ToySum (a server of this process, stopped on the way out)."""
    if env_id != "openenv/Remote-v0":
        yield {}
        return
    pytest.importorskip("openenv", reason="the interop extra: pip install -e '.[interop]'")
    from tests.unit.thundersync.test_interop_openenv import served

    with served("thundersync/ToySum-v0", {"tools": "python"}) as server:
        yield {"url": server.url}


def _check(env_id: str, kwargs: dict[str, Any]) -> None:
    env = gym.make(env_id, **kwargs)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            check_env(env.unwrapped)
        assert [str(w.message) for w in caught if "gymnasium" in w.filename] == []
        _, info = env.reset(seed=0)
        assert info["infra_failure"] is False, info.get("error")
    finally:
        env.close()
