"""ThunderSync: exact gradient streaming for agentic RL of language models (docs/design.md §8 API).

Names are imported lazily so that the protocol modules (``thundersync.events``,
``thundersync.types``) stay cheap for environments, which must not pay for torch.
"""

from __future__ import annotations

import importlib
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
    "GRPO": "thundersync.objectives",
    "OPD": "thundersync.objectives",
    "Learner": "thundersync.learner",
    "events": "thundersync.events",
    **{
        name: "thundersync.errors"
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
    from thundersync import events
    from thundersync.errors import (
        EventOrderError,
        IncompleteBatchError,
        InvalidEventError,
        InvariantError,
        NonFiniteGradientError,
        NonFiniteParameterError,
        StaleTokenError,
        ThunderSyncError,
    )
    from thundersync.learner import Learner
    from thundersync.objectives import GRPO, OPD


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module 'thundersync' has no attribute {name!r}")
    module = importlib.import_module(_LAZY[name])
    return module if name == "events" else getattr(module, name)
