"""Harbor's multi-step tasks (task.toml schema 1.4 ``[[steps]]``): reading the steps, the
``min_reward`` gate and the episode's reward over the steps (``multi_step_reward_strategy``).

A multi-step task is one episode in one sandbox: each step's ``steps/<name>/workdir/`` is copied
into the work folder and its ``workdir/setup.sh`` run, then its ``instruction.md`` is the next
user turn; when the agent submits, the step's verifier (its ``tests/`` over the task's) grades
it, and the ``min_reward`` gate decides whether the next step is played
(``environments.task_steps``, ``TerminalBenchTask.step_task``). Harbor 0.26's semantics are
docs/harbor-0.26-notes.md §2; where this differs from it, docs/guides/environments.md says so.
"""

from __future__ import annotations

import dataclasses
import math
import re
import shlex
import time
import unicodedata
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from environments.sandboxes.protocol import Sandbox
from environments.tasks import Grade, TaskFormatError
from environments.terminal_bench import collection, inputs, schema
from environments.terminal_bench import network as network_policy
from environments.terminal_bench.environment import TaskEnvironment
from environments.terminal_bench.users import read_user
from environments.terminal_bench.verifier import MODES, _plan
from thundersync.protocol.documents import excerpt

STRATEGIES = ("mean", "final")
"""``multi_step_reward_strategy``: Harbor's enum (unset is ``mean``)."""
STEP_KEYS = frozenset({"name", "min_reward", "artifacts", "healthcheck", "agent", "verifier"})
AGENT_KEYS = frozenset({"timeout_sec", "user", "network_mode", "allowed_hosts"})
VERIFIER_KEYS = frozenset(
    {
        "timeout_sec",
        "env",
        "user",
        "environment_mode",
        "environment",
        "collect",
        "network_mode",
        "allowed_hosts",
    }
)
DEFAULT_STEP_VERIFIER_TIMEOUT_S = 600.0
"""Harbor's per-step verifier default: a step does not inherit ``[verifier] timeout_sec``."""
_BAD_NAME = re.compile(r'[<>:"/\\|?*\x00-\x1f\x7f]')
_DEVICE_NAMES = frozenset(
    {"CON", "PRN", "AUX", "NUL"}
    | {f"COM{i}" for i in range(1, 10)}
    | {f"LPT{i}" for i in range(1, 10)}
)
_STAGE_CHUNK_CHARS = 64 * 1024
HEALTHCHECK_KEYS = frozenset(
    {"command", "interval_sec", "timeout_sec", "start_period_sec", "start_interval_sec", "retries"}
)
MAX_HEALTHCHECK_RETRIES = 1000


