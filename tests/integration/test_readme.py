"""The README's Python examples run as a user would run them (each block as a script in an
empty folder) and print what the README says they show."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


def python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), re.DOTALL)


def run_block(marker: str, folder: Path) -> str:
    (block,) = [b for b in python_blocks() if marker in b]
    script = folder / "example.py"
    script.write_text(block)
    done = subprocess.run(
        [sys.executable, str(script)], cwd=folder, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_readme_has_the_examples_this_file_runs():
    assert len(python_blocks()) == 3


@pytest.mark.slow
def test_the_learner_example_shows_streaming_and_sync_take_the_same_step(tmp_path):
    out = run_block("Learner(", tmp_path)
    difference = float(re.search(r"relative difference: (\S+)", out).group(1))
    assert 0 <= difference <= 1e-12, out
    assert re.search(r"\d+ trajectories, reward \d", out), out


def test_the_env_example_registers_an_env_that_an_oracle_solves(tmp_path):
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install bubblewrap")
    out = run_block("CountLinesEnv", tmp_path)
    assert out.split() == ["1.0", "True", "submitted"], out


@pytest.mark.slow
def test_the_trl_example_takes_a_step_with_our_env(tmp_path):
    """The TRL example as written, on a tiny tool-calling model in its ``runs/trl-model`` and
    with one step instead of ten."""
    pytest.importorskip("trl", reason="TRL: pip install trl==1.16.0")
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install bubblewrap")
    from tests.integration.test_trl import scripted_policy

    model, tokenizer = scripted_policy(tmp_path / "built")
    model.save_pretrained(tmp_path / "runs" / "trl-model")
    tokenizer.save_pretrained(tmp_path / "runs" / "trl-model")
    (block,) = [b for b in python_blocks() if "GRPOTrainer(" in b]
    assert "max_steps=10" in block
    script = tmp_path / "example.py"
    script.write_text(block.replace("max_steps=10", "max_steps=1"))
    done = subprocess.run(
        [sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "rewards/ToySum_v0/mean" in done.stdout + done.stderr


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
