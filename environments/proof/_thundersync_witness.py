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
contributes there (or what that code itself imports).

Uploaded alone into the grading sandbox, whose Python may be old: standard library only,
nothing of the project, no syntax newer than Python 3.5, and nothing imported at start-up that
is not already loaded (an import would search the work folder before the watch is up). It
never raises: a witness that cannot write leaves the run as it was.

PYTEST_DONT_REWRITE: pytest is asked to load this module as a plugin (``-p``) after the start-up
hook imported it, too late to rewrite its asserts (it has none); the marker stops pytest warning
so, which a repository's ``filterwarnings = error`` (Flask's) would turn into a failed run."""

# ruff: noqa: UP004, UP031, SIM105, SIM108 (Python 3.5 syntax, no contextlib at start-up)
import _thread  # built-in modules, loaded before any path is searched
import os
import sys

_FOLDER = os.environ.get("THUNDERSYNC_WITNESS", "")
_WORK = os.environ.get("THUNDERSYNC_WITNESS_WORKDIR", "").rstrip("/")
_THIS = os.path.abspath(__file__)
_CODE_SUFFIXES = (".py", ".pyc", ".pyo", ".pyw", ".so", ".pyd")
_state = {
    "token": None,
    "sessions": 0,
    "busy": set(),
    "started": False,
    "functions": set(),
    "called": set(),
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
        _after_exec(spec, lambda module: _patch_result(module.TestResult))
    elif name == "unittest":  # the package is whole: its modules' code as the runner's
        _after_exec(spec, lambda module: _snapshot(("unittest",)))


def _thread_id():
    return _thread.get_ident()


def _audit(event, args):
    """Code files under the work folder opened for reading by an import (a test may read the
    agent's files as data; those are not recorded)."""
    if event != "open" or not _WORK:
        return
    try:
        path, mode, flags = args[0], args[1], args[2]
        if isinstance(path, int):
            return
        text = os.fspath(path)
        if isinstance(text, bytes):
            text = text.decode("utf-8", "surrogateescape")
        if not text.endswith(_CODE_SUFFIXES):
            return
        if mode is None:
            reading = (flags & 3) == 0
        else:
            reading = "r" in mode and "+" not in mode
        if reading and _inside(text) and _importing():
            _load(text)
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
    """Called by the grader's ``sitecustomize`` at interpreter start: the process's first
    record, the watch on imports and opens, then the interpreter's own ``sitecustomize``
    (found after the grader's folder on the path), as if the grader's were not there."""
    if _state["started"]:
        return
    _state["started"] = True
    _append(("start", os.getpid(), list(getattr(sys, "orig_argv", sys.argv) or [])))
    sys.meta_path.insert(0, _Watch())
    if hasattr(sys, "addaudithook"):
        sys.addaudithook(_audit)
    _chain_sitecustomize()


def _chain_sitecustomize():
    here = os.path.dirname(_THIS)
    ours = sys.modules.pop("sitecustomize", None)
    saved = list(sys.path)
    try:
        sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != here]
        __import__("sitecustomize")
    except ImportError:
        pass
    except Exception:  # noqa: BLE001 (the interpreter's own would have printed and gone on)
        pass
    finally:
        sys.path[:] = saved
        if ours is not None:
            sys.modules["sitecustomize"] = ours


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
    _snapshot(_RUNNERS)


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


pytest_pyfunc_call.pytest_impl = {  # pluggy's hookimpl marker, as @pytest.hookimpl sets it
    "hookwrapper": True,
    "wrapper": False,
    "optionalhook": False,
    "tryfirst": False,
    "trylast": False,
    "specname": None,
}


def pytest_sessionfinish(session, exitstatus):
    sid = getattr(session.config, "_thundersync_witness_sid", None)
    if sid is not None:
        _check_runners(sid)
        _append(("finish", sid, int(exitstatus)))


# --- unittest ----------------------------------------------------------------------------------


def _after_exec(spec, then):
    """Wrap a module's loader so that, once the module is executed, ``then(module)`` runs:
    ``unittest.result``'s ``TestResult`` then records each test's outcome and each run's start
    and end; ``unittest``'s modules are then snapshot (``_snapshot``)."""
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


def _describe(sid, test, test_id):
    """A test's one-line description (its docstring's first line), which a verbose runner
    prints in place of its name (``test_x (module.Class)\nWhat it checks ... ok``)."""
    try:
        text = test.shortDescription()
    except Exception:  # noqa: BLE001
        return
    if text and isinstance(text, str):
        _append(("describe", sid, test_id, text))


