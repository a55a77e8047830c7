"""ToySum episodes whose tools answer instantly in-process: what is left of a batch's wall time
beyond the engine's generation is the agent loop's own overhead."""

from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from environments.sandboxes.protocol import ExecResult, SandboxSpec
from environments.toy import ToySumEnv


class MemorySandbox:
    """No processes: setup succeeds, and ``cat answer.txt`` returns the answer the env kept."""

    workdir = "/workspace"

    def __init__(self, spec: SandboxSpec) -> None:
        self.answer: str | None = None

    def execute(self, cmd: str, timeout: float) -> ExecResult:
        if cmd.strip() == "cat answer.txt":
            if self.answer is None:
                return ExecResult("cat: answer.txt: No such file\n", 1, False, 0.0)
            return ExecResult(self.answer + "\n", 0, False, 0.0)
        return ExecResult("", 0, False, 0.0)

    def upload(self, src: Path, dst: str) -> None: ...

    def download(self, src: str, dst: Path) -> None: ...

    def close(self) -> None: ...


class InstantToySumEnv(ToySumEnv):
    """ToySum with its three tools computed in Python instead of run in a sandbox."""

    def __init__(self) -> None:
        super().__init__(sandbox=MemorySandbox)

    def _execute(self, command: str, timeout: float) -> ExecResult:
        table = dict(self.task.table)
        name, _, arg = command.strip().partition(" ")
        if name == "lookup" and arg in table:
            return ExecResult(table[arg] + "\n", 0, False, 0.0)
        if name == "calc" and re.fullmatch(r"\d+\+\d+", arg):
            return ExecResult(f"{sum(int(x) for x in arg.split('+'))}\n", 0, False, 0.0)
        if name == "answer":
            self._sandbox.answer = arg  # type: ignore[union-attr]
            return ExecResult("THUNDERSYNC_SUBMIT\n", 0, False, 0.0)
        return ExecResult(f"unknown command {command!r}\n", 1, False, 0.0)


def run_instant_batch(model: Path, *, episodes: int, seed: int) -> tuple[float, float]:
    """(wall seconds, engine busy seconds) of ``episodes`` concurrent instant episodes."""
    from environments.runner import EpisodeRunner
    from thundersync.models import load_tokenizer
    from thundersync.training.agent import PolicyAgent
    from thundersync.training.chat import ChatFormat
    from thundersync.training.engines.batcher import DynamicBatcher
    from thundersync.training.engines.hf import HFEngine

    busy = [0.0]

    def on_batch(started: float, finished: float, *_: Any) -> None:
        busy[0] += finished - started

    engine = HFEngine(model)
    batcher = DynamicBatcher(engine, max_batch_size=episodes, on_batch=on_batch)
    agent = PolicyAgent(batcher.generate, ChatFormat(load_tokenizer(model)),
                        policy_version=lambda: 0, run_seed=seed, max_new_tokens=16,
                        max_context=engine.max_context)  # fmt: skip
    runner = EpisodeRunner(InstantToySumEnv, agent, lambda event: None)
    rng = np.random.default_rng(seed)
    tasks = [InstantToySumEnv().draw_task(rng) for _ in range(episodes)]

    def play(batch: list) -> float:
        started = time.perf_counter()
        with ThreadPoolExecutor(len(batch)) as pool:
            list(pool.map(lambda it: runner.run_episode(it[1], episode_id=f"e{it[0]}"),
                          enumerate(batch)))  # fmt: skip
        return time.perf_counter() - started

    try:
        play(tasks[:4])  # warm-up
        busy[0] = 0.0
        wall = play(tasks)
    finally:
        batcher.close()
    return wall, busy[0]
