"""Learner overhead of exact streaming when nothing overlaps, and its accumulator memory.

Every trajectory arrives at once (no rollout to hide behind), so streaming can only lose:
the ratio streaming/sync of learner time is its pure overhead (target <= 1.05). A learner
worker that receives the whole burst drains it once (``eager=False``), batching trajectories
whose advantages are final; the eager ratio (a backward per trajectory the moment its reward
arrives, what consume() alone does) is reported too. Runs are interleaved side by side
(sync, streaming, eager, then the reverse order, ...) because this machine is shared and
noisy; the report gives the median of the per-run ratios.

    python benchmarks/learner_overhead.py [--hidden 128 --layers 4 --groups 8 --group-size 8]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time

import torch

from thundersync import GRPO, Learner
from thundersync.models import build_tiny_model, load_model
from thundersync.rollouts import BatchShape, random_batch


def learner_seconds(model, events, *, streaming: bool, **kwargs) -> tuple[float, dict]:
    """Wall time of everything the learner does for one batch: consuming and the step."""
    learner = Learner(model, GRPO(), torch.optim.SGD(model.parameters(), lr=0.0),
                      streaming=streaming, **kwargs)  # fmt: skip
    started = time.perf_counter()
    for event in events:
        learner.consume(event)
    metrics = learner.step()
    return time.perf_counter() - started, metrics


def batch_events(model, args: argparse.Namespace, seed: int):
    shape = BatchShape(max_groups=args.groups, min_groups=args.groups,
                       max_group_size=args.group_size, min_group_size=args.group_size,
                       max_turns=args.turns, max_tokens=args.tokens, infra_failure_rate=0.0,
                       reward_values=(0.0, 1.0))  # fmt: skip
    events = random_batch(seed, model.config.vocab_size, shape, arrival="batch")
    return events


def measure_overhead(model, args: argparse.Namespace) -> tuple[list, list, list, list]:
    """Learner seconds of sync, lazy and eager streaming on the same batches, interleaved."""
    ratios, eager_ratios, sync_s, stream_s = [], [], [], []
    learner_seconds(model, batch_events(model, args, 0), streaming=True)  # warm-up
    for r in range(args.repeats):
        events = batch_events(model, args, 100 + r)
        runs = {
            "sync": lambda e=events: learner_seconds(model, e, streaming=False)[0],
            "lazy": lambda e=events: learner_seconds(model, e, streaming=True, eager=False)[0],
            "eager": lambda e=events: learner_seconds(model, e, streaming=True, eager=True)[0],
        }
        order = list(runs) if r % 2 == 0 else list(reversed(runs))  # no first-run bias
        seconds = {name: runs[name]() for name in order}
        sync_s.append(seconds["sync"])
        stream_s.append(seconds["lazy"])
        ratios.append(seconds["lazy"] / seconds["sync"])
        eager_ratios.append(seconds["eager"] / seconds["sync"])
    return sync_s, stream_s, ratios, eager_ratios


def measure_memory(model, args: argparse.Namespace, param_bytes: int) -> list[dict]:
    """Peak accumulator memory of streaming configurations on one batch."""
    memory = []
    events = batch_events(model, args, 7)
    for label, kwargs in [
        ("streaming, groups open as rewards arrive", {}),
        ("streaming + early start (buffers from EpisodeCompleted)", {"early_start": True}),
        ("streaming, budget = 2 buffers", {"buffer_budget_bytes": 2 * param_bytes}),
        ("streaming, budget = 0 (wait for groups)", {"buffer_budget_bytes": 0}),
    ]:
        _, metrics = learner_seconds(model, events, streaming=True, **kwargs)
        memory.append(
            {
                "config": label,
                "peak_buffer_bytes": metrics["peak_buffer_bytes"],
                "peak_over_params": metrics["peak_buffer_bytes"] / param_bytes,
            }
        )
    return memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--arch", default="qwen3", choices=["qwen3", "llama", "gpt2"])
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="thundersync-bench-") as tmp:
        folder = build_tiny_model(tmp, args.arch, hidden_size=args.hidden,
                                  num_layers=args.layers)  # fmt: skip
        model = load_model(folder)
    num_params = sum(p.numel() for p in model.parameters())
    param_bytes = num_params * 4

    sync_s, stream_s, ratios, eager_ratios = measure_overhead(model, args)
    memory = measure_memory(model, args, param_bytes)

    report = {
        "model": f"{args.arch} hidden={args.hidden} layers={args.layers}",
        "num_params": num_params,
        "batch": f"{args.groups} groups x {args.group_size}, <= {args.tokens} tokens, "
        f"<= {args.turns} turns",  # fmt: skip
        "sync_s_median": statistics.median(sync_s),
        "streaming_s_median": statistics.median(stream_s),
        "overhead_ratio_median": statistics.median(ratios),
        "overhead_ratios": ratios,
        "eager_overhead_ratio_median": statistics.median(eager_ratios),
        "target": "<= 1.05",
        "memory": memory,
    }
    if args.json:
        print(json.dumps(report, indent=2))
        return
    print(f"model {report['model']}: {num_params / 1e6:.2f} M params "
          f"({param_bytes / 2**20:.1f} MiB per buffer); batch {report['batch']}")  # fmt: skip
    print(f"learner time, nothing overlapping: sync {report['sync_s_median']:.2f} s, "
          f"streaming {report['streaming_s_median']:.2f} s")  # fmt: skip
    print(
        f"streaming/sync overhead ratio (median of {args.repeats} side-by-side pairs): "
        f"{report['overhead_ratio_median']:.3f}  (target <= 1.05; pairs: "
        + ", ".join(f"{r:.3f}" for r in ratios)
        + ")"
    )
    print(f"eager streaming (one backward per trajectory at its reward)/sync: "
          f"{report['eager_overhead_ratio_median']:.3f}")  # fmt: skip
    for row in memory:
        print(f"  {row['config']}: peak {row['peak_buffer_bytes'] / 2**20:.1f} MiB "
              f"= {row['peak_over_params']:.1f} x params")  # fmt: skip


if __name__ == "__main__":
    main()
