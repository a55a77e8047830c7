"""A real Verified instance, pallets__flask-5014, rebuilt offline from the Flask 2.3.0 sdist
and graded with its official test patch, F2P/P2P lists and parser: gold resolves, no patch
does not. Needs the Verified parquet and PyPI (the sdist and Flask's pinned dependencies, cached
under THUNDERSYNC_FLASK_CACHE when set); skipped without them."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from environments.sandboxes import Sandbox, make_sandbox
from environments.swebench import SWEBenchTask, load_instances
from environments.swebench.snapshot import snapshot_commit
from environments.tasks import GradingContext

pytestmark = pytest.mark.slow

REPO_ROOT = Path(__file__).resolve().parents[2]
DATA = Path(os.environ.get("THUNDERSYNC_SWEBENCH_DATA", REPO_ROOT.parent / "shared/data/swebench"))
VERIFIED = DATA / "SWE-bench_Verified.test.parquet"
INSTANCE_ID = "pallets__flask-5014"
FLASK_DEPS = ("werkzeug==2.3.0", "jinja2==3.1.2", "itsdangerous==2.1.2", "click==8.1.3")
FLASK_DEPS += ("blinker==1.6.2", "markupsafe==2.1.2")
# Flask 2.3.0's conftest needs a pytest of its time (monkeypatch.notset went in pytest 8)
FLASK_DEPS += ("pytest==7.3.1", "pluggy==1.0.0", "iniconfig==2.0.0", "packaging==23.1")
# the official image's environment activation, replaced by the offline equivalent
ACTIVATE = "source /opt/miniconda3/bin/activate\nconda activate testbed\n"
OFFLINE_ENV = (
    "export PATH=/testbed/.deps/bin:$PATH PYTHONPATH=/testbed/.deps:/testbed/src PIP_NO_INDEX=1 "
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1\n"
)


def pip(*args: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pip", *args, "-q", "--disable-pip-version-check"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot fetch Flask 2.3.0 from the package index: {done.stderr[-300:]}")


@pytest.fixture(scope="module")
def downloads(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cache = os.environ.get("THUNDERSYNC_FLASK_CACHE")
    root = Path(cache) if cache else tmp_path_factory.mktemp("flask-downloads")
    if not list(root.glob("sdist/Flask-2.3.0.tar.gz")):
        sdist = str(root / "sdist")
        pip("download", "flask==2.3.0", "--no-deps", "--no-binary", ":all:", "-d", sdist)
    if not (root / "deps" / "_pytest").is_dir():
        pip("install", "--no-deps", "--target", str(root / "deps"), *FLASK_DEPS)
    return root


@pytest.fixture(scope="module")
def task(downloads: Path, tmp_path_factory: pytest.TempPathFactory) -> SWEBenchTask:
    """The Verified row, rebased onto a snapshot of the sdist with the fix and its tests
    reverse-applied (the repository at the base commit)."""
    if not VERIFIED.exists():
        pytest.skip(f"{VERIFIED} absent")
    import pyarrow.parquet as pq

    rows = pq.read_table(VERIFIED).to_pylist()
    row = next(r for r in rows if r["instance_id"] == INSTANCE_ID)
    work = tmp_path_factory.mktemp("flask-5014")
    with tarfile.open(downloads / "sdist" / "Flask-2.3.0.tar.gz") as tar:
        tar.extractall(work, filter="data")
    snapshot = work / "Flask-2.3.0"
    for name in ("patch", "test_patch"):
        (work / name).write_text(row[name])
        subprocess.run(["git", "apply", "-R", str(work / name)], cwd=snapshot, check=True)
    shutil.copytree(downloads / "deps", snapshot / ".deps")
    (snapshot / ".gitignore").write_text(".deps/\n__pycache__/\n*.egg-info/\n.gitconfig\n")
    base_commit = snapshot_commit(snapshot)
    script = row["eval_script"].replace(row["base_commit"], base_commit)
    assert script.count(ACTIVATE) == 2
    script = script.replace(ACTIVATE, OFFLINE_ENV).replace("python -m pip install -e .\n", "")
    rebuilt = {**row, "base_commit": base_commit, "eval_script": script}
    rebuilt |= {"image": None, "repo_snapshot": str(snapshot)}
    (work / "row.jsonl").write_text(json.dumps(rebuilt) + "\n")
    return load_instances(work / "row.jsonl").get(INSTANCE_ID)


@pytest.mark.parametrize("strict", [True, False], ids=["strict", "official"])
@pytest.mark.parametrize("patch", ["gold", "none"])
def test_flask_5014_rebuilt_offline(task: SWEBenchTask, patch: str, strict: bool) -> None:
    sandbox = make_sandbox(task.sandbox_spec(), kind="bwrap")
    made: list[Sandbox] = []

    def fresh() -> Sandbox:
        made.append(make_sandbox(task.sandbox_spec(), kind="bwrap"))
        return made[-1]

    try:
        task.setup(sandbox)
        if patch == "gold":
            for command in task.reference_solution():
                result = sandbox.execute(command, timeout=60)
                assert result.exit_code == 0, result.output
        grade = task.grade(sandbox, GradingContext(fresh, strict=strict))
    finally:
        for each in [sandbox, *made]:
            each.close()
    assert not grade.infra_failure, grade.details
    assert grade.details["tamper_suspected"] is False, grade.details
    status = grade.details["tests_status"]
    assert len(status["PASS_TO_PASS"]["success"]) == len(task.instance.pass_to_pass)
    if patch == "gold":
        assert grade.reward == 1.0, grade.details
        assert status["FAIL_TO_PASS"]["success"] == list(task.instance.fail_to_pass)
    else:
        assert grade.reward == 0.0
        assert status["FAIL_TO_PASS"]["failure"] == list(task.instance.fail_to_pass)
