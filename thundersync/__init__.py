"""ThunderSync: exact gradient streaming for agentic RL of language models (docs/design.md §8 API).

Names are imported lazily so that the protocol (``thundersync.protocol``: events, types,
episode records) stays cheap for environments, which must not pay for torch. The layout is
docs/design.md §1: ``protocol/`` (the ground floor), ``core/`` (the learner), ``training/``
(the ``train`` command), ``interop/``; this root holds the public face.

Modules of 0.1's flat layout (``thundersync.events``, ``thundersync.objectives``, …) still
import, as the modules they moved to (``_MOVED``), so code written against them keeps working.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from typing import TYPE_CHECKING, Any

__all__ = [
    "GRPO",
    "OPD",
    "EventOrderError",
    "IncompleteBatchError",
    "InvalidEventError",
    "InvariantError",
    "Learner",
    "NonFiniteGradientError",
    "NonFiniteParameterError",
    "StaleTokenError",
    "ThunderSyncError",
    "events",
]
__version__ = "0.1.0"

_LAZY = {
    "GRPO": "thundersync.core.objectives",
    "OPD": "thundersync.core.objectives",
    "Learner": "thundersync.core.learner",
    "events": "thundersync.protocol.events",
    **{
        name: "thundersync.protocol.errors"
        for name in (
            "EventOrderError",
            "IncompleteBatchError",
            "InvalidEventError",
            "InvariantError",
            "NonFiniteGradientError",
            "NonFiniteParameterError",
            "StaleTokenError",
            "ThunderSyncError",
        )
    },
}

if TYPE_CHECKING:
    from thundersync.core.learner import Learner
    from thundersync.core.objectives import GRPO, OPD
    from thundersync.protocol import events
    from thundersync.protocol.errors import (
        EventOrderError,
        IncompleteBatchError,
        InvalidEventError,
        InvariantError,
        NonFiniteGradientError,
        NonFiniteParameterError,
        StaleTokenError,
        ThunderSyncError,
    )


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'thundersync' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    return module if name == "events" else getattr(module, name)


_MOVED = {
    **{
        f"thundersync.{name}": f"thundersync.protocol.{name}"
        for name in ("events", "types", "errors", "documents", "strict_json")
    },
    **{
        f"thundersync.{name}": f"thundersync.core.{name}"
        for name in (
            "learner",
            "objectives",
            "assembly",
            "batch",
            "canonical",
            "distill",
            "gradients",
            "strategy",
            "validation",
            "data_parallel",
            "policy",
        )
    },
    "thundersync.streaming": "thundersync.core.streaming_grpo",
    "thundersync.metrics": "thundersync.core.learner_metrics",
    "thundersync.rollouts": "thundersync.core.random_batches",
}
"""0.1's module paths and where each module lives now."""


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module it moved to (the same module object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname not in _MOVED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec: Any) -> Any:
        return importlib.import_module(_MOVED[spec.name])

    def exec_module(self, module: Any) -> None:
        """Nothing to run: the module was imported under its new name."""


if not any(isinstance(finder, _MovedModules) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())
