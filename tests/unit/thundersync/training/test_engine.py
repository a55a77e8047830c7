"""HFEngine and DynamicBatcher: seeded, batch-invariant sampling; log-probs of the sampling
distribution; in-place weight loads between batches; failures reach every waiter."""

from __future__ import annotations

import threading
import time

import pytest
import torch

from thundersync.models import load_model
from thundersync.training.engines.batcher import DynamicBatcher, EngineClosedError
from thundersync.training.engines.engine import GenerationRequest, SamplingParams, request_seed
from thundersync.training.engines.hf import HFEngine


def requests(n: int, *, max_new: int = 12, stop: tuple[int, ...] = ()) -> list:
    return [
        GenerationRequest(tuple(range(5, 8 + i)), SamplingParams(max_new, stop_ids=stop), seed=i)
        for i in range(n)
    ]


@pytest.fixture(scope="module")
def engine_dir(tiny_model_dirs):
    return tiny_model_dirs["qwen3"]


def test_tokens_depend_on_the_seed_not_on_the_batch(engine_dir):
    batched = HFEngine(engine_dir)
    invariant = HFEngine(engine_dir, batch_invariant=True)
    reqs = requests(6)
    together = batched.generate(reqs)
    alone = [invariant.generate([r])[0] for r in reqs]
    reordered = invariant.generate(reqs[::-1])[::-1]
    assert [c.token_ids for c in reordered] == [c.token_ids for c in alone]
    assert [c.token_ids for c in together] == [c.token_ids for c in alone]
    reseeded = invariant.generate([GenerationRequest(reqs[0].prompt_ids, reqs[0].params, 99)])
    assert reseeded[0].token_ids != alone[0].token_ids


def test_logprobs_are_the_models_and_limits_hold(engine_dir):
    engine = HFEngine(engine_dir, batch_invariant=True)
    request = requests(1, max_new=10)[0]
    completion = engine.generate([request])[0]
    assert len(completion.token_ids) == 10 and completion.finish_reason == "length"
    model = load_model(engine_dir)
    ids = torch.tensor([list(request.prompt_ids) + list(completion.token_ids)])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1], dim=-1)
    start = len(request.prompt_ids) - 1
    expected = [float(logp[start + i, t]) for i, t in enumerate(completion.token_ids)]
    assert max(abs(a - b) for a, b in zip(expected, completion.logprobs)) < 1e-4
    first = completion.token_ids[0]
    stopped = engine.generate([requests(1, max_new=10, stop=(first,))[0]])[0]
    assert stopped.token_ids == (first,) and stopped.finish_reason == "stop"
    with pytest.raises(ValueError, match="exceed the context"):
        engine.generate([requests(1, max_new=engine.max_context)[0]])


def test_greedy_sampling_takes_the_argmax(engine_dir):
    engine = HFEngine(engine_dir)
    request = GenerationRequest((5, 6, 7), SamplingParams(4, temperature=0.0), seed=1)
    again = GenerationRequest((5, 6, 7), SamplingParams(4, temperature=0.0), seed=2)
    assert engine.generate([request])[0].token_ids == engine.generate([again])[0].token_ids


@pytest.mark.parametrize("vocab", [7, 400, 32000])
def test_a_batch_draws_each_rows_token_as_multinomial_does_with_its_generator(engine_dir, vocab):
    """The reference is ``torch.multinomial`` on each live row alone, with that row's
    generator: the same tokens and log-probs bitwise, and every generator left in the same
    state (the next draw is the same too)."""
    engine = HFEngine(engine_dir)
    temperatures = [1.0, 0.7, 0.0, 1.0, 1.3, 1.0, 0.0, 0.7, 1.0]
    live = [True, True, True, False, True, True, True, True, True]
    reqs = [
        GenerationRequest((5,), SamplingParams(4, temperature=t), seed=i)
        for i, t in enumerate(temperatures)
    ]
    for trial in range(20):
        logits_BV = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(trial))
        logits_BV *= trial % 5 + 0.5
        ours = [torch.Generator().manual_seed(100 * trial + b) for b in range(len(reqs))]
        theirs = [torch.Generator().manual_seed(100 * trial + b) for b in range(len(reqs))]
        tokens, logprobs = [[] for _ in reqs], [[] for _ in reqs]
        next_B = engine._sample(logits_BV, reqs, ours, live, tokens, logprobs)
        for b, request in enumerate(reqs):
            if not live[b]:
                assert tokens[b] == [] and int(next_B[b]) == engine.pad_id
                continue
            t = request.params.temperature
            logp_V = torch.log_softmax(logits_BV[b] / t if t > 0 else logits_BV[b], dim=-1)
            if t > 0:
                token = int(torch.multinomial(logp_V.exp(), 1, generator=theirs[b]))
            else:
                token = int(logp_V.argmax())
            assert tokens[b] == [token] and int(next_B[b]) == token
            assert logprobs[b] == [float(logp_V[token])]
            assert torch.equal(ours[b].get_state(), theirs[b].get_state())
    broken = torch.full((len(reqs), vocab), float("nan"))
    with pytest.raises(RuntimeError, match="nan"):
        engine._sample(broken, reqs, ours, live, [[] for _ in reqs], [[] for _ in reqs])


