"""One Terminal-Bench 1 or Harbor task: its instruction, sandbox, grader and reference solution."""

from __future__ import annotations

import base64
import dataclasses
import gzip
import io
import shlex
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from environments import tamper, work
from environments.sandboxes.engines import sandbox_engine
from environments.sandboxes.protocol import (
    AgentBrokeSandbox,
    Sandbox,
    SandboxError,
    SandboxSpec,
)
from environments.task_steps import StepSetupFailed
from environments.tasks import Grade, GradingContext, TaskFormatError
from environments.terminal_bench import collection, grading, inputs, reference, strict, witness
from environments.terminal_bench import steps as harbor_steps
from environments.terminal_bench.environment import TaskEnvironment
from environments.terminal_bench.network import NetworkPolicy
from environments.terminal_bench.verifier import test_copy_uploads

_CHUNK_CHARS = 64 * 1024
"""Base64 per command: well under Linux's 128 KiB limit on one argument."""
SOLUTION_DIR = "/solution"
SOLUTION_DIR_VARIABLE = "THUNDERSYNC_SOLUTION_DIR"
"""Overrides where the oracle unpacks the solution, for running its commands outside a
sandbox (tests do): on a real host /solution would be a folder at the root."""


@dataclass(frozen=True, slots=True)
class TerminalBenchTask:
    """A task loaded from a ``task.yaml`` (``format="tb1"``) or ``task.toml`` (``"harbor"``).

    Matches the ``environments.tasks.Task`` protocol. ``timeout_s`` (per agent command) is the
    task's agent timeout, so one command (the oracle's solution script) may use all of it.
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

    # --- multi-step tasks (environments.task_steps) ----------------------------------------

    @property
    def num_steps(self) -> int:
        """The number of ``[[steps]]`` an episode of this task plays (0: a one-step task)."""
        return len(self.steps) if self.step_index is None else 0

    def step_task(self, index: int) -> TerminalBenchTask:
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
            artifacts=self.artifacts + step.artifacts,
            collect=self.collect + step.collect,
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
        sandbox.execute(f"{wipe} rm -rf {root}; true", timeout=60)
        self._stage(sandbox, index, check=True)

    def _stage(self, sandbox: Sandbox, index: int, *, check: bool) -> None:
        """Copy step ``index``'s workdir/ in and run its setup.sh, then (``check``) its
        healthcheck: StepSetupFailed when one fails."""
        step = self.steps[index]
        for command in harbor_steps.stage_commands(step, self.environment.workdir, _pack):
            result = sandbox.execute(command, timeout=step.timeout_s)
            if result.exit_code != 0 or result.timed_out:
                what = "setup.sh" if command.startswith("bash ") else "copying workdir/"
                status = "timed out" if result.timed_out else f"exited {result.exit_code}"
                raise StepSetupFailed(
                    f"step {step.name}: {what} {status}: {result.output.strip()[-300:]}"
                )
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

    def grade(self, sandbox: Sandbox, context: GradingContext | None = None) -> Grade:
        """Upload the tests, run them with the task's test timeout, and score the result.

        With a context (ShellEnv passes one), the agent's work folder is compared with a fresh
        sandbox's (the task's pristine state) and files that touch test infrastructure are
        reported: ``details["tamper_suspected"]`` and ``details["tamper_reasons"]``. Strict
        (``context.strict``): such an attempt scores 0, and otherwise the tests run in the
        fresh sandbox with only the work folder copied in and a pinned environment
        (``environments.terminal_bench.strict``). Not strict: the tests run in ``sandbox``
        itself, as the benchmark's own harness runs them, and the report changes no score.
        Without a context: the tests run in ``sandbox``, nothing is compared.

        A Harbor task with a separate verifier (``verifier``) runs its tests, strict or not, in
        a sandbox of the verifier's image (``context.make_sandbox``) with the agent's work
        folder copied in, as Harbor does (``details["separate_verifier"]``); its work folder
        the agent made unreadable scores 0; without a context that can make sandboxes it is
        an infrastructure failure, never a grade in the agent's own sandbox.

        Only a SandboxError (the sandbox could not run a command) is an infrastructure failure,
        and a task folder that changed after loading. A step that ran but failed in the state
        the agent left (a read-only workspace, deleted tools, an unreadable work folder) scores
        0 with ``details["reason"]``: otherwise an agent could turn its own failure into an
        episode that is excluded from training. So does a sandbox the agent broke
        (``AgentBrokeSandbox``), with ``details["agent_failure"]``.

        First every process of ``sandbox`` is killed from outside (``stop_processes``), so
        nothing the agent started runs on while its work is read or graded. A task that wants
        internet it does not get here says so (``network``)."""
        return self.network.annotate(self._grade(sandbox, context))

    def _grade(self, sandbox: Sandbox, context: GradingContext | None) -> Grade:
        if self.num_steps:
            error = f"task {self.task_id} has steps: grade each with step_task(i).grade"
            return Grade(reward=0.0, infra_failure=True, details={"error": error})
        try:
            sandbox.stop_processes()
            self._gather(sandbox, context)
            if self.verifier is not None and (context is None or context.make_sandbox is None):
                error = (
                    f"task {self.task_id}: a separate verifier needs a context that makes sandboxes"
                )
                return Grade(reward=0.0, infra_failure=True, details={"error": error})
            if context is None:
                return self._run_tests(sandbox, pinned=False)[0]
            with tempfile.TemporaryDirectory(prefix="thundersync-grading-") as tmp:
                return self._grade_against_pristine(sandbox, context, Path(tmp))
        except grading.GraderSetupError as err:
            return Grade(reward=0.0, details={"grader_setup_failed": True, "reason": str(err)})
        except AgentBrokeSandbox as err:
            return Grade(reward=0.0, details={"agent_failure": str(err), "reason": str(err)})
        except SandboxError as err:
            return Grade(reward=0.0, infra_failure=True, details={"error": f"grader: {err}"})
        except TaskFormatError as err:
            return Grade(reward=0.0, infra_failure=True, details={"error": f"task folder: {err}"})

    def _gather(self, sandbox: Sandbox, context: GradingContext | None) -> None:
        """Harbor's collection phase: the ``collect`` hooks, then the artifacts into the
        context's ``artifacts_dir`` (a step's in ``<step name>/``), when it names one."""
        collection.run_hooks(sandbox, self.collect, self.task_id)
        root = context.artifacts_dir if context is not None else None
        if root is not None:
            if self.step_index is not None:
                root = root / self.steps[self.step_index].name
            collection.collect(sandbox, self.artifacts, root, workdir=self.environment.workdir)

    def _grade_against_pristine(
        self, sandbox: Sandbox, context: GradingContext, tmp: Path
    ) -> Grade:
        standard = self._standard(context, type(sandbox).__name__)
        grade, _ = self._strict_grade(sandbox, context, tmp, standard=standard)
        return grade

    def _standard(self, context: GradingContext, kind: str) -> witness.Reference | Grade | None:
        """What a strict pass is proven against (the reference run's standard), or the grade
        every attempt gets where there is none; None when grading is not strict."""
        if not context.strict:
            return None
        run = self.reference_run(context, kind)
        if run.error is not None or run.reference is None:
            error = (
                f"strict grading cannot prove a pass on task {self.task_id}: {run.error} "
                "(`eval --agent oracle --strict` shows why; grade it without --strict)"
            )
            return Grade(reward=0.0, infra_failure=True, details={"error": error})
        if not run.reference.tests and run.reference.loads and not self.output_checked:
            error = (
                f"task {self.task_id}: its verifier runs the agent's code "
                f"({', '.join(sorted(run.reference.loads)[:3])}) but no pytest or unittest test "
                "the grader can watch, so strict grading cannot prove a pass (unwatched); a "
                "task whose verifier checks the output itself declares [metadata] "
                "output_checked = true"
            )
            return Grade(
                reward=0.0, infra_failure=True, details={"error": error, "unwatched": True}
            )
        return run.reference

    def reference_run(self, context: GradingContext, kind: str) -> reference.ReferenceRun:
        """The reference solution's strict run of this task (cached per task and sandbox
        ``kind``, the sandbox class where the context names none: ``reference``)."""
        commands = self.reference_solution()
        if self.step_index is not None:  # steps 0 to this one, each prepared then solved
            commands = [
                command
                for i in range(self.step_index + 1)
                for command in (
                    f"# step {self.steps[i].name}",
                    *harbor_steps.stage_commands(self.steps[i], self.environment.workdir, _pack),
                    *self.step_task(i).reference_solution(),
                )
            ]
        key = reference.task_key(self.path, commands, context.sandbox_kind or kind)
        return reference.reference_run(key, lambda: self._run_reference(context, commands))

    def _run_reference(
        self, context: GradingContext, commands: list[str]
    ) -> reference.ReferenceRun:
        """Play the reference solution in a fresh sandbox, then grade its work strictly, watched
        (with no standard but its own run's consistency). A sandbox failure raises
        SandboxError (nothing cached)."""
        oracle = context.fresh_sandbox()
        # a step's commands prepare each step themselves
        (self.setup if self.step_index is None else self.environment.setup)(oracle)
        for command in commands:
            oracle.execute(command, timeout=self.timeout_s)
        oracle.stop_processes()
        with tempfile.TemporaryDirectory(prefix="thundersync-reference-") as tmp:
            grade, seen = self._strict_grade(oracle, context, Path(tmp), standard=None)
        if grade.infra_failure:
            raise SandboxError(f"the reference solution's run: {grade.details.get('error')}")
        if grade.reward < 1.0 or seen is None:
            why = (
                grade.details.get("reason")
                or grade.details.get("reward_error")
                or (grade.details.get("output", "")[-300:])
            )
            return reference.ReferenceRun(
                None,
                f"its reference solution scores {grade.reward:g} strictly ({why})",
                grade.reward,
            )
        return reference.ReferenceRun(seen.reference(), None, grade.reward)

    def _strict_grade(
        self,
        sandbox: Sandbox,
        context: GradingContext,
        tmp: Path,
        *,
        standard: witness.Reference | Grade | None,
    ) -> tuple[Grade, witness.Observation | None]:
        """The grade against the task's pristine state, and what the witness saw (strict).
        ``standard``: the reference run's standard a strict pass is proven against; a Grade,
        the one to give (there is none); None, no proof asked (not strict, or the reference run
        itself)."""
        workdir = self.environment.workdir
        try:
            agent_work = work.export_work(sandbox, workdir, tmp, "work.tar")
        except work.WorkExportError as err:  # the agent's doing: its 0 when strict or separate
            if context.strict or self.verifier is not None:
                failure = {"agent_failure": str(err), "reason": str(err)}
                return Grade(reward=0.0, details={"strict": context.strict, **failure}), None
            grade, _ = self._run_tests(sandbox, pinned=False)
            unreported = {"strict": False, "tamper_report_error": str(err)}
            return Grade(grade.reward, grade.infra_failure, {**grade.details, **unreported}), None
        fresh = self._fresh_sandbox(sandbox, context)
        self._prepare(fresh, live=False)
        try:
            pristine = work.export_work(fresh, workdir, tmp, "pristine.tar")
        except work.WorkExportError as err:
            raise SandboxError(f"the fresh sandbox's work folder: {err}") from err
        separate = self._verifier_sandbox(context) if self.verifier is not None else None
        # the names the interpreter that runs the tests imports: the verifier image's, if any
        modules = tamper.importable_modules(separate or fresh)
        reasons = strict.tamper_reasons(workdir, pristine, agent_work, modules)
        reasons = sorted([*reasons, *work.link_reasons(workdir, pristine, agent_work)])
        report = {
            "strict": context.strict,
            "tamper_suspected": bool(reasons),
            "tamper_reasons": reasons,
        }
        if context.strict and reasons:
            reason = "strict grading: the agent's work touches test infrastructure"
            return Grade(reward=0.0, details={**report, "reason": reason}), None
        if isinstance(standard, Grade):
            return Grade(
                standard.reward, standard.infra_failure, {**standard.details, **report}
            ), None
        seen = None
        if not context.strict and self.verifier is None:
            grade, _ = self._run_tests(sandbox, pinned=False)
        else:
            target = separate or fresh
            try:
                work.import_work(target, workdir, agent_work)
            except work.WorkExportError as err:  # its work does not fit a fresh sandbox
                failure = {"agent_failure": str(err), "reason": str(err)}
                return Grade(reward=0.0, details={**report, **failure}), None
            proof = standard if isinstance(standard, witness.Reference) else None
            grade, seen = self._run_tests(target, pinned=context.strict, standard=proof)
        if self.verifier is not None:
            report["separate_verifier"] = True
        if isinstance(standard, witness.Reference) and not standard.tests:
            report["unwatched"] = True  # no test to follow: the verifier's own check stands
        if grade.details.get("tamper_suspected"):  # the witness contradicted the verifier
            report["tamper_suspected"] = True
            report["tamper_reasons"] = sorted([*reasons, *grade.details["tamper_reasons"]])
        return Grade(grade.reward, grade.infra_failure, {**grade.details, **report}), seen

    def _fresh_sandbox(self, sandbox: Sandbox, context: GradingContext) -> Sandbox:
        """A fresh sandbox like ``sandbox``; a compose task's joins ``sandbox``'s services as
        they are (their state is part of the work: a verifier may read what the agent left in a
        database), while its own container is fresh."""
        network = getattr(sandbox, "services_network", None)
        if network is None or context.make_sandbox is None:
            return context.fresh_sandbox()
        spec = self.sandbox_spec(context.sandbox_kind)
        return context.make_sandbox(dataclasses.replace(spec, services=(), network=network))

    def _verifier_sandbox(self, context: GradingContext) -> Sandbox:
        """A sandbox of the separate verifier's image (of the episode's sandbox kind)."""
        if self.verifier is None or context.make_sandbox is None:
            raise ValueError(f"task {self.task_id} has no separate verifier to make")
        made = context.make_sandbox(self.verifier.spec(context.sandbox_kind))
        self.verifier.setup(made)
        return made

    def _run_tests(
        self, sandbox: Sandbox, *, pinned: bool, standard: witness.Reference | None = None
    ) -> tuple[Grade, witness.Observation | None]:
        """Upload the tests and run them in ``sandbox``; the reward as the task's format defines
        it. ``pinned`` (strict): with the strict environment, watched by the witness, and a
        pass the records contradict (or, given the reference run's ``standard``, do not prove)
        scores 0 as tampering; what the witness saw is returned beside the grade."""
        workdir = self.environment.workdir
        paths = grading.prepare_grader(sandbox, workdir, self.test_uploads())
        script = f"{paths.tests}/{'run-tests.sh' if self.format == 'tb1' else 'test.sh'}"
        prefix = strict.pinned_environment(workdir) if pinned else ""
        watch = witness.prepare(sandbox, paths.verifier, workdir) if pinned else None
        result = grading.run_script(
            sandbox,
            paths,
            script,
            self.test_timeout_s,
            self.test_env,
            prefix=prefix,
            suffix=watch.exports(self.test_env) if watch is not None else "",
        )
        if self.format == "tb1":
            grade = grading.grade_tb1(result, self.test_timeout_s)
        else:
            grade = grading.grade_harbor(
                sandbox, paths, result, self.test_timeout_s, self.reward_key
            )
        if watch is None or grade.infra_failure:
            return grade, None
        seen = witness.observe(sandbox, watch)
        if grade.reward <= 0.0:
            return grade, seen
        reasons = witness.contradictions(
            seen, full_pass=grade.reward >= 1.0, reference=standard, workdir=workdir
        )
        if not reasons:
            return grade, seen
        details = {
            **grade.details,
            "tamper_suspected": True,
            "tamper_reasons": reasons,
            "reason": "strict grading: the test run does not prove the verifier's pass",
        }
        return Grade(reward=0.0, details=details), seen

    def test_uploads(self) -> list[tuple[Path, str]]:
        """The files the grader uploads (host file, path under the tests folder), each checked
        again to lie inside the task folder: tests/, plus run-tests.sh for Terminal-Bench 1,
        plus what a separate verifier's tests/Dockerfile copies into /tests (where the grader
        uploads the tests, so the image's copies are made again in either sandbox)."""
        uploads = inputs.list_files(self.tests_dir, self.path)
        shared = self.path / "tests"
        if self.step_index is not None and shared.is_dir() and shared != self.tests_dir:
            # Harbor uploads the task's tests/, then the step's over them
            by_rel = {rel: host for host, rel in inputs.list_files(shared, self.path)}
            by_rel.update({rel: host for host, rel in uploads})
            uploads = [(host, rel) for rel, host in sorted(by_rel.items())]
        if self.format == "tb1":
            script = inputs.inside(self.test_script, self.path, "run-tests.sh")
            uploads.append((script, "run-tests.sh"))
        if self.verifier is not None:
            by_name = dict((rel, host) for host, rel in uploads)
            for host, rel in test_copy_uploads(self.verifier.plan, self.path):
                by_name[rel] = host
            uploads = [(host, rel) for rel, host in sorted(by_name.items())]
        return uploads

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
        payload = _pack(files, self.solution_script.name)
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


def _pack(files: list[tuple[Path, str]], script_name: str) -> str:
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
