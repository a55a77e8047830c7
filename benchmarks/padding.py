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
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learner_overhead import learner_seconds  # noqa: E402

from thundersync.core import micro_batches  # noqa: E402
from thundersync.core.random_batches import BatchShape, random_episode_events  # noqa: E402
from thundersync.models import build_tiny_model, load_model  # noqa: E402
from thundersync.protocol import events as ev  # noqa: E402


def episodes(events: list[ev.Event]) -> list:
    """The batch's episode records, folded from its events."""
    from thundersync.protocol.episode import EpisodeRecord

    records: dict[str, EpisodeRecord] = {}
    for e in events:
        eid = getattr(e, "episode_id", None)
        if isinstance(eid, str):
            records.setdefault(eid, EpisodeRecord(eid)).fold(e)
    return list(records.values())


def padded_tokens(events: list[ev.Event], size: int) -> tuple[int, int]:
    """(padded, real) context tokens of the batch's micro-batches as the learner makes them."""
    lengths = [r.trajectory().context_length() for r in episodes(events)]
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


def pair_parser(description: str) -> argparse.ArgumentParser:
    """The arguments of a side-by-side sync step on this batch (this benchmark's and
    ``action_logits.py``'s)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--pairs", type=int, default=7, help="interleaved pairs of steps")
    parser.add_argument("--hidden", type=int, default=64, help="hidden size")
    parser.add_argument("--layers", type=int, default=2, help="transformer layers")
    parser.add_argument("--seed", type=int, default=0, help="batch seed")
    return parser


def checked(parser: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    args = parser.parse_args(argv)
    if args.pairs < 1:
        parser.error("--pairs must be >= 1")
    return args


def tiny_model(folder: Path, args: argparse.Namespace) -> torch.nn.Module:
    """The learner's model, on one thread (the learner alone, as on a quiet core)."""
    torch.set_num_threads(1)
    built = build_tiny_model(folder, hidden_size=args.hidden, num_layers=args.layers)
    return load_model(built, dtype=torch.float32)


def interleaved(
    pairs: int, names: tuple[str, str], seconds: Callable[[str], float]
) -> dict[str, list[float]]:
    """``seconds(name)`` of each of ``names``, ``pairs`` times, in turn then in reverse (the
    machine's drift hits both alike), after a pair that warms up."""
    measured: dict[str, list[float]] = {name: [] for name in names}
    for n in range(pairs + 1):
        for name in names if n % 2 == 0 else names[::-1]:
            value = seconds(name)
            if n:
                measured[name].append(value)
    return measured


def print_ratio(label: str, slower: list[float], faster: list[float]) -> None:
    """The median and range of the per-pair ratios ``slower`` / ``faster``."""
    ratios = [s / f for s, f in zip(slower, faster, strict=True)]
    print(
        f"{label}: median {statistics.median(ratios):.2f} "
        f"(range {min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} pairs)"
    )


def main(argv: list[str] | None = None) -> int:
    args = checked(pair_parser(__doc__.splitlines()[0]), argv)
    with tempfile.TemporaryDirectory(prefix="thundersync-padding-") as tmp:
        model = tiny_model(Path(tmp) / "model", args)
        events = toysum_like_batch(model.config.vocab_size, args.seed)
        kept = micro_batches.SPREAD
        tokens = {}

        def seconds(name: str) -> float:
            micro_batches.SPREAD = kept if name == "spread" else float("inf")
            tokens[name] = padded_tokens(events, 8)
            return learner_seconds(model, events, streaming=False)[0]

        measured = interleaved(args.pairs, ("spread", "fixed"), seconds)
        micro_batches.SPREAD = kept
    real = tokens["spread"][1]
    for name, times in measured.items():
        print(
            f"{name:<7} padded {tokens[name][0]:>6} tokens for {real} real; "
            f"sync step median {statistics.median(times) * 1000:.1f} ms"
        )
    print_ratio("fixed / spread learner time", measured["fixed"], measured["spread"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