@pytest.mark.parametrize("arch", ["qwen3", "gpt2"])
def test_the_prefill_projects_only_each_prompts_last_position(tiny_model_dirs, arch):
    engine = HFEngine(tiny_model_dirs[arch])
    positions: list[int] = []
    head = engine.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _out: positions.append(args[0].shape[1]))
    try:
        engine.generate(requests(3, max_new=4))
    finally:
        hook.remove()
    assert positions == [1, 1, 1, 1]


def test_loaded_weights_change_the_output_and_the_version(engine_dir):
    engine = HFEngine(engine_dir, batch_invariant=True)
    before = engine.generate(requests(2))
    flat = torch.cat([p.detach().reshape(-1) for p in engine.params])
    engine.load_weights(torch.randn_like(flat), policy_version=3)
    after = engine.generate(requests(2))
    assert after[0].policy_version == 3 and before[0].policy_version == 0
    assert [c.token_ids for c in after] != [c.token_ids for c in before]
    with pytest.raises(ValueError, match="values for"):
        engine.load_weights(flat[:-1], policy_version=4)


def test_request_seeds_are_a_function_of_seed_episode_and_turn():
    assert request_seed(0, "s1-g0-e0", 2) == request_seed(0, "s1-g0-e0", 2)
    seeds = {
        request_seed(s, e, t) for s in (0, 1) for e in ("s0-g0-e0", "s0-g0-e1") for t in (0, 1)
    }
    assert len(seeds) == 8


class SlowEngine:
    """Records batch sizes; each batch takes a while, so requests queue up behind it."""

    policy_version = 0
    max_context = 100

    def __init__(self, fail: bool = False) -> None:
        self.batches: list[int] = []
        self.fail = fail

    def generate(self, reqs):
        if self.fail:
            raise RuntimeError("engine died")
        self.batches.append(len(reqs))
        time.sleep(0.05)
        from thundersync.training.engines.engine import Completion

        return [Completion((1,), (-0.1,), "length", self.policy_version) for _ in reqs]


