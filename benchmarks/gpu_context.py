"""What ``gpu_check.py``'s items share: their sizes, the check they run in, and how they fail."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))


class ItemFailed(Exception):
    """An item ran and its check did not hold (the message says which)."""


class ItemSkipped(Exception):
    """An item could not run here (the message says why)."""


@dataclass(frozen=True, slots=True)
class Size:
    """How large each item runs: a GPU-sized run, or the dry run's tiny one on the CPU."""

    hidden_size: int
    num_layers: int
    num_heads: int
    demos: int
    warm_steps: int
    warm_lr: float
    bias_steps: int
    corrupt_fraction: float
    tasks: int
    group: int
    balanced_steps: int
    balanced_tasks: int
    balanced_group: int
    balanced_modes: tuple[str, ...]


GPU_SIZE = Size(
    hidden_size=768,
    num_layers=6,
    num_heads=12,
    demos=64,
    warm_steps=160,
    warm_lr=1e-3,
    bias_steps=4,
    corrupt_fraction=0.5,
    tasks=4,
    group=8,
    balanced_steps=4,
    balanced_tasks=4,
    balanced_group=8,
    balanced_modes=("sync", "streaming"),
)
"""About 43M parameters: the learner's passes are GPU work, not Python overhead. A short bias
phase: a wider model turns to guessing sooner (hidden 256, 4 layers, 160 steps at 1e-3 on the
CPU: 8 bias steps at 0.6 left 9 % of sampled episodes solved, 40 left none), and groups need
differing rewards for the update to move."""
DRY_SIZE = Size(
    hidden_size=64,
    num_layers=2,
    num_heads=2,
    demos=32,
    warm_steps=60,
    warm_lr=3e-3,
    bias_steps=30,
    corrupt_fraction=0.6,
    tasks=2,
    group=4,
    balanced_steps=3,
    balanced_tasks=1,
    balanced_group=2,
    balanced_modes=("sync", "streaming"),
)
"""The test suite's warm model's shape (its groups' rewards differ, so training moves it)."""


@dataclass
class Check:
    """What the items share: where they run, at what size, and what earlier items made."""

    device: str
    dry_run: bool
    size: Size
    work: Path
    deadline: float
    made: dict[str, Any] = field(default_factory=dict)

    def train(self, out: Path, *args: str) -> Path:
        """``thundersync train`` into ``out`` on this check's device (a subprocess, as a user
        runs it); its stderr is kept beside the run for the report."""
        command = [
            *(sys.executable, "-m", "thundersync.cli", "train", "--out", str(out)),
            *("--device", self.device, "--env-kwargs", '{"tools": "python"}'),
            *("--tasks-per-step", str(self.size.tasks), "--group-size", str(self.size.group)),
            *("--max-new-tokens", "16", "--seed", "0"),
            *args,
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=self.left(), cwd=ROOT, env=child_env()
        )
        if done.returncode != 0:
            raise ItemFailed(f"train exited {done.returncode}: {tail(done.stderr)}")
        return out

    def left(self) -> float:
        """Seconds left before the check's deadline (an item past it is skipped)."""
        return max(self.deadline - time.monotonic(), 1.0)


def child_env() -> dict[str, str]:
    """The subprocesses' environment: this checkout importable, the hub offline."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def tail(text: str, n: int = 1500) -> str:
    return text[-n:].strip()
