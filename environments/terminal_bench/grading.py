"""Runs a task's tests in the sandbox after an episode and turns their results into a Grade."""

from __future__ import annotations

import json
import math
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from environments.sandboxes.protocol import (
    ExecResult,
    GraderSetupError,
    Sandbox,
    bash_read_whole,
    own,
)
from environments.tasks import Grade

TESTS_DIR = "/tests"
VERIFIER_DIR = "/logs/verifier"
FALLBACK_DIR = ".thundersync-grader"
_OUTPUT_TAIL = 4000
_SUMMARY_LINE = re.compile(r"^(PASSED|FAILED|ERROR|XFAIL|XPASS|SKIPPED) (\S+)")
_FAILING = frozenset({"FAILED", "ERROR", "XPASS"})


REWARD_RANGE = (0.0, 1.0)
"""Every reward a verifier reports must be a finite number in [0, 1]. Harbor and Terminal-Bench
rewards are pass fractions, training normalises rewards per group, and eval averages them: a
NaN, an infinity or a 1e9 from a broken (or steered) verifier would poison both. A value outside
the range scores 0 with the reason in ``details["reward_error"]``, counted like any other 0."""


class RewardFileError(ValueError):
    """A verifier wrote a reward file that is not in the Harbor format or outside
    ``REWARD_RANGE``: the attempt scores 0 (it is counted, not excluded)."""


@dataclass(frozen=True, slots=True)
class GraderPaths:
    """Where the tests and the verifier's logs live in this sandbox."""

    tests: str
    verifier: str
    tmp: str | None = None
    """A writable TMPDIR for the tests, set only when the sandbox's own is not writable."""

    def exports(self) -> str:
        names = {"TEST_DIR": self.tests, "VERIFIER_DIR": self.verifier, "TMPDIR": self.tmp}
        return "export " + " ".join(f"{k}={shlex.quote(v)}" for k, v in names.items() if v)


def _empty_folder(path: str) -> str:
    """Make ``path`` an empty folder. Its contents are removed, not the folder, which may be a
    mount point (bubblewrap binds /tests and /logs); a file or link the agent put in its place
    is removed first, so nothing is written through a link. ``find`` never follows links."""
    q = shlex.quote(path)
    return (
        f"{{ if [ -L {q} ] || {{ [ -e {q} ] && [ ! -d {q} ]; }}; then rm -f {q}; fi; }} && "
        f"mkdir -p {q} && {{ find {q} -type d -exec chmod u+rwx {{}} + 2>/dev/null; true; }} && "
        f'find {q} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} + && test -z "$(ls -A {q})"'
    )


def _reset_command(paths: GraderPaths, root: str | None) -> str:
    """Empty the grader's folders (creating them). Under ``root`` (our own folder in the
    workspace) an agent-made file, link or read-only tree of that name is removed first."""
    folders = [p for p in (paths.tests, paths.verifier, paths.tmp) if p]
    reset = " && ".join(_empty_folder(folder) for folder in folders)
    if root is not None:
        quoted = shlex.quote(root)
        reset = (
            f"{{ find {quoted} -type d -exec chmod u+rwx {{}} + 2>/dev/null; true; }} && "
            f"rm -rf {quoted} && {reset}"
        )
    return (
        f"{reset} && test -w {shlex.quote(paths.verifier)} && "
        'if test -w "${TMPDIR:-/tmp}"; then echo tmp-writable; fi'
    )


def _make_folders(sandbox: Sandbox, workdir: str) -> GraderPaths:
    """Empty /tests and /logs/verifier at their published places (Docker, and bubblewrap, which
    binds them), or the same under ``<workdir>/.thundersync-grader/`` in a sandbox that has
    neither; scripts also find them in $TEST_DIR and $VERIFIER_DIR.
    Raises GraderSetupError when neither can be made (a SandboxError when the sandbox fails)."""
    root = f"{workdir.rstrip('/')}/{FALLBACK_DIR}"
    candidates = [
        (GraderPaths(TESTS_DIR, VERIFIER_DIR), None),
        (GraderPaths(f"{root}/tests", f"{root}/logs/verifier", f"{root}/tmp"), root),
    ]
    failures = []
    for paths, owned in candidates:
        made = sandbox.execute(own(_reset_command(paths, owned)), timeout=60)
        if made.exit_code == 0:
            if "tmp-writable" in made.output:
                return GraderPaths(paths.tests, paths.verifier)
            return paths
        status = "timed out" if made.timed_out else f"exit {made.exit_code}"
        failures.append(f"{paths.tests} ({status}): {made.output.strip()[-300:]}")
    raise GraderSetupError(
        "cannot create the grader's folders in the state the agent left the sandbox "
        f"(is the workspace writable, are mkdir and rm there?): {'; '.join(failures)}"
    )


