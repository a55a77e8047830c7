"""`thundersync verify`: passes on the real learner, catches a deliberately broken fold, and
never certifies vacuously; its verdict is the last line and fits 80 columns in a pipe."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from thundersync import cli_output
from thundersync.cli import main
from thundersync.cli_output import without_startup_lines
from thundersync.core import canonical
from thundersync.core import streaming_grpo as streaming
from thundersync.core.learner import Learner
from thundersync.core.random_batches import BatchShape, random_batch
from thundersync.models import load_model
from thundersync.textbook import textbook_gradient
from thundersync.verify import (
    bound_for,
    certify,
    learner_gradient,
    relative_error,
    variants,
    verdict,
)

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
        result = certify(
            gpt2, variant, trials=1, seed=3, deterministic=True, shape=SMALL, reference=reference
        )
        assert result["ok"], result
        assert result["max_rel_err_stream_vs_textbook"] <= 1e-12


def test_a_broken_streaming_fold_is_caught(gpt2, monkeypatch):
    monkeypatch.setattr(streaming, "group_stats", wrong_mean(streaming.group_stats))
    result = certify(gpt2, variants("grpo")[0], trials=2, seed=0, deterministic=False, shape=SMALL)
    assert not result["ok"]
    assert result["max_rel_err_stream_vs_sync"] > 1e-6


def test_a_broken_deterministic_fold_is_caught(gpt2, monkeypatch):
    monkeypatch.setattr(canonical, "group_stats", wrong_mean(canonical.group_stats))
    result = certify(gpt2, variants("grpo")[0], trials=2, seed=0, deterministic=True, shape=SMALL)
    # deterministic sync and streaming share the reduction: the textbook still catches it
    assert not result["ok"]


def test_the_cli_exits_nonzero_on_a_violation(tiny_model_dirs, monkeypatch, capsys):
    monkeypatch.setattr(streaming, "group_stats", wrong_mean(streaming.group_stats))
    code = main(
        [
            "verify",
            "--algo",
            "grpo",
            "--trials",
            "1",
            "--json",
            "--model",
            str(tiny_model_dirs["gpt2"]),
        ]
    )
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert code == 1 and report["ok"] is False
    assert captured.err.splitlines()[-1].startswith("verify: VIOLATION: ")


@pytest.mark.parametrize("trials", ["0", "-1"])
def test_zero_or_negative_trials_certify_nothing(trials, capsys):
    assert main(["verify", "--trials", trials]) == 2
    captured = capsys.readouterr()
    assert "--trials must be >= 1" in captured.err and "OK" not in captured.out + captured.err


def test_certify_refuses_zero_trials(gpt2):
    with pytest.raises(ValueError, match="trials must be >= 1"):
        certify(gpt2, variants("grpo")[0], trials=0, seed=0, deterministic=False)


def test_no_checks_is_not_ok():
    ok, line = verdict([], num_models=0, deterministic=False)
    assert not ok and line.startswith("verify: VIOLATION")


def bad_checkpoints(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    (garbage / "config.json").write_text("{}")
    no_weights = tmp_path / "no-weights"
    no_weights.mkdir()
    (no_weights / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    return {
        "missing": tmp_path / "nowhere",
        "empty": empty,
        "garbage": garbage,
        "no-weights": no_weights,
    }


@pytest.mark.parametrize("kind", ["missing", "empty", "garbage", "no-weights"])
def test_a_bad_model_is_a_one_line_error_with_exit_2(kind, tmp_path, capsys):
    folder = bad_checkpoints(tmp_path)[kind]
    assert main(["verify", "--trials", "1", "--model", str(folder)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1
    assert err.startswith(f"verify: error: --model {folder}: ")


def test_a_bad_model_prints_no_traceback_in_a_fresh_process(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", "verify", "--model", str(tmp_path / "nowhere")],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.returncode == 2, out.stderr[-2000:]
    err = without_startup_lines(out.stderr)
    assert "Traceback" not in err and err.startswith("verify: error: --model ")


def test_the_verdict_is_the_last_line_and_fits_80_columns_in_a_pipe(tiny_model_dirs, capsys):
    assert (
        main(
            [
                "verify",
                "--algo",
                "opd",
                "--trials",
                "1",
                "--deterministic",
                "--model",
                str(tiny_model_dirs["gpt2"]),
            ]
        )
        == 0
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("verify: OK: 3 checks (1 model x 3 variants), worst ")
    assert lines[-1].endswith(" <= 1e-12, bitwise")
    assert all(len(line) <= 80 for line in lines), [line for line in lines if len(line) > 80]
    assert lines[0].split()[-2:] == ["bitwise", "ok"]  # the verdict column was cut away in pipes
    assert all(line.split()[-1] == "yes" for line in lines[1:4])


def test_a_violation_is_the_last_line_on_stdout(tiny_model_dirs, monkeypatch, capsys):
    monkeypatch.setattr(streaming, "group_stats", wrong_mean(streaming.group_stats))
    assert (
        main(["verify", "--algo", "grpo", "--trials", "1", "--model", str(tiny_model_dirs["gpt2"])])
        == 1
    )
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("verify: VIOLATION: ") and " > 1e-12" in lines[-1]
    assert len(lines[-1]) <= 80


def test_progress_lines_appear_in_a_pipe(tiny_model_dirs, monkeypatch, capsys):
    monkeypatch.setattr(cli_output, "PIPE_INTERVAL_S", 0.01)
    assert (
        main(["verify", "--algo", "opd", "--trials", "1", "--model", str(tiny_model_dirs["gpt2"])])
        == 0
    )
    progress = [line for line in capsys.readouterr().err.splitlines() if "/3 checks, " in line]
    assert progress and all(line.startswith("verify: ") for line in progress)


def test_the_step_gradient_comes_from_grad_not_last_gradient(gpt2, monkeypatch):
    """verify must not depend on ``Learner.last_gradient`` (it is becoming opt-in)."""
    original = Learner.step

    def step_without_last_gradient(self):
        metrics = original(self)
        self.last_gradient = None
        return metrics

    monkeypatch.setattr(Learner, "step", step_without_last_gradient)
    variant = variants("grpo")[0]
    events = random_batch(0, gpt2.config.vocab_size, SMALL)
    got = learner_gradient(gpt2, variant, events, streaming=True, deterministic=False)
    book = textbook_gradient(gpt2, variant.objective, events)
    assert float(book.norm()) > 0 and relative_error(got, book) <= 1e-12


def test_bounds_follow_the_models_arithmetic(tiny_model_dirs):
    assert bound_for(load_model(tiny_model_dirs["gpt2"], dtype=torch.float64))[0] == 1e-12
    assert bound_for(load_model(tiny_model_dirs["qwen3"], dtype=torch.float64))[0] == 1e-6
    assert bound_for(load_model(tiny_model_dirs["gpt2"], dtype=torch.float32))[0] == 1e-6


@pytest.mark.slow
def test_verify_json_reports_every_objective_within_bounds():
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "thundersync.cli",
            "verify",
            "--json",
            "--trials",
            "1",
            "--deterministic",
        ],
        capture_output=True,
        text=True,
        timeout=1800,
        check=False,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    report = json.loads(out.stdout)
    assert report["ok"] is True
    assert out.stderr.splitlines()[-1] == report["verdict"]
    assert report["verdict"].startswith("verify: OK: 24 checks (2 models x 12 variants)")
    names = {r["variant"] for r in report["results"]}
    assert {v.name for v in variants("all")} <= names
    assert {r["model"] for r in report["results"]} == {"tiny-gpt2", "tiny-qwen3"}
    for r in report["results"]:
        assert r["max_rel_err_stream_vs_sync"] <= r["bound"]
        assert r["max_rel_err_stream_vs_textbook"] <= r["bound"]
        assert r["bitwise_equal_deterministic"] is True