def _patch_result(cls):
    outcomes = {
        "addSuccess": "passed",
        "addFailure": "failed",
        "addError": "error",
        "addSkip": "skipped",
        "addExpectedFailure": "xfailed",
        "addUnexpectedSuccess": "xpassed",
    }

    def recording(method, outcome):
        def wrapper(self, test, *args):
            sid = getattr(self, "_thundersync_sid", None)
            if sid is not None:
                try:
                    test_id = test.id()
                except Exception:  # noqa: BLE001
                    test_id = repr(test)
                _append(("test", sid, outcome, test_id))
                _describe(sid, test, test_id)
            return method(self, test, *args)

        return wrapper

    for name, outcome in outcomes.items():
        method = getattr(cls, name, None)
        if method is not None:
            setattr(cls, name, recording(method, outcome))
    sub_test = getattr(cls, "addSubTest", None)
    if sub_test is not None:

        def add_sub_test(self, test, subtest, err):
            sid = getattr(self, "_thundersync_sid", None)
            if sid is not None and err is not None:
                _append(("test", sid, "subtest-failed", test.id()))
            return sub_test(self, test, subtest, err)

        cls.addSubTest = add_sub_test
    start_run, stop_run = cls.startTestRun, cls.stopTestRun

    def start_test_run(self):
        self._thundersync_sid = _session_id()
        _append(("session", self._thundersync_sid, "unittest"))
        return start_run(self)

    def stop_test_run(self):
        result = stop_run(self)
        sid = getattr(self, "_thundersync_sid", None)
        if sid is not None:
            _check_runners(sid)
            _append(("finish", sid, 0 if self.wasSuccessful() else 1))
        return result

    cls.startTestRun, cls.stopTestRun = start_test_run, stop_test_run


# --- the runners' own code ---------------------------------------------------------------------

_RUNNERS = ("_pytest", "pytest", "pluggy", "unittest")
_MISSING = object()


_FUNCTION = type(_append)


def _function(value):
    """The plain function a member holds (a method's, a static or class method's, a
    property's getter), or None: read from the real wrappers only, as any object can carry a
    ``__func__`` or ``__code__`` attribute of its choosing."""
    if isinstance(value, (staticmethod, classmethod)) or type(value).__name__ == "method":
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    return value if type(value) is _FUNCTION else None


def _code(value):
    function = _function(value)
    return None if function is None else function.__code__


def _home(function):
    """Where a replacing function's code comes from: ``runner`` (a runner's own file),
    ``outside``, ``work`` (the work folder), or ``none``: no plain function, or one whose
    globals or file are not its module's (a runner's code object under forged globals)."""
    if function is None:
        return "none"
    code = function.__code__
    module = sys.modules.get(function.__globals__.get("__name__"))
    home = getattr(module, "__file__", None)
    if module is None or vars(module) is not function.__globals__ or not isinstance(home, str):
        return "none"
    if (home[:-1] if home.endswith(".pyc") else home) != code.co_filename:
        return "none"
    if code.co_filename in _state.get("runner_files", ()):
        return "runner"
    return "work" if _inside(code.co_filename) else "outside"


def _snapshot(packages):
    """Note each function, class and method (with its code object) of the loaded modules of
    ``packages``, as first seen: a failing test passes when code under test replaces one
    (``Function.runtest`` wrapped in a try, ``TestCase.assertEqual`` made a no-op)."""
    code = _state.setdefault("code", {})
    files = _state.setdefault("runner_files", set())
    for name, module in list(sys.modules.items()):
        if module is None or name.split(".", 1)[0] not in packages:
            continue
        if isinstance(getattr(module, "__file__", None), str):
            files.add(module.__file__)
        try:
            members = [(module, name, key, value) for key, value in vars(module).items()]
            for _, _, key, value in list(members):
                if isinstance(value, type) and getattr(value, "__module__", None) == name:
                    members.extend((value, name + "." + key, k, v) for k, v in vars(value).items())
        except Exception:  # noqa: BLE001
            continue
        for owner, where, key, value in members:
            if callable(value) or isinstance(value, (staticmethod, classmethod, property)):
                code.setdefault((where, key), (owner, value, _code(value)))


def _check_runners(sid):
    """Record the noted members replaced since: removed, or given code of the work folder,
    code with no source or forged globals (``("tampered", ...)``, which contradicts a pass);
    and every other replacement, by code outside the work folder or a runner's own file, as
    ``("replaced", sid, ["owner.member=module.function", ...])``: a plugin's (Hypothesis wraps
    ``FixtureFunctionMarker.__call__``) or the runner's own (pytest's ``legacypath`` sets
    ``Config._getini_unknown_type``), which stand where the reference solution's run shows
    the same, and an existing function swapped in (``unittest.case._addError``) does not."""
    changed, replaced = [], []
    for (where, key), (owner, value, code) in list(_state.get("code", {}).items()):
        try:
            now = vars(owner).get(key, _MISSING)
            function = None if now is _MISSING else _function(now)
            same = now is value or (function is not None and function is _function(value))
            if same and _code(now) is code:
                continue  # the same member or function (wrapped anew), its code unchanged
            home = _home(function)
            if home in ("work", "none"):
                changed.append("%s.%s" % (where, key))
            else:
                name = getattr(function, "__qualname__", function.__name__)
                replaced.append("%s.%s=%s.%s" % (where, key, function.__module__, name))
        except Exception:  # noqa: BLE001
            changed.append("%s.%s" % (where, key))
    if changed:
        _append(("tampered", sid, sorted(changed)[:8]))
    if replaced:
        _append(("replaced", sid, sorted(replaced)[:64]))
