"""The benchmark matrix's shape (``matrix.py``): its cells (the modes it runs) and its rows (the
workloads)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from thundersync.training.modes import REGISTRY, Mode, baseline_mode

STALENESS = (1, 2)
"""The staleness bounds the matrix runs a mode that takes one at (async)."""


@dataclass(frozen=True, slots=True)
class Cell:
    """One column of the matrix: a registered mode (``--mode``'s fields from the mode object),
    and for a streaming one early start, and early start holding every piece to its reward
    under a budget with room for them (``held``)."""

    mode: Mode
    early_start: bool = False
    held: bool = False

    @property
    def name(self) -> str:
        return self.mode.label + "-early" * self.early_start + "-held" * self.held

    @property
    def streams(self) -> bool:
        return self.mode.learner_contract().streams

    def flags(self) -> list[str]:
        fields = self.mode.train_fields().items()
        flags = [word for k, v in fields for word in (f"--{k.replace('_', '-')}", str(v))]
        if self.streams:
            flags.append("--early-start" if self.early_start else "--no-early-start")
        return flags


def _cells() -> dict[str, Cell]:
    """Every registered mode (one per staleness bound it takes), then a streaming mode's
    early-start variants, in the registry's order."""
    cells: list[Cell] = []
    for cls in REGISTRY:
        modes = [cls.from_label(cls.name, staleness=k) for k in STALENESS]
        for mode in {m.label: m for m in modes if m is not None}.values():
            cells.append(Cell(mode))
            if cells[-1].streams:
                cells += [Cell(mode, early_start=True), Cell(mode, early_start=True, held=True)]
    return {c.name: c for c in cells}


CELLS = _cells()
BASELINE = baseline_mode().label
"""The cell every ratio is against (sync)."""
STREAMING = next(name for name, c in CELLS.items() if c.streams and not c.early_start)
EARLY = next(name for name, c in CELLS.items() if c.early_start and not c.held)
HELD = next(name for name, c in CELLS.items() if c.held)
"""The streaming mode's cells the verdicts read: reward-triggered, early start, held."""
MODES = tuple(name for name, c in CELLS.items() if not c.held)


@dataclass(frozen=True, slots=True)
class Workload:
    """One row of the matrix: ToySum's latency knob and the algorithm."""

    name: str
    env_kwargs: dict[str, Any]
    algo: str = "grpo"
    modes: tuple[str, ...] = MODES
    warm: bool = True
    """Train the warm model (False: ``train``'s tiny random model, whose actions are all format
    errors, so every episode ends after the same turns, in the same generation batch)."""


WORKLOADS = {
    w.name: w
    for w in (
        Workload("balanced", {"tools": "python", "grade_latency_sigma": 1.0}),
        Workload(
            "long-tail",
            {
                "tools": "python",
                "tool_latency_s": 0.05,
                "tool_latency_sigma": 1.0,
                "grade_latency_s": 0.3,
                "grade_latency_sigma": 0.75,
            },
        ),
        Workload(
            "long-grading",
            {"tools": "python", "grade_latency_sigma": 0.25},
            modes=tuple(CELLS),
        ),
        Workload(
            "opd",
            {"tools": "python", "tool_latency_s": 0.1, "tool_latency_sigma": 0.5},
            algo="opd",
            modes=tuple(n for n, c in CELLS.items() if c.mode.exact and not c.early_start),
        ),
        Workload("no-overlap", {"tools": "python"}, warm=False),
    )
}
"""The matrix's rows. OPD has no async (the learner refuses off-policy OPD) and no early start
(its turns' gradients already start at each teacher score)."""


CROSS_SOURCES = (BASELINE, STREAMING)
"""The cells each cell is predicted from (``simulate --from``): the sync run, the streaming run."""