@dataclass(frozen=True, slots=True)
class Healthcheck:
    """``[steps.healthcheck]`` (Harbor's ``HealthcheckConfig``): run after the step's setup."""

    command: str
    interval_s: float = 5.0
    timeout_s: float = 30.0
    start_period_s: float = 0.0
    start_interval_s: float = 5.0
    retries: int = 3

    def failure(
        self,
        sandbox: Sandbox,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> str | None:
        """Harbor's rule (``run_healthcheck``): the first success passes; failures within
        ``start_period_s`` do not count (tried again after ``start_interval_s``); after it,
        ``retries`` failures in a row (``interval_s`` apart) fail. Why it failed, or None. An
        attempt past ``timeout_s`` is a failure (Harbor's Docker exec raises instead)."""
        started, failures = clock(), 0
        while True:
            result = sandbox.execute(self.command, timeout=self.timeout_s)
            if result.exit_code == 0 and not result.timed_out:
                return None
            if clock() - started < self.start_period_s:
                sleep(self.start_interval_s)
                continue
            failures += 1
            if failures >= self.retries:
                status = "timed out" if result.timed_out else f"exited {result.exit_code}"
                return (
                    f"healthcheck {self.command[:120]!r} {status} ({failures} failures in a "
                    f"row): {result.output.strip()[-300:]}"
                )
            sleep(self.interval_s)


def read_healthcheck(path: Path, field: str, value: object) -> Healthcheck | None:
    """``[environment.healthcheck]`` or ``[steps.healthcheck]`` (None when absent)."""
    if value is None:
        return None
    table = schema.check_mapping(path, field, value)
    schema.check_keys(path, table, HEALTHCHECK_KEYS, prefix=f"{field}.", strict=False)
    retries = table.get("retries", 3)
    if (
        isinstance(retries, bool)
        or not isinstance(retries, int)
        or not 0 <= retries <= MAX_HEALTHCHECK_RETRIES
    ):
        raise TaskFormatError(
            path,
            f"{field}.retries",
            f"expected a whole number from 0 to {MAX_HEALTHCHECK_RETRIES}, got {excerpt(retries)}",
        )

    def seconds(key: str, default: float) -> float:
        value = table.get(key)
        if value == 0 and not isinstance(value, bool):
            return 0.0
        return schema.read_timeout(path, f"{field}.{key}", value, default)

    return Healthcheck(
        command=schema.read_text(path, f"{field}.command", table.get("command")),
        interval_s=seconds("interval_sec", 5.0),
        timeout_s=schema.read_timeout(path, f"{field}.timeout_sec", table.get("timeout_sec"), 30.0),
        start_period_s=seconds("start_period_sec", 0.0),
        start_interval_s=seconds("start_interval_sec", 5.0),
        retries=retries,
    )


@dataclass(frozen=True, slots=True)
class TaskStep:
    """One ``[[steps]]`` entry, resolved against the task's defaults."""

    name: str
    instruction: str
    folder: Path
    """``steps/<name>/``."""
    timeout_s: float
    """Per agent command: ``[steps.agent] timeout_sec``, else ``[agent]``'s."""
    test_timeout_s: float
    test_env: dict[str, str]
    """``[verifier] env`` overlaid by ``[steps.verifier] env``."""
    tests_dir: Path
    """``steps/<name>/tests/`` if present, else the task's ``tests/``."""
    test_script: Path
    solution_script: Path | None
    verifier: TaskEnvironment | None
    min_reward: float | dict[str, float] | None = None
    agent_user: str | None = None
    """``[steps.agent] user``, else ``[agent]``'s: the step's setup.sh and agent run as it."""
    verifier_user: str | None = None
    """``[steps.verifier] user``, else ``[verifier]``'s: the step's test script runs as it."""
    healthcheck: Healthcheck | None = None
    """Run in the episode's sandbox after the step's ``setup.sh``; failing stops the episode."""
    artifacts: tuple[collection.Artifact, ...] = ()
    """The step's ``artifacts``, kept after the task's (``collection``)."""
    collect: tuple[collection.CollectHook, ...] = ()
    """``[[steps.verifier.collect]]``, run after the task's ``[[verifier.collect]]``."""
    network: tuple[network_policy.Declared, ...] = ()
    """``[steps.agent]`` / ``[steps.verifier]`` network overrides (``NetworkPolicy.for_step``)."""

    @property
    def workdir_files(self) -> list[tuple[Path, str]]:
        """``workdir/``'s files (host path, path under the work folder), checked to lie in
        the task folder."""
        folder = self.folder / "workdir"
        return inputs.list_files(folder, self.folder.parent.parent) if folder.is_dir() else []


def _check_name(path: Path, field: str, value: object) -> str:
    """Harbor's step name rules (``step_name.py``): a portable folder name."""
    if not isinstance(value, str):
        raise TaskFormatError(path, field, f"expected a step name, got {excerpt(value)}")
    bad = (
        not value
        or value in (".", "..")
        or value.endswith((".", " "))
        or _BAD_NAME.search(value) is not None
        or value.split(".")[0].upper() in _DEVICE_NAMES
        or len(value.encode("utf-8")) > 255
    )
    if bad:
        raise TaskFormatError(
            path,
            field,
            "expected a folder name (not '.' or '..', no trailing '.' or space, none of "
            f'<>:"/\\|?* or control characters, not a device name), got {excerpt(value)}',
        )
    return value


def _min_reward(path: Path, field: str, value: object) -> float | dict[str, float] | None:
    def number(name: str, item: object) -> float:
        if isinstance(item, bool) or not isinstance(item, int | float) or math.isnan(item):
            raise TaskFormatError(path, name, f"expected a number, got {excerpt(item)}")
        return float(item)

    if value is None:
        return None
    if isinstance(value, dict):
        table = schema.check_mapping(path, field, value)
        return {key: number(f"{field}.{key}", item) for key, item in table.items()}
    return number(field, value)


def read_strategy(path: Path, value: object) -> Literal["mean", "final"]:
    if value is None:
        return "mean"
    if value not in STRATEGIES:
        raise TaskFormatError(
            path, "multi_step_reward_strategy", f"expected 'mean' or 'final', got {excerpt(value)}"
        )
    return "final" if value == "final" else "mean"


def _verifier_mode(path: Path, field: str, table: dict[str, Any]) -> str | None:
    mode = table.get("environment_mode")
    if mode is not None and mode not in MODES:
        raise TaskFormatError(
            path,
            f"{field}.environment_mode",
            f"expected 'shared' or 'separate', got {excerpt(mode)}",
        )
    if "environment" in table:
        if mode == "shared":
            raise TaskFormatError(
                path,
                f"{field}.environment",
                "a verifier environment conflicts with environment_mode = 'shared'",
            )
        return "separate"
    return mode


def _image(path: Path, field: str, table: dict[str, Any]) -> str | None:
    own = schema.check_mapping(path, f"{field}.environment", table.get("environment", {}))
    image = own.get("docker_image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise TaskFormatError(
            path, f"{field}.environment.docker_image", f"expected an image, got {excerpt(image)}"
        )
    return image


def _step_verifier(
    task_dir: Path,
    folder: Path,
    field: str,
    own: dict[str, Any],
    task_table: dict[str, Any],
    environment: TaskEnvironment,
) -> TaskEnvironment | None:
    """Harbor's ``resolve_step_verifier_mode`` and verifier definition: the step's mode, else
    the task's; separate: the step's ``tests/`` (its ``docker_image`` or ``Dockerfile``), then
    the task's ``tests/``, else a fresh copy of the task's environment. None: shared."""
    path = task_dir / "task.toml"
    mode = _verifier_mode(path, field, own) or _verifier_mode(path, "verifier", task_table)
    if mode != "separate":
        return None
    for tests, table, name in (
        (folder / "tests", own, field),
        (task_dir / "tests", task_table, "verifier"),
    ):
        image = _image(path, name, table)
        if image is not None:
            return dataclasses.replace(environment, build_context=None, plan=None, image=image)
        if (tests / "Dockerfile").is_file():
            plan = _plan(tests / "Dockerfile", environment.workdir)
            return dataclasses.replace(environment, build_context=tests, plan=plan, image=None)
    return environment


def read_steps(
    task_dir: Path,
    entries: object,
    tables: dict[str, dict[str, Any]],
    environment: TaskEnvironment,
    *,
    agent_timeout_s: float,
) -> tuple[TaskStep, ...]:
    """The task's ``[[steps]]``, in order; a malformed one raises TaskFormatError."""
    path = task_dir / "task.toml"
    if not isinstance(entries, list) or not entries:
        raise TaskFormatError(path, "steps", f"expected [[steps]] tables, got {excerpt(entries)}")
    steps: list[TaskStep] = []
    seen: set[str] = set()
    for i, entry in enumerate(entries):
        field = f"steps[{i}]"
        table = schema.check_mapping(path, field, entry)
        schema.check_keys(path, table, STEP_KEYS, prefix=f"{field}.", strict=False)
        name = _check_name(path, f"{field}.name", table.get("name"))
        folded = unicodedata.normalize("NFC", name).casefold()
        if folded in seen:
            raise TaskFormatError(path, f"{field}.name", f"duplicate step name {name!r}")
        seen.add(folded)
        agent = schema.check_mapping(path, f"{field}.agent", table.get("agent", {}))
        schema.check_keys(path, agent, AGENT_KEYS, prefix=f"{field}.agent.", strict=False)
        verifier = schema.check_mapping(path, f"{field}.verifier", table.get("verifier", {}))
        schema.check_keys(path, verifier, VERIFIER_KEYS, prefix=f"{field}.verifier.", strict=False)
        folder = inputs.inside(task_dir / "steps" / name, task_dir, f"steps/{name}")
        if not folder.is_dir():
            raise TaskFormatError(task_dir, f"steps/{name}", "expected the step's folder")
        instruction = folder / "instruction.md"
        if not instruction.is_file():
            raise TaskFormatError(folder, "instruction.md", "expected the step's instruction.md")
        text = schema.read_utf8(instruction, "instruction", limit=inputs.MAX_INSTRUCTION_BYTES)
        own_tests = folder / "tests"
        tests_dir = own_tests if own_tests.is_dir() else task_dir / "tests"
        script = next(
            (d / "test.sh" for d in (own_tests, task_dir / "tests") if (d / "test.sh").is_file()),
            None,
        )
        if script is None:
            raise TaskFormatError(
                folder, "tests/test.sh", "expected the step's tests/test.sh or the task's"
            )
        solve = next(
            (
                s
                for s in (folder / "solution" / "solve.sh", task_dir / "solution" / "solve.sh")
                if s.is_file()
            ),
            None,
        )
        steps.append(
            TaskStep(
                name=name,
                instruction=schema.read_instruction(instruction, "instruction", text).strip()
                + "\n",
                folder=folder,
                timeout_s=schema.read_timeout(
                    path, f"{field}.agent.timeout_sec", agent.get("timeout_sec"), agent_timeout_s
                ),
                test_timeout_s=schema.read_timeout(
                    path,
                    f"{field}.verifier.timeout_sec",
                    verifier.get("timeout_sec"),
                    DEFAULT_STEP_VERIFIER_TIMEOUT_S,
                ),
                test_env={
                    **schema.read_env(path, "verifier.env", tables["verifier"].get("env")),
                    **schema.read_env(path, f"{field}.verifier.env", verifier.get("env")),
                },
                tests_dir=tests_dir,
                test_script=script,
                solution_script=solve,
                verifier=_step_verifier(
                    task_dir, folder, f"{field}.verifier", verifier, tables["verifier"], environment
                ),
                min_reward=_min_reward(path, f"{field}.min_reward", table.get("min_reward")),
                agent_user=read_user(path, f"{field}.agent.user", agent.get("user"))
                or read_user(path, "agent.user", tables["agent"].get("user")),
                verifier_user=read_user(path, f"{field}.verifier.user", verifier.get("user"))
                or read_user(path, "verifier.user", tables["verifier"].get("user")),
                healthcheck=read_healthcheck(
                    path, f"{field}.healthcheck", table.get("healthcheck")
                ),
                artifacts=collection.read_artifacts(
                    path, f"{field}.artifacts", table.get("artifacts")
                ),
                collect=collection.read_hooks(
                    path, f"{field}.verifier.collect", verifier.get("collect")
                ),
                network=network_policy.read_step_network(path, field, agent, verifier),
            )
        )
    return tuple(steps)


def step_rewards(grade: Grade) -> dict[str, float]:
    """A graded step's rewards as Harbor keys them: reward.json's metrics, else
    ``{"reward": ...}`` (reward.txt, or a verifier that wrote nothing usable: 0)."""
    metrics = grade.details.get("metrics")
    if isinstance(metrics, dict) and metrics:
        return {str(k): float(v) for k, v in metrics.items()}
    return {"reward": float(grade.reward)}


def gate_failure(min_reward: float | dict[str, float] | None, grade: Grade) -> str | None:
    """Harbor's ``min_reward`` gate after a step: why it stops the episode, or None. A float
    gates ``rewards["reward"]``, a table every key it lists; a missing key is -inf; a reward
    equal to its threshold passes."""
    if min_reward is None:
        return None
    thresholds = min_reward if isinstance(min_reward, dict) else {"reward": min_reward}
    rewards = step_rewards(grade)
    for key, threshold in thresholds.items():
        actual = rewards.get(key, -math.inf)
        if actual < threshold:
            return f"{key}={actual:g} below min_reward {threshold:g}"
    return None


def combine(
    strategy: Literal["mean", "final"], grades: Sequence[Grade]
) -> tuple[float, dict[str, float]]:
    """The episode's reward and per-key rewards over the graded steps (those played and
    verified, in order): ``mean`` averages each step's reward (a key a step lacks counts 0
    there), ``final`` takes the last graded step's. No graded step: 0."""
    if not grades:
        return 0.0, {}
    if strategy == "final":
        return float(grades[-1].reward), step_rewards(grades[-1])
    per_step = [step_rewards(g) for g in grades]
    keys = sorted({key for rewards in per_step for key in rewards})
    metrics = {key: sum(r.get(key, 0.0) for r in per_step) / len(per_step) for key in keys}
    return sum(float(g.reward) for g in grades) / len(grades), metrics


def stage_commands(
    step: TaskStep, workdir: str, pack: Callable[[list[tuple[Path, str]], str], str]
) -> list[str]:
    """Commands that copy the step's ``workdir/`` into the work folder (unpacked inside the
    sandbox, so nothing is written on the host through a link the agent made) and run its
    ``setup.sh`` with bash from there, as Harbor does; empty when the step has neither."""
    files = step.workdir_files
    if not files:
        return []
    payload = pack(files, "")
    quoted = shlex.quote(workdir)
    unpack = f"base64 -d | tar --no-same-owner -xzf - -C {quoted}"
    staged = ".thundersync-step.b64"
    if len(payload) <= _STAGE_CHUNK_CHARS:
        commands = [f"printf %s {payload} | {unpack}"]
    else:
        commands = [f"rm -f {staged}"]
        for start in range(0, len(payload), _STAGE_CHUNK_CHARS):
            commands.append(f"printf %s {payload[start : start + _STAGE_CHUNK_CHARS]} >> {staged}")
        commands.append(f"{unpack} < {staged}; status=$?; rm -f {staged}; exit $status")
    if any(rel == "setup.sh" for _, rel in files):
        commands.append(f"bash {quoted}/setup.sh")
    return commands
