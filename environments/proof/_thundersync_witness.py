"""ThunderSync's witness: started by the grader's own ``sitecustomize`` in every Python process of
a strict verifier run, before the interpreter has put the work folder on its import path and
before any conftest, plugin or module of the agent's can run (docs/design.md §6.1).

It appends to one record file per process, in the folder ``$THUNDERSYNC_WITNESS`` names
(outside the work folder), one Python literal a line (the grader reads them with
``ast.literal_eval``):

- ``("start", pid, argv)`` when the process starts;
- ``("load", path, importer)`` for each code file (a module found by the import system, or a
  ``.py``/``.pyc``/``.so`` file opened for reading) under ``$THUNDERSYNC_WITNESS_WORKDIR``, with
  the file of the code that asked for it (the first frame outside the import machinery);
- ``("read", path, reader, content)`` for each other file there read (by its name and its
  link's target; ``reader``: the innermost frame's file outside the standard library and
  installed packages, "" for none; ``content``: what it held as it was opened, ``_content``;
  a link's target read with ``"target"`` after them), ``("changed", path, reader)`` for each
  file changed after the reader last read it (``_recheck``), ``("wrote", path)`` for each
  written, and ``("defined", path)`` for each file whose code a test runs as its function
  (the tests' own files: ``witness.py``);
- ``("session", sid, runner)``, ``("test", sid, outcome, test_id)`` (with ``("describe",
  sid, test_id, first docstring line)`` for a unittest test that has one) and ``("finish", sid,
  status)`` (``("tampered", sid, names)`` before it when the test runners' own functions
  changed since they were loaded) for each pytest session (this module is also the pytest
  plugin ``-p _thundersync_witness``) and each unittest run (``unittest.result.TestResult``
  is wrapped when it is imported): a test counts as passed only where its call phase passed,
  and, for a plain test function, only where the function was called (``passed-unrun``
  otherwise).

The grader compares these with the reference solution's run of the same task: the tests it
passes must each be seen to pass, and the work folder may contribute only the code files it
contributes there (or what that code itself imports). Uploaded with ``_thundersync_runners.py``
alone into the grading sandbox, whose Python may be old: standard library only, no syntax
newer than Python 3.5, nothing imported at start-up that is not already loaded but that module
beside it (an import would search the work folder before the watch is up). It never raises: a
witness that cannot write leaves the run as it was.

PYTEST_DONT_REWRITE: pytest is asked to load this module as a plugin (``-p``) after the start-up
hook imported it, too late to rewrite its asserts (it has none); the marker stops pytest warning
so, which a repository's ``filterwarnings = error`` (Flask's) would turn into a failed run."""

# ruff: noqa: UP004, UP031, SIM105, SIM108 (Python 3.5 syntax, no contextlib at start-up)
import _thread  # built-in modules, loaded before any path is searched
import os
import sys

import _thundersync_runners as _runners  # beside this file, first on the path at start-up

_FOLDER = os.environ.get("THUNDERSYNC_WITNESS", "")
_WORK = os.environ.get("THUNDERSYNC_WITNESS_WORKDIR", "").rstrip("/")
_THIS = os.path.abspath(__file__)
_LIBRARY = os.path.dirname(os.path.abspath(os.__file__)) + "/"
_PACKAGES = ("/site-packages/", "/dist-packages/")
_CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")
_state = {
    "token": None,
    "sessions": 0,
    "busy": set(),
    "started": False,
    "functions": set(),
    "called": set(),
    "noted": {},
    "hashing": set(),
    "contents": {},
    "hashed": {},
    "sha256": None,
}


def _token():
    if _state["token"] is None or _state.get("pid") != os.getpid():  # a fork is a new process
        _state["token"] = "%d-%s" % (os.getpid(), os.urandom(6).hex())
        _state["pid"] = os.getpid()
    return _state["token"]


def _append(record):
    """One record, appended with one write(2) (records of other processes never interleave)."""
    if not _FOLDER:
        return
    try:
        name = os.path.join(_FOLDER, _token() + ".proc")
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
        try:
            os.write(fd, (repr(record) + "\n").encode("utf-8", "backslashreplace"))
        finally:
            os.close(fd)
    except Exception:  # noqa: BLE001 (a witness never changes the run it watches)
        pass


