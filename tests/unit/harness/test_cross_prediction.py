"""Every mode predicted from one run of another (``simulate --from RUN``), on synthetic run
folders whose answer is worked out by hand, both directions."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from harness.contention import fit_contention, uncontended
from harness.critical_path import LearnerPass, step_windows
from harness.cross_prediction import predict_from_run, tied_pass_cost
from tests.unit.harness.run_folders import STREAMING_S, SYNC_S, two_mode_runs


@pytest.fixture
def runs(tmp_path) -> dict[str, Path]:
    return two_mode_runs(tmp_path)


@pytest.mark.parametrize("source", ["sync", "streaming"])
def test_each_mode_is_predicted_from_a_run_of_the_other(runs, source):
    """From the sync run (its batched step: 3 ms a token, split 1 : 2) streaming's pieces and
    finals are predicted; from the streaming run (its passes: 3 ms a token) sync's batch."""
    result = predict_from_run(runs[source])
    modes = result["modes"]
    assert modes["sync"]["step_time_s"] == pytest.approx(SYNC_S)
    assert modes["streaming"]["step_time_s"] == pytest.approx(STREAMING_S)
    assert modes[source]["error"] == pytest.approx(0.0, abs=1e-9)
    # async(1) rolls batch n+1 out while learning n (0.16 s), over the run's four steps:
    # steps end at 0.66, 0.82, 1.32 (batch 2 submitted at 0.66) and 1.48; the mean interval
    # once its pipeline is full, after step 2
    assert modes["async-k1"]["step_time_s"] == pytest.approx((1.48 - 0.82) / 2)
    assert not modes["async-k1"]["same_updates"] and modes["streaming"]["same_updates"]
    # async(3) keeps 4 batches in flight, which the run's 4 steps never get past: it is driven
    # one step more. Steps end at 0.66, 0.82, 0.98, 1.14 (all four batches ready at 0.5);
    # batch 4, submitted at 0.66, ready at 1.16, learned by 1.32: 0.18 s once full
    deep = predict_from_run(runs[source], staleness=(3,))["modes"]["async-k3"]["step_time_s"]
    assert deep == pytest.approx(1.32 - 1.14)
    # the time to the run's last step, all four predicted
    assert modes["streaming"]["time_to_step_s"] == pytest.approx(4 * STREAMING_S)
    own = {"sync": SYNC_S, "streaming": STREAMING_S}[source]
    assert result["measured_time_to_step_s"] == pytest.approx(4 * own)
    assert not result["contention"]["measured"]  # no engine spans to show it


def engine_span(lo: float, hi: float, tokens: int = 8, batch: int = 1) -> dict:
    return {"name": "engine", "started": lo, "finished": hi, "worker": "engine"} | {
        "metrics": {"batch_size": batch, "num_tokens": tokens}
    }


def test_contention_is_fitted_from_generation_during_the_learners_work(runs):
    """Each step, a generation batch of 8 decode steps inside the learner's 0.1 .. 0.13 s pass
    (30 ms) and one alone (15 ms): twice as slow beside the learner. The engine generates
    45 ms of each 0.5 s rollout (9 %), so rollout runs 1 + 0.09 times slower while the
    learner computes."""
    folder = runs["streaming"]
    lines = (folder / "spans.jsonl").read_text()
    windows = step_windows(folder)
    extra = []
    for w in windows:
        at = w.submitted_at
        extra += [engine_span(at + 0.1, at + 0.13), engine_span(at + 0.2, at + 0.215)]
    (folder / "spans.jsonl").write_text(lines + "".join(json.dumps(s) + "\n" for s in extra))
    busy = [(w.submitted_at + 0.1, w.submitted_at + 0.13) for w in windows]
    fitted = fit_contention(folder, windows, busy, None)
    assert fitted.measured and fitted.generation_slowdown == pytest.approx(2.0)
    assert fitted.engine_share == pytest.approx(0.09)
    assert fitted.kappa == pytest.approx(0.09)
    assert fit_contention(folder, windows, busy, 0.25).kappa == 0.25  # given: it wins
    # 0.5 s from the batch's start, 30 ms of it beside the learner at κ = 1: 15 ms were lost
    assert uncontended(0.5, 0.0, [(0.1, 0.13)], 1.0) == pytest.approx(0.5 - 0.015)