def prepare_grader(sandbox: Sandbox, workdir: str, tests: list[tuple[Path, str]]) -> GraderPaths:
    """Create fresh test and log folders and upload ``tests`` (host file, path under tests).
    Raises GraderSetupError when a preparation command fails, SandboxError when the sandbox does."""
    paths = _make_folders(sandbox, workdir)
    parents = sorted({str(Path(paths.tests, rel).parent) for _, rel in tests})
    if parents:
        made = sandbox.execute(own("mkdir -p " + " ".join(shlex.quote(p) for p in parents)), 60)
        if made.exit_code != 0:
            raise GraderSetupError(f"cannot create the test folders: {made.output[-500:]}")
    for source, rel in tests:
        sandbox.upload(source, f"{paths.tests}/{rel}")
    return paths


def run_script(
    sandbox: Sandbox,
    paths: GraderPaths,
    script: str,
    timeout: float,
    env: dict[str, str],
    *,
    prefix: str = "",
    suffix: str = "",
) -> ExecResult:
    """Run ``script`` with bash from the workdir, after ``prefix`` (shell commands that set up
    the environment), with the grader's variables and ``env`` (names checked by the loader,
    values quoted), then ``suffix`` (commands applied after the task's ``env``). The script is
    read whole before it starts (``bash_read_whole``): code it runs cannot add lines to it."""
    extra = "".join(f" {k}={shlex.quote(v)}" for k, v in env.items())
    setup = f"{prefix} ; " if prefix else ""
    after = f" && {suffix}" if suffix else ""
    return sandbox.execute(
        f"{setup}{paths.exports()}{extra}{after} && {bash_read_whole(script)}", timeout=timeout
    )


def _timeout_grade(result: ExecResult, timeout: float) -> Grade:
    return Grade(
        reward=0.0,
        details={
            "timed_out": True,
            "reason": f"the tests ran past their {timeout:g} s timeout",
            "output": result.output[-_OUTPUT_TAIL:],
        },
    )


def parse_pytest_summary(output: str) -> dict[str, str]:
    """Test name → status from pytest's ``-rA`` short summary (empty if there is none)."""
    _, header, summary = output.rpartition("short test summary info")
    if not header:
        return {}
    results: dict[str, str] = {}
    for line in summary.splitlines():
        match = _SUMMARY_LINE.match(line.strip())
        if match:
            results[match.group(2)] = match.group(1)
    return results


def grade_tb1(result: ExecResult, timeout: float) -> Grade:
    """Reward of a Terminal-Bench 1 ``run-tests.sh`` run: when its output has a pytest ``-rA``
    summary, 1 iff no listed test failed (as Terminal-Bench's pytest parser decides), otherwise
    1 iff the script exited 0. A run past its timeout scores 0 (``details["timed_out"]``)."""
    if result.timed_out:
        return _timeout_grade(result, timeout)
    tests = parse_pytest_summary(result.output)
    details: dict[str, Any] = {
        "exit_code": result.exit_code,
        "output": result.output[-_OUTPUT_TAIL:],
    }
    if tests:
        details["tests"] = tests
        passed = not any(status in _FAILING for status in tests.values())
    else:
        passed = result.exit_code == 0
    return Grade(reward=1.0 if passed else 0.0, details=details)


def _check_range(name: str, value: float) -> float:
    low, high = REWARD_RANGE
    if not math.isfinite(value):
        raise RewardFileError(
            f"{name}: expected a finite number in [{low:g}, {high:g}], got {value!r}"
        )
    if not low <= value <= high:
        raise RewardFileError(f"{name}: expected a number in [{low:g}, {high:g}], got {value!r}")
    return float(value)


def parse_reward_txt(text: str) -> float:
    """The one number in ``reward.txt``, finite and in ``REWARD_RANGE``."""
    try:
        value = float(text.strip())
    except ValueError:
        raise RewardFileError(f"reward.txt: expected a number, got {text.strip()[:80]!r}") from None
    return _check_range("reward.txt", value)


REWARD_FILES = ("reward.txt", "reward.json", "rewards.json")
"""Read in this order, the first present wins: Harbor's verifier reads ``reward.txt`` or
``reward.json``; its 1.4 task template tells tests to write several rewards to
``rewards.json``, in the same format."""


