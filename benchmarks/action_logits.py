"""The learner's logits at the positions that predict an action token only, against logits at
every position (``Policy._action_logits``; docs/design.md §3).

A sync step of a ToySum-shaped batch (``padding.toysum_like_batch``: most episodes one turn,
a few up to eight turns of actions and tool observations), the same events both ways,
interleaved (this machine is shared and noisy): the model itself, which takes Hugging Face's
``logits_to_keep``, against the same model behind a forward that does not take it. The report
gives the rows the head projects each way and the median of the per-pair ratios of learner
time; ``--vocab`` grows the model's vocabulary to that many entries (the head's cost and the
logits' memory grow with it: the tiny tokenizer has 512, real ones 32k-152k). A measurement,
not a test: it exits 0 whatever it finds, 2 on bad arguments.

    python benchmarks/action_logits.py [--pairs 7 --hidden 64 --layers 2 --vocab 32768]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learner_overhead import learner_seconds  # noqa: E402
from padding import (  # noqa: E402
    checked,
    interleaved,
    pair_parser,
    print_ratio,
    tiny_model,
    toysum_like_batch,
)


class AllLogits(torch.nn.Module):
    """``model`` behind a forward without ``logits_to_keep``: the policy then computes every
    position's logits and takes the action positions'."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


def head_rows(model: torch.nn.Module, events) -> int:
    """Rows the model's head projected in one sync step."""
    rows: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _o: rows.append(args[0][..., 0].numel()))
    try:
        learner_seconds(model, events, streaming=False)
    finally:
        hook.remove()
    return sum(rows)


def main(argv: list[str] | None = None) -> int:
    parser = pair_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--vocab", type=int, default=0, help="vocabulary size (0: the tiny tokenizer's)"
    )
    args = checked(parser, argv)
    if args.vocab < 0:
        parser.error("--vocab must be >= 0")
    with tempfile.TemporaryDirectory(prefix="thundersync-action-logits-") as tmp:
        model = tiny_model(Path(tmp) / "model", args)
        tokens = model.config.vocab_size  # the batch's ids: the tokenizer's
        if args.vocab > tokens:  # entries the batch never uses, as in real vocabularies
            model.resize_token_embeddings(args.vocab, mean_resizing=False)
        models = {"actions": model, "every": AllLogits(model)}
        events = toysum_like_batch(tokens, args.seed)
        rows = {name: head_rows(m, events) for name, m in models.items()}
        measured = interleaved(
            args.pairs,
            ("actions", "every"),
            lambda name: learner_seconds(models[name], events, streaming=False)[0],
        )
    for name, times in measured.items():
        print(
            f"{name:<8} head rows {rows[name]:>6}; sync step median "
            f"{statistics.median(times) * 1000:.1f} ms"
        )
    label = f"every / actions learner time (vocabulary {model.config.vocab_size})"
    print_ratio(label, measured["every"], measured["actions"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
