"""``bash_read_whole``: a grader's script runs as ``bash FILE`` would, but read whole before
its first line, so lines its own commands append never run (docs/grading.md)."""

from __future__ import annotations

import subprocess
from pathlib import Path

from environments.sandboxes.protocol import bash_read_whole


def run(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-c", bash_read_whole(str(path))], capture_output=True, text=True, timeout=30
    )


def test_lines_appended_while_the_script_runs_never_run(tmp_path: Path) -> None:
    script = tmp_path / "it's a test.sh"  # a quote and a space in the path
    padding = "".join(
        f"# line {i} of a long script ...........................\n" for i in range(4000)
    )
    text = (
        'echo "start $0 ${BASH_SOURCE[0]}"\n'
        + padding  # past any buffer bash reads ahead
        + "printf 'echo APPENDED\\nexit 0\\n' >> \"$0\"\n"
        + "echo end\n"
        + "(exit 3)\n"  # the script's status, not an exit: bash FILE reads on
    )
    script.write_text(text)
    done = run(script)
    assert "APPENDED" not in done.stdout
    assert done.stdout.splitlines() == [f"start {script} {script}", "end"]
    assert done.returncode == 3
    # what it guards against: bash FILE runs the lines appended as it went
    script.write_text(text)
    unread = subprocess.run(["bash", str(script)], capture_output=True, text=True, timeout=30)
    assert (unread.stdout.endswith("end\nAPPENDED\n"), unread.returncode) == (True, 0)
