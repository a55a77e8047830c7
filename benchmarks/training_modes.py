"""Training modes side by side on a long-tailed toy workload, in one run on one machine.

Runs ``thundersync train`` in sync, streaming and async mode (same model, seed and
workload: the demo's ToySum with log-normal tool and grading latencies), then reports from the run
folders:

- each mode's median step time and T_sync / T_mode;
- the bound T* of every streaming step (docs/design.md §4), from the streaming run's own
  reward-ready times and optimizer/weight-sync spans, with bᵢ = L_sync / N measured in the
  sync run; and T* / T_streaming (target >= 0.95);
- the agent loop's overhead over raw engine generation (target: the engine waits on the loop
  <= 5 %): the wall time of ToySum episodes over the wall time of the same requests generated
  by the engine alone in the fullest batches possible (``agent_loop_overhead``); ``--only
  agent-loop`` runs just this part. With the run's model for each of ToySum's tool kinds:
  in-process tools that answer at once (``tools="python"``, stepped on the driver's loop)
  and sandboxed tools (``tools="sandbox"``, bubblewrap: each step on a thread); and with a
  256-wide, 4-layer model (in-process tools), since the overhead is the loop's fixed Python
  per turn over the engine's time per turn, which grows with the model; and the floor it
  cannot go below without overlapping generation: the episodes played one after another with
  instant answers. Each round's overhead is split into the engine waiting for the loop
  (steady: measured within the round) and the engine running slower inside the loop than
  alone (as noisy as the machine).

Ratios are measured side by side in one run (this machine is shared and noisy); the medians
are over steps, and the spread is printed so a reader can judge them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from harness.critical_path import batched_cost_per_trajectory, summarize  # noqa: E402

# The demo's workload (Makefile): in-process tools with heavy-tailed tool and grading latencies,
# GRPO with its published KL term, streaming's early start.
WORKLOAD = {
    "tools": "python",
    "tool_latency_s": 0.05,
    "tool_latency_sigma": 1.0,
    "grade_latency_s": 0.3,
    "grade_latency_sigma": 0.75,
}


LOOPS = (
    ("agent_loop_python", "run", "python"),
    ("agent_loop_sandbox", "run", "sandbox"),
    ("agent_loop_wide", "wide", "python"),
)
"""The agent-loop cases: the result's key, the model (the run's or a wider one), ToySum's
tools."""


def run_mode(mode: str, model: Path, out: Path, args: argparse.Namespace) -> Path:
    command = [
        sys.executable,
        "-m",
        "thundersync.cli",
        "train",
        "--mode",
        mode,
        "--model",
        str(model),
        "--out",
        str(out),
        "--steps",
        str(args.steps),
        "--seed",
        str(args.seed),
        "--tasks-per-step",
        str(args.tasks),
        "--group-size",
        str(args.group),
        "--max-new-tokens",
        "16",
        "--lr",
        "1e-3",
        "--env-kwargs",
        json.dumps(WORKLOAD),
        "--objective",
        json.dumps({"kl_coef": 0.04}),
        "--early-start",
        "--checkpoint-every",
        str(args.steps),
    ]
    started = time.monotonic()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"training_modes: {mode} failed:\n{done.stdout}\n{done.stderr}")
    print(
        f"training_modes: {mode}: {args.steps} steps in {time.monotonic() - started:.0f} s",
        flush=True,
    )
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


def agent_loop_overhead(
    model: Path, *, episodes: int, seed: int, repeats: int = 5, tools: str = "python"
) -> dict[str, Any]:
    """The agent loop's overhead over raw engine generation of the same requests.

    One round: ``episodes`` concurrent ToySum episodes with ``tools`` (``python``: in-process,
    answering at once; ``sandbox``: scripts run in bubblewrap) run through the whole loop as
    the rollout worker runs it (its ``EpisodeDriver``, ``gymnasium.make``, the runner,
    ``PolicyAgent``, ``DynamicBatcher``), which records every request it sends to the engine;
    then the same
    requests are replayed with ``engine.generate`` alone, in the fullest batches their
    dependencies allow: every episode's turn-k request in one batch, turn after turn, which is
    what a perfect loop would send. Overhead = loop wall / replay wall - 1: the
    cost of the loop's own work (env start-up, tokenising, events, the batching window) and of
    batches it could not fill. The replay must sample the same tokens (per-request seeds), so
    it is the same work; mismatches are counted. Each round runs both back to back, so the
    machine's noise hits both; the median of ``repeats`` rounds, after one untimed round,
    with every round's values.

    Each round's overhead splits in two: ``idle`` = loop wall / the engine's time in batches
    - 1, the engine waiting for the loop (start-up, a turn's Python, the window), measured
    within the round and so steady; and ``inflation`` = the engine's time in batches / replay
    wall - 1, the engine itself slower inside the loop (the loop's Python contends for the
    interpreter while rows still sample), measured across two runs and so as noisy as the
    machine (the same replay varies by ±20 % here from second to second)."""
    import numpy as np
    import torch

    import environments  # noqa: F401  (registers thundersync/ToySum-v0)
    from environments.registry import episode_envs
    from environments.runner import EpisodeRunner
    from environments.toy import ToySumEnv
    from thundersync.models import load_tokenizer
    from thundersync.training.agent import PolicyAgent
    from thundersync.training.chat import ChatFormat
    from thundersync.training.engines.batcher import DynamicBatcher
    from thundersync.training.engines.engine import request_seed
    from thundersync.training.engines.hf import HFEngine
    from thundersync.training.episodes import EpisodeDriver
    from thundersync.training.rollout_worker import derive_seed

    torch.set_num_threads(1)  # as the rollout worker (--rollout-threads)
    sent: list[tuple[Any, Any]] = []  # (request, completion) of every batch, in order
    num_batches = [0]
    busy = [0.0]  # the engine's time in batches

    def on_batch(started: float, finished: float, requests: list, completions: list) -> None:
        sent.extend(zip(requests, completions, strict=True))
        num_batches[0] += 1
        busy[0] += finished - started

    engine = HFEngine(model)
    batcher = DynamicBatcher(engine, max_batch_size=episodes, on_batch=on_batch)
    agent = PolicyAgent(
        batcher.generate,
        ChatFormat(load_tokenizer(model)),
        policy_version=lambda: 0,
        run_seed=seed,
        max_new_tokens=16,
        max_context=engine.max_context,
    )
    make_env = episode_envs("thundersync/ToySum-v0", tools=tools)
    runner = EpisodeRunner(make_env, agent, lambda event: None)
    driver = EpisodeDriver(runner, batcher, max_concurrency=episodes)
    rng = np.random.default_rng(seed)
    tasks = [ToySumEnv(tools=tools).draw_task(rng) for _ in range(episodes)]
    turn_of = {
        request_seed(seed, f"e{index}", turn): turn
        for index, task in enumerate(tasks)
        for turn in range(task.max_turns)
    }

    def play() -> dict[
        str, Any
    ]:  # as the rollout worker does (thundersync/training/rollout_worker.py)
        sent.clear()
        num_batches[0], busy[0] = 0, 0.0
        started = time.perf_counter()
        futures = driver.submit_all(
            {"task": task, "episode_id": f"e{index}", "seed": derive_seed(seed, f"e{index}")}
            for index, task in enumerate(tasks)
        )
        for future in futures:
            future.result()
        return {
            "loop_s": time.perf_counter() - started,
            "loop_batches": num_batches[0],
            "engine_s": busy[0],
        }

    try:
        rounds = []
        for _ in range(repeats + 1):
            measured = play()
            measured.update(replay(engine, sent, turn_of))
            measured["overhead"] = measured["loop_s"] / measured["replay_s"] - 1.0
            measured["idle"] = measured["loop_s"] / measured["engine_s"] - 1.0
            measured["inflation"] = measured["engine_s"] / measured["replay_s"] - 1.0
            rounds.append(measured)
    finally:
        driver.shutdown()
        batcher.close()
    rounds = rounds[1:]  # the first round warms both paths up
    median = sorted(rounds, key=lambda r: r["overhead"])[len(rounds) // 2]
    # The floor: the loop's own work, one episode after another on one thread, each request
    # answered at once with the completion it got (no engine, no overlap, no window).
    answers = {request.seed: completion for request, completion in sent}
    direct = PolicyAgent(
        lambda request: answers[request.seed],
        agent.chat,
        policy_version=lambda: 0,
        run_seed=seed,
        max_new_tokens=16,
        max_context=engine.max_context,
    )
    alone = EpisodeRunner(runner.make_env, direct, lambda event: None)
    python_s = []
    for _ in range(repeats):
        started = time.perf_counter()
        for index, task in enumerate(tasks):
            alone.run_episode(task, episode_id=f"e{index}", seed=derive_seed(seed, f"e{index}"))
        python_s.append(time.perf_counter() - started)
    floor = statistics.median(python_s) / statistics.median(r["replay_s"] for r in rounds)
    return {
        **median,
        "rounds": rounds,
        "python_s": statistics.median(python_s),
        "python_floor": floor,
        "driver": type(driver).__name__,
        "tools": tools,
    }


def replay(engine: Any, sent: list[tuple[Any, Any]], turn_of: dict[int, int]) -> dict[str, Any]:
    """Generate ``sent``'s requests again with ``engine`` alone, all requests of a turn in one
    batch (a request's turn from its seed, ``turn_of``); its wall time and how many
    completions differ from the loop's."""
    by_turn: dict[int, list[tuple[Any, Any]]] = {}
    for request, completion in sent:
        by_turn.setdefault(turn_of[request.seed], []).append((request, completion))
    batches = [by_turn[turn] for turn in sorted(by_turn)]
    started = time.perf_counter()
    outputs = [engine.generate([request for request, _ in batch]) for batch in batches]
    elapsed = time.perf_counter() - started
    mismatches = sum(
        again.token_ids != completion.token_ids
        for batch, generated in zip(batches, outputs, strict=True)
        for (_, completion), again in zip(batch, generated, strict=True)
    )
    return {
        "replay_s": elapsed,
        "replay_batches": len(batches),
        "num_requests": len(sent),
        "mismatched_completions": mismatches,
    }


def wider_model(folder: Path, seed: int) -> Path:
    """A random 256-wide, 4-layer model (still tiny): generation costs ~10x the warm model's
    per token, so the loop's fixed Python per turn weighs less, as with any real model."""
    from thundersync.models import build_tiny_model

    return build_tiny_model(folder / "wide", "qwen3", hidden_size=256, num_layers=4, seed=seed)


def model_shape(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    return f"{config['hidden_size']}-wide {config['num_hidden_layers']}-layer"


def warm_model(folder: Path, seed: int) -> Path:
    import torch

    from thundersync.training.warmstart import WarmStartConfig, warm_start

    torch.set_num_threads(1)
    print("training_modes: warm-starting a tiny model on ToySum demonstrations", flush=True)
    return warm_start(
        WarmStartConfig(num_demos=128, steps=200, corrupt_fraction=0.6, seed=seed), folder / "warm"
    )


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
    parser.add_argument(
        "--modes",
        type=lambda s: s.split(","),
        default=["sync", "streaming", "async"],
        help="modes to run (sync is required)",
    )
    parser.add_argument(
        "--rounds", type=int, default=5, help="agent-loop rounds (each the loop, then its replay)"
    )
    parser.add_argument(
        "--only",
        choices=["modes", "agent-loop"],
        default=None,
        help="run only the modes' comparison or only the agent-loop overhead (default: both)",
    )
    parser.add_argument(
        "--loops",
        type=lambda s: s.split(","),
        default=[key.removeprefix("agent_loop_") for key, _, _ in LOOPS],
        help="agent-loop cases to run: python (the run's model, in-process tools), sandbox "
        "(the run's model, bubblewrap tools), wide (a wider model, in-process tools)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args(argv)
    if "sync" not in args.modes or args.steps < 2:
        parser.error("--modes must include sync and --steps must be >= 2")
    if args.rounds < 1:
        parser.error("--rounds must be >= 1")
    known = [key.removeprefix("agent_loop_") for key, _, _ in LOOPS]
    unknown = [loop for loop in args.loops if loop not in known]
    if unknown or not args.loops:
        parser.error(f"--loops: expected some of {','.join(known)}, got {','.join(args.loops)!r}")
    result: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="thundersync-bench-") as tmp:
        model = args.model or warm_model(Path(tmp), args.seed)
        if args.only != "agent-loop":
            result.update(compare_modes(model, Path(tmp), args))
        if args.only != "modes":
            wide = wider_model(Path(tmp), args.seed) if "wide" in args.loops else None
            for key, loop_model, tools in LOOPS:
                if key.removeprefix("agent_loop_") not in args.loops:
                    continue
                chosen = wide if loop_model == "wide" else model
                result[key] = agent_loop_overhead(
                    chosen,
                    episodes=args.tasks * args.group,
                    seed=args.seed,
                    repeats=args.rounds,
                    tools=tools,
                )
                result[key]["model"] = model_shape(chosen)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_result(result)
    return 0


def print_result(result: dict[str, Any]) -> None:
    verdicts = []
    if "modes" in result:
        print_modes(result)
        stream = result["modes"].get("streaming", {})
        if "efficiency" in stream:
            verdicts.append(f"T*/T_streaming {stream['efficiency']:.3f} (target >= 0.95)")
    for key, _, _ in LOOPS:
        if key not in result:
            continue
        loop = result[key]
        print_agent_loop(loop)
        low, high = middle_half(loop, "idle")
        idle = statistics.median(r["idle"] for r in loop["rounds"])
        verdicts.append(
            f"engine waits on the loop {idle * 100:.1f}% median of {len(loop['rounds'])} "
            f"({loop['tools']} tools, {loop['model']} model; target <= 5%"
            f"{'; too noisy to conclude' if high - low > 0.05 else ''})"
        )
    print("training_modes: " + "; ".join(verdicts))


def print_modes(result: dict[str, Any]) -> None:
    print(f"{'mode':<10} {'step time':>10} {'spread':>16} {'T_sync/T':>9} {'T*/T':>6}")
    for mode, s in result["modes"].items():
        times = s["step_times_s"]
        spread = f"{min(times):.2f}-{max(times):.2f} s"
        eff = f"{s['efficiency']:.3f}" if "efficiency" in s else "-"
        print(
            f"{mode:<10} {s['step_time_s']:>8.2f} s {spread:>16} "
            f"{s['speedup_vs_sync']:>9.2f} {eff:>6}"
        )
    print(f"b_i (sync learner per trajectory) {result['cost_per_trajectory_s'] * 1000:.1f} ms")


def print_agent_loop(loop: dict[str, Any]) -> None:
    print(
        f"agent loop ({loop['model']} model, {loop['tools']} tools, {loop['driver']}) vs raw "
        f"replay of its "
        f"{loop['num_requests']} requests, per round:"
    )
    for r in loop["rounds"]:
        print(
            f"  loop {r['loop_s']:.3f} s in {r['loop_batches']} batches, replay "
            f"{r['replay_s']:.3f} s in {r['replay_batches']}: overhead {r['overhead']:.1%}"
            f" (engine idle {r['idle']:.1%}, slower {r['inflation']:.1%}), "
            f"{r['mismatched_completions']} completions differ"
        )
    overheads = sorted(r["overhead"] for r in loop["rounds"])
    low, high = middle_half(loop)
    print(
        f"  spread {overheads[0]:.1%} to {overheads[-1]:.1%}, middle half {low:.1%} to {high:.1%}"
    )
    for part, meaning in (
        ("idle", "the engine waiting for the loop"),
        ("inflation", "the engine slower inside the loop"),
    ):
        part_low, part_high = middle_half(loop, part)
        median = statistics.median(r[part] for r in loop["rounds"])
        print(f"  {meaning}: median {median:.1%}, middle half {part_low:.1%} to {part_high:.1%}")
    print(
        f"  the episodes alone (one after another, instant answers): "
        f"{loop['python_s'] * 1000:.0f} ms, {loop['python_floor']:.1%} of the replay: the "
        "floor of the overhead without overlap"
    )
    if high - low > 0.05:
        print(
            "  the middle half spans more than the 5 % target: the median is not conclusive "
            "(a busy machine); rerun with more --rounds or on a quiet machine"
        )


def middle_half(loop: dict[str, Any], key: str = "overhead") -> tuple[float, float]:
    """The lower and upper quartiles of the rounds' ``key`` (the agent-loop overhead)."""
    overheads = sorted(r[key] for r in loop["rounds"])
    return overheads[len(overheads) // 4], overheads[(3 * len(overheads)) // 4]


if __name__ == "__main__":
    sys.exit(main())
