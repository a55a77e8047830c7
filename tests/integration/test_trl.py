"""TRL's GRPOTrainer takes one real optimisation step on ToySum through our adapter, on CPU and
offline, its rewards coming from our grader reading the bubblewrap sandbox the tool ran in."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

trl = pytest.importorskip("trl", reason="TRL: pip install trl==1.16.0")

from datasets import Dataset  # noqa: E402  (after the skip: TRL brings datasets)

from thundersync.interop.trl import task_rows, trl_environment  # noqa: E402
from thundersync.models import build_tiny_model, load_model, load_tokenizer  # noqa: E402

pytestmark = pytest.mark.slow

RIGHT = '<tool_call>\n{"name": "bash", "arguments": {"command": "answer 0"}}\n</tool_call>'
WRONG = '<tool_call>\n{"name": "bash", "arguments": {"command": "answer 1"}}\n</tool_call>'
NUM_GENERATIONS = 8


def scripted_policy(folder: Path):
    """A tiny GPT-2 and a tokenizer with TRL's Qwen2.5 chat template (one TRL parses tool calls
    of) whose every next token is, whatever the context, one of three: the whole tool call
    ``bash("answer 0")`` (right: ToySum with two keys of value 0 sums to 0), ``bash("answer
    1")`` (wrong), or the end of turn, with odds 2:2:1. The final layer norm's weight is 0 and
    its bias a unit vector, so the hidden state is constant and the tied embedding's column 0
    is the logits; training moves both, so a step changes the parameters."""
    from trl.chat_template_utils import qwen2_5_chat_template

    build_tiny_model(folder, "gpt2", hidden_size=16, num_layers=1)
    tokenizer = load_tokenizer(folder)
    tokenizer.add_tokens([RIGHT, WRONG])
    tokenizer.chat_template = qwen2_5_chat_template
    model = load_model(folder)
    model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
    right, wrong = tokenizer.convert_tokens_to_ids([RIGHT, WRONG])
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        logits = model.transformer.wte.weight[:, 0]
        logits.zero_()
        logits[[right, wrong]] = 20.0
        logits[tokenizer.eos_token_id] = 20.0 - float(torch.log(torch.tensor(2.0)))
    model.train()
    return model, tokenizer


def test_grpo_trainer_steps_on_toysum_with_rewards_from_our_grader(
    tmp_path, monkeypatch, leftovers
):
    monkeypatch.setenv("TRL_EXPERIMENTAL_SILENCE", "1")
    torch.set_num_threads(1)
    model, tokenizer = scripted_policy(tmp_path / "model")
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    environment = trl_environment("thundersync/ToySum-v0", num_keys=2, max_value=0)
    args = trl.GRPOConfig(
        output_dir=str(tmp_path / "run"),
        per_device_train_batch_size=NUM_GENERATIONS,
        num_generations=NUM_GENERATIONS,
        max_completion_length=16,
        max_tool_calling_iterations=2,
        max_steps=1,
        learning_rate=1e-2,
        use_cpu=True,
        report_to="none",
        logging_steps=1,
        save_strategy="no",
        seed=0,
    )
    trainer = trl.GRPOTrainer(
        model=model,
        args=args,
        processing_class=tokenizer,
        environment_factory=environment,
        train_dataset=Dataset.from_list(task_rows(1)),
    )
    trainer.train()

    assert trainer.state.global_step == 1
    changed = [n for n, p in model.named_parameters() if not torch.equal(p, before[n])]
    assert changed, "the optimiser step left every parameter as it was"

    # The rewards TRL logged, rollout by rollout, are our grader's: 1.0 exactly where the
    # sandbox's answer.txt held the sum, which only the `answer 0` tool call wrote there.
    outcomes = [env.outcome for env in trainer.environments]
    logged = list(trainer._logs["rewards"][environment.__name__])
    assert logged == [outcome.reward for outcome in outcomes]
    assert len(logged) == NUM_GENERATIONS and 0.0 < sum(logged) < NUM_GENERATIONS
    completions = list(trainer._logs["completion"])
    for outcome, completion in zip(outcomes, completions, strict=True):
        calls = completion[0].get("tool_calls") or []
        first = calls[0]["function"]["arguments"]["command"] if calls else None
        right = outcome.details["answer"] == outcome.details["expected"] == "0"
        assert outcome.reward == (1.0 if right else 0.0)
        assert right == (first == "answer 0")  # the model's first call decided the grade
    assert {outcome.task_id for outcome in outcomes} == {outcomes[0].task_id}  # one group
    metrics = trainer.state.log_history[0]
    assert metrics[f"rewards/{environment.__name__}/mean"] == pytest.approx(
        sum(logged) / len(logged)
    )
    assert metrics["tools/call_frequency"] > 0
    assert all(env.outcome is not None for env in trainer._environment_pool[None])
    assert leftovers() == ([], []), "every rollout's sandbox is closed once it is graded"
