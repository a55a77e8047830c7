"""The HF engine's sampling and prefill against row-by-row ``torch.multinomial`` and every
prompt position's logits (``HFEngine._sample``, ``HFEngine._last_only``).

One batch of ToySum-shaped turns (32 prompts of 40-140 tokens, 16 new tokens each, temperature
1), the same requests both ways, interleaved (this machine is shared and noisy): the engine as
it is, against the same engine drawing each row alone with ``torch.multinomial`` (the same
tokens: ``tests/unit/thundersync/training/test_engine.py``) and projecting the whole prompt
onto the vocabulary at the prefill. The report gives the rows the head projects each way and
the median of the per-pair ratios of generation time; ``--vocab`` grows the vocabulary (the
tiny tokenizer has 512 entries, real ones 32k-152k). A measurement, not a test: it exits 0
whatever it finds, 2 on bad arguments.

    python benchmarks/sampling.py [--pairs 7 --hidden 64 --layers 2 --vocab 32768]
"""

from __future__ import annotations

import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from padding import checked, interleaved, pair_parser, print_ratio  # noqa: E402

from thundersync.models import build_tiny_model  # noqa: E402
from thundersync.training.engines.engine import GenerationRequest, SamplingParams  # noqa: E402
from thundersync.training.engines.hf import HFEngine  # noqa: E402


class RowByRow(HFEngine):
    """The engine drawing each live row alone with ``torch.multinomial`` and computing every
    prompt position's logits at the prefill: how it sampled before."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._last_only = {}

    def _sample(self, logits_BV, requests, generators, live, tokens, logprobs):
        next_B = torch.full((len(requests),), self.pad_id, dtype=torch.long)
        logits_BV = logits_BV.float().cpu()
        for b, request in enumerate(requests):
            if live[b]:
                logp_V = torch.log_softmax(logits_BV[b] / request.params.temperature, dim=-1)
                token = int(torch.multinomial(logp_V.exp(), 1, generator=generators[b]))
                tokens[b].append(token)
                logprobs[b].append(float(logp_V[token]))
                next_B[b] = token
        return next_B.to(self.device)


def toysum_turns(tokens: int, seed: int) -> list[GenerationRequest]:
    rng = random.Random(seed)
    return [
        GenerationRequest(
            tuple(rng.randrange(4, tokens) for _ in range(rng.randrange(40, 141))),
            SamplingParams(16, temperature=1.0),
            seed=i,
        )
        for i in range(32)
    ]


def head_rows(engine: HFEngine, requests: list[GenerationRequest]) -> int:
    rows: list[int] = []
    head = engine.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _o: rows.append(args[0][..., 0].numel()))
    try:
        engine.generate(requests)
    finally:
        hook.remove()
    return sum(rows)


def seconds(engine: HFEngine, requests: list[GenerationRequest]) -> float:
    started = time.perf_counter()
    engine.generate(requests)
    return time.perf_counter() - started


def main(argv: list[str] | None = None) -> int:
    parser = pair_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--vocab", type=int, default=0, help="vocabulary size (0: the tiny tokenizer's)"
    )
    args = checked(parser, argv)
    if args.vocab < 0:
        parser.error("--vocab must be >= 0")
    torch.set_num_threads(1)  # the engine's default (--rollout-threads)
    with tempfile.TemporaryDirectory(prefix="thundersync-sampling-") as tmp:
        folder = build_tiny_model(
            Path(tmp) / "model", hidden_size=args.hidden, num_layers=args.layers
        )
        engines = {"batched": HFEngine(folder), "row-by-row": RowByRow(folder)}
        tokens = engines["batched"].model.config.vocab_size  # the prompts' ids: the tokenizer's
        for engine in engines.values():
            if args.vocab > tokens:  # entries the prompts never use, as in real vocabularies
                torch.manual_seed(args.seed)  # the same new rows in both
                engine.model.resize_token_embeddings(args.vocab, mean_resizing=False)
        requests = toysum_turns(tokens, args.seed)
        differ = sum(
            a.token_ids != b.token_ids
            for a, b in zip(*(e.generate(requests) for e in engines.values()), strict=True)
        )
        rows = {name: head_rows(e, requests) for name, e in engines.items()}
        measured = interleaved(
            args.pairs, ("batched", "row-by-row"), lambda name: seconds(engines[name], requests)
        )
    for name, times in measured.items():
        print(
            f"{name:<10} head rows {rows[name]:>6}; generation median "
            f"{statistics.median(times) * 1000:.1f} ms"
        )
    # The draws are multinomial's bitwise; a prompt's last logits projected alone can round
    # differently in the last bits than within the whole prompt's, which can flip a draw.
    print(f"rows whose tokens differ: {differ} of {len(requests)}")
    vocab = engines["batched"].model.config.vocab_size
    label = f"row-by-row / batched generation time (vocabulary {vocab})"
    print_ratio(label, measured["row-by-row"], measured["batched"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
