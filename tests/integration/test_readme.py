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
    assert len(python_blocks()) == 2


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
