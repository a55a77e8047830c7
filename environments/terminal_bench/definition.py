"""A Terminal-Bench 1 or Harbor task's definition: its instruction, sandbox, setup, steps and
reference solution (its grading is ``task.py``'s)."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import shlex
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Self

from environments.sandboxes.engines import RUNS_AS_USER, sandbox_engine
from environments.sandboxes.protocol import Sandbox, SandboxError, SandboxSpec, own
from environments.task_steps import StepSetupFailed
from environments.tasks import Grade
from environments.terminal_bench import collection, grading, inputs, users
from environments.terminal_bench import steps as harbor_steps
from environments.terminal_bench.environment import TaskEnvironment
from environments.terminal_bench.network import NetworkPolicy

_CHUNK_CHARS = 64 * 1024
"""Base64 per command: well under Linux's 128 KiB limit on one argument."""
HARBOR_LOG_DIRS = ("/logs/agent", "/logs/verifier", collection.CONVENTION_DIR)
"""What Harbor's environment mounts into every task's container (``EnvironmentPaths``)."""
SOLUTION_DIR = "/solution"
SOLUTION_DIR_VARIABLE = "THUNDERSYNC_SOLUTION_DIR"
"""Overrides where the oracle unpacks the solution, for running its commands outside a
sandbox (tests do): on a real host /solution would be a folder at the root."""