def _inside(path):
    """Whether ``path`` lies in the work folder (as given, or with its links resolved)."""
    if not _WORK or not path:
        return False
    try:
        path = os.fspath(path) if hasattr(os, "fspath") else path
        if isinstance(path, bytes):
            path = path.decode("utf-8", "surrogateescape")
        if not isinstance(path, str):
            return False
        full = os.path.abspath(path)
        if full == _WORK or full.startswith(_WORK + "/"):
            return True
        real, work = os.path.realpath(full), os.path.realpath(_WORK)
        return real == work or real.startswith(work + "/")
    except Exception:  # noqa: BLE001
        return False


def _importer():
    """The file of the code that asked for a module or opened a file: the first frame that is
    neither the import machinery's nor this module's."""
    try:
        frame = sys._getframe(2)
    except Exception:  # noqa: BLE001
        return ""
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<frozen") and os.path.abspath(name) != _THIS:
            return os.path.abspath(name)
        frame = frame.f_back
    return ""


def _load(path):
    _append(("load", os.path.abspath(path), _importer()))


class _Watch(object):
    """A meta-path finder ahead of all others: asks the rest for each module's spec and
    records those found in the work folder (an extension module opens no file Python sees)."""

    def find_spec(self, name, path=None, target=None):
        ident = _thread_id()
        busy = _state["busy"]
        if ident in busy:
            return None
        busy.add(ident)
        try:
            for finder in list(sys.meta_path):
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    _note(name, spec)
                    return spec
            return None
        finally:
            busy.discard(ident)


def _note(name, spec):
    places = []
    if getattr(spec, "has_location", False) and spec.origin:
        places.append(spec.origin)
    places.extend(spec.submodule_search_locations or ())
    for place in places:
        if _inside(place):
            _load(place)
            return
    if name == "unittest.result":
        _after_exec(
            spec,
            lambda module: _runners.record_unittest(
                module.TestResult, _append, _session_id, _defined, _inside, _recheck
            ),
        )
    elif name == "unittest":  # the package is whole: its modules' code as the runner's
        _after_exec(spec, lambda module: _runners.snapshot(("unittest",)))


def _thread_id():
    return _thread.get_ident()


def _audit(event, args):
    """Files under the work folder opened: a code file read by an import is a load (a test may
    read the agent's source as data: not one); any other file read is a read, and one written
    (or renamed into place) a write."""
    if not _WORK:
        return
    try:
        if event in ("os.rename", "os.replace"):
            _wrote(args[1])
            return
        if event != "open" or _thread_id() in _state["hashing"]:
            return  # (``_content``'s own open of the file it hashes: no read of the run's)
        path, mode, flags = args[0], args[1], args[2]
        if isinstance(path, int):
            return
        text = os.fspath(path)
        if isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        if mode is None:
            reading = (flags & 3) == 0
        else:
            reading = "r" in mode and "+" not in mode
        if not _inside(text):
            return
        if text.endswith(_CODE_SUFFIXES):
            if reading and _importing():
                _load(text)
        elif not reading:
            _wrote(text)
        else:
            reader = _reader()
            content, name = _content(text, reader), os.path.abspath(text)
            for path in set((name, os.path.realpath(text))):
                if _inside(path):
                    link = () if path == name else ("target",)
                    _note_once(("read", path, reader, content) + link, ("read", reader))
    except Exception:  # noqa: BLE001
        pass


def _wrote(path):
    """A file the run writes (not code, nor a bytecode cache's, which Python writes as it
    imports a test file: the file would pass for the run's output)."""
    path = os.fspath(path)
    if not isinstance(path, str) or "__pycache__" in path or path.endswith(_CODE_SUFFIXES):
        return
    if _inside(path):
        _note_once(("wrote", os.path.abspath(path)))


