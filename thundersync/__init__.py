"""ThunderSync: exact gradient streaming for agentic RL of language models (docs/design.md §8 API).

Names are imported lazily so that the protocol (``thundersync.protocol``: events, types,
episode records) stays cheap for environments, which must not pay for torch. The layout is
docs/design.md §1: ``protocol/`` (the ground floor), ``core/`` (the learner), ``training/``
(the ``train`` command), ``interop/``; this root holds the public face.
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
