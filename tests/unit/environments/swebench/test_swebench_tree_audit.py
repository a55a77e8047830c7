"""The tree audit after the eval script's install step (``swebench/tree_audit.py``): the
recorder on real folders and interpreters, the judge of two records (what pytest loads that
appeared unseen by the diff's audit is flagged; what a legitimate install rewrites is not), and
where the recorder goes in an eval script."""

from __future__ import annotations

import ast
import shutil
import subprocess
from pathlib import Path

import pytest

from environments.swebench import load_instances, tree_audit
from environments.swebench.grading import make_spec
from environments.swebench.transfer import MAX_READ_BYTES
from environments.swebench.tree_audit import (
    MAX_RECORD_BYTES,
    RECORDER,
    TreeRecord,
    command,
    parse,
    reasons,
    with_audit,
)

REPO_ROOT = Path(__file__).resolve().parents[4]
FIXTURES = REPO_ROOT / "environments/fixtures/swebench"
OLD_PYTHON = Path("/root/.pyenv/versions/3.6.15/bin/python3.6")
FINDER = "import __editable___intervals_0_1_0_finder; __editable___intervals_0_1_0_finder.install()"


def recorded(root: Path, out: Path, *, python: str = "python3", folders=("tests",)) -> TreeRecord:
    """Run the recorder with ``python`` (as the eval script runs it) and parse its record."""
    lines = command(str(root), str(out), (), folders).replace("python3 -I", f"{python} -I")
    done = subprocess.run(["bash", "-c", lines], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    parsed = parse(out.read_text())
    assert parsed is not None
    return parsed


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "testbed"
    shutil.copytree(FIXTURES / "repos/intervals", root)
    (root / ".git").mkdir()
    (root / ".git/conftest.py").write_text("never loaded\n")
    return root


def test_install_time_plants_are_found_and_ordinary_changes_are_not(
    repo: Path, tmp_path: Path
) -> None:
    before = recorded(repo, tmp_path / "before.json")
    (repo / "conftest.py").write_text("import pytest\n")
    (repo / "tests/__init__.py").write_text("import intervals\n")
    (repo / "tests/test_ops.py").write_text("# the test patch's own change\n")
    with open(repo / "pyproject.toml", "a") as config:
        config.write('addopts = "-p hackplug"\n')  # inside [tool.pytest.ini_options]
    (repo / "intervals/ops.py").write_text("# the code under test: not the audit's business\n")
    (repo / "argparse.py").write_text("import atexit\n")
    (repo / "build").mkdir()
    (repo / "build/lib.py").write_text("x = 1\n")
    found = reasons(
        before,
        recorded(repo, tmp_path / "after.json"),
        task_paths={"tests/test_ops.py"},
        test_folders=("tests",),
        modules={"argparse", "pytest"},
    )
    flagged = sorted(reason.split(":", 1)[0] for reason in found)
    assert flagged == ["argparse.py", "conftest.py", "pyproject.toml", "tests/__init__.py"], found
    assert all("during the eval script" in reason for reason in found)


def test_a_record_gone_after_the_tests_started_is_reported() -> None:
    assert "missing or unreadable" in reasons(TreeRecord(), None)[0]


def test_config_edits_outside_test_sections_are_not_flagged(repo: Path, tmp_path: Path) -> None:
    before = recorded(repo, tmp_path / "before.json")
    text = (repo / "pyproject.toml").read_text().replace('version = "0.1.0"', 'version = "0.2"')
    (repo / "pyproject.toml").write_text(text)
    (repo / "setup.cfg").write_text("[metadata]\nname = intervals\n")
    assert reasons(before, recorded(repo, tmp_path / "after.json")) == []


def entry(text: str | None, digest: str = "") -> tuple[str, str | None]:
    return (digest or f"sha-{hash(text)}", text)


SITE = "/env/lib/python3.9/site-packages"


@pytest.mark.parametrize(
    ("old", "new", "flagged"),
    [
        ({}, {f"{SITE}/__editable__.intervals-0.1.0.pth": entry("/testbed\n")}, False),
        ({}, {f"{SITE}/__editable__.intervals-0.1.0.pth": entry(FINDER + "\n")}, False),
        ({}, {f"{SITE}/hack.pth": entry("import hackfix\n")}, True),
        ({}, {f"{SITE}/sitecustomize.py": entry(None)}, True),
        (  # easy-install.pth rewritten: its import lines were there before
            {f"{SITE}/easy-install.pth": entry("import sys; sys.__plen = len(sys.path)\n")},
            {f"{SITE}/easy-install.pth": entry("import sys; sys.__plen = len(sys.path)\n/x\n")},
            False,
        ),
        ({}, {f"{SITE}/intervals-0.1.dist-info/entry_points.txt": entry(None)}, False),
        (
            {},
            {f"{SITE}/hack-1.dist-info/entry_points.txt": entry("[pytest11]\nhack = hack\n")},
            True,
        ),
        (  # the same plugin, its distribution's version renamed by a reinstall
            {f"{SITE}/astro-1.dist-info/entry_points.txt": entry("[pytest11]\na = astro.p\n")},
            {f"{SITE}/astro-1.1.dist-info/entry_points.txt": entry("[pytest11]\na = astro.p\n")},
            False,
        ),
        (
            {f"{SITE}/_pytest/runner.py": entry(None, "a")},
            {f"{SITE}/_pytest/runner.py": entry(None, "b")},
            True,
        ),
        ({"conftest.py": entry(None, "a")}, {"conftest.py": entry(None, "a")}, False),
    ],
    ids=[
        "editable-path",
        "editable-finder",
        "pth-running-code",
        "sitecustomize",
        "easy-install-rewritten",
        "entry-points-without-pytest11",
        "new-pytest11-plugin",
        "pytest11-plugin-renamed",
        "runner-module-edited",
        "unchanged-conftest",
    ],
)
def test_site_folder_changes_are_judged_by_what_runs(old: dict, new: dict, flagged: bool) -> None:
    """A legitimate install step writes editable-install ``.pth`` files and distribution
    metadata; only code that runs in every interpreter, or a pytest plugin no distribution had
    registered, changes how the tests run."""
    before = TreeRecord((SITE,), old)
    after = TreeRecord((SITE,), {**old, **new})
    assert bool(reasons(before, after)) is flagged, reasons(before, after)


def test_the_recorder_runs_on_old_interpreters(repo: Path, tmp_path: Path) -> None:
    """SWE-bench environments run Python 3.5 to 3.11: no f-strings, walrus or annotations in
    the recorder, and a real run on the oldest interpreter this machine has."""
    tree = ast.parse(RECORDER)
    modern = (ast.JoinedStr, ast.NamedExpr, ast.AnnAssign)
    assert not [node for node in ast.walk(tree) if isinstance(node, modern)]
    if not OLD_PYTHON.exists():
        pytest.skip(f"{OLD_PYTHON} absent")
    before = recorded(repo, tmp_path / "before.json", python=str(OLD_PYTHON))
    assert "conftest.py" not in before.entries and ".git/conftest.py" not in before.entries
    (repo / "conftest.py").write_text("import pytest\n")
    after = recorded(repo, tmp_path / "after.json", python=str(OLD_PYTHON))
    assert [r.split(":", 1)[0] for r in reasons(before, after)] == ["conftest.py"]
    assert after.site_dirs and all(Path(d).is_dir() for d in after.site_dirs)


def test_the_recorder_goes_just_before_the_start_marker() -> None:
    """After the install step and the test patch, right before the test command; a marker
    text inside the test patch's heredoc is not the marker line."""
    task = load_instances(FIXTURES).get("thundersync__intervals-1")
    script = make_spec(task.instance).eval_script
    audited, added = with_audit(script, "RECORD\n")
    lines = audited.splitlines()
    assert added and lines[lines.index("RECORD") + 1] == ": '>>>>> Start Test Output'"
    assert lines.index("RECORD") > lines.index("EOF_114329324912")
    tricky = script.replace("+def test_merge_touching", "+# : '>>>>> Start Test Output'\n+def t")
    audited, _ = with_audit(tricky, "RECORD\n")
    assert audited.index("RECORD") > audited.rindex("EOF_114329324912")
    assert with_audit("echo '>>>>> Start Test Output'\n", "RECORD\n") == (
        "echo '>>>>> Start Test Output'\n",
        False,
    )


def test_a_record_the_agents_code_nested_too_deep_is_no_record() -> None:
    """The after-record is written where the agent's code ran since: JSON nested past the
    decoder's depth raised RecursionError, which made the attempt an infrastructure failure;
    it is a record that is not one (reported as missing, never dropped)."""
    assert parse('{"entries": ' + "[" * 100_000) is None


def test_a_record_is_capped_as_json_writes_it(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Config text of control characters is written 6 bytes to the byte: counted raw, the
    record grew to 6 times its cap, past what the grader reads (an infrastructure failure the
    agent's files caused). Counted as written, it ends within one entry of its cap, marked
    truncated; here at a 1 MiB cap (the real one is 24 MiB)."""
    monkeypatch.setattr(tree_audit, "MAX_RECORD_BYTES", 1 << 20)
    for i in range(24):
        (repo / f"data/d{i}").mkdir(parents=True)
        (repo / f"data/d{i}/setup.cfg").write_bytes(b"\x01" * (64 << 10))
    out = tmp_path / "record.json"
    record = recorded(repo, out)
    assert record.truncated
    assert out.stat().st_size <= (1 << 20) + 6 * (64 << 10) + 4096
    assert MAX_RECORD_BYTES + 6 * (257 << 10) + 6 * 2 * 4096 < MAX_READ_BYTES