def parse_reward_json(
    text: str, key: str | None = None, name: str = "reward.json"
) -> tuple[float, dict[str, float]]:
    """(reward, metrics) of a JSON object of metrics (``name`` is the file, for errors). The
    training reward is metric ``key`` (a task's ``[verifier] reward_key``), else the
    ``"reward"`` metric if present, else the mean of all metrics. Every metric must be finite;
    the reward, and every metric averaged into it, must lie in ``REWARD_RANGE`` (so that
    out-of-range metrics cannot cancel out in the mean). A missing ``key`` is a RewardFileError
    naming it."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as err:  # also over-long integers and deep nesting
        raise RewardFileError(f"{name}: expected JSON, got invalid text ({err})") from None
    if not isinstance(data, dict) or not data:
        raise RewardFileError(f"{name}: expected a non-empty object of metrics, got {data!r}")
    for metric, value in data.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise RewardFileError(f"{name}: metric {metric!r}: expected a number, got {value!r}")
        try:
            finite = math.isfinite(float(value))
        except OverflowError:  # an integer too large for a float
            finite = False
        if not finite:
            raise RewardFileError(f"{name}: metric {metric!r}: expected a finite number")
    metrics = {metric: float(value) for metric, value in data.items()}
    if key is not None and key not in metrics:
        raise RewardFileError(
            f"{name}: the task's reward_key {key!r} is missing; metrics: {sorted(metrics)}"
        )
    chosen = key or ("reward" if "reward" in metrics else None)
    if chosen is not None:
        return _check_range(f"{name}: metric {chosen!r}", metrics[chosen]), metrics
    for metric, value in metrics.items():
        _check_range(f"{name}: metric {metric!r} (averaged into the reward)", value)
    return sum(metrics.values()) / len(metrics), metrics


def read_harbor_reward(
    sandbox: Sandbox, paths: GraderPaths, reward_key: str | None = None
) -> tuple[float, dict[str, Any]]:
    """Read the verifier's reward file, the first of ``REWARD_FILES`` present. One that is a
    link or not a regular file is a RewardFileError: code the tests import can turn
    ``reward.txt`` into a link the verifier's shell writes through (``/proc/self/fd/255``) and
    the grader cannot read, to make a failure look like a broken task. Read with the system's
    ``cat`` (``own``)."""
    folder = shlex.quote(paths.verifier)
    odd = sandbox.execute(
        f"cd {folder} && for f in {' '.join(REWARD_FILES)}; do "
        'if [ -L "$f" ] || { [ -e "$f" ] && [ ! -f "$f" ]; }; then echo "$f"; fi; done',
        timeout=60,
    )
    not_files = [name for name in odd.output.split() if name in REWARD_FILES]
    if not_files:
        raise RewardFileError(f"{not_files[0]}: a link or not a regular file")
    for name in REWARD_FILES:
        shown = sandbox.execute(own(f"cat {folder}/{name}"), timeout=60)
        if shown.exit_code != 0:
            continue
        if name == "reward.txt":
            return parse_reward_txt(shown.output), {}
        reward, metrics = parse_reward_json(shown.output, reward_key, name)
        return reward, {"metrics": metrics}
    raise RewardFileError(
        f"the verifier wrote neither {paths.verifier}/reward.txt nor reward.json nor rewards.json"
    )


def grade_harbor(
    sandbox: Sandbox,
    paths: GraderPaths,
    result: ExecResult,
    timeout: float,
    reward_key: str | None = None,
) -> Grade:
    """Reward of a Harbor ``tests/test.sh`` run, from ``reward.txt`` (a number) or else
    ``reward.json`` / ``rewards.json`` (metric names to numbers: ``parse_reward_json`` picks the
    training reward; all metrics go to ``details["metrics"]``). A run past
    its timeout scores 0. A reward file that is malformed, not finite or outside
    ``REWARD_RANGE`` scores 0 with ``details["reward_error"]`` (the agent's output can steer what
    a verifier writes, so this is never an excluded infrastructure failure). No reward file
    scores 0 the same way, whatever the verifier's exit status: the agent's work runs inside
    the verifier (the modules its tests import) and can remove the file or end the script, and
    must not thereby turn its failure into an episode that is never trained on. A task whose
    verifier never writes one scores 0 for every agent, the oracle too (``eval --agent
    oracle`` shows it)."""
    if result.timed_out:
        return _timeout_grade(result, timeout)
    details: dict[str, Any] = {
        "exit_code": result.exit_code,
        "output": result.output[-_OUTPUT_TAIL:],
    }
    try:
        reward, extra = read_harbor_reward(sandbox, paths, reward_key)
    except RewardFileError as err:
        return Grade(
            reward=0.0,
            details={**details, "reward_error": str(err), "reason": f"invalid reward: {err}"},
        )
    return Grade(reward=reward, details={**details, **extra})
