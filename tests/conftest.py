"""Shared test configuration: hypothesis profiles (select with HYPOTHESIS_PROFILE=ci|dev)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "dev", max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


import pytest  # noqa: E402


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """Tiny checkpoints built once per session: {"gpt2": Path, "qwen3": Path, "llama": Path}."""
    from thundersync.models import build_tiny_model

    root = tmp_path_factory.mktemp("tiny-models")
    return {arch: build_tiny_model(root / arch, arch) for arch in ("gpt2", "qwen3", "llama")}