@dataclass(frozen=True, slots=True)
class TaskDefinition:
    """What a Terminal-Bench task is and how an episode plays it: its fields, sandbox, setup,
    steps and reference solution. ``TerminalBenchTask`` (``task.py``) adds its grading.
    ``timeout_s`` (per agent command) is the task's agent timeout, so one command (the oracle's
    solution script) may use all of it.
    """

    task_id: str
    instruction: str
    path: Path
    format: Literal["tb1", "harbor"]
    environment: TaskEnvironment
    tests_dir: Path
    test_script: Path
    """run-tests.sh (Terminal-Bench 1) or tests/test.sh (Harbor)."""
    test_timeout_s: float
    solution_script: Path | None = None
    """solution.sh or solution/solve.sh; None when ``solution_commands`` (solution.yaml) is set."""
    solution_commands: tuple[str, ...] = ()
    solution_env: dict[str, str] = field(default_factory=dict)
    test_env: dict[str, str] = field(default_factory=dict)
    """Extra environment for the tests (Harbor's ``[verifier] env``)."""
    timeout_s: float = 600.0
    max_turns: int = 50
    metadata: dict[str, Any] = field(default_factory=dict)
    verifier: TaskEnvironment | None = None
    """Harbor's separate verifier environment (``environments.terminal_bench.verifier``): the
    tests run in a sandbox made from it with the agent's work folder copied in. None: they
    run in the agent's sandbox (or, strict, a fresh one like it)."""
    reward_key: str | None = None
    """Harbor's ``[verifier] reward_key``: the metric of a reward.json that is the reward."""
    steps: tuple[harbor_steps.TaskStep, ...] = ()
    """Harbor's ``[[steps]]`` (``environments.terminal_bench.steps``): non-empty, the episode
    plays them in order in one sandbox (``environments.task_steps``); the fields above are then
    step 0's, and ``step_task(i)`` is step ``i`` as a task."""
    reward_strategy: Literal["mean", "final"] = "mean"
    """Harbor's ``multi_step_reward_strategy``: the episode's reward over its graded steps."""
    step_index: int | None = None
    """Set on ``step_task(i)``: this is step ``i`` of ``steps``, graded on its own."""
    network: NetworkPolicy = NetworkPolicy()
    """Harbor's declared network policy (``environments.terminal_bench.network``): a task that
    wants internet runs without it, and its grade says so."""
    healthcheck: harbor_steps.Healthcheck | None = None
    """``[environment.healthcheck]``: run once in the episode's sandbox after its setup, before
    the first step; failing is the task's infrastructure failure (Harbor fails the trial)."""
    artifacts: tuple[collection.Artifact, ...] = ()
    """Harbor's ``artifacts`` (a step's: the task's and the step's), copied out of the
    episode's sandbox before grading when the context names a folder (``collection``)."""
    collect: tuple[collection.CollectHook, ...] = ()
    """``[[verifier.collect]]`` hooks (a step's: the task's, then the step's), run in the
    episode's sandbox before the artifacts are copied and the tests run."""
    agent_user: str | None = None
    """``[agent] user`` (a step's: ``[steps.agent] user``, else the task's): the agent's
    commands run as it (``environments.terminal_bench.users``); None: the image's user."""
    verifier_user: str | None = None
    """``[verifier] user`` (a step's likewise): the test script runs as it."""

    @property
    def output_checked(self) -> bool:
        """Declared (``[metadata] output_checked = true``): the verifier checks the work's
        output itself, with no test session the witness can follow test by test, so strict
        grading takes its reward with the other checks of the run (``witness.py``) but no
        test-by-test proof (``details["unwatched"]``). A verifier that loads none of the
        agent's code (a shell script comparing files) needs no declaration; one that runs
        the agent's code with no test to follow, undeclared, is not graded strictly."""
        return bool(self.metadata.get("output_checked"))

    @property
    def needs(self) -> dict[str, str]:
        """What a sandbox engine must be able to do to run this task, each with why: its
        environment's ``needs``, then its separate verifier's (``environments.sandboxes.
        engines`` capabilities)."""
        needs = dict(self.environment.needs)
        named = users.named_users(self)
        if named:
            needs.setdefault(RUNS_AS_USER, f"it runs commands as a user it names ({named})")
        verifiers = [self.verifier, *(step.verifier for step in self.steps)]
        for verifier in (v for v in verifiers if v is not None):
            for capability, why in verifier.needs.items():
                needs.setdefault(
                    capability, f"its verifier image (tests/Dockerfile or docker_image): {why}"
                )
        return needs

    @property
    def needs_docker_reason(self) -> str | None:
        """Why bubblewrap cannot run this task (the first of ``needs``), or None."""
        return next(iter(self.needs.values()), None)

    def sandbox_spec(self, kind: str | None = None) -> SandboxSpec:
        """How to make the sandbox; an engine ``kind`` that cannot do what the task ``needs``
        (its separate verifier's included) raises NeedsDockerError before the agent starts."""
        if kind is not None:
            sandbox_engine(kind).refuse(self.needs, f"task {self.task_id}")
        return self.environment.spec(kind)

    def setup(self, sandbox: Sandbox) -> None:
        """Replay the Dockerfile's RUN steps when the workspace was staged rather than built.
        A multi-step task then prepares its step 0 (``start_step``); step ``i`` as a task
        (grading's pristine state) prepares steps 0 to ``i``, none of them solved. Step 0's
        ``setup.sh`` failing is the task's failure (a SandboxError); a later step's may rely on
        the work of the steps before it, which a pristine sandbox lacks, so there it is
        replayed as far as it goes."""
        self._prepare(sandbox, live=self.step_index is None)

    def _prepare(self, sandbox: Sandbox, *, live: bool) -> None:
        """``setup``; ``live``: the episode's own sandbox (not a grading replay), which runs
        the task's healthcheck before its first step and the first step's."""
        self.environment.setup(sandbox)
        if self.format == "harbor":
            # Harbor mounts these before its container starts, so an agent publishes into
            # /logs/artifacts and a collect hook writes there; bubblewrap binds them, a Docker
            # image lacks them. Best effort: an image whose user cannot make /logs goes on.
            sandbox.execute(f"mkdir -p {' '.join(HARBOR_LOG_DIRS)} 2>/dev/null", timeout=30)
            if users.named_users(self):  # writable for the task's users, as Harbor's mounts
                sandbox.execute(f"chmod a+rwx {' '.join(HARBOR_LOG_DIRS)}", timeout=30)
        failure = self.healthcheck.failure(sandbox) if live and self.healthcheck else None
        if failure is not None:
            raise SandboxError(f"task {self.task_id}: [environment.healthcheck]: {failure}")
        last = self.step_index if self.step_index is not None else 0 if self.steps else -1
        for index in range(last + 1):
            try:  # the live episode's step 0 (not a replay) also runs its healthcheck
                self._stage(sandbox, index, check=live)
            except StepSetupFailed as err:
                if index == 0:
                    raise SandboxError(f"task {self.task_id}: {err}") from err
        if live:  # the agent's turn begins: its commands run as its user
            users.agent_phase(sandbox, self.steps[0].agent_user if self.steps else self.agent_user)

    # --- multi-step tasks (environments.task_steps) ----------------------------------------

    @property
    def num_steps(self) -> int:
        """The number of ``[[steps]]`` an episode of this task plays (0: a one-step task)."""
        return len(self.steps) if self.step_index is None else 0

    def step_task(self, index: int) -> Self:
        """Step ``index`` as a task: its instruction, timeouts, tests (the task's ``tests/``
        overlaid by the step's), verifier, reference solution and ``[verifier] env``."""
        step = self.steps[index]
        return dataclasses.replace(
            self,
            instruction=step.instruction,
            tests_dir=step.tests_dir,
            test_script=step.test_script,
            test_timeout_s=step.test_timeout_s,
            solution_script=step.solution_script,
            solution_commands=(),
            test_env=step.test_env,
            timeout_s=step.timeout_s,
            verifier=step.verifier,
            step_index=index,
            agent_user=step.agent_user,
            verifier_user=step.verifier_user,
            artifacts=self.artifacts + step.artifacts,
            collect=self.collect + step.collect,
            network=self.network.for_step(step.network),
        )

    def start_step(self, sandbox: Sandbox, index: int) -> None:
        """Prepare step ``index`` in the episode's sandbox: the previous step's test and
        verifier log folders are emptied (Harbor does, so the agent never sees its grading
        files), then the step's ``workdir/`` is copied in and its ``setup.sh`` run."""
        empty = "find {d} -mindepth 1 -maxdepth 1 -exec rm -rf {{}} +"
        wipe = " ".join(
            f"if [ -d {d} ] && [ ! -L {d} ]; then {empty.format(d=d)}; fi;"
            for d in (grading.TESTS_DIR, grading.VERIFIER_DIR)
        )
        root = shlex.quote(f"{self.environment.workdir.rstrip('/')}/{grading.FALLBACK_DIR}")
        users.agent_phase(sandbox, None)
        sandbox.execute(own(f"{wipe} rm -rf {root}; true"), timeout=60)
        self._stage(sandbox, index, check=True)
        users.agent_phase(sandbox, self.steps[index].agent_user)

    def _stage(self, sandbox: Sandbox, index: int, *, check: bool) -> None:
        """Copy step ``index``'s workdir/ in and run its setup.sh, then (``check``) its
        healthcheck: StepSetupFailed when one fails."""
        step = self.steps[index]
        for command in harbor_steps.stage_commands(step, self.environment.workdir, pack_files):
            with users.running_as(sandbox, step.agent_user):  # Harbor's: the step's agent user
                result = sandbox.execute(command, timeout=step.timeout_s)
            if result.exit_code != 0 or result.timed_out:
                what = "setup.sh" if command.startswith("bash ") else "copying workdir/"
                status = "timed out" if result.timed_out else f"exited {result.exit_code}"
                raise StepSetupFailed(
                    f"step {step.name}: {what} {status}: {result.output.strip()[-300:]}"
                )
        with users.running_as(sandbox, step.agent_user):  # Harbor's, as setup.sh
            failure = step.healthcheck.failure(sandbox) if check and step.healthcheck else None
        if failure is not None:
            raise StepSetupFailed(f"step {step.name}: {failure}")

    def stop_after(self, index: int, grade: Grade) -> str | None:
        """Harbor's ``min_reward`` gate of step ``index`` (``harbor_steps.gate_failure``)."""
        failure = harbor_steps.gate_failure(self.steps[index].min_reward, grade)
        return f"step {self.steps[index].name}: {failure}" if failure else None

    def combine_steps(
        self, grades: Sequence[Grade], stopped: str | None, *, gated: bool = False
    ) -> Grade:
        """The episode's grade: ``reward_strategy`` over the graded steps' rewards
        (``harbor_steps.combine``), each step's grade in ``details["steps"]``; a step whose grading
        failed makes the episode an infrastructure failure. Tamper reports and the strict and
        separate-verifier marks of any step are the episode's too. Only Harbor's ``min_reward``
        gate (``gated``) excuses the steps never played; an episode that ended early otherwise
        (its turn or time limit, a step's setup) scores them 0, or an agent that solves step 1
        and never submits would skip the harder steps for a full reward."""
        unplayed = 0 if gated else len(self.steps) - len(grades)
        counted = [*grades, *[Grade(0.0) for _ in range(unplayed)]]
        reward, metrics = harbor_steps.combine(self.reward_strategy, counted)
        played = [
            {
                "name": self.steps[i].name,
                "reward": grade.reward,
                "rewards": harbor_steps.step_rewards(grade),
                "infra_failure": grade.infra_failure,
                "details": dict(grade.details),
            }
            for i, grade in enumerate(grades)
        ]
        reasons = sorted({r for g in grades for r in g.details.get("tamper_reasons", ())})
        details: dict[str, Any] = {
            "reward_strategy": self.reward_strategy,
            "steps": played,
            "steps_played": len(grades),
            "num_steps": len(self.steps),
            "stopped": stopped,
            "metrics": metrics,
            "tamper_suspected": any(g.details.get("tamper_suspected") for g in grades),
            "tamper_reasons": reasons,
        }
        for key in ("strict", "separate_verifier"):
            if any(key in g.details for g in grades):
                details[key] = any(g.details.get(key) for g in grades)
        failed = next((g for g in grades if g.infra_failure), None)
        if failed is not None:
            error = f"step {self.steps[len(grades) - 1].name}: {failed.details.get('error')}"
            return Grade(0.0, infra_failure=True, details={**details, "error": error})
        return self.network.annotate(Grade(reward, details=details))

    def reference_steps(self) -> list[list[str]]:
        """The oracle's commands, step by step (one list for a one-step task)."""
        if self.num_steps == 0:
            return [self.reference_solution()]
        return [self.step_task(i).reference_solution() for i in range(self.num_steps)]

    def reference_solution(self) -> list[str]:
        """Commands that unpack the solution into ``/solution`` (Harbor's path, which published
        solve.sh scripts hard-code; ``$SOLUTION_DIR`` names it too) and run it from the
        workdir; nothing of the solution is in the sandbox before they run, and /solution is
        emptied after. Where /solution cannot be made, a temporary folder stands in for it.
        One command when it fits; larger ones are staged in the workspace first.
        """
        if self.solution_script is None:
            return list(self.solution_commands)
        if self.format == "harbor":
            files = inputs.list_files(self.solution_script.parent, self.path)
        else:
            files = [(inputs.inside(self.solution_script, self.path, "solution.sh"), "")]
        payload = pack_files(files, self.solution_script.name)
        exports = "".join(f"export {k}={shlex.quote(v)}; " for k, v in self.solution_env.items())
        empty = 'find "$d" -mindepth 1 -maxdepth 1 -exec rm -rf {} +'
        run = (
            f'top="${{{SOLUTION_DIR_VARIABLE}:-{SOLUTION_DIR}}}"; d="$top"; '
            f'{{ mkdir -p "$d" && {empty} && test -w "$d"; }} 2>/dev/null || '
            'd=$(mktemp -d 2>/dev/null || mktemp -d -p "$PWD" .thundersync-oracle.XXXXXX) && '
            '{ {SOURCE} | base64 -d | tar -xzf - -C "$d"; } && '
            f'({exports}SOLUTION_DIR="$d" bash "$d/{self.solution_script.name}"); status=$?; '
            f'if [ "$d" = "$top" ]; then {empty}; else rm -rf "$d"; fi; {{STAGED}}exit $status'
        )
        if len(payload) <= _CHUNK_CHARS:
            return [run.replace("{SOURCE}", f"printf %s {payload}").replace("{STAGED}", "")]
        staged = ".thundersync-oracle.b64"
        commands = [f"rm -f {staged}"]
        for start in range(0, len(payload), _CHUNK_CHARS):
            commands.append(f"printf %s {payload[start : start + _CHUNK_CHARS]} >> {staged}")
        cleanup = f"rm -f {staged}; "
        commands.append(run.replace("{SOURCE}", f"cat {staged}").replace("{STAGED}", cleanup))
        return commands


def pack_files(files: list[tuple[Path, str]], script_name: str) -> str:
    """A base64 tar.gz of ``files`` (host path, name in the archive; an empty name is the
    script itself): Harbor's solution/ folder or TB1's single solution.sh."""
    buffer = io.BytesIO()
    # gzip's header stamped with 0, not the time: the same solution packs to the same command
    # (the reference run's cache key holds it)
    with (
        gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as packed,
        tarfile.open(fileobj=packed, mode="w") as archive,
    ):
        for path, name in files:
            archive.add(path, arcname=name or script_name, recursive=False)
    return base64.b64encode(buffer.getvalue()).decode("ascii")