def test_requests_that_wait_together_are_generated_together():
    engine = SlowEngine()
    batcher = DynamicBatcher(engine, window_s=0.02, max_batch_size=8)
    threads = [threading.Thread(target=batcher.generate, args=(r,)) for r in requests(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    batcher.close()
    assert sum(engine.batches) == 8 and len(engine.batches) < 8


def test_a_batch_keeps_gathering_while_requests_keep_arriving():
    """Requests 40 ms apart with a 100 ms window: each arrives within a window of the last, so
    they form one batch although the last comes 120 ms after the first."""
    engine = SlowEngine()
    batcher = DynamicBatcher(engine, window_s=0.1, max_batch_size=8)
    threads = [threading.Thread(target=batcher.generate, args=(r,)) for r in requests(4)]
    for t in threads:
        t.start()
        time.sleep(0.04)
    for t in threads:
        t.join()
    batcher.close()
    assert engine.batches == [4]


def test_a_batch_closes_once_every_live_requester_has_asked_not_at_the_window():
    """Three episodes in flight, all waiting on the engine: nobody else can add to the batch,
    so it runs at once (the 60 s window would otherwise hold it). When one episode ends, the
    next batch needs only the two left."""
    engine = SlowEngine()
    batcher = DynamicBatcher(engine, window_s=60.0, max_batch_size=8)
    done: list = []

    def episode(turns: int, request) -> None:
        try:
            for _ in range(turns):
                done.append(batcher.generate(request))
        finally:
            batcher.leave()

    threads = []
    for turns, request in zip((2, 2, 1), requests(3)):
        batcher.join()
        threads.append(threading.Thread(target=episode, args=(turns, request), daemon=True))
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=20)
    batcher.close()
    assert len(done) == 5, "a batch waited out its window for a caller that was not coming"
    assert engine.batches == [3, 2]


def test_a_batch_does_not_wait_for_a_requester_that_is_away():
    """Three episodes in flight; one is inside a sandboxed command (``away``) and will not ask
    until it is ``back``: the other two's requests run at once, not after the 60 s window; once
    they have ended, the third's runs when it asks."""
    engine = SlowEngine()
    batcher = DynamicBatcher(engine, window_s=60.0, max_batch_size=8)
    for _ in range(3):
        batcher.join()
    batcher.away()
    first = [batcher.submit(r) for r in requests(2)]
    assert all(f.result(timeout=20) for f in first), "a batch waited for the caller away"
    batcher.leave()
    batcher.leave()
    batcher.back()
    assert batcher.submit(requests(1)[0]).result(timeout=20)
    batcher.leave()
    batcher.close()
    assert engine.batches == [2, 1]


def test_a_caller_whose_request_was_submitted_then_away_is_not_waited_for_until_back():
    """Two episodes in flight whose next calls are tools' (``then_away``): once their batch is
    settled, the batcher counts them away, so a third caller's request runs at once instead of
    waiting the 60 s window for two callers inside their tools; ``back()`` ends it, and the
    next batch waits for them again."""
    engine = SlowEngine()
    batcher = DynamicBatcher(engine, window_s=60.0, max_batch_size=8)
    for _ in range(3):
        batcher.join()
    batcher.away()  # the third is in its first tool call
    first = [batcher.submit(r, then_away=True) for r in requests(2)]
    assert all(f.result(timeout=20) for f in first)
    batcher.back()
    alone = batcher.submit(requests(1)[0])
    assert alone.result(timeout=20), "a batch waited for callers counted away by then_away"
    batcher.back()
    batcher.back()  # both back from their tools: the next batch waits for all three
    later = [batcher.submit(r) for r in requests(2)]
    with pytest.raises(TimeoutError):
        later[0].result(timeout=0.2)
    later.append(batcher.submit(requests(1)[0]))
    assert all(f.result(timeout=20) for f in later)
    for _ in range(3):
        batcher.leave()
    batcher.close()
    assert engine.batches == [2, 1, 3]


def test_a_call_runs_between_batches_and_a_dead_engine_fails_every_waiter():
    engine = SlowEngine()
    batcher = DynamicBatcher(engine, window_s=0.0)
    batcher.generate(requests(1)[0])
    assert batcher.call(lambda e: setattr(e, "policy_version", 5)) is None
    assert batcher.generate(requests(1)[0]).policy_version == 5
    batcher.close()
    with pytest.raises(EngineClosedError):
        batcher.generate(requests(1)[0])
    broken = DynamicBatcher(SlowEngine(fail=True), window_s=0.0)
    with pytest.raises(EngineClosedError, match="engine died"):
        broken.generate(requests(1)[0])
    broken.close()


def test_a_settle_hook_runs_once_per_batch_after_every_future_of_it_is_settled():
    """What wakes the episode driver's loop once per batch: by the time the hook runs, every
    future of its batch holds its completion, or its error when the engine died."""
    for fail in (False, True):
        batcher = DynamicBatcher(SlowEngine(fail=fail), window_s=60.0, max_batch_size=8)
        futures: list = []
        seen: list = []
        ran = threading.Event()

        def hook(futures=futures, seen=seen, ran=ran) -> None:
            seen.append([f.done() for f in futures])
            ran.set()

        batcher.add_settle_hook(hook)
        for _ in range(4):
            batcher.join()
        futures += [batcher.submit(r) for r in requests(3)]
        batcher.leave()  # every live requester has asked: the batch of three runs now
        assert ran.wait(20)
        assert seen == [[True, True, True]]
        assert all((f.exception() is not None) is fail for f in futures)
        batcher.remove_settle_hook(hook)
        batcher.close()
        assert len(seen) == 1


def test_a_request_near_the_window_shares_a_batch_with_a_longer_one(tiny_model_dirs):
    """Finished rows stop advancing their positions: a GPT-2 (absolute positions) batch with
    one request ending at the window and one generating longer does not overflow."""
    engine = HFEngine(tiny_model_dirs["gpt2"])
    limit = engine.max_context
    near = GenerationRequest(tuple([5] * (limit - 2)), SamplingParams(2), seed=1)
    longer = GenerationRequest((5, 6, 7), SamplingParams(12), seed=2)
    out = engine.generate([near, longer])
    assert len(out[0].token_ids) == 2 and len(out[1].token_ids) == 12
