"""``make gpu-check``'s script (``benchmarks/gpu_check.py``) on a CPU: its dry run runs every
item at a tiny size and reports each ``skipped: no CUDA`` — none ``failed`` — so the first run
on a GPU machine cannot fail on the script's own logic; without CUDA and without
``--dry-run`` it checks nothing and says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
ITEMS = ["train-bitwise", "engine-hf", "engine-vllm", "opd", "balanced", "test-gpu"]


@pytest.mark.slow
def test_the_dry_run_exercises_every_item_and_none_fails(tmp_path):
    report = tmp_path / "gpu-check.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--dry-run", "--install", "--report", str(report)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    items = {e["item"]: e for e in json.loads(report.read_text())["items"]}
    assert list(items) == ["install", "environment", *ITEMS]
    assert items["environment"]["status"] == "passed"
    assert items["environment"]["details"]["torch"] == torch.__version__
    assert items["install"]["status"] == "skipped"
    assert items["install"]["reason"].startswith("dry run: would run pip")
    for name in ITEMS:
        entry = items[name]
        assert entry["status"] == "skipped", (name, entry)
        why = ("no CUDA", "vLLM is not installed") if name == "engine-vllm" else ("no CUDA",)
        assert entry["reason"].startswith(why), (name, entry["reason"])
    # what each item measured on the CPU is kept, as it would be on the GPU
    bitwise = items["train-bitwise"]["details"]
    assert bitwise["bitwise_equal"] and bitwise["max_weight_change"] > 0
    assert bitwise["devices"] == ["cpu"]
    assert items["engine-hf"]["details"]["greedy_equal_fresh"]
    assert items["engine-hf"]["details"]["logprob_mismatch_max"] < 1e-4
    assert items["opd"]["details"]["turns_scored"] == items["opd"]["details"]["turns"]
    assert set(items["balanced"]["details"]["step_time_s"]) == {"sync", "streaming"}
    outcomes = items["test-gpu"]["details"]["outcomes"]
    assert outcomes and all(o.startswith("skipped") for o in outcomes.values())
    lines = [line for line in done.stdout.splitlines() if line.startswith("gpu-check: ")]
    assert len(lines) == len(items) + 1  # a line per item and the verdict
    assert "no headline" not in done.stdout
    assert "sync vs streaming bitwise equal" in done.stdout
    assert "8 of 8 items without failure" in lines[-1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here")
def test_without_cuda_nothing_is_checked_and_the_status_says_so(tmp_path):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--report", str(tmp_path / "r.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "no CUDA GPU here: nothing checked" in done.stderr
    assert not (tmp_path / "r.json").exists()
