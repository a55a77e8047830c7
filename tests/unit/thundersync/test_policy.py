"""Policy log-probs: action tokens only, one forward, and the teacher's KV-cached scoring."""

from __future__ import annotations

import pytest
import torch

from thundersync.core.policy import Policy, _cache_keyword
from thundersync.models import load_model
from thundersync.protocol.types import Trajectory, Turn


@pytest.fixture(scope="module", params=["gpt2", "qwen3"])
def policy(request, tiny_model_dirs):
    return Policy(load_model(tiny_model_dirs[request.param], dtype=torch.float64))


def trajectory(obs0=(40, 41, 42)) -> Trajectory:
    return Trajectory(
        episode_id="e0",
        group_id="g0",
        group_size=1,
        task_id="t",
        prompt_ids=(10, 11, 12),
        turns=(
            Turn(
                action_ids=(20, 21),
                action_logprobs=(-1.0, -1.0),
                policy_version=0,
                observation_ids=obs0,
            ),
            Turn(
                action_ids=(30, 31, 32),
                action_logprobs=(-1.0,) * 3,
                policy_version=0,
                observation_ids=(50,),
            ),
        ),
    )


def manual_logprobs(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    """log p(ids[pos] | ids[:pos]) by running the model on each prefix separately."""
    values = []
    for pos in positions:
        logits = model(input_ids=torch.tensor([ids[:pos]])).logits[0, -1]
        values.append(torch.log_softmax(logits, -1)[ids[pos]])
    return torch.stack(values)


def manual_entropies(model, ids: list[int], positions: list[int]) -> torch.Tensor:
    """−Σ_v p log p of the next-token distribution before each ``ids[pos]``, prefix by prefix."""
    values = []
    with torch.no_grad():
        for pos in positions:
            p = torch.softmax(model(input_ids=torch.tensor([ids[:pos]])).logits[0, -1], -1)
            values.append(-(p.double() * p.double().log()).sum())
    return torch.stack(values)


def test_action_logprobs_cover_action_tokens_only(policy):
    traj = trajectory()
    logp_T, turn_T, entropy_T = policy.action_logprobs(traj)
    assert turn_T.tolist() == [0, 0, 1, 1, 1]
    ids = [10, 11, 12, 20, 21, 40, 41, 42, 30, 31, 32]  # the last observation is not context
    expected = manual_logprobs(policy.model, ids, [3, 4, 8, 9, 10])
    assert torch.allclose(logp_T, expected, rtol=0, atol=1e-6)
    assert torch.allclose(entropy_T, manual_entropies(policy.model, ids, [3, 4, 8, 9, 10]))


def test_observations_are_context_for_later_actions(policy):
    a = policy.action_logprobs(trajectory(obs0=(40, 41, 42))).logp_T
    b = policy.action_logprobs(trajectory(obs0=(43, 44))).logp_T
    assert torch.equal(a[:2], b[:2])
    assert not torch.allclose(a[2:], b[2:])


def test_batched_logprobs_match_one_by_one(policy):
    trajs = [trajectory(), trajectory(obs0=(43,))]
    batched = policy.batch_action_logprobs(trajs)
    for traj, out in zip(trajs, batched):
        alone = policy.action_logprobs(traj)
        assert torch.allclose(out.logp_T, alone.logp_T, rtol=0, atol=1e-6)
        assert torch.equal(out.turn_T, alone.turn_T)
        assert torch.allclose(out.entropy_T, alone.entropy_T, rtol=0, atol=1e-6)


@pytest.mark.parametrize("obs0", [(40, 41, 42), ()])
def test_teacher_scores_turns_incrementally_with_a_kv_cache(policy, obs0):
    """With an empty observation turn 1's first action is predicted by turn 0's last position,
    which the first call kept."""
    traj = trajectory(obs0=obs0)
    cache: dict = {}
    turn0 = policy.score_turn(traj, 0, cache)
    turn1 = policy.score_turn(traj, 1, cache)
    full = policy.action_logprobs(traj).logp_T
    assert len(turn0) == 2 and len(turn1) == 3
    assert torch.allclose(torch.tensor(turn0 + turn1, dtype=full.dtype), full.detach(), atol=1e-6)


def test_teacher_scoring_passes_the_cache_by_the_models_own_name(policy):
    """transformers 5.x renamed ``past_key_values`` to ``cache``: the old name warned
    FutureWarning on every OPD turn."""
    import warnings

    cache: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        policy.score_turn(trajectory(), 0, cache)
        policy.score_turn(trajectory(), 1, cache)


def test_an_empty_prompt_is_rejected_with_the_episode_named(policy):
    traj = Trajectory(
        episode_id="e9",
        group_id="g",
        group_size=1,
        task_id="t",
        prompt_ids=(),
        turns=(Turn(action_ids=(5,), action_logprobs=(-1.0,), policy_version=0),),
    )
    with pytest.raises(ValueError, match="e9.*empty prompt_ids"):
        policy.action_logprobs(traj)


def test_only_the_positions_that_predict_an_action_are_projected_onto_the_vocabulary(policy):
    """An agentic context is mostly prompt and observations: the head computes logits for the
    five positions that predict an action token, not the trajectory's eleven (or, batched, the
    two rows' padded twenty-two)."""
    rows: list[int] = []
    head = policy.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[:-1]))
    try:
        policy.action_logprobs(trajectory())
        policy.batch_action_logprobs([trajectory(), trajectory(obs0=(43,))])
    finally:
        hook.remove()
    assert [torch.Size(r).numel() for r in rows] == [5, 10]


