"""The documentation (README.md and the site built from docs/, issue 36): the site builds with
``mkdocs build --strict`` (broken links and anchors fail it), the README and the design stay
short, and every code block that could run either runs in a test or says why not — in an HTML
comment on the line above it: ``<!-- run by: tests/...py::test_name -->`` or ``<!-- not run:
reason -->``. Every ``thundersync`` command of every bash block parses with the CLI's own
parser, run or not, so a renamed flag fails here."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
README_MAX_LINES = 150
DESIGN_MAX_LINES = 400
CHECKED = ("bash", "python", "toml")
"""The languages whose blocks must be run by a test or say why not."""
QUOTED = (DOCS / "harbor-0.26-notes.md",)
"""Lab-notebook pages that quote other projects' code: their blocks are read, never run."""

BLOCK = re.compile(
    r"^(?:<!-- (?P<note>[^\n]*?) -->\n)?```(?P<lang>\w*)\n(?P<code>.*?)^```",
    re.MULTILINE | re.DOTALL,
)
"""A fenced block (fences at the start of a line), with the comment on the line above it."""


@dataclasses.dataclass(frozen=True)
class Block:
    page: Path
    lang: str
    code: str
    note: str | None

    def __str__(self) -> str:
        first = self.code.strip().splitlines()[0] if self.code.strip() else ""
        return f"{self.page.relative_to(ROOT)} ({self.lang}: {first[:60]!r})"


def pages() -> list[Path]:
    return [README, *sorted(p for p in DOCS.rglob("*.md") if p not in QUOTED)]


def blocks(page: Path) -> list[Block]:
    return [Block(page, m["lang"], m["code"], m["note"]) for m in BLOCK.finditer(page.read_text())]


def all_blocks(lang: str | None = None) -> list[Block]:
    return [b for p in pages() for b in blocks(p) if lang is None or b.lang == lang]


def run_by(test: str) -> list[Block]:
    """The blocks that say this test runs them (``test`` as ``path::name``)."""
    return [b for b in all_blocks() if b.note == f"run by: {test}"]


def commands(code: str) -> list[list[str]]:
    """Each ``thundersync ...`` command of a bash block, as argv after the program (a leading
    ``VAR=value`` or a path to the program, such as ``.venv-vllm/bin/thundersync``, allowed)."""
    found = []
    for line in code.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        while words and re.match(r"^[A-Z_]+=", words[0]):
            words = words[1:]
        if words and Path(words[0]).name == "thundersync":
            found.append(words[1:])
    return found


def test_every_block_that_could_run_is_run_or_says_why_not():
    problems = []
    for block in all_blocks():
        if block.lang not in CHECKED:
            continue
        note = block.note or ""
        if note.startswith("not run: ") and len(note) > len("not run: ") + 5:
            continue
        found = re.fullmatch(r"run by: (?P<path>tests/\S+\.py)::(?P<name>test_\w+)", note)
        if not found:
            problems.append(f"{block}: neither 'run by: tests/...::test_...' nor 'not run: why'")
            continue
        test_file = ROOT / found["path"]
        if not test_file.is_file() or f"def {found['name']}(" not in test_file.read_text():
            problems.append(f"{block}: {note!r} names no test")
    assert not problems, "\n".join(problems)


def test_the_block_finder_sees_every_fence():
    """The check above is only as good as the finder: every line that opens or closes a fence
    belongs to a block it found (an odd count, or a fence inside prose, would hide blocks)."""
    for page in pages():
        fences = len(re.findall(r"^```", page.read_text(), re.MULTILINE))
        assert fences == 2 * len(blocks(page)), page


def test_every_thundersync_command_in_the_docs_parses():
    from thundersync.cli import build_parser

    failures = []
    for block in all_blocks("bash"):
        for argv in commands(block.code):
            try:
                build_parser().parse_args(argv)
            except SystemExit as exit_:
                if exit_.code != 0:  # --version and --help exit 0
                    failures.append(f"{block}: thundersync {shlex.join(argv)}")
    assert not failures, "\n".join(failures)
    assert sum(len(commands(b.code)) for b in all_blocks("bash")) > 20  # it saw the commands


def test_every_python_block_compiles():
    for block in all_blocks("python"):
        compile(block.code, str(block), "exec")


def test_the_readme_and_the_design_stay_short():
    readme = len(README.read_text().splitlines())
    design = len((DOCS / "design.md").read_text().splitlines())
    assert readme <= README_MAX_LINES, f"README.md: {readme} lines"
    assert design <= DESIGN_MAX_LINES, f"docs/design.md: {design} lines"


