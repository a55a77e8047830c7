"""Tiny warm-started models for the training tests (built once per session), and the sandbox
kind of the tests that run in both."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from tests.conftest import SANDBOX_KINDS, built_once


@pytest.fixture(params=SANDBOX_KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """The sandbox kind (bwrap, docker) of a test that takes ``kind``."""
    return request.param


@pytest.fixture(scope="session")
def warm_model(tmp_path_factory) -> Path:
    """A tiny model warm-started on ToySum oracle play (it solves a minority of tasks, so
    groups have differing rewards and the gradient is not zero). The demonstrations run in
    bubblewrap; where it is missing (a GPU machine for ``make gpu-check``), with ToySum's
    in-process tools."""
    from thundersync.training.warmstart import WarmStartConfig, warm_start

    torch.set_num_threads(1)
    tools = None if shutil.which("bwrap") else {"tools": "python"}
    config = WarmStartConfig(
        num_demos=64, steps=120, corrupt_fraction=0.6, seed=1, env_kwargs=tools
    )
    return built_once(tmp_path_factory, "warm", lambda folder: warm_start(config, folder / "model"))


@pytest.fixture(scope="session")
def warm_gpt2(tmp_path_factory) -> Path:
    """The same kit on a GPT-2-style model, whose every op runs in float64 when asked."""
    from thundersync.training.warmstart import WarmStartConfig, warm_start

    config = WarmStartConfig(arch="gpt2", num_demos=64, steps=120, corrupt_fraction=0.6, seed=1)
    return built_once(
        tmp_path_factory, "warm-gpt2", lambda folder: warm_start(config, folder / "model")
    )
