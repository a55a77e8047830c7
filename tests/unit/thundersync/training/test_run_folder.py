"""A run folder is created once (issue 35, Broken 1): ``train`` and ``compare`` refuse an
``--out`` holding another run before any work starts (exit 2, one line naming ``--resume``,
``--overwrite`` and another folder), and ``--overwrite`` removes only what a run wrote.

Before: ``train --steps 1`` on a finished 12-step run exited 0 with the new config.json beside
the old step-000011 and step-000012, pruning having deleted the new run's step-000001; and
``compare`` on an existing folder trained every run, then crashed (``KeyError: 2``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from thundersync.cli import main
from thundersync.training.config import TrainConfig
from thundersync.training.worker_pool import WorkerError


def finished_run(folder: Path, steps: tuple[int, ...] = (11, 12)) -> Path:
    """A run folder as a 12-step run leaves it (the files' names and a run's config.json)."""
    folder.mkdir(parents=True, exist_ok=True)
    record = TrainConfig(steps=max(steps), out=str(folder)).record()
    (folder / "config.json").write_text(json.dumps(record))
    for name in ("metrics.jsonl", "events.jsonl", "spans.jsonl", "trajectories.jsonl"):
        (folder / name).write_text("{}\n")
    for step in steps:
        checkpoint = folder / "checkpoints" / f"step-{step:06d}"
        checkpoint.mkdir(parents=True)
        (checkpoint / "trainer_state.pt").write_bytes(b"old")
    (folder / "init-model").mkdir()
    (folder / "init-model" / "config.json").write_text("{}")
    return folder


def listing(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.fixture
def no_worker(monkeypatch):
    """Fail the test if a run gets as far as making its Trainer (which starts workers)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a Trainer was made: the refused folder reached the run")

    monkeypatch.setattr("thundersync.training.trainer.Trainer", refuse)


@pytest.fixture
def trainer_sees(monkeypatch):
    """Stand-in Trainer: records the run folder's listing when the run would start, then
    stops the run (exit 1) before any worker."""
    seen: list[list[str]] = []

    def record(config, **kwargs):
        seen.append(listing(Path(config.out)))
        raise WorkerError("stopped by the test")

    monkeypatch.setattr("thundersync.training.trainer.Trainer", record)
    return seen


def refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2, (code, err)
    assert len(err) == 1, err
    return err[0]


def test_train_refuses_a_folder_holding_another_run_and_says_what_to_do(
    tmp_path, capsys, no_worker
):
    out = finished_run(tmp_path / "sync")
    before = listing(out)
    line = refused(["train", "--steps", "1", "--out", str(out)], capsys)
    assert line.startswith(f"train: error: --out {out} holds a run"), line
    assert "step-000012" in line, line
    for remedy in ("--resume to continue it", "--overwrite to replace it", "another --out"):
        assert remedy in line, line
    assert listing(out) == before


def test_train_overwrite_replaces_only_what_the_run_wrote(tmp_path, capsys, trainer_sees):
    out = finished_run(tmp_path / "sync")
    (out / ".learner-group-123").write_text("")  # a killed multi-rank run's rendezvous
    assert main(["train", "--steps", "1", "--overwrite", "--out", str(out)]) == 1
    assert trainer_sees == [[]], "the new run starts in an empty folder"
    assert out.is_dir()
    err = capsys.readouterr().err
    assert "--overwrite" in err and "stopped by the test" in err


def test_overwrite_never_removes_a_folder_holding_other_files(tmp_path, capsys, no_worker):
    out = finished_run(tmp_path / "sync")
    (out / "notes.txt").write_text("mine")
    before = listing(out)
    line = refused(["train", "--steps", "1", "--overwrite", "--out", str(out)], capsys)
    assert "notes.txt" in line and "another --out" in line, line
    assert listing(out) == before


def test_a_config_json_that_is_not_a_runs_is_never_written_over(tmp_path, capsys, no_worker):
    out = tmp_path / "project"
    out.mkdir()
    (out / "config.json").write_text('{"name": "my project"}')
    for flags in ([], ["--overwrite"]):
        line = refused(["train", "--steps", "1", *flags, "--out", str(out)], capsys)
        assert "config.json, not a run's" in line and "another --out" in line, line
    assert (out / "config.json").read_text() == '{"name": "my project"}'


def test_overwrite_refuses_to_remove_the_model_the_run_trains(tmp_path, capsys, no_worker):
    from thundersync.models import build_tiny_model

    out = finished_run(tmp_path / "run", steps=(2,))
    model = out / "checkpoints" / "step-000002"
    build_tiny_model(model, "qwen3")
    (model / "trainer_state.pt").write_bytes(b"old")
    before = listing(out)
    line = refused(
        ["train", "--overwrite", "--model", str(model), "--steps", "1", "--out", str(out)], capsys
    )
    assert "a model this run needs" in line, line
    assert listing(out) == before


