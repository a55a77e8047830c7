"""Control runs: the instance's eval script on the base commit, without the agent's patch.

An eval log that never reached the tests (no start marker), or whose test patch did not apply,
says nothing by itself about who failed: the agent's code runs before the start marker (an
official eval script's install step runs the repository's ``setup.py``) and inside the tests
(code that reopens its standard output truncates the log). Labelling every such log an
infrastructure failure would exclude the agent's failure from training (docs/design.md §6.1,
principle 3). So the grader runs the same script on the base commit in a fresh sandbox: only
when that control run fails too is the episode an infrastructure failure.

The control's outcome is a property of the instance (and of the grading mode and sandbox kind
it ran in), not of the attempt: ``CONTROL_RUNS`` keeps it for the life of the process, so each
instance's control runs at most once however many attempts need it, concurrent ones included.
An outcome the machine could not produce (the control's sandbox failed, its script timed out)
is never kept: the run raises, and the next attempt runs it again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable

REACHED = ""
"""A control outcome: the base commit's run reached the tests with the test patch applied."""


class ControlRuns:
    """Control outcomes by key, each computed at most once per process (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._outcomes: dict[Hashable, str] = {}
        self._gates: dict[Hashable, threading.Lock] = {}

    def outcome(self, key: Hashable, run: Callable[[], str]) -> str:
        """The kept outcome for ``key`` (``REACHED``, or the control's own problem), else
        ``run()``'s, kept. Concurrent callers of one key wait for a single run; a run that
        raises keeps nothing."""
        with self._lock:
            if key in self._outcomes:
                return self._outcomes[key]
            gate = self._gates.setdefault(key, threading.Lock())
        with gate:
            with self._lock:
                if key in self._outcomes:
                    return self._outcomes[key]
            result = run()
            with self._lock:
                self._outcomes[key] = result
                self._gates.pop(key, None)
            return result

    def clear(self) -> None:
        """Forget every outcome (tests; a process that changed its sandboxes)."""
        with self._lock:
            self._outcomes.clear()


CONTROL_RUNS = ControlRuns()
