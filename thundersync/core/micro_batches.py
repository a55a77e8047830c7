"""Which trajectories share a padded micro-batch: the learner's batched passes
(``batch.micro_batches``) and the replay's cost model (``harness/critical_path.py``) both take
them from here, so that what the replay charges is what the learner computes. No torch.

A padded forward computes every row to its micro-batch's longest. An agentic batch's lengths
differ tenfold (ToySum: one-turn episodes of 45 tokens and eight-turn ones of 470), so rows are
taken shortest first, and a micro-batch ends at ``size`` rows or where the next row is more
than twice as long as its first: a micro-batch's padding is then under one token per real one.
Taken ``size`` at a time instead, seven one-turn rows and a long one computed four tokens per
real one (docs/measurements.md).
"""

from __future__ import annotations

from collections.abc import Sequence

SPREAD = 2
"""A micro-batch's longest row is at most this many times its shortest."""


def length_chunks(lengths: Sequence[int], size: int) -> list[list[int]]:
    """Indices into ``lengths``, shortest first (a stable sort: the same lengths always make
    the same micro-batches), cut at ``size`` rows or where a row is more than ``SPREAD``
    times the first of its micro-batch."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    chunks: list[list[int]] = []
    for i in order:
        chunk = chunks[-1] if chunks else None
        if chunk is None or len(chunk) >= size or lengths[i] > SPREAD * lengths[chunk[0]]:
            chunks.append([i])
        else:
            chunk.append(i)
    return chunks


def chunk_shapes(lengths: Sequence[int], size: int) -> list[tuple[int, int]]:
    """(rows, longest row) of each micro-batch ``length_chunks`` makes."""
    return [(len(chunk), max(lengths[i] for i in chunk)) for chunk in length_chunks(lengths, size)]


def weight_classes(weights: Sequence[float | None]) -> list[tuple[list[int], float | None]]:
    """A batched deposit's passes (``batch.piece_sums``, where both Σ cᵢhᵢ and Σ hᵢ are
    wanted) as indices into its rows' weights cᵢ = rᵢ − c, each with the weight its rows
    share (None: mixed, or unknown where a weight is None): the rows of weight 0 (the reward
    the group's shift c was taken from), then the rest. A pass of one weight takes one
    backward for both sums (Σ hᵢ, and the weight times it): a pass/fail group's deposit,
    whose weights are 0 and one other, takes half the backwards of one pass with a backward
    per sum, and never more."""
    zero = [i for i, w in enumerate(weights) if w == 0.0]
    rest = [i for i, w in enumerate(weights) if w != 0.0]
    shared = {weights[i] for i in rest}
    classes: list[tuple[list[int], float | None]] = [(zero, 0.0)] if zero else []
    if rest:
        classes.append((rest, shared.pop() if len(shared) == 1 else None))
    return classes
