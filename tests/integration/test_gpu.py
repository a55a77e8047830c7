"""On a CUDA GPU (marked ``gpu``; skipped without one): the HF rollout engine keeps its
contract there — tokens a function of the seed and the weights only, log-probs of the model
it holds — and agrees with the same engine on the CPU; ``train --device cuda`` streams the
sync update bitwise, OPD's teacher scores there, and two GPU ranks (NCCL) give one
learner's weights."""

from __future__ import annotations

import json

import pytest
import torch

from tests.integration.training_kit import (
    final_weights,
    final_weights_of,
    metrics,
    noisy_copy,
    train,
)
from thundersync.training.engines.engine import GenerationRequest, SamplingParams
from thundersync.training.engines.hf import HFEngine

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"),
]


def requests(n: int, *, temperature: float = 1.0) -> list[GenerationRequest]:
    params = SamplingParams(12, temperature=temperature)
    return [GenerationRequest(tuple(range(5, 8 + i)), params, seed=i) for i in range(n)]


@pytest.fixture(scope="module")
def model_dir(tiny_model_dirs):
    return tiny_model_dirs["qwen3"]


def test_gpu_tokens_depend_on_the_seed_not_on_the_batch(model_dir):
    engine = HFEngine(model_dir, device="cuda", batch_invariant=True)
    reqs = requests(6)
    alone = [engine.generate([r])[0] for r in reqs]
    reordered = engine.generate(reqs[::-1])[::-1]
    assert [c.token_ids for c in reordered] == [c.token_ids for c in alone]
    again = engine.generate(reqs[:1])[0]
    assert again.token_ids == alone[0].token_ids


def test_gpu_engine_agrees_with_the_cpu_engine(model_dir):
    gpu = HFEngine(model_dir, device="cuda", batch_invariant=True)
    cpu = HFEngine(model_dir, batch_invariant=True)
    greedy = requests(4, temperature=0.0)
    assert [c.token_ids for c in gpu.generate(greedy)] == [
        c.token_ids for c in cpu.generate(greedy)
    ]
    for request in requests(4):
        on_gpu, on_cpu = gpu.generate([request])[0], cpu.generate([request])[0]
        n = next(
            (i for i, (a, b) in enumerate(zip(on_gpu.token_ids, on_cpu.token_ids)) if a != b),
            min(len(on_gpu.token_ids), len(on_cpu.token_ids)),
        )
        assert n >= 1, "the first sampled token differs"
        diffs = [abs(a - b) for a, b in zip(on_gpu.logprobs[:n], on_cpu.logprobs[:n])]
        assert max(diffs) < 1e-3


# --- training on GPUs ---------------------------------------------------------------------

GPU_RUN = [
    "--steps",
    "2",
    "--deterministic",
    "--seed",
    "0",
    "--env-kwargs",
    '{"tools": "python"}',
    "--tasks-per-step",
    "2",
    "--group-size",
    "4",
    "--max-new-tokens",
    "16",
    "--lr",
    "3e-3",
    "--device",
    "cuda",
]


def test_training_on_a_gpu_streams_the_sync_update_bitwise(warm_model, tmp_path):
    """Learner, KL reference and HF engine on the GPU; weights cross to the engine each step."""
    args = ["--model", str(warm_model), "--objective", '{"kl_coef": 0.04}', *GPU_RUN]
    train(tmp_path / "sync", "--mode", "sync", *args)
    train(tmp_path / "streaming", "--mode", "streaming", *args)
    a, b = final_weights(tmp_path / "sync"), final_weights(tmp_path / "streaming")
    initial = final_weights_of(warm_model)
    assert any(not torch.equal(a[k], initial[k]) for k in a), "training changed nothing"
    assert all(torch.equal(a[k], b[k]) for k in a)
    records = metrics(tmp_path / "streaming")
    assert all(m["learner"].get("max_staleness_seen", 0) == 0 for m in records)
    assert {m["learner"]["device"] for m in records} == {"cuda:0"}  # not the CPU after all


def test_opd_scores_turns_with_a_teacher_on_the_gpu(warm_model, tmp_path):
    student = noisy_copy(warm_model, tmp_path / "student")
    out = tmp_path / "opd"
    train(
        out,
        "--algo",
        "opd",
        "--model",
        str(student),
        "--teacher",
        str(warm_model),
        "--mode",
        "streaming",
        *GPU_RUN,
    )
    records = metrics(out)
    assert len(records) == 2 and all(m["teacher_kl"] is not None for m in records)
    spans = [json.loads(line) for line in (out / "spans.jsonl").read_text().splitlines()]
    scored = sum(1 for s in spans if s["name"] == "teacher")
    events = [json.loads(line) for line in (out / "events.jsonl").read_text().splitlines()]
    assert scored == sum(1 for e in events if e["event"] == "TurnCompleted")  # every turn


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_gpu_learner_ranks_over_nccl_give_one_learners_weights(warm_model, tmp_path):
    args = ["--model", str(warm_model), "--mode", "streaming", *GPU_RUN]
    train(tmp_path / "one", *args)
    train(tmp_path / "two", "--learner-ranks", "2", *args)
    a, b = final_weights(tmp_path / "one"), final_weights(tmp_path / "two")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert metrics(tmp_path / "two")[-1]["learner"]["world_size"] == 2


def test_eval_runs_a_checkpoint_on_the_gpu(model_dir, capsys):
    from thundersync.cli import main

    code = main(
        [
            "eval",
            "--env",
            "thundersync/ToySum-v0",
            "--env-kwargs",
            '{"tools": "python"}',
            "--checkpoint",
            str(model_dir),
            "--device",
            "cuda",
            "--tasks",
            "2",
            "--max-new-tokens",
            "8",
            "--no-leaderboard",
            "--json",
        ]
    )
    assert code == 0
    assert json.loads(capsys.readouterr().out)["num_attempts"] == 2
