"""``eval --engine`` and ``--dtype``: the same names, values and rules as ``train``'s, refused in
one line (exit 2) before any task runs; the engine and dtype reach the policy's engine and are
recorded in config.json, results.json and the leaderboard row; the engine is closed on the way
out even when the policy fails to start. (``--engine vllm`` end to end: test_vllm_engine.py.)"""

from __future__ import annotations

import importlib.util
import json
import threading

import pytest

from harness.eval import EvalConfig
from thundersync.cli import main


def refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, (code, err)
    return err[0]


def policy_eval(checkpoint, *flags: str) -> list[str]:
    return ["eval", "--env", "thundersync/ToySum-v0", "--checkpoint", str(checkpoint), *flags]


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vLLM is installed")
def test_the_vllm_engine_without_vllm_says_how_to_install_it(tiny_model_dirs, capsys):
    line = refused(policy_eval(tiny_model_dirs["qwen3"], "--engine", "vllm"), capsys)
    assert line.startswith("eval: error: --engine: vLLM is not installed"), line
    assert "make test-vllm" in line and "pip install vllm" in line


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--engine", "sglang"], "--engine: input should be 'hf' or 'vllm', got 'sglang'"),
        (
            ["--dtype", "float16"],
            "--dtype: input should be 'float32', 'float64' or 'bfloat16', got 'float16'",
        ),
        (
            ["--engine", "vllm", "--dtype", "float64"],
            "--dtype: expected float32 or bfloat16 with --engine vllm (vLLM has no float64), "
            "got 'float64'",
        ),
    ],
    ids=["unknown-engine", "float16", "vllm-float64"],
)
def test_engine_and_dtype_are_checked_as_training_checks_them(
    tiny_model_dirs, flags, message, capsys
):
    assert refused(policy_eval(tiny_model_dirs["qwen3"], *flags), capsys) == (
        f"eval: error: {message}"
    )


@pytest.mark.parametrize("flag", [["--engine", "hf"], ["--dtype", "float64"]])
def test_an_engine_flag_without_a_policy_is_refused_not_ignored(flag, capsys):
    line = refused(["eval", "--suite", "toy-sum", "--agent", "oracle", *flag], capsys)
    assert line == f"eval: error: {flag[0]} sets the policy's engine; --agent oracle runs none"


def test_vllm_places_itself_so_a_gpu_device_is_refused_with_it():
    with pytest.raises(ValueError, match=r"^--device: --engine vllm places the model itself"):
        EvalConfig("toy-sum", "policy", "bwrap", 1, 1, engine="vllm", device="cuda:1")
    assert EvalConfig("toy-sum", "policy", "bwrap", 1, 1, engine="vllm").device == "cpu"


def test_the_engine_and_dtype_act_and_are_recorded(tiny_model_dirs, tmp_path, capsys):
    from leaderboard.store import Store

    out, db = tmp_path / "out", tmp_path / "board.sqlite"
    flags = ["--env-kwargs", '{"tools": "python"}', "--tasks", "2", "--max-new-tokens", "8"]
    flags += ["--engine", "hf", "--dtype", "float64", "--out", str(out), "--db", str(db)]
    assert main(policy_eval(tiny_model_dirs["qwen3"], *flags)) == 0, capsys.readouterr().err
    assert "agent policy (hf)" in capsys.readouterr().out
    assert json.loads((out / "results.json").read_text())["engine"] == "hf"
    config = json.loads((out / "config.json").read_text())
    assert (config["engine"], config["dtype"]) == ("hf", "float64")
    with Store(db, read_only=True) as store:
        (row,) = store.entries(kind="eval")
    assert (row.config["engine"], row.config["dtype"]) == ("hf", "float64")


class FakeEngine:
    policy_version = 0
    max_context = 512

    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        self.closed.set()


def test_the_engine_is_closed_when_the_policy_fails_to_start(tiny_model_dirs, monkeypatch):
    """Ctrl-C while the tokenizer loads (after the engine started): the engine is closed and
    its batcher's thread stopped, not left behind (a vLLM engine holds its memory)."""
    import thundersync.models
    import thundersync.training.engines as engines
    from harness.policy_eval import PolicyEvaluator

    built: list[tuple] = []
    fake = FakeEngine()

    def build_engine(kind, model_dir, **settings):
        built.append((kind, settings))
        return fake

    def interrupted(folder):
        raise KeyboardInterrupt

    monkeypatch.setattr(engines, "build_engine", build_engine)
    monkeypatch.setattr(thundersync.models, "load_tokenizer", interrupted)
    threads = set(threading.enumerate())
    with pytest.raises(KeyboardInterrupt):
        PolicyEvaluator(tiny_model_dirs["qwen3"], engine="vllm", dtype="bfloat16", seed=3)
    assert built == [("vllm", {"dtype": "bfloat16", "device": "cpu", "seed": 3})]
    assert fake.closed.is_set()
    assert set(threading.enumerate()) <= threads, "the batcher's thread outlived the failure"


def test_an_evaluator_loads_another_checkpoint_in_the_learners_order(tiny_model_dirs, tmp_path):
    """``load`` swaps weights through the engine's own ``load_weights`` (the learner's flat
    order, from the checkpoint's config): what ``compare`` does on whichever engine ran."""
    import torch

    from harness.policy_eval import PolicyEvaluator
    from thundersync.models import load_model

    changed = tmp_path / "changed"
    model = load_model(tiny_model_dirs["qwen3"], dtype=torch.float32)
    with torch.no_grad():
        for i, p in enumerate(model.parameters()):
            p.add_(i + 1.0)
    model.save_pretrained(changed)
    with PolicyEvaluator(tiny_model_dirs["qwen3"], max_new_tokens=4) as judge:
        judge.load(changed)
        loaded = dict(judge.engine.model.named_parameters())
    for name, p in model.named_parameters():
        assert torch.equal(loaded[name].detach(), p.detach()), name


def test_compare_evaluates_on_the_engine_and_dtype_the_runs_sampled_with(monkeypatch, tmp_path):
    import harness.policy_eval
    from harness.compare import CompareConfig, Run, evaluate_runs
    from thundersync.training.config import TrainConfig

    built: list[dict] = []

    class Stop(Exception):
        pass

    def evaluator(checkpoint, **kwargs):
        built.append(kwargs)
        raise Stop

    monkeypatch.setattr(harness.policy_eval, "PolicyEvaluator", evaluator)
    train = TrainConfig(
        env="thundersync/ToySum-v0",
        env_kwargs={"tools": "python"},
        engine="vllm",
        dtype="bfloat16",
        out=str(tmp_path / "run"),
    )
    config = CompareConfig(train, eval_tasks=2, out=str(tmp_path))
    (tmp_path / "sync").mkdir()
    (tmp_path / "sync" / "metrics.jsonl").write_text("")  # a run that saved no checkpoint
    with pytest.raises(Stop):
        evaluate_runs([Run("sync", 0, tmp_path / "sync")], config)
    assert (built[0]["engine"], built[0]["dtype"]) == ("vllm", "bfloat16")
