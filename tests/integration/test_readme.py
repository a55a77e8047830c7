"""The documentation's Python examples (README.md and docs/) run as a user would run them
(each block as a script in an empty folder) and print what the page says they show; the
README's links lead somewhere. tests/integration/test_docs.py checks that every other block
is run by a test or says why not."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
EXAMPLES = ("relative difference", "CountLinesEnv", "GRPOTrainer(")
"""What marks each example this file runs (docs/concepts.md, docs/guides/environments.md,
docs/guides/interop.md)."""


def python_blocks() -> list[str]:
    """Every Python block of the README and the docs pages (fences at the start of a line)."""
    found = []
    for page in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        found += re.findall(r"^```python\n(.*?)^```", page.read_text(), re.DOTALL | re.MULTILINE)
    return found


def run_block(marker: str, folder: Path) -> str:
    (block,) = [b for b in python_blocks() if marker in b]
    script = folder / "example.py"
    script.write_text(block)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_docs_have_the_examples_this_file_runs():
    for marker in EXAMPLES:
        assert len([b for b in python_blocks() if marker in b]) == 1, marker


@pytest.mark.slow
def test_the_learner_example_shows_streaming_and_sync_take_the_same_step(tmp_path):
    out = run_block("relative difference", tmp_path)
    difference = float(re.search(r"relative difference: (\S+)", out).group(1))
    assert 0 <= difference <= 1e-12, out
    assert re.search(r"\d+ trajectories, reward \d", out), out


def test_the_env_example_registers_an_env_that_an_oracle_solves(tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install bubblewrap")
    out = run_block("CountLinesEnv", tmp_path)
    assert out.split() == ["1.0", "True", "submitted"], out


@pytest.mark.slow
def test_the_trl_example_runs_offline_as_written(tmp_path, leftovers):
    """As a user pastes it, in an empty folder, with no hub to download from: the model it
    names exists once the example has built it, TRL accepts its chat template (it refused the
    warm model's: "does not support tool calling"), every step of ``max_steps`` runs, and the
    rewards are our grader's."""
    pytest.importorskip("trl", reason="TRL: pip install trl==1.16.0")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install bubblewrap")
    (block,) = [b for b in python_blocks() if "GRPOTrainer(" in b]
    report = (
        "\nimport json\n"
        "print(json.dumps({'step': trainer.state.global_step, 'max': trainer.args.max_steps, "
        "'rewards': list(trainer._logs['rewards'][trainer.environment_factories[None].__name__])"
        "}))\n"
    )
    offline = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    env = dict(os.environ, TRL_EXPERIMENTAL_SILENCE="1", **offline)
    done = subprocess.run(
        [sys.executable, "-c", block + report],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["step"] == result["max"] > 0
    assert result["rewards"] and all(r in (0.0, 1.0) for r in result["rewards"])
    assert (tmp_path / "runs" / "trl-model" / "tokenizer_config.json").is_file()
    assert leftovers() == ([], []), "every rollout's sandbox is closed once it is graded"


FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
"""A fenced block (its fences start a line; an inline ``` ```bash ``` is not one)."""


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = FENCED.sub("", path.read_text())
    return {anchor(h) for h in re.findall(r"^#+ (.+)$", text, re.MULTILINE)}


def test_the_readme_links_lead_somewhere():
    """Every relative link of the README names a file that exists and, after ``#``, a heading
    of that file (the README's own when the link is only an anchor)."""
    text = FENCED.sub("", README.read_text())
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    assert any(link.startswith("docs/measurements.md") for link in links), links
    broken = []
    for link in links:
        if re.match(r"[a-z]+://", link):
            continue
        target, _, fragment = link.partition("#")
        path = README.parent / target if target else README
        if not path.exists() or (fragment and fragment not in anchors(path)):
            broken.append(link)
    assert not broken, broken
