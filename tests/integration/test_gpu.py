"""On a CUDA GPU (marked ``gpu``; skipped without one): the HF rollout engine keeps its
contract there — tokens a function of the seed and the weights only, log-probs of the model
it holds — and agrees with the same engine on the CPU."""

from __future__ import annotations

import pytest
import torch

from thundersync.training.engines.hf import HFEngine
from thundersync.training.engines.protocol import GenerationRequest, SamplingParams

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
        n = next((i for i, (a, b) in enumerate(zip(on_gpu.token_ids, on_cpu.token_ids))
                  if a != b), min(len(on_gpu.token_ids), len(on_cpu.token_ids)))  # fmt: skip
        assert n >= 1, "the first sampled token differs"
        diffs = [abs(a - b) for a, b in zip(on_gpu.logprobs[:n], on_cpu.logprobs[:n])]
        assert max(diffs) < 1e-3
