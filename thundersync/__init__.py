"""ThunderSync: exact gradient streaming for agentic RL of language models (DESIGN §8 API)."""

from __future__ import annotations

from thundersync import events
from thundersync.learner import IncompleteBatchError, Learner, StaleTokenError
from thundersync.objectives import GRPO, OPD

__all__ = ["GRPO", "OPD", "IncompleteBatchError", "Learner", "StaleTokenError", "events"]
__version__ = "0.1.0"
