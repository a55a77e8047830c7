"""The gym side: Gymnasium text envs, their registry, sandboxes, benchmarks and toy tasks."""

from __future__ import annotations

from environments.registry import (
    list_envs,
    load_plugins,
    register,
    register_builtin,
    require_env,
)

__all__ = ["list_envs", "load_plugins", "register", "register_builtin", "require_env"]

register_builtin()
