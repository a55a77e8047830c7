"""ThunderSync's witness: a pytest plugin that strict grading loads into every pytest session of
a verifier run (``-p _thundersync_witness``), recording each session's start and, when pytest
gets that far, its exit status, in the folder ``$THUNDERSYNC_WITNESS`` names (outside the work
folder). The grader compares the records with the verifier's verdict (``witness.py``;
docs/design.md §6.1): code under test that makes a failing session exit 0 from an ``atexit``
hook, or ends the process before pytest reports, leaves a record that says so.

Stdlib only, and nothing here imports the project: this file is uploaded alone into the
grading sandbox. It never raises: a witness that cannot write leaves the session as it was."""

from __future__ import annotations

import json
import os
import uuid

_FOLDER = os.environ.get("THUNDERSYNC_WITNESS", "")


def _write(name: str, record: dict) -> None:
    if not _FOLDER:
        return
    try:
        with open(os.path.join(_FOLDER, name), "w", encoding="utf-8") as handle:
            json.dump(record, handle)
    except (OSError, TypeError, ValueError):
        pass


def pytest_configure(config) -> None:
    token = uuid.uuid4().hex
    config._thundersync_witness_token = token
    _write(f"{token}.start", {"pid": os.getpid(), "cwd": os.getcwd()})


def pytest_sessionfinish(session, exitstatus) -> None:
    token = getattr(session.config, "_thundersync_witness_token", None)
    if token is None:
        return
    _write(
        f"{token}.finish",
        {
            "exitstatus": int(exitstatus),
            "failed": int(getattr(session, "testsfailed", 0)),
            "collected": int(getattr(session, "testscollected", 0)),
        },
    )
