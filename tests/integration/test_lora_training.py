"""``thundersync train --lora`` end to end on the tiny warm-started model: every mode trains the
adapter alone; deterministic sync and streaming give bitwise the same adapter; the base stays
bitwise the same; a checkpoint is a PEFT adapter folder that ``PeftModel.from_pretrained``
loads to the log-probs the run sampled with; ``--resume`` continues bitwise; and an engine that
took the adapter by sync samples what a fresh engine built from the checkpoint samples."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from tests.integration.training_kit import SMALL, metrics, noisy_copy, token_events, train

pytest.importorskip("peft")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap missing"),
]

LORA = ["--lora", '{"rank": 4, "target_modules": ["q_proj", "v_proj"]}']


def lora_args(warm_model: Path, steps: int = 2) -> list[str]:
    return ["--model", str(warm_model), "--steps", str(steps), "--seed", "0", *LORA, *SMALL]


def adapter(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(folder / "adapter_model.safetensors")


def checkpoint(out: Path, step: int) -> Path:
    return out / "checkpoints" / f"step-{step:06d}"


@pytest.fixture(scope="module")
def runs(warm_model, tmp_path_factory) -> dict[str, Path]:
    """Two steps of deterministic sync and streaming with a KL term on the base."""
    root = tmp_path_factory.mktemp("lora-runs")
    args = [*lora_args(warm_model), "--deterministic", "--objective", '{"kl_coef": 0.05}']
    for mode in ("sync", "streaming"):
        train(root / mode, "--mode", mode, *args)
    return {"sync": root / "sync", "streaming": root / "streaming"}


def test_sync_and_streaming_train_the_same_adapter_bitwise_and_leave_the_base(runs, warm_model):
    from safetensors.torch import load_file

    sync, streaming = runs["sync"], runs["streaming"]
    assert token_events(sync) == token_events(streaming)
    a, b = adapter(checkpoint(sync, 2)), adapter(checkpoint(streaming, 2))
    start = adapter(sync / "init-adapter")
    assert a.keys() == start.keys() and any(not torch.equal(a[k], start[k]) for k in a)
    assert all(torch.equal(a[k], b[k]) for k in a)
    # the checkpoint is the adapter alone, on the base it names; the base is bitwise the same
    folder = checkpoint(sync, 2)
    assert not (folder / "model.safetensors").exists()
    config = json.loads((folder / "adapter_config.json").read_text())
    assert Path(config["base_model_name_or_path"]) == warm_model.resolve()
    from thundersync.lora import load_policy

    base = load_file(warm_model / "model.safetensors")
    state = load_policy(folder, dtype=torch.float32).get_base_model().state_dict()
    loaded = {k.replace(".base_layer", ""): v for k, v in state.items() if "lora_" not in k}
    assert loaded.keys() == base.keys()
    assert all(torch.equal(loaded[k], base[k]) for k in base)
    # what moved to the engine each step: the adapter's bytes
    nbytes = sum(t.numel() * t.element_size() for t in a.values())
    assert {m["learner"]["weight_sync_bytes"] for m in metrics(sync)} == {nbytes}
    assert all(m["learner"]["kl_reference"] is not None for m in metrics(streaming))


def test_the_checkpoint_loads_with_peft_and_gives_the_logprobs_the_run_sampled_with(
    runs, warm_model
):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = runs["streaming"]
    records = [json.loads(line) for line in (out / "trajectories.jsonl").read_text().splitlines()]
    started = next(r for r in records if r["event"] == "EpisodeStarted" and r["policy_version"])
    turn = next(
        r
        for r in records
        if r["event"] == "TurnCompleted" and r["episode_id"] == started["episode_id"]
    )
    assert turn["turn"] == 0 and turn["policy_version"] == 1
    base = AutoModelForCausalLM.from_pretrained(warm_model)
    model = PeftModel.from_pretrained(base, str(checkpoint(out, 1))).eval()
    ids = torch.tensor([started["prompt_ids"] + turn["action_ids"]])
    with torch.no_grad():
        logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].double(), -1)
    n = len(turn["action_ids"])
    mine = logp[-n:].gather(-1, ids[0, -n:, None]).squeeze(-1)
    torch.testing.assert_close(
        mine, torch.tensor(turn["action_logprobs"]).double(), atol=1e-4, rtol=0
    )


def test_an_engine_synced_to_the_adapter_samples_as_one_built_from_the_checkpoint(runs):
    from thundersync.lora import synced_parameters
    from thundersync.training.engines.engine import GenerationRequest, SamplingParams
    from thundersync.training.engines.hf import HFEngine

    out = runs["sync"]
    synced = HFEngine(out / "init-adapter", batch_invariant=True)
    fresh = HFEngine(checkpoint(out, 2), batch_invariant=True, policy_version=2)
    trained = torch.cat([p.detach().reshape(-1) for p in synced_parameters(fresh.model)])
    base_before = [p.clone() for n, p in synced.model.named_parameters() if "lora_" not in n]
    synced.load_weights(trained, 2)
    base_after = [p for n, p in synced.model.named_parameters() if "lora_" not in n]
    assert all(torch.equal(a, b) for a, b in zip(base_before, base_after, strict=True))
    requests = [
        GenerationRequest((2, 88, 316, 202, 36), SamplingParams(max_new_tokens=12), seed=s)
        for s in range(3)
    ]
    assert synced.generate(requests) == fresh.generate(requests)


def test_resume_continues_the_adapter_bitwise(runs, warm_model, tmp_path):
    out = tmp_path / "resumed"
    args = [*lora_args(warm_model), "--deterministic", "--objective", '{"kl_coef": 0.05}']
    train(out, "--mode", "sync", *args, "--steps", "1")
    train(out, "--mode", "sync", *args, "--resume")
    a, b = adapter(checkpoint(out, 2)), adapter(checkpoint(runs["sync"], 2))
    assert all(torch.equal(a[k], b[k]) for k in b)


@pytest.mark.parametrize(
    "extra",
    [["--mode", "async", "--staleness", "1"], ["--mode", "streaming", "--algo", "opd"]],
    ids=["async-grpo", "streaming-opd"],
)
def test_async_and_an_opd_student_train_the_adapter(warm_model, tmp_path, extra):
    teacher = []
    if "opd" in extra:  # a teacher that differs from the student's base: a gap to close
        teacher = ["--teacher", str(noisy_copy(warm_model, tmp_path / "teacher"))]
    out = tmp_path / "run"
    train(out, *lora_args(warm_model), *extra, *teacher)
    assert [m["learner"]["policy_version"] for m in metrics(out)] == [1, 2]
    a, start = adapter(checkpoint(out, 2)), adapter(out / "init-adapter")
    assert any(not torch.equal(a[k], start[k]) for k in a)


def test_eval_runs_an_adapter_checkpoint_as_its_policy(runs, tmp_path):
    import subprocess
    import sys

    folder = checkpoint(runs["sync"], 2)
    proc = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "eval", "--agent", "policy"]
        + ["--checkpoint", str(folder), "--env", "thundersync/ToySum-v0", "--tasks", "1"]
        + ["-k", "1", "--max-new-tokens", "16", "--no-leaderboard", "--json"],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["num_attempts"] == 1 and report["num_infra_failed_attempts"] == 0
