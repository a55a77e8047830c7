"""How busy the rollout's cores are while a run trains: a sampler of ``/proc/stat``.

Every ``INTERVAL_S`` a daemon thread reads the busy and total time of each core the rollout
may use (the run's placement: every core colocated, the rollout's own disaggregated) and keeps
the busy share since its last reading. ``Telemetry`` writes each reading as a span (``cpu``,
worker ``machine``, ``metrics={"busy": share, "cores": n}``) to ``spans.jsonl``.

What reads it: the simulator (``harness/contention.py``), to know whether two batches rolling
out at once would slow each other. Where one batch's rollout already keeps its cores busy (a
terminal task's graders on two cores), a second batch beside it halves both; where it leaves
them idle (tools that wait), both run at full speed (docs/design.md §4). The share is the
whole machine's use of those cores, other processes' included: on a shared machine that is
what the rollout competes with too. Linux only; elsewhere nothing is recorded.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from thundersync.protocol import events as ev

INTERVAL_S = 0.25
"""Between readings: short enough to see a batch's tail (a step of the demo is 1–4 s), and
four reads of a small file a second cost nothing measurable."""

STAT = Path("/proc/stat")


def core_times(cores: Sequence[int], stat: Path = STAT) -> tuple[int, int] | None:
    """(busy, total) clock ticks summed over ``cores`` since boot; None where unreadable."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    wanted, busy, total = {f"cpu{c}" for c in cores}, 0, 0
    for line in lines:
        name, *fields = line.split()
        if name in wanted:
            ticks = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle = ticks[3] + ticks[4]
            total += sum(ticks)
            busy += sum(ticks) - idle
    return (busy, total) if total else None


class CpuSampler:
    """Calls ``record(started, finished, busy_share, cores)`` for each reading, from its own
    thread, until ``close`` (or until ``times``, the cores' (busy, total) ticks, fails)."""

    def __init__(
        self,
        cores: Sequence[int],
        record: Callable[[float, float, float, int], None],
        *,
        interval_s: float = INTERVAL_S,
        times: Callable[[], tuple[int, int] | None] | None = None,
    ) -> None:
        self.cores, self.record, self.interval_s = tuple(cores), record, interval_s
        self.times = times or (lambda: core_times(self.cores))
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Start sampling; False (and nothing started) where ``/proc/stat`` is unreadable."""
        if not self.cores or self.times() is None:
            return False
        self._thread = threading.Thread(target=self._loop, name="cpu-sampler", daemon=True)
        self._thread.start()
        return True

    def _loop(self) -> None:
        last, at = self.times(), ev.now()
        while not self._stop.wait(self.interval_s):
            now_times, now = self.times(), ev.now()
            if last is None or now_times is None:
                return
            total = now_times[1] - last[1]
            if total > 0:
                self.record(at, now, (now_times[0] - last[0]) / total, len(self.cores))
            last, at = now_times, now

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