def test_resume_and_overwrite_together_are_refused(tmp_path, capsys, no_worker):
    out = finished_run(tmp_path / "run")
    line = refused(["train", "--resume", "--overwrite", "--out", str(out)], capsys)
    assert "--resume" in line and "--overwrite" in line and "give one" in line, line


def test_a_new_run_may_start_where_no_run_is(tmp_path, trainer_sees):
    empty, others, leftover = tmp_path / "empty", tmp_path / "others", tmp_path / "leftover"
    empty.mkdir()
    others.mkdir()
    (others / "notes.txt").write_text("kept")
    leftover.mkdir()
    (leftover / "requested-config.json").write_text("{}")  # compare writes it before train
    for out in (empty, others, leftover, tmp_path / "new"):
        assert main(["train", "--steps", "1", "--out", str(out)]) == 1
    assert trainer_sees == [[], ["notes.txt"], ["requested-config.json"], []]


def test_the_survey_sorts_what_a_run_wrote_from_the_rest(tmp_path):
    from thundersync.training.run_folder import clear_run_folder, run_folder_problem, survey

    out = finished_run(tmp_path / "run")
    (out / "checkpoints" / ".tmp-step-000013-7").mkdir()
    contents = survey(out)
    assert contents.holds_run and contents.foreign == []
    assert contents.checkpoints == ["step-000011", "step-000012"]
    assert run_folder_problem(out, resume=True) is None
    assert run_folder_problem(out, overwrite=True) is None
    removed = clear_run_folder(out)
    assert out.is_dir() and listing(out) == [] and len(removed) == 7
    (out / "checkpoints").mkdir()
    (out / "checkpoints" / "mine.bin").write_text("")
    assert "checkpoints/mine.bin, not a run's" in run_folder_problem(out)


# --- compare ---------------------------------------------------------------------------------

COMPARE = ["compare", "--modes", "sync,streaming", "--seeds", "1", "--steps", "2"]


@pytest.fixture
def no_training(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("compare started its runs: the refused folder reached the work")

    monkeypatch.setattr("harness.compare_command.run_compare", refuse)


@pytest.fixture
def compare_sees(monkeypatch):
    seen: list[list[str]] = []

    def record(config, **options):
        seen.append(listing(Path(config.out)))
        raise RuntimeError("compare: stopped by the test")

    monkeypatch.setattr("harness.compare_command.run_compare", record)
    return seen


def finished_comparison(out: Path) -> Path:
    for name in ("sync-seed0", "streaming-seed0", "async-k1-seed0"):
        finished_run(out / "runs" / name, steps=(2, 4))
        (out / "runs" / name / "requested-config.json").write_text("{}")
    (out / "results.json").write_text("{}")
    (out / "accuracy_vs_time.png").write_bytes(b"png")
    return out


def test_compare_refuses_a_folder_holding_a_comparison_before_any_run(
    tmp_path, capsys, no_training
):
    out = finished_comparison(tmp_path / "compare")
    before = listing(out)
    line = refused([*COMPARE, "--no-leaderboard", "--out", str(out)], capsys)
    assert line.startswith(f"compare: error: --out {out} holds a comparison"), line
    assert "--overwrite to replace it" in line and "another --out" in line, line
    assert listing(out) == before


def test_compare_refuses_a_killed_comparisons_run_folder(tmp_path, capsys, no_training):
    out = tmp_path / "compare"
    finished_run(out / "runs" / "sync-seed0", steps=(2,))  # killed in its second run
    line = refused([*COMPARE, "--no-leaderboard", "--out", str(out)], capsys)
    assert "sync-seed0" in line and "--overwrite to replace it" in line, line


def test_compare_overwrite_replaces_only_a_comparisons_files(tmp_path, capsys, compare_sees):
    out = finished_comparison(tmp_path / "compare")
    (out / "notes.txt").write_text("mine")
    before = listing(out)
    line = refused([*COMPARE, "--overwrite", "--no-leaderboard", "--out", str(out)], capsys)
    assert "notes.txt" in line and "another --out" in line, line
    assert listing(out) == before and compare_sees == []
    (out / "notes.txt").unlink()
    code = main([*COMPARE, "--overwrite", "--no-leaderboard", "--out", str(out)])
    assert code == 1 and compare_sees == [[]], compare_sees


def test_compare_never_takes_a_training_runs_folder(tmp_path, capsys, no_training):
    out = finished_run(tmp_path / "sync")
    before = listing(out)
    for flags in ([], ["--overwrite"]):
        line = refused([*COMPARE, *flags, "--no-leaderboard", "--out", str(out)], capsys)
        assert "not a comparison" in line and "another --out" in line, line
    assert listing(out) == before
