"""Inputs that used to fail inside a worker (a traceback) or do nothing silently are one line
and exit 2 before any worker starts: an OPD teacher whose tokenizer is not the student's, a
policy model without a chat template, ``--early-start`` where it changes nothing."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from harness.compare import mode_config
from thundersync.cli import main
from thundersync.training.checks import check_inputs
from thundersync.training.config import TrainConfig


@pytest.fixture
def no_worker(monkeypatch):
    """Fail the test if a run gets as far as making its Trainer (which starts workers)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a Trainer was made: the bad input reached the workers")

    monkeypatch.setattr("thundersync.training.trainer.Trainer", refuse)


def refused(argv: list[str], capsys) -> str:
    """The one stderr line of a command that must exit 2."""
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(err) == 1, err
    return err[0]


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, Path]:
    """A student-like tiny model (the default tokenizer, 512 tokens), a teacher with a
    400-token tokenizer of other texts (as warmstart builds), and a copy of the student
    without a chat template."""
    from thundersync.models import build_tiny_model

    root = tmp_path_factory.mktemp("models")
    student = build_tiny_model(root / "student", "qwen3")
    texts = [f"lookup key{i} -> {i * 37 % 1000}; calc {i}+{i * 7} -> {i * 8}" for i in range(400)]
    teacher = build_tiny_model(root / "teacher", "llama", vocab_size=400, texts=texts)
    bare = root / "no-template"
    shutil.copytree(student, bare)
    (bare / "chat_template.jinja").unlink(missing_ok=True)
    settings = json.loads((bare / "tokenizer_config.json").read_text())
    settings.pop("chat_template", None)
    (bare / "tokenizer_config.json").write_text(json.dumps(settings))
    return {"student": student, "teacher": teacher, "bare": bare}


def test_an_opd_teacher_with_another_vocabulary_is_refused_before_workers(
    models, tmp_path, capsys, no_worker
):
    # the default student (no --model): the tiny model's 512-token tokenizer
    line = refused(
        [
            "train",
            "--algo",
            "opd",
            "--teacher",
            str(models["teacher"]),
            "--out",
            str(tmp_path / "run"),
        ],
        capsys,
    )
    assert line.startswith("train: error: config field 'teacher':"), line
    assert "vocabulary of 400 tokens, the student's 512" in line and str(models["teacher"]) in line
    line = refused(
        [
            "train",
            "--algo",
            "opd",
            "--teacher",
            str(models["teacher"]),
            "--model",
            str(models["student"]),
            "--out",
            str(tmp_path / "run"),
        ],
        capsys,
    )
    assert "vocabulary of 400 tokens, the student's 512" in line


def test_an_opd_teacher_with_the_same_vocabulary_but_other_ids_is_refused(models, tmp_path):
    other = build_shuffled(models["student"], tmp_path / "shuffled")
    config = TrainConfig(
        algo="opd", teacher=str(other), model=str(models["student"]), out=str(tmp_path / "run")
    )
    with pytest.raises(ValueError, match=r"2 of 512 tokens have other ids"):
        check_inputs(config)


def build_shuffled(student: Path, folder: Path) -> Path:
    """The student's folder with two tokens' ids swapped: the same size, other ids."""
    shutil.copytree(student, folder)
    file = folder / "tokenizer.json"
    spec = json.loads(file.read_text())
    vocab = spec["model"]["vocab"]
    a, b = "a", "b"
    vocab[a], vocab[b] = vocab[b], vocab[a]
    file.write_text(json.dumps(spec))
    return folder


def test_a_teacher_sharing_the_students_tokenizer_passes(models, tmp_path):
    check_inputs(TrainConfig(algo="opd", teacher=str(models["student"]), out=str(tmp_path / "a")))
    check_inputs(
        TrainConfig(
            algo="opd",
            teacher=str(models["student"]),
            model=str(models["student"]),
            out=str(tmp_path / "b"),
        )
    )


def test_a_model_without_a_chat_template_says_how_to_add_one(models, tmp_path, capsys, no_worker):
    line = refused(["train", "--model", str(models["bare"]), "--out", str(tmp_path / "r")], capsys)
    assert line.startswith("train: error: config field 'model':") and "no chat template" in line
    assert "chat_template.jinja" in line and "tokenizer_config.json" in line
    check_inputs(TrainConfig(model=str(models["student"]), out=str(tmp_path / "ok")))


@pytest.mark.parametrize(
    "argv, says",
    [
        (["--mode", "sync"], "with --mode sync"),
        (["--mode", "async"], "with --mode async"),
        (["--algo", "opd", "--teacher", "t"], "with --algo opd"),
        (["--deterministic"], "with --deterministic"),
    ],
)
def test_early_start_where_it_does_nothing_is_refused(argv, says, tmp_path, capsys, no_worker):
    line = refused(["train", "--early-start", *argv, "--out", str(tmp_path / "r")], capsys)
    assert line.startswith("train: error: config field 'early_start': no effect " + says), line


def test_early_start_is_kept_where_it_acts_and_compare_gives_it_to_streaming_only(tmp_path):
    base = TrainConfig(early_start=True)  # streaming GRPO: the backward starts at completion
    assert mode_config(base, "streaming", 0, tmp_path, 1).early_start
    assert not mode_config(base, "sync", 0, tmp_path, 1).early_start
    assert not mode_config(base, "async-k2", 0, tmp_path, 1).early_start
