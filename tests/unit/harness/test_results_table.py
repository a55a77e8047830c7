"""The README's results block is generated from results.json and says what the verdicts say:
a clearly faster mode "faster", an indistinguishable one "not distinguishable" with the seeds
that would separate them; the rest of the README is left as it was."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.results_table import END, START, main, render, splice
from tests.unit.harness.test_verdicts import _comparison

ROOT = Path(__file__).resolve().parents[3]


def _results(tmp_path: Path, speed: dict[str, float], **kwargs) -> dict:
    """A comparison's results.json: the synthetic runs' verdicts, and per-mode statistics."""
    tmp_path.mkdir(exist_ok=True)
    results = _comparison(tmp_path, speed, **kwargs)
    stat = {"median": 10.0, "ci": [8.0, 12.0]}
    results["initial_accuracy"] = 0.25
    results["config"] = {
        "eval_tasks": 32,
        "eval_every": 2,
        "train": {"env": "thundersync/ToySum-v0", "tasks_per_step": 8, "group_size": 8, "steps": 8},
    }
    results["modes"] = {
        mode: {
            "seeds": list(range(6)),
            "time_to_target_s": stat,
            "speedup_vs_sync": {"median": 1.0, "ci": [1.0, 1.0]},
            "accuracy_at_budget": {"median": 0.6, "ci": [0.55, 0.65]},
            "step_time_s": 2.0,
            "staleness": {"max": 1, "histogram": {"0": 10, "1": 30} if "async" in mode else {}},
        }
        for mode in speed
    }
    return json.loads(json.dumps(results))  # as read back from the file


def _unwrapped(block: str) -> str:
    """The block with each wrapped sentence on one line (every line fits 100 columns)."""
    assert all(len(line) <= 100 for line in block.splitlines() if not line.startswith("|"))
    return block.replace("\n  ", " ")


def test_the_block_says_what_each_pairs_verdicts_say(tmp_path):
    faster = _unwrapped(
        render(_results(tmp_path / "a", {"sync": 1.0, "streaming": 0.75}), date="D", commit="C")
    )
    assert "(D, main at C)" in faster and "6 seeds" in faster
    assert "| streaming | 10.0 s [8.0, 12.0] |" in faster
    line = next(x for x in faster.splitlines() if x.startswith("- **streaming vs sync**"))
    assert "time to 0.6: faster, 1.3" in line
    assert "at equal steps (8): faster" in line
    assert "the same held-out accuracy at every evaluated step" in line

    same = _unwrapped(
        render(
            _results(tmp_path / "b", {"sync": 1.0, "async-k1": 1.0}, seeds=12, jitter=0.3),
            date="D",
            commit="C",
        )
    )
    line = next(x for x in same.splitlines() if x.startswith("- **async-k1 vs sync**"))
    assert "faster" not in line and "slower" not in line
    assert "time to 0.6: not distinguishable" in line and "seeds" in line
    assert "equal steps" not in line  # async's updates are not sync's
    assert "| async-k1 |" in same and "75%, up to 1 version old" in same


def test_the_readme_block_is_rewritten_and_nothing_else(tmp_path):
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_results(tmp_path, {"sync": 1.0, "streaming": 0.75})))
    readme = tmp_path / "README.md"
    readme.write_text(f"# Title\n\nbefore\n{START}\nold table\n{END}\nafter\n")
    assert main([str(results), "--into", str(readme), "--date", "D", "--commit", "C"]) == 0
    text = readme.read_text()
    assert text.startswith(f"# Title\n\nbefore\n{START}\n`make demo`")
    assert text.endswith(f"{END}\nafter\n") and "old table" not in text
    with pytest.raises(ValueError, match="needs one"):
        splice("no markers", "x", path=readme)


def test_the_readme_has_the_block_the_generator_rewrites():
    text = (ROOT / "README.md").read_text()
    assert text.count(START) == 1 and text.count(END) == 1


def test_two_runs_are_compared_verdict_by_verdict(tmp_path, capsys):
    """``--replicates``: each verdict beside the other run's, and exit status 1 when one
    differs (a clearly faster streaming in one run, an indistinguishable one in the other)."""
    faster, again, level = (tmp_path / name for name in ("faster.json", "again.json", "level.json"))
    faster.write_text(json.dumps(_results(tmp_path / "a", {"sync": 1.0, "streaming": 0.75})))
    again.write_text(json.dumps(_results(tmp_path / "b", {"sync": 1.0, "streaming": 0.74})))
    level.write_text(
        json.dumps(_results(tmp_path / "c", {"sync": 1.0, "streaming": 1.0}, seeds=12, jitter=0.3))
    )
    assert main([str(faster), "--replicates", str(again)]) == 0
    out = capsys.readouterr().out
    assert "streaming vs sync, time to target: faster 1.3" in out
    assert out.endswith("4 of 4 verdicts the same in both runs\n")
    assert main([str(faster), "--replicates", str(level)]) == 1
    out = capsys.readouterr().out
    assert "time to target: faster 1.3" in out and "/ not distinguishable" in out
    assert "<- differs" in out and "verdicts the same in both runs" in out


def test_a_file_that_is_not_a_comparisons_results_is_named_in_one_line(tmp_path, capsys):
    not_json, other = tmp_path / "README.md", tmp_path / "other.json"
    not_json.write_text("# a readme\n")
    other.write_text('{"runs": []}')
    for path in (tmp_path / "missing.json", not_json, other):
        assert main([str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("results_table: error: ") and str(path.name) in err
        assert len(err.strip().splitlines()) == 1
