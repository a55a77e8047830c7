"""Where strict grading's witness lives in a grading sandbox and how every Python process of a
verifier's run starts it (docs/grading.md, "a pass is proven"): its folder beside the verifier's
log folder, outside the work folder; the witness and its runners' module with the grader's own
``sitecustomize`` first on ``PYTHONPATH``; a user site whose ``.pth`` file starts it where a
script sets its own ``PYTHONPATH``; and which verifiers name Python, so that a run the witness
never saw is known unwatched. What it records and what proves a pass: ``witness.py``."""

from __future__ import annotations

import posixpath
import re
import shlex
import shutil
import tempfile
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from environments.sandboxes.protocol import GraderSetupError, Sandbox, own

PLUGIN = Path(__file__).with_name("_thundersync_witness.py")
MODULE = PLUGIN.stem
RUNNERS = Path(__file__).with_name("_thundersync_runners.py")
STARTUP = Path(__file__).with_name("_thundersync_sitecustomize.py")
FOLDER_NAME = ".thundersync-witness"
SENTINEL = ".sentinel"
"""The records folder's file holding each run's nonce: removed or changed, no record stands."""

KEEP_USER_SITE = 'THUNDERSYNC_WITNESS_USERBASE="${PYTHONUSERBASE:-}"'
"""A shell assignment keeping the run's own user site, which the witness adds back."""
_LAUNCHERS = re.compile(
    r"(?<![\w.-])(python[0-9.]*|pytest|py\.test|unittest|uvx?|pip[0-9.]*|tox|nox|poetry|pdm|"
    r"hatch|pipenv|conda|mamba|micromamba)(?![\w-])"
)


def python_named(name: str, text: str) -> str | None:
    """The Python launcher a verifier's file ``name`` (with its ``text``) names, if any: a
    Python file, or a word that starts Python (``python3``, ``pytest``, ``uv``...). A reference
    run whose verifier names one while the witness saw no Python process was not watched (a
    test script that exports its own ``PYTHONPATH``, ``env -i``, ``python -I``): its verdict
    cannot stand for a pass (red team, 2026-12-07: an agent's ``os._exit(0)`` appended to the
    module a unittest verifier imported scored 1)."""
    if name.endswith(".py"):
        return name
    found = _LAUNCHERS.search(text)
    return None if found is None else found[1]


_WORD = re.compile(r"[^\s;&|()<>'\"`=]+")


def work_files_named(texts: list[str], workdir: str, present: Collection[str]) -> list[str]:
    """The work folder's files (of ``present``, relative to it) a verifier's scripts
    (``texts``) name, which they may run: a path in the work folder, absolute or relative to
    it (``/app/run_tests.sh``, ``./check``, ``run_tests.sh``), and the ``Makefile`` where they
    name ``make`` (a recipe ``PYTHONPATH=src pytest`` names Python where the script does
    not: red team, 2026-12-07)."""
    root = workdir.rstrip("/") + "/"
    found: list[str] = []
    for text in texts:
        for word in _WORD.findall(text):
            if word == "make":
                candidates = ["Makefile", "makefile", "GNUmakefile"]
            elif word.startswith(root):
                candidates = [posixpath.normpath(word[len(root) :])]
            else:
                candidates = [] if word.startswith("/") else [posixpath.normpath(word)]
            found += [c for c in candidates if c in present and c not in found]
    return found


