"""``thundersync train`` end to end: real processes, real sandboxed ToySum episodes, a tiny
warm-started model. Sync and streaming give the same update; async trains on bounded-stale
tokens; OPD moves a student toward its teacher; a run killed with -9 resumes exactly."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from tests.integration.training_kit import (
    SMALL,
    descendants,
    final_weights,
    final_weights_of,
    kill_worker,
    metrics,
    noisy_copy,
    spawned_workers,
    start_until_first_checkpoint,
    token_events,
    train,
    wait_gone,
)
from thundersync.training.checkpoint import load_state

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]


def test_deterministic_sync_and_streaming_roll_out_the_same_tokens_and_weights(
    warm_model, tmp_path
):
    # seed 0: a group whose rewards differ at the first step, so the update is not zero
    args = ["--model", str(warm_model), "--steps", "3", "--deterministic", "--seed", "0", *SMALL]
    train(tmp_path / "sync", "--mode", "sync", *args)
    train(tmp_path / "streaming", "--mode", "streaming", *args)
    assert token_events(tmp_path / "sync") == token_events(tmp_path / "streaming")
    a, b = final_weights(tmp_path / "sync"), final_weights(tmp_path / "streaming")
    initial = final_weights_of(warm_model)
    assert any(not torch.equal(a[k], initial[k]) for k in a), "training changed nothing"
    assert all(torch.equal(a[k], b[k]) for k in a)
    for m in metrics(tmp_path / "streaming"):
        assert m["learner"].get("max_staleness_seen", 0) == 0
    assert [m["step"] for m in metrics(tmp_path / "sync")] == [1, 2, 3]
    assert {m["learner"]["device"] for m in metrics(tmp_path / "sync")} == {"cpu"}


def test_async_trains_on_bounded_stale_tokens_and_reports_clipping(warm_model, tmp_path):
    out = tmp_path / "async"
    train(
        out,
        "--mode",
        "async",
        "--staleness",
        "1",
        "--model",
        str(warm_model),
        "--steps",
        "3",
        *SMALL,
    )
    records = metrics(out)
    assert [m["step"] for m in records] == [1, 2, 3]
    for m in records:
        histogram = {int(k): v for k, v in m["learner"]["staleness_histogram"].items()}
        assert max(histogram) <= 1 and sum(histogram.values()) == m["num_action_tokens"]
        assert 0.0 <= m["learner"]["clip_fraction"] <= 1.0
    assert any(int(k) == 1 for m in records for k in m["learner"]["staleness_histogram"])


def test_a_killed_run_resumes_to_the_same_weights_and_leaves_nothing_running(warm_model, tmp_path):
    args = [
        "--mode",
        "streaming",
        "--model",
        str(warm_model),
        "--steps",
        "3",
        "--deterministic",
        "--seed",
        "5",
        *SMALL,
    ]
    train(tmp_path / "whole", *args)
    out = tmp_path / "killed"
    proc = start_until_first_checkpoint(out, *args)
    try:
        family = descendants(proc.pid)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    wait_gone(family)
    resumed = train(out, "--resume")
    assert "resuming after step 1" in resumed.stderr
    a, b = final_weights(tmp_path / "whole"), final_weights(out)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert [m["step"] for m in metrics(out)] == [1, 2, 3]


def test_ctrl_c_stops_a_run_cleanly_and_it_resumes(tmp_path):
    """SIGINT (what Ctrl-C sends): exit 130 with a one-line message, no traceback, every
    worker gone; the run continues from its last checkpoint with --resume."""
    out = tmp_path / "run"
    proc = start_until_first_checkpoint(out, "--steps", "50", *SMALL)
    family, stderr = kill_worker(proc, lambda _: proc.pid, signal.SIGINT)  # the trainer
    assert proc.returncode == 130, stderr
    assert "interrupted; continue with --resume: it starts after step-" in stderr
    assert "Traceback" not in stderr
    wait_gone(family)
    done = max(m["step"] for m in metrics(out))
    resumed = train(out, "--resume", "--steps", str(done + 1))
    assert f"resuming after step {done}" in resumed.stderr
    assert [m["step"] for m in metrics(out)] == list(range(1, done + 2))


def test_a_checkpoint_loads_with_auto_model_and_generates(warm_model, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "run"
    train(out, "--mode", "sync", "--model", str(warm_model), "--steps", "1", *SMALL)
    folder = sorted((out / "checkpoints").glob("step-*"))[-1]
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001"]
    model = AutoModelForCausalLM.from_pretrained(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    messages = [{"role": "user", "content": "Add red and blue."}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt")
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    generated = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert generated.shape[1] > ids.shape[1]
    state = load_state(folder)
    assert state["completed_steps"] == 1 and state["policy_version"] == 1


def test_resume_refuses_a_checkpoint_holding_another_steps_state(tmp_path):
    """step 1's trainer state copied over step 2's: resuming would say "after step 1" and
    apply update 2 twice (the folder's weights already hold it). It exits 2 naming both
    steps, before any step runs."""
    out = tmp_path / "run"
    small = ["--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]
    train(out, "--steps", "2", *small, "--env-kwargs", '{"tools": "python"}')
    checkpoints = out / "checkpoints"
    shutil.copyfile(
        checkpoints / "step-000001" / "trainer_state.pt",
        checkpoints / "step-000002" / "trainer_state.pt",
    )
    steps_before = metrics(out)
    proc = train(out, "--resume", "--steps", "3", check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr and "resuming after" not in proc.stderr
    (error,) = [line for line in proc.stderr.splitlines() if line.startswith("train: error:")]
    assert "step-000002" in error and "after step 1" in error and "step 2" in error, error
    assert sorted(p.name for p in checkpoints.glob("step-*")) == ["step-000001", "step-000002"]
    assert metrics(out) == steps_before


@pytest.mark.parametrize("strict", [False, None], ids=["strict-grading-off", "default"])
def test_training_without_strict_grading_says_so_and_the_run_keeps_it(tmp_path, strict):
    """Default grading runs the tests in the agent's own sandbox, which a policy can game
    (docs/design.md §6.1): a run that asks for it is allowed, but it says so on stderr at its
    start and its config.json keeps the warning. A strict run (the default) has none."""
    out = tmp_path / "run"
    env_kwargs = {"tools": "python"} | ({} if strict is None else {"strict_grading": strict})
    small = ["--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]
    proc = train(out, "--steps", "1", *small, "--env-kwargs", json.dumps(env_kwargs))
    warned = [line for line in proc.stderr.splitlines() if line.startswith("train: warning:")]
    recorded = json.loads((out / "config.json").read_text())["warnings"]
    if strict is None:
        assert warned == [] and recorded == []
        return
    assert len(warned) == 1 and "strict grading is off" in warned[0], proc.stderr
    assert proc.stderr.index(warned[0]) < proc.stderr.index("train: step 1/1"), "at the start"
    assert recorded == [warned[0].removeprefix("train: warning: ")]


def test_opd_moves_a_student_toward_its_teacher_with_per_turn_work(warm_model, tmp_path):
    student = noisy_copy(warm_model, tmp_path / "student")  # it still calls the tools
    out = tmp_path / "opd"
    train(
        out,
        "--algo",
        "opd",
        "--mode",
        "streaming",
        "--model",
        str(student),
        "--teacher",
        str(warm_model),
        "--steps",
        "4",
        "--objective",
        '{"granularity": "turn"}',
        "--env-kwargs",
        '{"tool_latency_s": 0.3}',
        "--tasks-per-step",
        "2",
        "--group-size",
        "4",
        "--max-new-tokens",
        "12",
        "--lr",
        "1e-3",
    )
    kl = [m["teacher_kl"] for m in metrics(out)]
    # the trend, not one step: each step draws other tasks, whose KL differs by itself
    assert all(k is not None for k in kl) and sum(kl[-2:]) / 2 < 0.9 * kl[0], kl
    # Per-turn work: each sampled turn is scored by the teacher, and its gradient is computed
    # on its own or, when the learner finds a whole episode ready before any of its turns was
    # done (a busy machine), with that episode in one batched pass (its span has no turn).
    # Whether the work overlaps the tool call in wall time depends on free cores, so it is
    # measured by benchmarks/, and its causes are tested deterministically in
    # tests/unit/thundersync/training/test_teacher.py and test_learner.py.
    spans = [json.loads(line) for line in (out / "spans.jsonl").read_text().splitlines()]
    turns = {(s["episode_id"], s["turn"]) for s in spans if s["name"] == "tool"}
    teacher = {(s["episode_id"], s["turn"]) for s in spans if s["name"] == "teacher"}
    backward = {(s["episode_id"], s["turn"]) for s in spans if s["name"] == "backward"}
    learned = {(e, t) for e, t in turns if (e, t) in backward or (e, None) in backward}
    assert turns and turns <= teacher and learned == turns, (turns - teacher, turns - learned)
    # each generation call's padded shape, which an engine cost model needs (multi-turn
    # prompts grow; a call of mixed turns computes every row to its longest)
    calls = [s["metrics"] for s in spans if s["name"] == "engine"]
    assert calls and all(0 < c["longest_completion"] <= 12 for c in calls), calls
    assert all(c["num_tokens"] <= c["batch_size"] * c["longest_completion"] for c in calls)
    assert all(
        c["longest_prompt"] <= c["prompt_tokens"] <= c["batch_size"] * c["longest_prompt"]
        for c in calls
    )
    assert max(c["longest_prompt"] for c in calls) > min(c["longest_prompt"] for c in calls)


def test_a_dead_rollout_worker_stops_the_run_with_a_clear_message(warm_model, tmp_path):
    out = tmp_path / "run"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "thundersync.cli",
            "train",
            "--out",
            str(out),
            "--mode",
            "streaming",
            "--model",
            str(warm_model),
            "--steps",
            "50",
            *SMALL,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoints" / "step-000001").is_dir():
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        workers = spawned_workers(proc.pid)
        assert workers
        family = descendants(proc.pid)
        os.kill(workers[0], signal.SIGKILL)
        _, stderr = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 1
    assert "rollout" in stderr and "--resume" in stderr and "Traceback" not in stderr
    wait_gone(family)


def test_metrics_reach_tensorboard_and_offline_wandb_under_the_same_names(
    warm_model, tmp_path, monkeypatch
):
    pytest.importorskip("tensorboard")
    pytest.importorskip("wandb")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    for name, value in {
        "WANDB_MODE": "offline",
        "WANDB_SILENT": "true",
        "WANDB_DIR": tmp_path,
        "WANDB_CONFIG_DIR": tmp_path / "wandb-config",
        "WANDB_CACHE_DIR": tmp_path / "wandb-cache",
    }.items():
        monkeypatch.setenv(name, str(value))
    train(
        out,
        "--mode",
        "sync",
        "--model",
        str(warm_model),
        "--steps",
        "2",
        "--tensorboard",
        "--wandb",
        *SMALL,
    )
    accumulator = EventAccumulator(str(out / "tensorboard"))
    accumulator.Reload()
    tags = set(accumulator.Tags()["scalars"])
    assert {"reward_mean", "learner/grad_norm", "step_time_s"} <= tags
    assert [e.step for e in accumulator.Scalars("learner/grad_norm")] == [1, 2]  # as named
    runs = list((out / "wandb").glob("offline-run-*/*.wandb"))
    assert runs and runs[0].stat().st_size > 0


def test_without_deterministic_the_first_update_still_matches_sync(warm_gpt2, tmp_path):
    """Summation order differs (streaming folds in arrival order), so the updates agree to
    rounding: float64 and plain SGD, where a gradient difference is an update difference.

    The warm GPT-2 solves few tasks, so a step's groups may all be equal (a zero update,
    nothing to compare): the first seed whose sync update is not zero is the one compared."""
    initial = final_weights_of(warm_gpt2)
    args = [
        "--model",
        str(warm_gpt2),
        "--steps",
        "1",
        "--dtype",
        "float64",
        "--optimizer",
        "sgd",
        "--lr",
        "0.5",
        "--max-grad-norm",
        "0",
        "--tasks-per-step",
        "4",
        "--group-size",
        "8",
        "--max-new-tokens",
        "16",
    ]

    def update(out: Path) -> torch.Tensor:
        weights = final_weights(out)
        return torch.cat(
            [(weights[k].double() - initial[k].double()).reshape(-1) for k in sorted(weights)]
        )

    for seed in ("11", "12", "13", "14", "15"):
        train(tmp_path / f"sync-{seed}", "--mode", "sync", "--seed", seed, *args)
        update_sync = update(tmp_path / f"sync-{seed}")
        if float(update_sync.norm()) > 0:
            break
    else:
        pytest.fail("no informative group in 5 seeds: the warm model solves no task")
    train(tmp_path / "streaming", "--mode", "streaming", "--seed", seed, *args)
    assert token_events(tmp_path / f"sync-{seed}") == token_events(tmp_path / "streaming")
    update_streaming = update(tmp_path / "streaming")
    relative = float((update_sync - update_streaming).norm() / update_sync.norm())
    assert relative <= 1e-12


def test_a_step_that_would_make_the_weights_non_finite_stops_the_run_cleanly(tmp_path):
    """lr=1e308 used to exit 0 with every checkpoint parameter NaN. Now the step stops the run
    with one line (exit 1), the last good checkpoint stays as it was, and every run file is
    strict JSON."""
    out = tmp_path / "run"
    tiny = [
        "--steps",
        "1",
        "--tasks-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--checkpoint-every",
        "1",
    ]
    train(out, *tiny)
    good = final_weights(out)
    assert all(torch.isfinite(w).all() for w in good.values())
    config = tmp_path / "overflow.toml"
    config.write_text(f'lr = 1e308\nsteps = 2\nout = "{out}"\n')
    proc = train(out, "--config", str(config), "--resume", check=False)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("train: error:")]
    assert len(error) == 1 and "non-finite" in error[0] and "step-000001" in error[0]
    assert sorted(p.name for p in (out / "checkpoints").glob("step-*")) == ["step-000001"]
    after = final_weights(out)
    assert all(torch.equal(good[k], after[k]) for k in good)
    for name in ("metrics.jsonl", "events.jsonl", "spans.jsonl", "config.json"):
        text = (out / name).read_text()
        records = text.splitlines() if name.endswith(".jsonl") else [text]
        for record in records:
            json.loads(record, parse_constant=_refuse)
    assert [m["step"] for m in metrics(out)] == [1]


def _refuse(constant: str) -> None:
    raise AssertionError(f"a run file holds {constant}, which strict JSON has not")


def test_one_step_numbering_and_progress_lines_through_a_pipe(tmp_path):
    """Step N is the N-th optimizer step everywhere: the console line, ``step-00000N``,
    metrics.jsonl, timeline and compare's checkpoint curve; through a pipe the start-up says
    what it does before step 1. An old run folder (metrics counted from 0) reads the same
    and resumes into one numbering."""
    from harness.compare import checkpoints

    out = tmp_path / "run"
    small = ["--tasks-per-step", "2", "--group-size", "2", "--max-new-tokens", "8"]
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "thundersync.cli",
            "train",
            "--out",
            str(out),
            "--steps",
            "2",
            *small,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout
    lines = proc.stdout.splitlines()
    order = [
        "train: loading the model",
        "train: starting the rollout worker",
        "train: workers ready",
        "train: rolling out step 1/2",
        "train: step 1/2: ",
        "train: step 2/2: ",
        "train: done",
    ]
    found = [next(i for i, line in enumerate(lines) if line.startswith(p)) for p in order]
    assert found == sorted(found), proc.stdout
    assert "solved 0% of 4 episodes (reward >= 1); wall-clock" in proc.stdout
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["step-000001", "step-000002"]
    records = metrics(out)
    assert [(m["step"], m["step_base"], m["learner"]["step"]) for m in records] == [
        (1, 1, 1),
        (2, 1, 2),
    ]
    for key in ("reward_std", "response_tokens_mean", "response_tokens_max"):
        assert key in records[0]
    for key in ("loss", "entropy_mean", "neg_logprob_mean", "kl_reference", "clip_fraction"):
        assert key in records[0]["learner"]
    times = [m["time_s"] for m in records]

    def timeline(step: int) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "thundersync.cli", "timeline", str(out), "--step", str(step)],
            capture_output=True,
            text=True,
        )

    for old in (False, True):
        if old:  # as a run folder written before step_base: steps counted from 0
            (out / "metrics.jsonl").write_text(
                "".join(
                    json.dumps(
                        {**{k: v for k, v in m.items() if k != "step_base"}, "step": m["step"] - 1}
                    )
                    + "\n"
                    for m in records
                )
            )
        assert [(s, t) for s, t, _ in checkpoints(out)] == [(1, times[0]), (2, times[1])]
        shown = timeline(2)
        assert shown.returncode == 0 and "chart of step 2 in" in shown.stdout, shown.stderr
        assert [line.split()[0] for line in shown.stdout.splitlines()[1:3]] == ["1", "2"]
        missing = timeline(3)
        assert missing.returncode == 2 and "no step 3 (steps 1..2)" in missing.stderr
    resumed = train(out, "--resume", "--steps", "3")
    assert "resuming after step 2" in resumed.stderr and "step 3/3: " in resumed.stderr
    assert [(m["step"], m.get("step_base")) for m in metrics(out)] == [(1, 1), (2, 1), (3, 1)]
