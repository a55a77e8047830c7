"""The benchmark matrix's glue (``benchmarks/matrix.py``) on synthetic run folders."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from tests.unit.harness.run_folders import STREAMING_S, sync_step, two_mode_runs, write_run

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def matrix(monkeypatch):
    """``benchmarks/matrix.py`` as a module (its dataclasses need it in ``sys.modules``)."""
    spec = importlib.util.spec_from_file_location("matrix", ROOT / "benchmarks" / "matrix.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "matrix", module)
    spec.loader.exec_module(module)
    return module


def matrix_run(matrix, out: Path, mode: str, last_reward: float = 1.0) -> Path:
    """A synthetic run folder of one matrix cell, as ``thundersync train`` would leave it: six
    steps of two rewards (the last ``last_reward`` s in, the step ending 0.55 s after it)."""
    cell = matrix.CELLS[mode]
    config = {"staleness": 1, **cell.mode.train_fields(), "tasks_per_step": 1}
    config["early_start"] = cell.early_start
    steps = []
    for n in range(6):
        step = sync_step(4.0 * n, (0.5, last_reward))
        if cell.streams:
            step["spans"].insert(0, ("backward", 4.0 * n + 0.5, 4.0 * n + 0.6))
        step["completed"] = (4.0 * n + 0.2, 4.0 * n + 0.3)
        steps.append(step)
    run = write_run(out, config, steps)
    learner = {"peak_buffer_bytes": 200, "buffer_bytes": 100}
    lines = [
        {**json.loads(line), "learner": learner}
        | {"learner_idle_fraction": 0.5, "engine_idle_fraction": 0.25}
        for line in (run / "metrics.jsonl").read_text().splitlines()
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in lines))
    return run


def test_the_matrix_reads_each_cell_and_prints_every_verdict(matrix, tmp_path, monkeypatch, capsys):
    """The benchmark's glue on synthetic runs (its ``train`` replaced): every workload's row,
    the bounds, memory and the simulator's error reach the table and the verdicts."""

    def fake_train(out, model, workload, mode, args, extra=None):
        return matrix_run(matrix, out, mode)

    monkeypatch.setattr(matrix, "train", fake_train)
    args = matrix.argparse.Namespace(
        workloads=list(matrix.WORKLOADS), budget=True, tasks=1, group=2, steps=6, seed=0, repeats=1
    )
    result = matrix.run_matrix(tmp_path / "model", tmp_path, args)
    assert set(result["workloads"]) == set(matrix.WORKLOADS)
    streaming = result["workloads"]["long-tail"]["modes"]["streaming"]
    assert streaming["peak_accumulators"] == 2.0 and "efficiency_strict" in streaming
    assert result["budget"]["budget_bytes"] == 300
    matrix.print_matrix(result)
    out = capsys.readouterr().out
    for expected in (
        "balanced T_sync/T_streaming",
        "the strict bound allows",
        "long-grading early start",
        "holding every piece",
        "no-overlap T_streaming/T_sync",
        "budget held: True",
        "simulator worst error",
    ):
        assert expected in out
    assert "per repeat" not in out


def test_repeats_alternate_the_modes_order_and_pair_each_ratio_within_its_repeat(
    matrix, tmp_path, monkeypatch, capsys
):
    """With ``--repeats`` the modes run in turn, in order then reversed (the machine's drift
    hits each alike), and T_sync/T is the median of the ratios paired within each repeat: a
    slow moment of the machine slows both runs of its repeat, not one mode's median."""
    last_reward = {"sync": [1.0, 2.0, 3.0], "streaming": [1.5, 0.5, 2.9]}  # step: + 0.55 s
    calls = []

    def fake_train(out, model, workload, mode, args, extra=None):
        repeat = int(out.parent.name.removeprefix("repeat-"))
        calls.append((repeat, mode))
        return matrix_run(matrix, out, mode, last_reward[mode][repeat])

    monkeypatch.setattr(matrix, "train", fake_train)
    workload = matrix.Workload("no-overlap", {"tools": "python"}, modes=("sync", "streaming"))
    args = matrix.argparse.Namespace(steps=6, repeats=3)
    row = matrix.run_row(tmp_path / "model", tmp_path, workload, args)
    in_order, reversed_ = [(0, "sync"), (0, "streaming")], [(1, "streaming"), (1, "sync")]
    assert calls == [*in_order, *reversed_, (2, "sync"), (2, "streaming")]
    streaming = row["modes"]["streaming"]
    # step times: sync 1.55, 2.55, 3.55 and streaming 2.05, 1.05, 3.45; paired ratios
    # 0.756, 2.43, 1.029 (a ratio of the medians would say 2.55 / 2.05 = 1.244)
    assert streaming["repeat_speedups"] == pytest.approx([1.55 / 2.05, 2.55 / 1.05, 3.55 / 3.45])
    assert streaming["speedup_vs_sync"] == pytest.approx(3.55 / 3.45)
    assert streaming["step_time_s"] == pytest.approx(3.45)  # the median run's own numbers
    assert row["modes"]["sync"]["step_time_s"] == pytest.approx(2.55)
    assert matrix.paired(streaming, row["modes"]["sync"]) == pytest.approx(3.45 / 3.55)
    matrix.print_matrix({"workloads": {"no-overlap": row}, "repeats": 3})
    out = capsys.readouterr().out
    assert "T_sync/T per repeat: streaming 0.76, 2.43, 1.03" in out
    assert "no-overlap T_streaming/T_sync 0.972" in out


def test_the_cells_are_the_registered_modes_with_the_flags_train_takes(matrix):
    """Each registered mode is a cell (async once per staleness bound), streaming's early-start
    variants beside it, each cell's flags what ``thundersync train`` parses for that mode."""
    from thundersync.cli import build_parser

    assert list(matrix.CELLS) == [
        "sync",
        "async-k1",
        "async-k2",
        "streaming",
        "streaming-early",
        "streaming-early-held",
    ]
    assert matrix.WORKLOADS["opd"].modes == ("sync", "streaming")  # OPD: exact, no early start
    for name, cell in matrix.CELLS.items():
        args = build_parser().parse_args(["train", *cell.flags()])
        assert args.mode == cell.mode.name, name
        assert bool(args.early_start) == cell.early_start, name  # None: the mode's default
        assert str(args.staleness) == str(getattr(cell.mode, "staleness", args.staleness)), name


def test_each_cell_is_predicted_from_the_rows_sync_and_streaming_runs(matrix, tmp_path):
    """A row's sync run and its streaming run each predict every cell (synthetic runs whose
    answer is worked out in ``run_folders.two_mode_runs``); a cell the prediction does not
    model says why, and the table prints each error."""
    runs = two_mode_runs(tmp_path)
    cross = matrix.cross_predictions(runs, matrix.STREAMING, STREAMING_S)
    assert set(cross) == {matrix.BASELINE, matrix.STREAMING}
    for predicted in cross.values():
        assert predicted["predicted_step_time_s"] == pytest.approx(STREAMING_S)
        assert predicted["error"] == pytest.approx(0.0, abs=1e-9)
    held = matrix.cross_predictions(runs, matrix.HELD, STREAMING_S)
    assert all(isinstance(why, str) for why in held.values())
    assert matrix.cross_error({"cross": cross}, matrix.BASELINE) in ("+0%", "-0%")
    assert matrix.cross_error({"cross": held}, matrix.BASELINE) == "-"
