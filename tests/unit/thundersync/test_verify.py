"""`thundersync verify`: passes on the real learner and catches a deliberately broken fold."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from thundersync import canonical, streaming
from thundersync.cli import main
from thundersync.models import load_model
from thundersync.rollouts import BatchShape
from thundersync.verify import bound_for, certify, variants

SMALL = BatchShape(max_groups=2, max_group_size=4, max_turns=3, max_tokens=48)


@pytest.fixture(scope="module")
def gpt2(tiny_model_dirs):
    return load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)


def wrong_mean(original):
    def broken(rewards, objective):
        mean, scale = original(rewards, objective)
        return mean + 0.01, scale

    return broken


def test_certificate_holds_for_every_variant(gpt2, tiny_model_dirs):
    reference = load_model(tiny_model_dirs["gpt2"], dtype=torch.float64)
    with torch.no_grad():
        for p in reference.parameters():
            p.mul_(1.01)
    for variant in variants("all"):
        result = certify(gpt2, variant, trials=1, seed=3, deterministic=True, shape=SMALL,
                         reference=reference)  # fmt: skip
        assert result["ok"], result
        assert result["max_rel_err_stream_vs_textbook"] <= 1e-12


def test_a_broken_streaming_fold_is_caught(gpt2, monkeypatch):
    monkeypatch.setattr(streaming, "group_stats", wrong_mean(streaming.group_stats))
    result = certify(gpt2, variants("grpo")[0], trials=2, seed=0, deterministic=False,
                     shape=SMALL)  # fmt: skip
    assert not result["ok"]
    assert result["max_rel_err_stream_vs_sync"] > 1e-6


def test_a_broken_deterministic_fold_is_caught(gpt2, monkeypatch):
    monkeypatch.setattr(canonical, "group_stats", wrong_mean(canonical.group_stats))
    result = certify(gpt2, variants("grpo")[0], trials=2, seed=0, deterministic=True,
                     shape=SMALL)  # fmt: skip
    # deterministic sync and streaming share the reduction: the textbook still catches it
    assert not result["ok"]


def test_the_cli_exits_nonzero_on_a_violation(tiny_model_dirs, monkeypatch, capsys):
    monkeypatch.setattr(streaming, "group_stats", wrong_mean(streaming.group_stats))
    code = main(["verify", "--algo", "grpo", "--trials", "1", "--json",
                 "--model", str(tiny_model_dirs["gpt2"])])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert code == 1 and report["ok"] is False


def test_bounds_follow_the_models_arithmetic(tiny_model_dirs):
    assert bound_for(load_model(tiny_model_dirs["gpt2"], dtype=torch.float64))[0] == 1e-12
    assert bound_for(load_model(tiny_model_dirs["qwen3"], dtype=torch.float64))[0] == 1e-6
    assert bound_for(load_model(tiny_model_dirs["gpt2"], dtype=torch.float32))[0] == 1e-6


@pytest.mark.slow
def test_verify_json_reports_every_objective_within_bounds():
    out = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "verify", "--json", "--trials", "1",
         "--deterministic"],
        capture_output=True, text=True, timeout=1800, check=False,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] is True
    names = {r["variant"] for r in report["results"]}
    assert {v.name for v in variants("all")} <= names
    assert {r["model"] for r in report["results"]} == {"tiny-gpt2", "tiny-qwen3"}
    for r in report["results"]:
        assert r["max_rel_err_stream_vs_sync"] <= r["bound"]
        assert r["max_rel_err_stream_vs_textbook"] <= r["bound"]
        assert r["bitwise_equal_deterministic"] is True
