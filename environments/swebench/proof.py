"""Strict SWE-bench grading's proof of a pass (docs/grading.md, principle 4).

A SWE-bench log is the repository's own test run, and the code under test runs inside it: a
patch whose module prints ``PASSED tests/test_x.py::test_y`` for every test of the instance and
then calls ``os._exit(0)`` (or ``pytest.exit(returncode=0)``, or raises ``SkipTest``) gives a log
that swebench's parser reads as resolved. So strict grading runs the eval script watched by the
witness (``environments/proof/witness.py``) and counts a resolved log only where the witness saw
the instance's tests pass, one by one, against a standard from the **reference run**: the gold
patch graded the same way, once per instance, sandbox kind and witness version (cached like the
Terminal-Bench tasks' reference runs, ``environments/proof/reference.py``).

- *Tests.* The standard is the instance's ``FAIL_TO_PASS`` and ``PASS_TO_PASS`` tests that the
  witness saw the gold patch pass, named as the witness names them (``witness_id``; a docstring
  Django printed in place of a name, by the description the witness recorded). A resolved
  log needs each of them seen passing, in pytest sessions and unittest runs that finished (with
  failures or not: other tests of the same files may fail before and after the fix, and
  swebench's verdict is the listed tests alone). A name the witness has no id for (sympy's
  runner's) is not part of the standard; the rest are.
- *Code files.* The repository is the code under test, so it may contribute any code file
  below the top-level folders (and the top-level modules) the reference run loads from, or
  that its own code imports. A new top-level module or package that something outside the
  repository asked for (``org/__init__.py``, imported by ``copy``) ran inside the tests
  although they never asked for it.
- *Unwatched instances.* An instance whose gold run shows none of its tests to the witness
  (sympy's own test runner; a runner that strips ``PYTHONPATH``) cannot be proven test by
  test: every strict attempt on it is an infrastructure failure saying so, and so is every
  attempt on an instance whose gold patch does not resolve it strictly.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
import shlex
from dataclasses import replace

from environments.proof import watch, witness
from environments.proof.reference import ReferenceRun
from environments.swebench.instance import SWEBenchInstance
from environments.tasks import Grade

BESIDE = "/logs/verifier"
"""``watch.prepare`` makes the witness's folder beside this path, outside the repository
(Harbor's verifier folder: one outside the work folder that bubblewrap publishes too)."""
PASSENV = "TOX_TESTENV_PASSENV"
"""tox 3 passes the variables it names into a test environment (it starts one without them)."""
_UNITTEST_NAME = re.compile(r"^(\w+) \(([\w.]+)\)$")


def witness_id(name: str) -> str | None:
    """The witness's id of a test as swebench's log parsers name it: a pytest node id
    (``tests/test_x.py::test_y[1]``) is pytest's; ``test_y (module.Class)``, or Python 3.11's
    ``test_y (module.Class.test_y)``, is unittest's ``module.Class.test_y``. Other names have
    none here: a docstring's first line printed in place of the name is found by the witness's
    descriptions (``reference_run``); sympy's runner's bare ``test_y`` is not found."""
    if "::" in name:
        return f"pytest:{name}"
    found = _UNITTEST_NAME.match(name)
    if found is None:
        return None
    method, where = found.groups()
    return f"unittest:{where if where.endswith('.' + method) else f'{where}.{method}'}"


def watch_command(seen: watch.Witness) -> str:
    """The exports for the eval script, run just before its test command (after its own
    activation and exports, which may set ``PYTHONPATH`` or ``PYTEST_ADDOPTS`` themselves):
    the witness's folder first on ``PYTHONPATH``, its plugin added to ``PYTEST_ADDOPTS``."""
    variables = seen.variables({})
    folder, records = shlex.quote(variables["PYTHONPATH"]), variables["THUNDERSYNC_WITNESS"]
    passed = " ".join([f"${{{PASSENV}:-}}", *variables, "THUNDERSYNC_WITNESS_USERBASE"])
    return (
        f"export {watch.KEEP_USER_SITE} THUNDERSYNC_WITNESS={shlex.quote(records)} "
        f"THUNDERSYNC_WITNESS_WORKDIR={shlex.quote(variables['THUNDERSYNC_WITNESS_WORKDIR'])} "
        f'PYTEST_ADDOPTS="${{PYTEST_ADDOPTS:-}} -p {watch.MODULE}" '
        f"PYTHONUSERBASE={shlex.quote(variables['PYTHONUSERBASE'])} "
        f'PYTHONPATH={folder}"${{PYTHONPATH:+:$PYTHONPATH}}" {PASSENV}="{passed}"'
    )


def run_key(instance: SWEBenchInstance, kind: str) -> str:
    """The reference run's cache key: everything it depends on (the row, whose base commit
    names the repository's files, the sandbox kind, the witness's version)."""
    row = json.dumps(instance.swebench_row(), sort_keys=True, default=str)
    text = f"swebench witness {witness.VERSION}\nkind {kind}\n{row}"
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


def reference_run(
    instance: SWEBenchInstance, gold: Grade, flagged: list[str], seen: witness.Observation
) -> ReferenceRun:
    """The standard from the gold patch's strict run (``gold``: its grade; ``flagged``: what
    the audit found in that run; ``seen``: what the witness recorded), or why there is none."""
    if flagged:
        return ReferenceRun(None, f"the audit flags its gold patch's run: {flagged[0]}")
    if gold.reward != 1.0:
        status = gold.details.get("tests_status", {})
        failing = [t for group in status.values() for t in group.get("failure", [])]
        shown = f" ({len(failing)} tests failing: {', '.join(failing[:3])})" if failing else ""
        return ReferenceRun(None, f"its gold patch does not resolve it strictly{shown}")
    broken = witness.contradictions(seen, full_pass=True, failing_sessions=True)
    if broken:
        return ReferenceRun(
            None, f"its gold patch's test run is not one the witness can follow: {broken[0]}"
        )
    named: set[str] = set()
    for name in (*instance.fail_to_pass, *instance.pass_to_pass):
        test = witness_id(name)
        named |= {test} if test is not None else seen.described.get(name, set())
    tests = seen.passed() & named
    if not tests:
        return ReferenceRun(
            None,
            "the witness saw none of its FAIL_TO_PASS or PASS_TO_PASS tests pass in the gold "
            "patch's run (its test runner is neither pytest nor unittest, or strips the "
            "witness's variables): unwatched",
        )
    standard = witness.Reference(frozenset(tests), frozenset(seen.loads), seen.replacements())
    return ReferenceRun(standard, reward=1.0)


def contradictions(
    seen: witness.Observation, standard: witness.Reference, workdir: str
) -> list[str]:
    """Why the witness's records do not prove a resolved log against ``standard`` (empty when
    they do). Code files below a top-level name the reference run loads from are the
    repository's; the witness judges the rest."""
    roots = {_root(path) for path in standard.loads}
    foreign = {path: by for path, by in seen.loads.items() if _root(path) not in roots}
    return witness.contradictions(
        replace(seen, loads=foreign),
        full_pass=True,
        reference=standard,
        workdir=workdir,
        failing_sessions=True,
    )


def _root(path: str) -> str:
    return posixpath.normpath(path).split("/", 1)[0]
