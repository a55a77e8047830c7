"""The rollout cores' load sampler (``thundersync/training/cpu_load.py``): what it reads from
``/proc/stat`` and what it records, on readings given by the test."""

from __future__ import annotations

from pathlib import Path

import pytest

from thundersync.training.cpu_load import CpuSampler, core_times

STAT = """cpu  900 0 300 1800 0 0 0 0 0 0
cpu0 100 0 100 700 100 0 0 0 0 0
cpu1 500 10 90 300 0 0 0 100 0 0
cpu2 300 0 100 800 0 0 0 0 0 0
intr 12345 0 0
"""


def test_core_times_sum_the_named_cores_busy_and_idle_ticks(tmp_path):
    """busy = user + nice + system + irq + softirq + steal; idle and iowait are not."""
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    # cpu0: total 1000, idle 800; cpu1: total 1000, idle 300
    assert core_times([0], stat) == (200, 1000)
    assert core_times([0, 1], stat) == (200 + 700, 2000)
    assert core_times([7], stat) is None  # no such core: nothing to read
    assert core_times([0], tmp_path / "missing") is None


def test_each_reading_is_the_busy_share_since_the_last_until_closed():
    """Readings (busy, total): (0, 0), (30, 100), (130, 200), then the source fails: two
    readings, 30 % and 100 %, each spanning the interval between its two reads."""
    ticks = iter([(0, 0), (0, 0), (30, 100), (130, 200), None])
    recorded: list[tuple[float, float, float, int]] = []
    sampler = CpuSampler(
        [0, 1], lambda *r: recorded.append(r), interval_s=0.0, times=lambda: next(ticks)
    )
    assert sampler.start()  # its first read (0, 0) says the source works
    sampler.close()  # the thread ended at None; close joins it
    shares = [r[2] for r in recorded]
    assert shares == [pytest.approx(0.3), pytest.approx(1.0)]
    assert all(r[3] == 2 for r in recorded)
    assert recorded[0][1] == recorded[1][0] and all(lo <= hi for lo, hi, *_ in recorded)


def test_nothing_is_sampled_where_the_cores_cannot_be_read():
    assert not CpuSampler([0], lambda *r: None, times=lambda: None).start()
    assert not CpuSampler([], lambda *r: None).start()


def test_a_run_folder_records_the_rollout_cores_load(tmp_path: Path):
    """Telemetry starts the sampler with the clock and writes its readings as ``cpu`` spans
    of the worker ``machine`` at the step's record, outside the step's busy window."""
    from thundersync.training.run_metrics import BatchTracker
    from thundersync.training.telemetry import Telemetry

    config = {"mode": "sync", "tensorboard": False, "wandb": None}
    telemetry = Telemetry(
        tmp_path, config | {"placed": {"learner_affinity": [0]}}, resume=False, start_step=0
    )
    telemetry.sampler.times = iter([(0, 0), (0, 0), (40, 100), None]).__next__
    telemetry.sampler.interval_s = 0.0
    telemetry.start_clock()
    telemetry.sampler.close()
    tracker = BatchTracker(step=0, episode_ids=frozenset(), needs_teacher=False)
    metrics = telemetry.step_record(0, tracker, {}, device="cpu")
    telemetry.close()
    spans = [line for line in (tmp_path / "spans.jsonl").read_text().splitlines()]
    assert len(spans) == 1 and '"name": "cpu"' in spans[0] and '"busy": 0.4' in spans[0]
    assert '"worker": "machine"' in spans[0] and "cpu" not in metrics["breakdown_s"]
