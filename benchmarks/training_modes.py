"""Training modes side by side on a long-tailed toy workload, in one run on one machine.

Runs ``thundersync train`` in sync, streaming and async mode (same model, seed and
workload: the demo's ToySum with log-normal tool and grading latencies), then reports from the run
folders:

- each mode's median step time and T_sync / T_mode;
- the bound T* of every streaming step (docs/design.md §4), from the streaming run's own
  reward-ready times and optimizer/weight-sync spans, with bᵢ = L_sync / N measured in the
  sync run; and T* / T_streaming (target >= 0.95);
- the agent loop's overhead over raw engine generation (target <= 5 %): ToySum episodes whose
  tools answer instantly in-process (``tools="python"``), so the loop's wall time is
  generation plus whatever the loop adds (episode threads, the runner, events, the batching
  window).

Ratios are measured side by side in one run (this machine is shared and noisy); the medians
are over steps, and the spread is printed so a reader can judge them.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.critical_path import batched_cost_per_trajectory, summarize  # noqa: E402

# The demo's workload (Makefile): in-process tools with heavy-tailed tool and grading latencies,
# GRPO with its published KL term, streaming's early start.
WORKLOAD = {"tools": "python", "tool_latency_s": 0.05, "tool_latency_sigma": 1.0,
            "grade_latency_s": 0.3, "grade_latency_sigma": 0.75}  # fmt: skip


def run_mode(mode: str, model: Path, out: Path, args: argparse.Namespace) -> Path:
    command = [
        sys.executable, "-m", "thundersync.cli", "train", "--mode", mode, "--model", str(model),
        "--out", str(out), "--steps", str(args.steps), "--seed", str(args.seed),
        "--tasks-per-step", str(args.tasks), "--group-size", str(args.group),
        "--max-new-tokens", "16", "--lr", "1e-3", "--env-kwargs", json.dumps(WORKLOAD),
        "--objective", json.dumps({"kl_coef": 0.04}), "--early-start",
        "--checkpoint-every", str(args.steps),
    ]  # fmt: skip
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"training_modes: {mode} failed:\n{done.stdout}\n{done.stderr}")
    print(f"training_modes: {mode}: {args.steps} steps in {time.monotonic() - started:.0f} s",
          flush=True)  # fmt: skip
    return out


def compare_modes(model: Path, folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    runs = {mode: run_mode(mode, model, folder / mode, args) for mode in args.modes}
    cost = batched_cost_per_trajectory(runs["sync"])
    result: dict[str, Any] = {"cost_per_trajectory_s": cost, "modes": {}}
    for mode, run in runs.items():
        result["modes"][mode] = summarize(run, cost if mode == "streaming" else None)
    sync_time = result["modes"]["sync"]["step_time_s"]
    for summary in result["modes"].values():
        summary["speedup_vs_sync"] = sync_time / summary["step_time_s"]
    return result


def agent_loop_overhead(model: Path, *, episodes: int, seed: int,
                        repeats: int = 5) -> dict[str, Any]:  # fmt: skip
    """Wall time of a batch of concurrent ToySum episodes whose tools answer instantly
    in-process (``tools="python"``, no latency) over the engine's busy time, minus 1: what is
    left beyond generation is the agent loop's own overhead. The median of ``repeats``
    batches (the same tasks each time), with every round's value."""
    import numpy as np

    from environments.runner import EpisodeRunner
    from environments.toy import ToySumEnv
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
    runner = EpisodeRunner(lambda: ToySumEnv(tools="python"), agent, lambda event: None)
    rng = np.random.default_rng(seed)
    tasks = [ToySumEnv(tools="python").draw_task(rng) for _ in range(episodes)]

    def episode(index: int, task: Any) -> None:
        try:
            runner.run_episode(task, episode_id=f"e{index}")
        finally:
            batcher.leave()

    def play(batch: list) -> float:  # as the rollout worker does (thundersync/training)
        started = time.perf_counter()
        with ThreadPoolExecutor(len(batch)) as pool:
            for _ in batch:
                batcher.join()
            list(pool.map(episode, range(len(batch)), batch))
        return time.perf_counter() - started

    try:
        play(tasks[:4])  # warm-up
        rounds = []
        for _ in range(repeats):
            busy[0] = 0.0
            wall = play(tasks)
            rounds.append({"wall_s": wall, "engine_busy_s": busy[0],
                           "overhead": wall / busy[0] - 1.0})  # fmt: skip
    finally:
        batcher.close()
    rounds.sort(key=lambda r: r["overhead"])
    return {**rounds[len(rounds) // 2], "overheads": [r["overhead"] for r in rounds]}


def warm_model(folder: Path, seed: int) -> Path:
    import torch

    from thundersync.training.warmstart import WarmStartConfig, warm_start

    torch.set_num_threads(1)
    print("training_modes: warm-starting a tiny model on ToySum demonstrations", flush=True)
    return warm_start(WarmStartConfig(num_demos=128, steps=200, corrupt_fraction=0.6,
                                      seed=seed), folder / "warm")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--model",
        type=Path,
        default=None,
        help="checkpoint to train (default: warm-start a tiny one)",
    )
    parser.add_argument("--steps", type=int, default=5, help="steps per mode")
    parser.add_argument("--tasks", type=int, default=4, help="tasks per step (B)")
    parser.add_argument("--group", type=int, default=8, help="episodes per task (G)")
    parser.add_argument("--seed", type=int, default=0, help="seed of every run")
    parser.add_argument("--modes", type=lambda s: s.split(","), default=["sync", "streaming",
                        "async"], help="modes to run (sync is required)")  # fmt: skip
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if "sync" not in args.modes or args.steps < 2:
        parser.error("--modes must include sync and --steps must be >= 2")
    with tempfile.TemporaryDirectory(prefix="thundersync-bench-") as tmp:
        model = args.model or warm_model(Path(tmp), args.seed)
        result = compare_modes(model, Path(tmp), args)
        result["agent_loop"] = agent_loop_overhead(model, episodes=args.tasks * args.group,
                                                   seed=args.seed)  # fmt: skip
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result)
    return 0


def print_result(result: dict[str, Any]) -> None:
    print(f"{'mode':<10} {'step time':>10} {'spread':>16} {'T_sync/T':>9} {'T*/T':>6}")
    for mode, s in result["modes"].items():
        times = s["step_times_s"]
        spread = f"{min(times):.2f}-{max(times):.2f} s"
        eff = f"{s['efficiency']:.3f}" if "efficiency" in s else "-"
        print(f"{mode:<10} {s['step_time_s']:>8.2f} s {spread:>16} "
              f"{s['speedup_vs_sync']:>9.2f} {eff:>6}")  # fmt: skip
    loop = result["agent_loop"]
    stream = result["modes"].get("streaming", {})
    print(
        f"b_i (sync learner per trajectory) {result['cost_per_trajectory_s'] * 1000:.1f} ms; "
        f"agent loop {loop['wall_s']:.2f} s over engine {loop['engine_busy_s']:.2f} s (median "
        f"of {len(loop['overheads'])}: " + " ".join(f"{o:.1%}" for o in loop["overheads"]) + ")"
    )
    verdicts = []
    if "efficiency" in stream:
        verdicts.append(f"T*/T_streaming {stream['efficiency']:.3f} (target >= 0.95)")
    verdicts.append(f"agent-loop overhead {loop['overhead'] * 100:.1f}% median (target <= 5%)")
    print("training_modes: " + "; ".join(verdicts))


if __name__ == "__main__":
    sys.exit(main())
