"""``compare --resume``: a comparison killed after some runs goes on from them. A run that
finished is kept byte for byte (never trained twice); a run that did not is trained again from
its first step; a run requested with other settings, or a folder that is not one of the
comparison's runs, is refused before anything trains."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness import compare
from thundersync.cli import main

COMPARE = [
    "compare",
    "--modes",
    "sync,streaming",
    "--seeds",
    "1",
    "--steps",
    "2",
    "--eval-every",
    "1",
    "--eval-tasks",
    "4",
    "--tasks-per-step",
    "2",
    "--group-size",
    "2",
    "--max-new-tokens",
    "8",
    "--env-kwargs",
    '{"tools": "python"}',
    "--no-leaderboard",
]


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_killed_comparison_resumes_from_its_finished_runs(tmp_path, monkeypatch, capsys):
    out = tmp_path / "compare"
    real, trained = compare.train_run, []

    def killed_at_the_second(config, label, progress=None):
        if trained:  # the second run: half-trained, then the comparison dies
            Path(config.out).mkdir(parents=True)
            (Path(config.out) / "requested-config.json").write_text(
                json.dumps(json.loads(json.dumps(config.to_dict())))
            )
            (Path(config.out) / "metrics.jsonl").write_text('{"step": 1}\n')
            raise RuntimeError(f"compare: run {label} failed (exit -9)")
        trained.append(label)
        real(config, label, progress)

    monkeypatch.setattr(compare, "train_run", killed_at_the_second)
    assert main([*COMPARE, "--out", str(out)]) == 1
    kept = _files(out / "runs" / "sync-seed0")
    assert trained == ["sync seed 0"] and not (out / "results.json").exists()

    line = _refused([*COMPARE, "--out", str(out)], capsys)  # without --resume: as before
    assert "holds a comparison" in line and "--overwrite" in line
    line = _refused([*COMPARE, "--lr", "0.5", "--resume", "--out", str(out)], capsys)
    assert "sync-seed0 was requested with lr=" in line and "this command gives lr=0.5" in line
    line = _refused(
        [*COMPARE, "--seeds", "2", "--seed", "1", "--resume", "--out", str(out)], capsys
    )
    assert "is not one of this comparison's runs" in line

    trained.clear()
    monkeypatch.setattr(
        compare, "train_run", lambda c, label, p=None: (trained.append(label), real(c, label, p))
    )
    assert main([*COMPARE, "--resume", "--out", str(out)]) == 0
    assert trained == ["streaming seed 0"]  # the finished sync run was not trained again
    err = capsys.readouterr().err
    assert "sync-seed0: kept, it finished before (--resume)" in err and "run 1/1" in err
    now = _files(out / "runs" / "sync-seed0")
    assert {k: v for k, v in now.items() if k in kept} == kept
    results = json.loads((out / "results.json").read_text())
    assert sorted(results["modes"]) == ["streaming", "sync"]
    streaming = [json.loads(x) for x in (out / "runs/streaming-seed0/metrics.jsonl").open()]
    assert [m["step"] for m in streaming] == [1, 2]  # trained from its first step, once


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    capsys.readouterr()
    assert main(argv) == 2
    return capsys.readouterr().err.strip()
