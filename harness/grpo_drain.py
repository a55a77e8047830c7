"""What one drain of a streaming GRPO learner costs, as ``StreamingGRPO.drain`` groups its work
(docs/design.md §3): the simulated learner's model of the real one's passes."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from harness.workload import Item, Workload, pass_seconds
from thundersync.core.holds import next_deposit
from thundersync.core.micro_batches import weight_classes


class GrpoDrain:
    """A step's trajectories as the learner sees them arrive (``see``), and the seconds each
    drain takes (``drain``). Of everything that has arrived: the trajectories of closed
    groups (every reward in) as one batch of finals (one backward per micro-batch); the
    rewarded ones of each open group as one deposit (``micro_batches.weight_classes``: those
    whose reward is the group's shift c, the first reward it deposited, and the rest, each a
    backward for Σ hᵢ and Σ cᵢhᵢ where its rewards are one, else a backward per sum; and one for
    Σ kᵢ with a KL term; a lone one, its own piece); with early start a piece of its own for
    each completed trajectory without a reward yet (whose reward then costs nothing more), or
    with ``split`` (early start within two buffers per open group) each open group's completed
    ones as one pass of Σ hᵢ (and Σ kᵢ), their rewards' halves (none where the reward is c) then
    a backward each per group, or once the group closes one batch with the finals' (none in a
    group of equal rewards). Each pass is charged by its trajectories' padded tokens
    (``pass_seconds``).

    As the training loop's learner does (``thundersync.core.holds``), a drain with finals
    leaves the open groups' deposits for the next drain, and one without runs one group's
    (``next_deposit``) and leaves the rest (``deferred``: the caller comes straight back);
    ``drain(defer=False)``, the step's, runs everything. The ski-rental hold of a group whose
    members are all being graded is not modelled."""

    def __init__(self, items: Sequence[Item], w: Workload) -> None:
        self.items, self.w = list(items), w
        self.members: dict[str, list[int]] = {}
        values: dict[str, set[float | None]] = {}
        for i, item in enumerate(self.items):
            self.members.setdefault(item.group, []).append(i)
            values.setdefault(item.group, set()).add(item.value)
        # a group of equal rewards has no advantage: its split rest costs nothing
        self.equal = {g for g, v in values.items() if len(v) == 1 and None not in v}
        self.order: dict[tuple[int, bool], int] = {}  # (item, rewarded) -> arrival number
        self.pieces: set[int] = set()
        self.halves: set[int] = set()
        self.left = set(range(len(self.items)))
        self.shifts: dict[str, float | None] = {}  # a group's c: its first reward deposited
        self.deferred = False  # the last drain left deposits for the next

    def see(self, index: int, *, rewarded: bool) -> None:
        """Item ``index`` completed (``rewarded`` False) or has its reward."""
        self.order.setdefault((index, rewarded), len(self.order))

    def _wake(self, i: int) -> int | None:
        """When (in arrival order) item i has work: its reward, or with early start, unless
        its piece or first half is done, its completion; None: not yet."""
        started = i in self.pieces or i in self.halves
        if self.w.early_start and not started and (i, False) in self.order:
            return self.order[(i, False)]
        return self.order.get((i, True))

    def _rewarded(self, i: int) -> bool:
        return (i, True) in self.order

    def _closed(self, group: str) -> bool:
        return all(self._rewarded(i) for i in self.members[group])

    def _weight(self, i: int) -> float | None:
        """rᵢ − c (None: unknown)."""
        value, shift = self.items[i].value, self.shifts.get(self.items[i].group, 0.0)
        return None if value is None or shift is None else value - shift

    def _weighted(self, group: Iterable[int]) -> list[int]:
        """The split items whose (rᵢ − c) hᵢ is not known to be 0."""
        return [i for i in group if self._weight(i) != 0.0]

    def _passes(self, groups: Iterable[list[int]], backwards: int, forwards: int) -> float:
        """One pass per group of item indices."""
        return sum(
            pass_seconds(
                [self.items[i].tokens for i in g], self.w, backwards=backwards, forwards=forwards
            )
            for g in groups
        )

    def drain(self, *, defer: bool = True) -> float:
        """The seconds of one drain of what has arrived (the class docstring)."""
        kl, split = int(self.w.kl), self.w.split
        ref = 1 + kl  # forwards of a pass that computes the KL term: the reference's too
        woken = sorted((k, i) for i in self.left if (k := self._wake(i)) is not None)
        t = 0.0
        finals: list[int] = []
        remainders: list[int] = []
        deposits: dict[str, list[int]] = {}
        seconds: dict[str, list[int]] = {}
        firsts: dict[str, list[int]] = {}
        for _, i in woken:
            group = self.items[i].group
            if i in self.pieces:  # its piece is added, scaled once the group closes: no pass
                self.left.discard(i)
            elif self._closed(group):
                (remainders if i in self.halves else finals).append(i)
            elif self._rewarded(i):
                (seconds if i in self.halves else deposits).setdefault(group, []).append(i)
            elif split:
                firsts.setdefault(group, []).append(i)
            else:  # early start: its piece now, in the drain's loop
                t += pass_seconds([self.items[i].tokens], self.w, backwards=1 + kl, forwards=ref)
                self.pieces.add(i)
        self.deferred = False
        if defer and deposits:
            unrewarded = {g: sum(not self._rewarded(i) for i in self.members[g]) for g in deposits}
            first = () if finals or remainders else (next_deposit(unrewarded),)
            self.deferred = len(first) < len(deposits)
            deposits = {g: members for g, members in deposits.items() if g in first}
        for gid, members in [*seconds.items(), *deposits.items()]:
            self.shifts.setdefault(gid, self.items[members[0]].value)
        for members in deposits.values():  # a lone one: its piece, one backward (and kᵢ)
            weights = [self._weight(i) for i in members]
            classes = weight_classes(weights) if len(members) > 1 else [([0], 0.0)]
            for indices, shared in classes:
                chosen = [members[k] for k in indices]
                t += self._passes([chosen], (1 if shared is not None else 2) + kl, ref)
            self.left.difference_update(members)
        t += self._passes(map(self._weighted, seconds.values()), 1, 1)
        t += self._passes(firsts.values(), 1 + kl, ref)
        for members in seconds.values():
            self.left.difference_update(members)
        for members in firsts.values():
            self.halves.update(members)
        self.left.difference_update(remainders)
        rest = self._weighted(i for i in remainders if self.items[i].group not in self.equal)
        for batch, forwards in ((rest, 1), (finals, ref)):
            if batch:
                t += self._passes([batch], 1, forwards)
                self.left.difference_update(batch)
        return t
