"""The learner's logits at the positions that predict an action token only, against logits at
every position (``Policy._action_logits``; docs/design.md §3).

A sync step of a ToySum-shaped batch (``padding.toysum_like_batch``: most episodes one turn,
a few up to eight turns of actions and tool observations), the same events both ways,
interleaved (this machine is shared and noisy): the model itself, which takes Hugging Face's
``logits_to_keep``, against the same model behind a forward that does not take it. The report
gives the rows the head projects each way and the median of the per-pair ratios of learner
time (``--teacher``: of the OPD teacher's scoring of every turn of the batch, each episode's
turns in order on its KV cache, ``Policy.score_turn``); ``--vocab`` grows the model's
vocabulary to that many entries (the head's cost and the logits' memory grow with it: the
tiny tokenizer has 512, real ones 32k-152k). A measurement, not a test: it exits 0 whatever
it finds, 2 on bad arguments.

    python benchmarks/action_logits.py [--pairs 7 --hidden 64 --layers 2 --vocab 32768 --teacher]
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

from learner_overhead import learner_seconds  # noqa: E402
from padding import (  # noqa: E402
    checked,
    episodes,
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

    def forward(self, input_ids, attention_mask=None, cache=None, use_cache=None):
        # the teacher's KV cache by transformers 5.x's name
        cached = {} if cache is None else {"cache": cache, "use_cache": use_cache}
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, **cached)

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()


def teacher(model: torch.nn.Module):
    """The OPD teacher's ``Policy``, having asked the model whether it keeps some logits."""
    from thundersync.core.policy import Policy

    scorer = Policy(model)
    scorer._takes_keep_mask()
    return scorer


def step_seconds(model: torch.nn.Module, events, scorer) -> float:
    """A sync step of the batch, or with ``scorer`` (a teacher) its scoring of every turn, each
    episode's turns in order on its KV cache (the teacher worker's work for one step)."""
    if scorer is None:
        return learner_seconds(model, events, streaming=False)[0]
    started = time.perf_counter()
    for record in episodes(events):
        cache: dict = {}
        for turn in range(record.num_turns):
            scorer.score_turn(record.trajectory(turn), turn, cache)
    return time.perf_counter() - started


def head_rows(model: torch.nn.Module, events, scorer) -> int:
    """Rows the model's head projected in ``step_seconds``."""
    rows: list[int] = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _o: rows.append(args[0][..., 0].numel()))
    try:
        step_seconds(model, events, scorer)
    finally:
        hook.remove()
    return sum(rows)


def main(argv: list[str] | None = None) -> int:
    parser = pair_parser(__doc__.splitlines()[0])
    parser.add_argument(
        "--vocab", type=int, default=0, help="vocabulary size (0: the tiny tokenizer's)"
    )
    parser.add_argument(
        "--teacher", action="store_true", help="the OPD teacher's scoring instead of a sync step"
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
        scorers = {name: teacher(m) if args.teacher else None for name, m in models.items()}
        rows = {name: head_rows(m, events, scorers[name]) for name, m in models.items()}
        measured = interleaved(
            args.pairs,
            ("actions", "every"),
            lambda name: step_seconds(models[name], events, scorers[name]),
        )
    work = "teacher scoring" if args.teacher else "sync step"
    for name, times in measured.items():
        print(
            f"{name:<8} head rows {rows[name]:>6}; {work} median "
            f"{statistics.median(times) * 1000:.1f} ms"
        )
    who = "teacher" if args.teacher else "learner"
    label = f"every / actions {who} time (vocabulary {model.config.vocab_size})"
    print_ratio(label, measured["every"], measured["actions"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