def _reader():
    """The file of the innermost frame (from the caller of ``open``, two frames up) that is
    neither the standard library's, an installed package's nor the witness's: the test code
    or the work folder's code that read a file; "" for none (the runner's own read)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith("<") and "_thundersync_" not in os.path.basename(name):
            full = os.path.abspath(name)
            if not full.startswith(_LIBRARY) and not any(p in full for p in _PACKAGES):
                return full
        frame = frame.f_back
    return ""


def _content(path, reader):
    """A regular file's size and SHA-256 as it is opened (its size alone past 1 GiB; "" if
    it cannot be read), cached per reader by its status (its change time moves with any write,
    rename or link, and no call sets it; a write through a shared mapping moves nothing, so a
    reader's first read of it is hashed afresh: red team, 2026-12-08): a test that reads
    another file's content than the reference run's test did (its ``open`` redirected, its
    folder changed, the file rewritten for the run and put back) reads other expectations."""
    ident, sha256 = _thread_id(), _state["sha256"]
    _state["hashing"].add(ident)
    try:
        status = os.stat(path)
        if sha256 is None or status.st_mode & 0o170000 != 0o100000:  # no FIFO: it would block
            return ""
        key = (_status(status), reader)
        if key not in _state["contents"]:
            digest, fd = sha256(), os.open(path, os.O_RDONLY)
            try:
                for _ in range(1024):
                    chunk = os.read(fd, 1 << 20)
                    if not chunk:
                        break
                    digest.update(chunk)
                whole = not os.read(fd, 1)
            finally:
                os.close(fd)
            hexdigest = digest.hexdigest() if whole else ""
            _state["contents"][key] = "%d:%s" % (status.st_size, hexdigest)
        _state["hashed"][(os.path.abspath(path), reader)] = key[0]
        return _state["contents"][key]
    except Exception:  # noqa: BLE001
        return ""
    finally:
        _state["hashing"].discard(ident)


def _recheck():
    """Each file read and hashed, looked at again as a session ends and as the process
    exits: one renamed, linked or written since its reader last read it (its status moved)
    may have been other content when the reader read it than when it was hashed (another
    process renamed a copy over it for the read and put it back: red team, 2026-12-08)."""
    for (path, reader), then in list(_state["hashed"].items()):
        try:
            now = _status(os.stat(path))
        except Exception:  # noqa: BLE001 (gone)
            now = None
        if now != then:
            _note_once(("changed", path, reader), ("changed", reader))


def _status(status):
    return (status.st_dev, status.st_ino, status.st_size, status.st_mtime_ns, status.st_ctime_ns)


def _hashlib():
    """The standard library's SHA-256, imported from its own folders alone as the watch starts:
    the work folder may be on the path already (``PYTHONPATH=/app``), where a ``hashlib.py``
    would forge it."""
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in saved if p and (os.path.abspath(p) + "/").startswith(_LIBRARY)]
        import hashlib

        name = os.path.abspath(getattr(hashlib, "__file__", None) or _LIBRARY)
        return hashlib.sha256 if name.startswith(_LIBRARY) else None
    except Exception:  # noqa: BLE001
        return None
    finally:
        sys.path[:] = saved


def _note_once(record, kind=None):
    """A record not yet written by this process, up to 4096 of each kind (a test reading a
    thousand files, once each, writes a bounded record; reads per reader, so the code under
    test reading many cannot crowd out the test's own)."""
    noted = _state["noted"].setdefault(kind or record[0], set())
    if record not in noted and len(noted) < 4096:
        noted.add(record)
        _append(record)


def _defined(function):
    """The file of a test's function, where it lies in the work folder: its innermost
    function through decorators' ``__wrapped__``."""
    try:
        for _ in range(16):
            function = getattr(function, "__func__", function)
            inner = getattr(function, "__wrapped__", None)
            if inner is None:
                break
            function = inner
        name = getattr(getattr(function, "__code__", None), "co_filename", None)
        if isinstance(name, str) and _inside(name):
            _note_once(("defined", os.path.abspath(name)))
    except Exception:  # noqa: BLE001
        pass


def _importing():
    """Whether the import system is on the stack: a code file opened to be imported (by
    Python, or by pytest's assertion rewriter inside an import), not a test reading the
    agent's source as data (a style check over every ``*.py`` of the work folder)."""
    frame = sys._getframe(2)
    depth = 0
    while frame is not None and depth < 200:
        if frame.f_code.co_filename.startswith("<frozen importlib"):
            return True
        frame, depth = frame.f_back, depth + 1
    return False


def start():
    """The process's first record, then the watch on imports and opens: called at interpreter
    start by the grader's ``sitecustomize`` or, earlier, by its user-site ``.pth`` file
    (``user_site``), whichever comes first."""
    if _state["started"]:
        return
    _state["started"] = True
    _append(("start", os.getpid(), list(getattr(sys, "orig_argv", sys.argv) or [])))
    sys.meta_path.insert(0, _Watch())
    _state["sha256"] = _hashlib()
    try:
        import atexit  # built in: no path is searched

        atexit.register(_recheck)
    except Exception:  # noqa: BLE001
        pass
    if hasattr(sys, "addaudithook"):
        sys.addaudithook(_audit)


def user_site():
    """Called by the ``.pth`` file in the grader's user site (``$PYTHONUSERBASE``), which
    Python reads while it starts even where a test script or a ``Makefile`` set its own
    ``PYTHONPATH`` and dropped the grader's folder: with the grader's folder put first on the
    path (so Python's ``sitecustomize`` is the grader's, which chains to the interpreter's
    own), the watch starts, and the user site the process would have had is added back."""
    start()
    import site  # loaded: this runs inside it

    ours = os.environ.get("PYTHONUSERBASE", "")
    base = os.environ.get("THUNDERSYNC_WITNESS_USERBASE") or os.path.expanduser("~/.local")
    user = getattr(site, "USER_SITE", None)
    if ours and isinstance(user, str) and user.startswith(ours):
        site.USER_BASE, site.USER_SITE = base, base + user[len(ours) :]
        if os.path.isdir(site.USER_SITE):
            site.addsitedir(site.USER_SITE)


# --- pytest ------------------------------------------------------------------------------------


def _session_id():
    _state["sessions"] += 1
    return "%s-%d" % (_token(), _state["sessions"])


def pytest_addoption(parser):
    """Called as pytest registers this plugin (``-p``), before any conftest, entry-point
    plugin or test module is imported: the runners' code as pytest ships it."""
    try:
        __import__("unittest")  # the standard library's, for the TestCase items pytest runs
    except Exception:  # noqa: BLE001
        pass
    _runners.snapshot(_runners.RUNNERS)


def pytest_configure(config):
    sid = _session_id()
    config._thundersync_witness_sid = sid
    _state["pytest_sid"] = sid
    _append(("session", sid, "pytest"))


def pytest_runtest_logreport(report):
    sid = _state.get("pytest_sid")
    if sid is None:
        return
    if report.when == "call":
        outcome = report.outcome
        if outcome == "passed" and hasattr(report, "wasxfail"):
            outcome = "xpassed"
        elif outcome == "skipped" and hasattr(report, "wasxfail"):
            outcome = "xfailed"
        elif outcome == "passed" and _unrun(report.nodeid):
            outcome = "passed-unrun"  # its test function was never called
        _append(("test", sid, outcome, report.nodeid))
    elif report.outcome != "passed":  # a setup or teardown that failed or skipped
        _append(("test", sid, "%s-%s" % (report.when, report.outcome), report.nodeid))


def _unrun(nodeid):
    return nodeid in _state["functions"] and nodeid not in _state["called"]


def pytest_collection_modifyitems(items):
    """The plain test functions of the session (pytest's own ``Function`` items, whose call
    phase always calls ``pytest_pyfunc_call``)."""
    try:
        for item in items:
            kind = type(item)
            if kind.__name__ == "Function" and kind.__module__ == "_pytest.python":
                _state["functions"].add(item.nodeid)
            _defined(getattr(item, "obj", None))
    except Exception:  # noqa: BLE001
        pass


def pytest_pyfunc_call(pyfuncitem):
    """Notes each test function actually called: a call phase that passed without it (the
    code under test made ``Function.runtest`` a no-op) proves nothing. A hook wrapper, so no
    other implementation (a conftest's, a plugin's) can answer before it sees the call."""
    try:
        module = getattr(pyfuncitem, "module", None)
        if module is None or type(module) is type(sys):  # a module whose class was changed
            _state["called"].add(pyfuncitem.nodeid)  # can hand pytest another function
    except Exception:  # noqa: BLE001
        pass
    yield


# pluggy's hookimpl marker, as @pytest.hookimpl sets it
pytest_pyfunc_call.pytest_impl = dict.fromkeys(
    ("wrapper", "optionalhook", "tryfirst", "trylast"), False
)
pytest_pyfunc_call.pytest_impl.update(hookwrapper=True, specname=None)


def pytest_sessionfinish(session, exitstatus):
    sid = getattr(session.config, "_thundersync_witness_sid", None)
    if sid is not None:
        _runners.report(sid, _inside, _append)
        _recheck()
        _append(("finish", sid, int(exitstatus)))


# --- unittest ----------------------------------------------------------------------------------


def _after_exec(spec, then):
    """Wrap a module's loader so that, once the module is executed, ``then(module)`` runs:
    ``unittest.result``'s ``TestResult`` then records each test's outcome and each run's start
    and end; ``unittest``'s modules are then snapshot (``_runners.snapshot``)."""
    loader = spec.loader
    execute = getattr(loader, "exec_module", None)
    if execute is None:
        return

    def exec_module(module):
        execute(module)
        try:
            then(module)
        except Exception:  # noqa: BLE001
            pass

    try:
        loader.exec_module = exec_module
    except Exception:  # noqa: BLE001
        pass
