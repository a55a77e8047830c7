"""The test runners' own code for strict grading's witness (``_thundersync_witness.py``, which
imports this module from beside itself while Python starts, before the work folder is on the
import path; docs/design.md §6.1): each function, class and method of pytest's, pluggy's and
unittest's modules noted as first loaded, and the ones replaced since named at each session's
end; unittest's results made to record each run and test (``record_unittest``). Same
constraints as the witness: standard library only, Python 3.5 syntax, nothing imported."""

# ruff: noqa: UP031 (Python 3.5 syntax)
import sys

RUNNERS = ("_pytest", "pytest", "pluggy", "unittest")
_MISSING = object()


_FUNCTION = type(lambda: None)
_state = {"code": {}, "runner_files": set()}


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


def _home(function, inside):
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
    return "work" if inside(code.co_filename) else "outside"


def snapshot(packages):
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


def check(inside):
    """The noted members replaced since, as ``(changed, replaced)``: ``changed`` those removed,
    or given code of the work folder (``inside``), code with no source or forged globals, which
    contradicts a pass; ``replaced`` every other replacement, by code outside the work folder
    or a runner's own file, as ``"owner.member=module.function"``: a plugin's (Hypothesis wraps
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
            home = _home(function, inside)
            if home in ("work", "none"):
                changed.append("%s.%s" % (where, key))
            else:
                name = getattr(function, "__qualname__", function.__name__)
                replaced.append("%s.%s=%s.%s" % (where, key, function.__module__, name))
        except Exception:  # noqa: BLE001
            changed.append("%s.%s" % (where, key))
    return changed, replaced


def report(sid, inside, append):
    """``check``'s findings for session ``sid`` as records (``append``): ``("tampered", sid,
    names)``, which contradicts a pass, and ``("replaced", sid, names)``, which stands where
    the reference solution's run shows the same."""
    try:
        changed, replaced = check(inside)
    except Exception:  # noqa: BLE001 (a witness never raises)
        changed, replaced = ["the runners' check"], []
    if changed:
        append(("tampered", sid, sorted(changed)[:8]))
    if replaced:
        append(("replaced", sid, sorted(replaced)[:64]))


def record_unittest(cls, append, new_session, defined, inside, ending):
    """``unittest.result.TestResult`` (``cls``) made to record, through the witness's
    ``append``, each run's start (``new_session()`` names it) and end (with ``report``, after
    ``ending()``) and each test's outcome, with its one-line description (its docstring's
    first line, which a verbose runner prints in place of its name: ``test_x
    (module.Class)\\nWhat it checks ... ok``) and its method's file (``defined``)."""
    outcomes = {
        "addSuccess": "passed",
        "addFailure": "failed",
        "addError": "error",
        "addSkip": "skipped",
        "addExpectedFailure": "xfailed",
        "addUnexpectedSuccess": "xpassed",
    }

    def describe(sid, test, test_id):
        defined(getattr(test, str(getattr(test, "_testMethodName", "")), None))
        try:
            text = test.shortDescription()
        except Exception:  # noqa: BLE001
            return
        if text and isinstance(text, str):
            append(("describe", sid, test_id, text))

    def recording(method, outcome):
        def wrapper(self, test, *args):
            sid = getattr(self, "_thundersync_sid", None)
            if sid is not None:
                try:
                    test_id = test.id()
                except Exception:  # noqa: BLE001
                    test_id = repr(test)
                append(("test", sid, outcome, test_id))
                describe(sid, test, test_id)
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
                append(("test", sid, "subtest-failed", test.id()))
            return sub_test(self, test, subtest, err)

        cls.addSubTest = add_sub_test
    start_run, stop_run = cls.startTestRun, cls.stopTestRun

    def start_test_run(self):
        self._thundersync_sid = new_session()
        append(("session", self._thundersync_sid, "unittest"))
        return start_run(self)

    def stop_test_run(self):
        result = stop_run(self)
        sid = getattr(self, "_thundersync_sid", None)
        if sid is not None:
            report(sid, inside, append)
            ending()
            append(("finish", sid, 0 if self.wasSuccessful() else 1))
        return result

    cls.startTestRun, cls.stopTestRun = start_test_run, stop_test_run
