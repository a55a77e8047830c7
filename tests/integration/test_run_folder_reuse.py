"""Issue 35's first Broken step, as the user met it, with real runs: ``train --steps 1`` on a
finished run's folder, without ``--resume``, exited 0 and left the new config.json beside the
old run's checkpoints, checkpoint pruning having deleted the new run's step-000001. Now it is
refused before anything starts, and ``--overwrite`` replaces the run with the new one alone."""

from __future__ import annotations

import json

import pytest

from tests.integration.training_kit import metrics, train

SMALL = ["--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]
TOOLS = ["--env-kwargs", '{"tools": "python"}']


@pytest.mark.slow
def test_a_finished_runs_folder_is_refused_then_replaced_with_overwrite(tmp_path):
    out = tmp_path / "sync"
    train(out, "--steps", "3", *SMALL, *TOOLS)
    checkpoints = out / "checkpoints"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000002", "step-000003"]
    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*")}

    again = train(out, "--steps", "1", *SMALL, *TOOLS, check=False)
    assert again.returncode == 2, again.stdout + again.stderr
    (error,) = again.stderr.strip().splitlines()
    assert error.startswith(f"train: error: --out {out} holds a run"), error
    assert "--resume" in error and "--overwrite" in error and "step-000003" in error, error
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*")} == before, "nothing touched"

    replaced = train(out, "--steps", "1", "--overwrite", *SMALL, *TOOLS)
    assert "--overwrite: removed what a run wrote" in replaced.stderr
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000001"]
    assert [m["step"] for m in metrics(out)] == [1]
    assert json.loads((out / "config.json").read_text())["steps"] == 1