@dataclass(frozen=True, slots=True)
class Witness:
    """Where the witness and its records live in one grading sandbox, the sentinel's text, and
    the work folder it watches."""

    folder: str
    nonce: str
    workdir: str = "/app"

    @property
    def records(self) -> str:
        return f"{self.folder}/records"

    @property
    def plugin(self) -> str:
        return f"{self.folder}/plugin"

    def variables(self, test_env: dict[str, str]) -> dict[str, str]:
        """The variables starting the witness in every Python process and loading it into every
        pytest session: the task's ``PYTEST_ADDOPTS`` (``test_env``) kept, the plugin added;
        ``PYTHONPATH`` the witness's folder alone (``exports`` keeps the run's own after it);
        ``PYTHONUSERBASE`` the grader's user site, whose ``.pth`` file starts the witness where
        a script sets its own ``PYTHONPATH`` (``exports`` keeps the run's own user site in
        ``THUNDERSYNC_WITNESS_USERBASE``, which the witness adds back)."""
        addopts = f"{test_env.get('PYTEST_ADDOPTS', '')} -p {MODULE}".strip()
        return {
            "THUNDERSYNC_WITNESS": self.records,
            "THUNDERSYNC_WITNESS_WORKDIR": self.workdir.rstrip("/"),
            "PYTEST_ADDOPTS": addopts,
            "PYTHONUSERBASE": f"{self.folder}/user",
            "PYTHONPATH": self.plugin,
        }

    def exports(self, test_env: dict[str, str]) -> str:
        """Shell exports of ``variables``, applied after the task's ``[verifier] env`` (whose
        ``PYTHONPATH`` follows the witness's folder, and whose user site the witness keeps).
        The user site is read again: the grader's pinned environment turned it off
        (``PYTHONNOUSERSITE``), and it is now the grader's folder, under a fresh ``HOME``."""
        words = [f"{name}={shlex.quote(value)}" for name, value in self.variables(test_env).items()]
        exported = f"export {KEEP_USER_SITE} " + " ".join(words) + '"${PYTHONPATH:+:$PYTHONPATH}"'
        return f"unset PYTHONNOUSERSITE && {exported}"

    def user_site_line(self) -> str:
        """The grader's user-site ``.pth`` line: Python runs it while it starts, before its
        ``sitecustomize``, whatever ``PYTHONPATH`` says (not under ``-s``, ``-E``, ``-I``, nor
        in a virtual environment without the system's packages)."""
        code = (
            f"try:\n if {self.plugin!r} not in sys.path:\n  sys.path.insert(0, {self.plugin!r})\n"
            f" import {MODULE}\n {MODULE}.user_site()\nexcept Exception:\n pass\n"
        )
        return f"import sys; exec({code!r})\n"


def prepare(sandbox: Sandbox, verifier_folder: str, workdir: str = "/app") -> Witness:
    """Make the witness's folder beside the verifier's log folder (outside the work folder
    where the sandbox has /logs), upload the witness and its start-up hook, write the
    sentinel."""
    folder = posixpath.join(posixpath.dirname(verifier_folder.rstrip("/")), FOLDER_NAME)
    seen = Witness(folder, uuid.uuid4().hex, workdir)
    q, records = shlex.quote(folder), shlex.quote(seen.records)
    made = sandbox.execute(
        own(
            f"rm -rf {q} && mkdir -p {records} && chmod 777 {records} && "
            f"echo {seen.nonce} > {records}/{SENTINEL}"
        ),
        timeout=60,
    )
    if made.exit_code != 0:
        raise GraderSetupError(f"cannot make {folder}: {made.output.strip()[-300:]}")
    with tempfile.TemporaryDirectory() as tmp:  # two uploads: a Docker call costs ~60 ms
        plugin, user = Path(tmp, "plugin"), Path(tmp, "user")
        plugin.mkdir()
        for source in (PLUGIN, RUNNERS):
            shutil.copyfile(source, plugin / source.name)
        shutil.copyfile(STARTUP, plugin / "sitecustomize.py")
        line = seen.user_site_line()
        for minor in range(6, 21):  # the user site Python looks for (3.13t: free-threaded)
            for threaded in ("", "t"):
                site = user / "lib" / f"python3.{minor}{threaded}" / "site-packages"
                site.mkdir(parents=True)
                (site / f"{MODULE}.pth").write_text(line)
        sandbox.upload(plugin, f"{folder}/plugin")
        sandbox.upload(user, f"{folder}/user")
    return seen
