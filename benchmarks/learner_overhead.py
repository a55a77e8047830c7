"""Learner overhead of exact streaming when nothing overlaps, and its accumulator memory.

Every trajectory arrives at once (no rollout to hide behind), so streaming can only lose:
the ratio streaming/sync of learner time is its pure overhead (target <= 1.05). A learner
worker that receives the whole burst drains it once (``eager=False``), batching trajectories
whose advantages are final; the eager ratio (a backward per trajectory the moment its reward
arrives, what consume() alone does) is reported too. Runs are interleaved side by side
(sync, streaming, eager, then the reverse order, ...) because this machine is shared and
noisy; the report gives the median of the per-run ratios and their range, and its last line
says whether the target is met by every pair, missed by every pair, or undecided because the
pairs fall on both sides of it (a median alone would hide that). It exits 0 whatever the
verdict (a measurement, not a test), 2 on bad arguments. Why the overhead matters: the bound
T* of docs/design.md §4 assumes streaming loses nothing to batching.

    python benchmarks/learner_overhead.py [--hidden 128 --layers 4 --groups 8 --group-size 8]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence

import torch

from thundersync import GRPO, Learner
from thundersync.cli_output import Progress, print_verdict, strict_json
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import build_tiny_model, load_model


def learner_seconds(model, events, *, streaming: bool, **kwargs) -> tuple[float, dict]:
    """Wall time of everything the learner does for one batch: consuming and the step."""
    learner = Learner(
        model, GRPO(), torch.optim.SGD(model.parameters(), lr=0.0), streaming=streaming, **kwargs
    )
    started = time.perf_counter()
    for event in events:
        learner.consume(event)
    metrics = learner.step()
    return time.perf_counter() - started, metrics


def batch_events(model, args: argparse.Namespace, seed: int):
    shape = BatchShape(
        max_groups=args.groups,
        min_groups=args.groups,
        max_group_size=args.group_size,
        min_group_size=args.group_size,
        max_turns=args.turns,
        max_tokens=args.tokens,
        infra_failure_rate=0.0,
        reward_values=(0.0, 1.0),
    )
    events = random_batch(seed, model.config.vocab_size, shape, arrival="batch")
    return events


TARGET = 1.05
"""Streaming/sync learner time that counts as no real overhead."""


def measure_overhead(model, args: argparse.Namespace, progress: Progress) -> tuple[list, ...]:
    """Learner seconds of sync, lazy and eager streaming on the same batches, interleaved."""
    ratios, eager_ratios, sync_s, stream_s = [], [], [], []
    learner_seconds(model, batch_events(model, args, 0), streaming=True)  # warm-up
    progress.advance()
    for r in range(args.repeats):
        events = batch_events(model, args, 100 + r)
        runs = {
            "sync": lambda e=events: learner_seconds(model, e, streaming=False)[0],
            "lazy": lambda e=events: learner_seconds(model, e, streaming=True, eager=False)[0],
            "eager": lambda e=events: learner_seconds(model, e, streaming=True, eager=True)[0],
        }
        order = list(runs) if r % 2 == 0 else list(reversed(runs))  # no first-run bias
        seconds = {}
        for name in order:
            seconds[name] = runs[name]()
            progress.advance()
        sync_s.append(seconds["sync"])
        stream_s.append(seconds["lazy"])
        ratios.append(seconds["lazy"] / seconds["sync"])
        eager_ratios.append(seconds["eager"] / seconds["sync"])
    return sync_s, stream_s, ratios, eager_ratios


MEMORY_CONFIGS = (
    ("streaming, groups open as rewards arrive", {}),
    ("streaming + early start (buffers from EpisodeCompleted)", {"early_start": True}),
    ("streaming, budget = 2 buffers", {"buffer_budget_bytes": 2}),
    ("streaming, budget = 0 (wait for groups)", {"buffer_budget_bytes": 0}),
)
"""(label, Learner options) of the memory measurement; budgets in parameter-sized buffers."""


def measure_memory(
    model, args: argparse.Namespace, param_bytes: int, progress: Progress
) -> list[dict]:
    """Peak accumulator memory of streaming configurations on one batch."""
    memory = []
    events = batch_events(model, args, 7)
    for label, budget in MEMORY_CONFIGS:
        kwargs = dict(budget)
        if "buffer_budget_bytes" in kwargs:  # in parameter-sized buffers
            kwargs["buffer_budget_bytes"] *= param_bytes
        _, metrics = learner_seconds(model, events, streaming=True, **kwargs)
        memory.append(
            {
                "config": label,
                "peak_buffer_bytes": metrics["peak_buffer_bytes"],
                "peak_over_params": metrics["peak_buffer_bytes"] / param_bytes,
            }
        )
        progress.advance()
    return memory


def verdict(ratios: Sequence[float]) -> str:
    """One line: the median ratio, its range, and met / NOT met / undecided against TARGET."""
    low, high, median = min(ratios), max(ratios), statistics.median(ratios)
    if high <= TARGET:
        outcome = "met by every pair"
    elif low > TARGET:
        outcome = "NOT met by any pair"
    else:
        outcome = "undecided"
    pairs = f"{len(ratios)} pair{'s' * (len(ratios) != 1)}"
    return f"learner_overhead: {median:.3f} ({pairs} {low:.2f}-{high:.2f}) <= {TARGET}? {outcome}"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument(
        "--arch",
        default="qwen3",
        choices=["qwen3", "llama", "gpt2"],
        help="architecture of the tiny model",
    )
    parser.add_argument("--hidden", type=int, default=128, help="hidden size")
    parser.add_argument("--layers", type=int, default=4, help="transformer layers")
    parser.add_argument("--groups", type=int, default=8, help="GRPO groups per batch")
    parser.add_argument("--group-size", type=int, default=8, help="trajectories per group")
    parser.add_argument("--turns", type=int, default=4, help="most turns per trajectory")
    parser.add_argument("--tokens", type=int, default=256, help="most tokens per trajectory")
    parser.add_argument(
        "--repeats", type=int, default=5, help="side-by-side sync/streaming/eager runs"
    )
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument(
        "--json", action="store_true", help="print a JSON report; the verdict goes to stderr"
    )
    args = parser.parse_args(argv)
    for name in (
        "hidden",
        "layers",
        "groups",
        "group_size",
        "turns",
        "tokens",
        "repeats",
        "threads",
    ):
        if getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            parser.error(f"{flag} must be >= 1, got {getattr(args, name)}")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)

    with tempfile.TemporaryDirectory(prefix="thundersync-bench-") as tmp:
        folder = build_tiny_model(tmp, args.arch, hidden_size=args.hidden, num_layers=args.layers)
        model = load_model(folder)
    num_params = sum(p.numel() for p in model.parameters())
    param_bytes = num_params * 4

    total = 1 + 3 * args.repeats + len(MEMORY_CONFIGS)
    with Progress("learner_overhead", total, "runs") as progress:
        sync_s, stream_s, ratios, eager_ratios = measure_overhead(model, args, progress)
        memory = measure_memory(model, args, param_bytes, progress)
    line = verdict(ratios)

    report = {
        "model": f"{args.arch} hidden={args.hidden} layers={args.layers}",
        "num_params": num_params,
        "batch": f"{args.groups} groups x {args.group_size}, <= {args.tokens} tokens, "
        f"<= {args.turns} turns",
        "sync_s_median": statistics.median(sync_s),
        "streaming_s_median": statistics.median(stream_s),
        "overhead_ratio_median": statistics.median(ratios),
        "overhead_ratios": ratios,
        "eager_overhead_ratio_median": statistics.median(eager_ratios),
        "target": f"<= {TARGET}",
        "verdict": line,
        "memory": memory,
    }
    if args.json:
        print(strict_json(report))
    else:
        print_report(report, param_bytes)
    print_verdict(line, to_stderr=args.json)
    return 0


def print_report(report: dict, param_bytes: int) -> None:
    ratios = report["overhead_ratios"]
    print(
        f"model {report['model']}: {report['num_params'] / 1e6:.2f} M params "
        f"({param_bytes / 2**20:.1f} MiB per buffer)"
    )
    print(f"batch {report['batch']}")
    print(
        f"learner time, nothing overlapping: sync {report['sync_s_median']:.2f} s, "
        f"streaming {report['streaming_s_median']:.2f} s"
    )
    print("streaming/sync ratio per side-by-side pair: " + ", ".join(f"{r:.3f}" for r in ratios))
    print(
        f"eager streaming (a backward per trajectory at its reward)/sync: "
        f"{report['eager_overhead_ratio_median']:.3f}"
    )
    for row in report["memory"]:
        print(f"  {row['config'][:56]}: {row['peak_over_params']:.1f} x params")


if __name__ == "__main__":
    sys.exit(main())