def test_simulate_from_a_run_prints_every_mode_and_takes_json(runs, capsys):
    from thundersync.cli import main

    assert main(["simulate", "--from", str(runs["sync"]), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["from_mode"] == "sync" and set(result["modes"]) == {
        "sync",
        "async-k1",
        "streaming",
    }
    assert main(["simulate", "--from", str(runs["streaming"])]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "simulate: every mode predicted from the streaming run streaming"
    assert out[-4].startswith("contention kappa 0.00: not measured in this run")
    assert out[-3].startswith("rollout load: not recorded in this run")  # no cpu spans
    assert result["loads"] == {"batches": 4, "said": 0, "mean_share": None}
    # the old form keeps its keys, each registered mode now predicted from the run's spans
    assert main(["simulate", "--workload", str(runs["streaming"]), "--json"]) == 0
    times = json.loads(capsys.readouterr().out)["step_time_s"]
    assert times["sync"] == pytest.approx(SYNC_S) and "bound" in times
    assert main(["simulate", "--from", str(runs["sync"].parent)]) == 2
    assert "not a run folder" in capsys.readouterr().err


def test_the_time_to_the_target_is_at_the_step_the_comparison_saw_it_reached(tmp_path, capsys):
    """Inside a comparison's folder (``runs/<mode>-seed<N>/``), ``--target`` reads the run's
    curve from ``results.json``: 0.3 at step 2 and 0.7 at step 4, so 0.6 is reached at step 4
    (every exact mode there too) and 0.2 at step 2; a target never reached is refused."""
    from thundersync.cli import main

    runs = two_mode_runs(tmp_path / "compare" / "runs")
    curve = [
        {"step": 2, "time_s": 1.0, "accuracy": 0.3},
        {"step": 4, "time_s": 2.0, "accuracy": 0.7},
    ]
    results = {"runs": [{"mode": "sync", "seed": 0, "folder": str(runs["sync"]), "curve": curve}]}
    (tmp_path / "compare" / "results.json").write_text(json.dumps(results))
    for target, step in ((0.6, 4), (0.2, 2)):
        assert (
            main(["simulate", "--from", str(runs["sync"]), "--target", str(target), "--json"]) == 0
        )
        result = json.loads(capsys.readouterr().out)
        assert result["at_step"] == step
        assert result["modes"]["streaming"]["time_to_step_s"] == pytest.approx(step * STREAMING_S)
    assert main(["simulate", "--from", str(runs["sync"]), "--target", "0.9"]) == 2
    assert "--target 0.9: no comparison's results.json" in capsys.readouterr().err


def test_a_streaming_runs_passes_charge_a_batched_pass_with_a_backward_at_two_forwards():
    """Passes shaped as the demo's (mostly a lone piece's two forwards and two backwards),
    each 0.5 ms a micro-batch plus 17 µs a forward token and 34 µs a backward one, timed with
    ±15 % noise: the tied fit gives back o and f, so sync's one batched pass of 4,000 padded
    tokens (two forwards, one backward, 8 micro-batches) is charged within 5 % of its cost."""
    rng = random.Random(7)
    o, f = 5e-4, 1.7e-5
    shapes = [(2, 2, 1)] * 30 + [(1, 1, 1)] * 10 + [(2, 1, 1), (1, 1, 2), (2, 2, 2)] * 3
    passes = []
    for forwards, backwards, micro in shapes:
        tokens = rng.randint(40, 400)
        cost = o * micro + tokens * (forwards + 2 * backwards) * f
        passes.append(
            LearnerPass(0.0, cost * rng.uniform(0.85, 1.15), 1, tokens, micro, backwards, forwards)
        )
    fitted_o, fitted_f = tied_pass_cost(passes)
    batched = 8 * fitted_o + 4000 * (2 + 2) * fitted_f
    assert batched == pytest.approx(8 * o + 4000 * 4 * f, rel=0.05)
    exact = [
        LearnerPass(
            0.0,
            o * p.micro_batches + p.padded_tokens * (p.forwards + 2 * p.backwards) * f,
            1,
            p.padded_tokens,
            p.micro_batches,
            p.backwards,
            p.forwards,
        )
        for p in passes
    ]
    assert tied_pass_cost(exact) == pytest.approx((o, f), rel=1e-9)


def cpu_span(lo: float, hi: float, busy: float) -> dict:
    return {"name": "cpu", "started": lo, "finished": hi, "worker": "machine"} | {
        "metrics": {"busy": busy, "cores": 2}
    }


@pytest.mark.parametrize(("share", "async_step"), [(1.0, 0.5), (0.4, (1.48 - 0.82) / 2)])
def test_async_predicted_from_a_sync_run_shares_the_cores_its_batches_kept_busy(
    runs, share, async_step
):
    """The sync run's rollout kept its cores busy at ``share`` (two readings per batch while
    it rolled out alone; a third, during the learner's step, is not the rollout's). At 1,
    async(1)'s two batches in flight share them: batches 0 and 1 both ready at 1.0 (half
    speed), learned 1.0..1.16 and 1.16..1.32; from then each new batch runs alone for 0.16 s
    and at half speed beside the next, so the run's last two steps end at 2.16 and 2.32: 0.5 s
    a step once full. At 0.4 the two add to 0.8: as without readings (the first test's). The
    learner's own reading, during its step, is its load ℓ (0 here: it slows nobody)."""
    folder = runs["sync"]
    add_readings(folder, share, learner=0.0)
    result = predict_from_run(folder)
    modes = result["modes"]
    assert result["learner_load"] == 0.0
    assert modes["async-k1"]["step_time_s"] == pytest.approx(async_step)
    assert modes["sync"]["step_time_s"] == pytest.approx(SYNC_S)  # one batch: no sharing
    assert modes["streaming"]["step_time_s"] == pytest.approx(STREAMING_S)


def add_readings(folder, share: float, learner: float) -> None:
    """Two readings of ``share`` per batch while it rolls out, one of ``learner`` during the
    learner's step."""
    extra = []
    for w in step_windows(folder):
        at = w.submitted_at
        extra += [cpu_span(at, at + 0.25, share), cpu_span(at + 0.25, at + 0.5, share)]
        extra.append(cpu_span(at + 0.5, at + 0.61, learner))
    with (folder / "spans.jsonl").open("a") as spans:
        spans.writelines(json.dumps(s) + "\n" for s in extra)


def test_a_sync_runs_learner_load_slows_async_s_learner_beside_a_rollout(runs, tmp_path):
    """The same sync run with the learner's step read at 0.5 of the cores: beside a batch
    that fills them, async(1)'s learner and that batch share them (1.5: each slower), so
    its step is longer than where the learner asks nothing; sync, never overlapping, the
    same. A value given for κ (``contention``) is used instead of the loads."""
    steps = {}
    for learner in (0.0, 0.5):
        folder = tmp_path / f"sync-{learner}"
        shutil.copytree(runs["sync"], folder)
        add_readings(folder, 1.0, learner=learner)
        result = predict_from_run(folder)
        assert result["learner_load"] == learner
        steps[learner] = result["modes"]
    assert steps[0.5]["async-k1"]["step_time_s"] > steps[0.0]["async-k1"]["step_time_s"] * 1.05
    assert steps[0.5]["sync"]["step_time_s"] == pytest.approx(steps[0.0]["sync"]["step_time_s"])
    assert predict_from_run(tmp_path / "sync-0.5", contention=0.0)["learner_load"] is None


def test_batches_that_shared_the_cores_are_taken_back_to_their_time_alone(tmp_path):
    """An async run's two batches rolled out together over 0..1 s with the cores full (two
    readings of 1.0), then one alone at 0.8 (1..1.2 s); a reading during the learner's work
    (1.2..1.4) is left out. Alone a batch asks 0.8 of the cores, so two ask 1.6: each ran at
    1/1.6 of its speed and lost 1 − 1/1.6 of each second. A reading below full (0.6 of two
    batches, 2..2.5 s) slowed nobody (each asked 0.3). A batch whose readings cover a quarter
    of its rollout (3..4 s) has no load said: too few to be its own."""
    from harness.contention import rollout_sharing
    from harness.critical_path import StepWindow

    spans = [cpu_span(0.0, 0.5, 1.0), cpu_span(0.5, 1.0, 1.0), cpu_span(1.0, 1.2, 0.8)]
    spans += [cpu_span(1.2, 1.4, 0.1), cpu_span(2.0, 2.5, 0.6)]
    spans.append(cpu_span(3.0, 3.25, 0.8))
    (tmp_path / "spans.jsonl").write_text("".join(json.dumps(s) + "\n" for s in spans))
    windows = [
        StepWindow(1, 0.0, 1.4, (0.9, 1.0), {}),
        StepWindow(2, 0.0, 1.6, (1.2,), {}),
        StepWindow(3, 2.0, 3.0, (2.5,), {}),
        StepWindow(4, 2.0, 3.2, (2.5,), {}),
        StepWindow(5, 3.0, 4.2, (4.0,), {}),
    ]
    sharing = rollout_sharing(tmp_path, windows, [(1.2, 1.4)])
    assert sharing.alone == pytest.approx(0.8)
    assert [r[3] for r in sharing.readings] == [2, 2, 1, 2, 1]  # the learner's reading is out
    assert sharing.lost(0.0, 1.0) == pytest.approx(1.0 - 1.0 / 1.6)
    assert sharing.lost(0.0, 1.2) == sharing.lost(0.0, 1.0)  # alone, nothing lost
    assert sharing.lost(2.0, 2.5) == 0.0
    loads = sharing.loads(windows, lambda w, t: t)
    assert loads[2] == ((0.5, pytest.approx(0.3)),)  # its reading, split between two
    assert loads[0] == ((0.5, pytest.approx(0.8)), (1.0, pytest.approx(0.8)))
    assert loads[4] == ((0.0, 0.0),)  # a quarter covered: not said
