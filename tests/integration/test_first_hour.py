"""The Quickstart's "First hour" section (docs/quickstart.md) runs as written: its fenced
commands, in order, each through a pipe, at a small scale (flags appended per subcommand;
argparse takes the last occurrence, so the page's own flags must still exist). Each command
exits 0, is never silent for ``SILENCE_S`` or more, prints no traceback, and the outputs the
section names exist afterwards. A command renamed on the page or a flag removed from the CLI
fails here."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "docs" / "quickstart.md"
SECTION = "## First hour"
SILENCE_S = 10.0
"""The longest a Quickstart command may print nothing through a pipe (issue 16's Done-when)."""

EXIT_S = 30.0
"""The longest a command may take to exit after its last line (its verdict is out by then)."""

TINY_WORKLOAD = '{"tools": "python"}'  # no injected latencies
SMALL = {
    "warmstart": ["--num-demos", "8", "--steps", "4", "--bias-steps", "2", "--hidden-size", "64"],
    # keeps --steps: the section evaluates the last step's checkpoint by name
    "train": ["--tasks-per-step", "2", "--group-size", "2", "--env-kwargs", TINY_WORKLOAD],
    "eval": ["--tasks", "4"],
    "compare": [
        *("--modes", "sync,streaming", "--seeds", "1", "--steps", "2"),
        *("--tasks-per-step", "2", "--group-size", "2"),
        *("--eval-every", "2", "--eval-tasks", "4", "--env-kwargs", TINY_WORKLOAD),
    ],
}
"""What the test appends to each subcommand of the section to run it in a few minutes."""


def section(text: str) -> str:
    start = text.index(SECTION + "\n")
    end = text.find("\n## ", start + len(SECTION))
    return text[start : end if end >= 0 else len(text)]


def commands(text: str) -> list[list[str]]:
    """Each ``thundersync ...`` command of the section's bash blocks, in order, as argv."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.DOTALL):
        for line in block.replace("\\\n", " ").splitlines():
            words = shlex.split(line, comments=True)
            if words:
                assert words[0] == "thundersync", f"not a thundersync command: {line!r}"
                found.append(words[1:])
    return found


def named_outputs(text: str) -> list[str]:
    """The files and folders the section's prose says the commands write (``runs/...``)."""
    prose = re.sub(r"^```.*?^```", "", text, flags=re.MULTILINE | re.DOTALL)
    return sorted({p.rstrip("/") for p in re.findall(r"`(runs/[^`\s]+)`", prose)})


def run_piped(argv: list[str], cwd: Path) -> tuple[int, str, float, float]:
    """Run ``thundersync argv`` with stdout and stderr into one pipe; its exit status, its
    output, the longest time it printed nothing while working (start to first line, between
    lines) and the time from its last line to its exit (the interpreter's shutdown, after the
    verdict: seconds on a loaded machine, for torch's teardown in C)."""
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("THUNDERSYNC_LEADERBOARD", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "thundersync.cli", *argv],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    last = time.monotonic()
    silence = 0.0
    lines = []
    for line in proc.stdout:  # a line arrives when the command flushes it into the pipe
        now = time.monotonic()
        lines.append(f"[{now - last:5.1f} s after] {line}")
        silence, last = max(silence, now - last), now
    code = proc.wait(timeout=300)
    return code, "".join(lines), silence, time.monotonic() - last


def test_the_commands_parse_and_name_their_outputs():
    text = section(QUICKSTART.read_text())
    argvs = commands(text)
    assert [a[0] for a in argvs] == [
        *("warmstart", "train", "train", "train"),
        *("eval", "compare", "leaderboard", "timeline"),
    ]
    assert {a[a.index("--mode") + 1] for a in argvs if a[0] == "train"} == {
        "sync",
        "async",
        "streaming",
    }
    assert "runs/first-hour/compare/results.json" in named_outputs(text)


@pytest.mark.slow
@pytest.mark.serial  # bounds the silence between progress lines
def test_the_first_hour_section_runs_as_written_at_a_small_scale(tmp_path):
    text = section(QUICKSTART.read_text())
    for argv in commands(text):
        full = [*argv, *SMALL.get(argv[0], [])]
        began = time.monotonic()
        code, out, silence, tail = run_piped(full, tmp_path)
        print(f"--- {time.monotonic() - began:.0f} s: thundersync {shlex.join(full)}\n{out}")
        shown = f"thundersync {shlex.join(full)}\n{out}[{tail:5.1f} s after] exit {code}"
        assert code == 0, shown
        assert "Traceback" not in out, shown
        assert silence < SILENCE_S, f"silent for {silence:.1f} s through a pipe: {shown}"
        assert tail < EXIT_S, f"exited {tail:.1f} s after its last line: {shown}"
    missing = [p for p in named_outputs(text) if not (tmp_path / p).exists()]
    assert not missing, missing