class _NoKeep(torch.nn.Module):
    """A causal LM whose forward takes no ``logits_to_keep``."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner = model

    def forward(self, input_ids, attention_mask=None):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


class _IntKeep(_NoKeep):
    """One that takes ``logits_to_keep`` as a count of last positions only."""

    def forward(self, input_ids, attention_mask=None, logits_to_keep=0):
        if not isinstance(logits_to_keep, int):
            raise TypeError("logits_to_keep must be an int")
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


class _Passes(_NoKeep):
    """A wrapper that passes ``**kwargs`` on to a model that refuses them."""

    def forward(self, input_ids, attention_mask=None, **kwargs):
        if kwargs:
            raise TypeError(f"unexpected {sorted(kwargs)}")
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


@pytest.mark.parametrize("wrapper", [_NoKeep, _IntKeep, _Passes])
def test_a_model_that_cannot_keep_some_logits_gives_the_same_log_probs(policy, wrapper):
    plain = Policy(wrapper(policy.model))
    trajs = [trajectory(), trajectory(obs0=(43,))]
    for _ in range(2):  # the first call finds out, the second goes straight to all logits
        for a, b in zip(plain.batch_action_logprobs(trajs), policy.batch_action_logprobs(trajs)):
            assert torch.allclose(a.logp_T, b.logp_T, rtol=0, atol=1e-12)
    assert plain._keeps_logits is False


def test_a_wrapper_that_passes_keyword_arguments_on_keeps_only_the_action_logits(policy):
    """PEFT's models take ``**kwargs`` and hand them to the model they wrap."""

    class Passing(_NoKeep):
        def forward(self, input_ids, attention_mask=None, **kwargs):
            return self.inner(input_ids=input_ids, attention_mask=attention_mask, **kwargs)

    wrapped = Policy(Passing(policy.model))
    out = wrapped.action_logprobs(trajectory())
    assert wrapped._keeps_logits is True
    assert torch.allclose(out.logp_T, policy.action_logprobs(trajectory()).logp_T, atol=1e-12)


def test_the_teacher_projects_only_the_positions_that_predict_its_turns_actions(policy):
    """Turn 0 (prompt and two actions): the two actions' predictors and its last position,
    which predicts the next call's first token; turn 1 (three observation tokens, three
    actions): the three actions' predictors and its last; not all five and six."""
    policy._takes_keep_mask()  # found out before counting
    rows: list[int] = []
    head = policy.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _out: rows.append(args[0].shape[:-1]))
    try:
        cache: dict = {}
        policy.score_turn(trajectory(), 0, cache)
        policy.score_turn(trajectory(), 1, cache)
    finally:
        hook.remove()
    assert [torch.Size(r).numel() for r in rows] == [3, 4]


class _CachedRefusesKeep(torch.nn.Module):
    """A causal LM with a KV cache whose forward passes ``**kwargs`` on and refuses
    ``logits_to_keep``; it records each call's (``logits_to_keep`` given, a cache given)."""

    def __init__(self, model) -> None:
        super().__init__()
        self.inner, self.calls = model, []

    def forward(self, input_ids, past_key_values=None, use_cache=None, **kwargs):
        self.calls.append(("logits_to_keep" in kwargs, past_key_values is not None))
        if kwargs:
            raise TypeError(f"unexpected {sorted(kwargs)}")
        cache = {_cache_keyword(self.inner): past_key_values}
        return self.inner(input_ids=input_ids, use_cache=use_cache, **cache)


@pytest.mark.parametrize("obs0", [(40, 41, 42), ()])
def test_a_teacher_that_cannot_keep_some_logits_scores_the_same_and_never_refuses_a_cache(
    policy, obs0
):
    """It is asked once, of a forward with no cache, so no episode's KV cache holds a call the
    model refused."""
    model = _CachedRefusesKeep(policy.model)
    plain = Policy(model)
    for scorer in (plain, policy):
        cache: dict = {}
        scores = [x for k in (0, 1) for x in scorer.score_turn(trajectory(obs0=obs0), k, cache)]
        if scorer is plain:
            expected = scores
    assert scores == pytest.approx(expected, rel=0, abs=1e-12)
    assert plain._keeps_logits is False
    assert (True, True) not in model.calls and model.calls[0] == (True, False)
