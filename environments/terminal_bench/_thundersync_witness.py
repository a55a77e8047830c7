"""ThunderSync's witness: a pytest plugin that strict grading loads into every pytest session of
a verifier run (``-p _thundersync_witness``), recording each session's start and, when pytest
gets that far, its exit status, in the folder ``$THUNDERSYNC_WITNESS`` names (outside the work
folder). The grader compares the records with the verifier's verdict (``witness.py``;
docs/design.md §6.1): code under test that makes a failing session exit 0 from an ``atexit``
hook, or ends the process before pytest reports, leaves a record that says so.

Uploaded alone into the grading sandbox, whose Python may be old: standard library only,
nothing of the project, no syntax newer than Python 3.5. It never raises: a witness that
cannot write leaves the session as it was."""

import json
import os
import uuid

_FOLDER = os.environ.get("THUNDERSYNC_WITNESS", "")


def _write(name, record):
    if not _FOLDER:
        return
    try:
        with open(os.path.join(_FOLDER, name), "w") as handle:
            json.dump(record, handle)
    except Exception:  # noqa: BLE001 (a witness never changes the run it watches)
        pass


def pytest_configure(config):
    token = uuid.uuid4().hex
    config._thundersync_witness_token = token
    _write(token + ".start", {"pid": os.getpid()})


def pytest_sessionfinish(session, exitstatus):
    token = getattr(session.config, "_thundersync_witness_token", None)
    if token is None:
        return
    _write(token + ".finish", {"exitstatus": int(exitstatus)})
