"""``thundersync eval --suite`` on a Harbor dataset folder (issue 37 item 6): a
``dataset.toml`` beside one task folder and one task in Harbor's package cache layout; the
oracle solves both in bubblewrap, the report names each task by its package name, and each
attempt's artifacts folder is under ``--out``."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

DATASET = Path(__file__).resolve().parents[1] / "fixtures" / "harbor-dataset"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="no bwrap"),
]


def test_eval_runs_a_harbor_dataset_folder_by_task_name(tmp_path: Path) -> None:
    command = [sys.executable, "-m", "thundersync.cli", "eval", "--suite", str(DATASET)]
    command += ["--agent", "oracle", "--sandbox", "bwrap", "--out", str(tmp_path), "--json"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    rewards = {task["task_id"]: task["reward"] for task in report["tasks"]}
    assert rewards == {"word-count": 1.0, "greeting-file": 1.0}
    # eval --out keeps each attempt's artifacts (here only Harbor's /logs/artifacts convention)
    manifests = sorted((tmp_path / "artifacts").glob("*/manifest.json"))
    assert len(manifests) == 2, manifests
    assert [e["source"] for e in json.loads(manifests[0].read_text())] == ["/logs/artifacts"]
