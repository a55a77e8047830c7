"""Strict grading's witness of the verifier's pytest sessions (docs/design.md §6.1).

The code under test runs inside the verifier's test process: ``from calc import add`` imports
the agent's module into pytest. Such code can register ``atexit.register(lambda:
os._exit(0))`` and a failing session then exits 0, which a Harbor ``test.sh`` turns into a
reward of 1; or it prints a passing summary at exit, which Terminal-Bench's parser reads. No
rule over file names can see that: the module is the agent's legitimate work.

So strict grading loads a plugin of its own into every pytest session the verifier starts
(``_thundersync_witness.py``: ``PYTEST_ADDOPTS=-p _thundersync_witness``, its folder appended to
``PYTHONPATH`` after the task's own), which records each session's start and its exit status
outside the work folder, beside a sentinel the grader wrote. A verdict of a full pass is
contradicted, and scores 0 as tampering, when a session failed (a non-zero exit status), when
a session started and never reached its end (the process exited from inside the run), or when
the records were removed or the sentinel changed.

What it cannot see (code written against it, in the same process) and which tasks qualify:
docs/design.md §6.1, principle 4."""

from __future__ import annotations

import json
import posixpath
import shlex
import uuid
from dataclasses import dataclass
from pathlib import Path

from environments.sandboxes.protocol import Sandbox
from environments.terminal_bench.grading import GraderSetupError

PLUGIN = Path(__file__).with_name("_thundersync_witness.py")
MODULE = PLUGIN.stem
FOLDER_NAME = ".thundersync-witness"
_SENTINEL = ".sentinel"


@dataclass(frozen=True, slots=True)
class Witness:
    """Where the plugin and its records live in one grading sandbox, and the sentinel's text."""

    folder: str
    nonce: str

    @property
    def records(self) -> str:
        return f"{self.folder}/records"

    def exports(self, test_env: dict[str, str]) -> str:
        """Shell exports loading the plugin into every pytest session, applied after the task's
        ``[verifier] env`` (whose ``PYTEST_ADDOPTS`` is kept, the plugin added to it)."""
        addopts = f"{test_env.get('PYTEST_ADDOPTS', '')} -p {MODULE}".strip()
        plugin = shlex.quote(f"{self.folder}/plugin")
        return (
            f"export THUNDERSYNC_WITNESS={shlex.quote(self.records)} "
            f"PYTEST_ADDOPTS={shlex.quote(addopts)} "
            f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}"{plugin}'
        )


def prepare(sandbox: Sandbox, verifier_folder: str) -> Witness:
    """Make the witness's folder beside the verifier's log folder (outside the work folder
    where the sandbox has /logs), upload the plugin and write the sentinel."""
    folder = posixpath.join(posixpath.dirname(verifier_folder.rstrip("/")), FOLDER_NAME)
    witness = Witness(folder, uuid.uuid4().hex)
    q, records = shlex.quote(folder), shlex.quote(witness.records)
    made = sandbox.execute(
        f"rm -rf {q} && mkdir -p {q}/plugin {records} && chmod 777 {records} && "
        f"echo {witness.nonce} > {records}/{_SENTINEL}",
        timeout=60,
    )
    if made.exit_code != 0:
        raise GraderSetupError(f"cannot make {folder}: {made.output.strip()[-300:]}")
    sandbox.upload(PLUGIN, f"{folder}/plugin/{MODULE}.py")
    return witness


def contradictions(sandbox: Sandbox, witness: Witness, *, full_pass: bool) -> list[str]:
    """Why the records contradict a passing verdict (empty when they do not). A session that
    failed contradicts only a ``full_pass``: a verifier that gives partial credit runs failing
    sessions by design."""
    listed = sandbox.execute(
        f"cd {shlex.quote(witness.records)} && for f in {_SENTINEL} *.start *.finish; do "
        'if [ -f "$f" ] && [ ! -L "$f" ]; then '
        'printf "%s\\t%s\\n" "$f" "$(head -c 2048 "$f" | tr -d "\\n\\t")"; fi; done',
        timeout=60,
    )
    records = dict(
        line.split("\t", 1) for line in listed.output.splitlines() if line.count("\t") == 1
    )
    if listed.exit_code != 0 or records.get(_SENTINEL, "").strip() != witness.nonce:
        return [f"{witness.records}: the grader's records of the test run were removed or changed"]
    if listed.truncated:  # records hidden in the middle of a flood of sessions
        return [f"{witness.records}: more records of pytest sessions than the grader reads"]
    reasons = []
    started = [name.removesuffix(".start") for name in records if name.endswith(".start")]
    for token in started:
        finish = records.get(f"{token}.finish")
        if finish is None:
            reasons.append(
                "a pytest session of the test run ended before pytest finished it (the process "
                "exited from inside the run: os._exit, a signal, a crash)"
            )
            continue
        status = _exit_status(finish)
        if full_pass and status != 0:
            reasons.append(
                f"a pytest session of the test run finished with exit status {status} "
                "(tests failed or errored), yet the verifier reported a pass"
            )
    return sorted(set(reasons))


def _exit_status(record: str) -> int | None:
    """The ``exitstatus`` of a finish record; None where it cannot be read."""
    try:
        value = json.loads(record).get("exitstatus")
    except (ValueError, AttributeError):
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) else None
