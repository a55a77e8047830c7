"""The SWE-bench unit tests grade shell stand-ins for eval scripts (lines echoed as a log), on
host stand-ins for sandboxes: no test process runs that a witness could watch, so strict
grading here proves nothing test by test (``SWEBenchTask._standard`` gives no standard) and
prepares no witness on the host. The proof of a pass is tested on real eval runs, in both
sandboxes (tests/integration/test_reward_hacks_swebench.py)."""

from __future__ import annotations

import pytest

from environments.swebench import SWEBenchTask


@pytest.fixture(autouse=True)
def _no_proof_of_a_shell_log(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(SWEBenchTask, "_standard", lambda self, context, kind: None)
