"""The learner's padded micro-batches: rows shortest first, cut at twice a micro-batch's first
row (``thundersync/core/micro_batches.py``), against rows taken ``micro_batch_size`` at a time.

A sync step of one batch of lengths as ToySum's episodes run (most one turn, a few up to
eight), the
same events both ways, interleaved (this machine is shared and noisy); the report gives the
padded tokens each way and the median of the per-pair ratios of learner time. A measurement,
not a test: it exits 0 whatever it finds, 2 on bad arguments.

    python benchmarks/padding.py [--pairs 7 --hidden 64 --layers 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learner_overhead import learner_seconds  # noqa: E402

from thundersync.core import micro_batches  # noqa: E402
from thundersync.core.random_batches import BatchShape, random_episode_events  # noqa: E402
from thundersync.models import build_tiny_model, load_model  # noqa: E402
from thundersync.protocol import events as ev  # noqa: E402


def padded_tokens(events: list[ev.Event], size: int) -> tuple[int, int]:
    """(padded, real) context tokens of the batch's micro-batches as the learner makes them."""
    from thundersync.protocol.episode import EpisodeRecord

    records: dict[str, EpisodeRecord] = {}
    for e in events:
        eid = getattr(e, "episode_id", None)
        if isinstance(eid, str):
            records.setdefault(eid, EpisodeRecord(eid)).fold(e)
    lengths = [r.trajectory().context_length() for r in records.values()]
    shapes = micro_batches.chunk_shapes(lengths, size)
    return sum(rows * longest for rows, longest in shapes), sum(lengths)


def toysum_like_batch(vocab_size: int, seed: int) -> list[ev.Event]:
    """4 groups of 8 whose lengths run as ToySum's (the matrix's runs): most episodes one turn
    of about 45 tokens, one or two a group of up to eight turns and 470 tokens."""
    rng = random.Random(seed)
    short = BatchShape(max_turns=1, max_tokens=48, infra_failure_rate=0.0)
    long = BatchShape(max_turns=8, max_tokens=470, infra_failure_rate=0.0)
    events: list[ev.Event] = []
    for g in range(4):
        longs = rng.randint(1, 2)
        for i in range(8):
            events += random_episode_events(
                rng,
                vocab_size,
                long if i < longs else short,
                episode_id=f"g{g}-e{i}",
                group_id=f"g{g}",
                group_size=8,
                policy_version=0,
                teacher=False,
            )
    return events


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=7, help="interleaved pairs of steps")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--seed", type=int, default=0, help="batch seed")
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be >= 1")
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory(prefix="thundersync-padding-") as tmp:
        folder = build_tiny_model(
            Path(tmp) / "model", hidden_size=args.hidden, num_layers=args.layers
        )
        model = load_model(folder, dtype=torch.float32)
        events = toysum_like_batch(model.config.vocab_size, args.seed)
        kept = micro_batches.SPREAD
        measured: dict[str, list[float]] = {"spread": [], "fixed": []}
        tokens = {}
        for n in range(args.pairs + 1):  # the first pair warms up
            for name in ("spread", "fixed") if n % 2 == 0 else ("fixed", "spread"):
                micro_batches.SPREAD = kept if name == "spread" else float("inf")
                tokens[name] = padded_tokens(events, 8)
                seconds, _ = learner_seconds(model, events, streaming=False)
                if n:
                    measured[name].append(seconds)
        micro_batches.SPREAD = kept
    real = tokens["spread"][1]
    for name, times in measured.items():
        print(
            f"{name:<7} padded {tokens[name][0]:>6} tokens for {real} real; "
            f"sync step median {statistics.median(times) * 1000:.1f} ms"
        )
    ratios = [f / s for f, s in zip(measured["fixed"], measured["spread"], strict=True)]
    print(
        f"fixed / spread learner time: median {statistics.median(ratios):.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} pairs)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