def test_the_site_builds_strictly_and_offline(tmp_path):
    """``mkdocs build --strict``: a broken link or anchor, a page left out of the nav, a
    reference the hook cannot generate or an API name mkdocstrings cannot find fails it.
    The generated reference holds every TrainConfig flag and every command's help, and no
    page fetches fonts or scripts from elsewhere."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs missing: pip install -e '.[docs]' (make install does)")
    site = tmp_path / "site"
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", "mkdocs.yml", "-d", str(site)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    config = (site / "reference" / "config" / "index.html").read_text()
    from thundersync.training.config import TrainConfig

    missing = [
        f.name for f in dataclasses.fields(TrainConfig) if f"<code>{f.name}</code>" not in config
    ]
    assert not missing, missing
    cli = (site / "reference" / "cli" / "index.html").read_text()
    for command in ("train", "eval", "compare", "verify", "warmstart", "leaderboard", "serve"):
        assert f"thundersync {command}" in cli, command
    assert "--tasks-per-step" in cli
    api = (site / "reference" / "api" / "index.html").read_text()
    assert "Learner" in api and "GRPO" in api and "EpisodeStarted" in api
    results = (site / "results" / "index.html").read_text()
    block = (ROOT / "README.md").read_text().split("[start:results]")[1].split("[end:results]")[0]
    row = next(line for line in block.splitlines() if line.startswith("| streaming |"))
    speedup = row.split("|")[3].split()[0]  # its speed-up over sync, e.g. 1.19×
    assert speedup in results, "the README's results table, included"
    for page in site.rglob("*.html"):
        assert "fonts.googleapis.com" not in page.read_text(), page


def _thundersync(argv: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )
    env.pop("THUNDERSYNC_LEADERBOARD", None)
    return subprocess.run(
        [sys.executable, "-m", "thundersync.cli", *argv],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def test_the_quick_commands_run_as_written(tmp_path):
    blocks_ = run_by("tests/integration/test_docs.py::test_the_quick_commands_run_as_written")
    argvs = [argv for b in blocks_ for argv in commands(b.code)]
    assert ["--version"] in argvs and ["envs"] in argvs, argvs
    for argv in argvs:
        done = _thundersync(argv, tmp_path)
        assert done.returncode == 0, f"thundersync {shlex.join(argv)}\n{done.stdout}{done.stderr}"
    assert "thundersync/ToySum-v0" in _thundersync(["envs"], tmp_path).stdout


@pytest.mark.slow
def test_the_suite_checks_run_as_written(tmp_path):
    """The oracle solves every task of the suite the guide names and the nop none, and the
    leaderboard shows both, with the commands as the guide writes them."""
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing: apt-get install bubblewrap")
    (block,) = run_by("tests/integration/test_docs.py::test_the_suite_checks_run_as_written")
    argvs = commands(block.code)
    assert [a[0] for a in argvs] == ["eval", "eval", "leaderboard"]
    for argv in argvs:
        done = _thundersync(argv, tmp_path)
        assert done.returncode == 0, f"thundersync {shlex.join(argv)}\n{done.stdout}{done.stderr}"
    oracle, nop = (argv[argv.index("--out") + 1] for argv in argvs[:2])
    assert json.loads((tmp_path / oracle / "results.json").read_text())["mean_reward"] == 1.0
    assert json.loads((tmp_path / nop / "results.json").read_text())["mean_reward"] == 0.0
    site = argvs[2][argvs[2].index("--html") + 1]
    assert (tmp_path / site / "index.html").is_file()


def test_the_config_file_example_is_a_train_config():
    from thundersync.training.config import TrainConfig

    (block,) = run_by(
        "tests/integration/test_docs.py::test_the_config_file_example_is_a_train_config"
    )
    config = TrainConfig(**tomllib.loads(block.code))
    assert config.mode == "streaming" and config.objective == {"kl_coef": 0.04}


def test_the_plugin_entry_point_is_the_projects_own_form():
    """The guide's entry-point table names the group the registry reads, in the form this
    project's own pyproject.toml declares its built-in envs with."""
    (block,) = run_by(
        "tests/integration/test_docs.py::test_the_plugin_entry_point_is_the_projects_own_form"
    )
    declared = tomllib.loads(block.code)["project"]["entry-points"]
    ours = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]
    assert set(declared) == {"thundersync.envs"} and "thundersync.envs" in ours
    (target,) = declared["thundersync.envs"].values()
    assert re.fullmatch(r"[\w.]+:\w+", target), target
