"""One Terminal-Bench 1 or Harbor task: its definition (``definition.py``) and its grader."""

from __future__ import annotations

import dataclasses
import posixpath
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from environments import tamper, work
from environments.proof import reference, watch, witness
from environments.sandboxes.protocol import (
    AgentBrokeSandbox,
    GraderSetupError,
    HasServices,
    Sandbox,
    SandboxError,
    own,
)
from environments.tasks import Grade, GradingContext, TaskFormatError
from environments.terminal_bench import collection, grading, inputs, strict, users
from environments.terminal_bench import steps as harbor_steps
from environments.terminal_bench.definition import (
    SOLUTION_DIR_VARIABLE,
    TaskDefinition,
    pack_files,
)
from environments.terminal_bench.verifier import test_copy_uploads

__all__ = ["SOLUTION_DIR_VARIABLE", "TerminalBenchTask"]

Collected = tuple[list[collection.Restorable], list[str]]
"""What a grading sandbox of its own gets of the collection phase (``collection.restorable``)."""


@dataclass(frozen=True, slots=True)
class TerminalBenchTask(TaskDefinition):
    """A task loaded from a ``task.yaml`` (``format="tb1"``) or ``task.toml`` (``"harbor"``).

    Matches the ``environments.tasks.Task`` protocol: its definition, sandbox, setup and
    steps are ``TaskDefinition``'s; here, how an attempt at it is graded.
    """

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
        (``AgentBrokeSandbox``), with ``details["agent_failure"]``, and a compose service that
        exited by itself before the verifier began (``HasServices.check_services``: asked
        again after the verifier, for one its engine still reported running).

        First every process of ``sandbox`` is killed from outside (``stop_processes``), so
        nothing the agent started runs on while its work is read or graded. A task that wants
        internet it does not get here says so (``network``)."""
        return self.network.annotate(self._grade(sandbox, context))

    def _grade(self, sandbox: Sandbox, context: GradingContext | None) -> Grade:
        if self.num_steps:
            error = f"task {self.task_id} has steps: grade each with step_task(i).grade"
            return Grade(reward=0.0, infra_failure=True, details={"error": error})
        users.agent_phase(sandbox, None)  # the agent's turn is over: the image's user again
        try:
            sandbox.stop_processes()
            grading_began = time.time()
            with tempfile.TemporaryDirectory(prefix="thundersync-grading-") as tmp:
                collected = self._gather(sandbox, context, Path(tmp))
                if self.verifier is not None and (context is None or context.make_sandbox is None):
                    error = (
                        f"task {self.task_id}: a separate verifier needs a context that makes "
                        "sandboxes"
                    )
                    return Grade(reward=0.0, infra_failure=True, details={"error": error})
                if context is None:
                    grade = self._run_tests(sandbox, pinned=False)[0]
                else:
                    grade = self._grade_against_pristine(sandbox, context, Path(tmp), collected)
            if isinstance(sandbox, HasServices):  # one that died as grading began, seen late
                sandbox.check_services(until=grading_began)
            return grade
        except GraderSetupError as err:
            return Grade(reward=0.0, details={"grader_setup_failed": True, "reason": str(err)})
        except AgentBrokeSandbox as err:
            return Grade(reward=0.0, details={"agent_failure": str(err), "reason": str(err)})
        except SandboxError as err:
            return Grade(reward=0.0, infra_failure=True, details={"error": f"grader: {err}"})
        except TaskFormatError as err:
            return Grade(reward=0.0, infra_failure=True, details={"error": f"task folder: {err}"})

    def _gather(
        self, sandbox: Sandbox, context: GradingContext | None, tmp: Path, *, keep: bool = True
    ) -> Collected:
        """Harbor's collection phase: the ``collect`` hooks, then the artifacts into the
        context's ``artifacts_dir`` (a step's in ``<step name>/``) when it names one and
        ``keep``, else into ``tmp`` when a grading sandbox of its own (strict, or a separate
        verifier) gets them, as Harbor's separate verifier does (``collection.restore``)."""
        collection.run_hooks(sandbox, self.collect, self.task_id)
        root = context.artifacts_dir if context is not None and keep else None
        if root is not None and self.step_index is not None:
            root = root / self.steps[self.step_index].name
        own_sandbox = context is not None and (context.strict or self.verifier is not None)
        if root is None and own_sandbox and self.format == "harbor":
            root = tmp / "artifacts"
        if root is None:
            return [], []
        workdir = self.environment.workdir
        manifest = collection.collect(sandbox, self.artifacts, root, workdir=workdir)
        strict = context is not None and context.strict
        return collection.restorable(manifest, root, workdir=workdir, strict=strict)

    def _grade_against_pristine(
        self, sandbox: Sandbox, context: GradingContext, tmp: Path, collected: Collected
    ) -> Grade:
        standard = self._standard(context, type(sandbox).__name__)
        grade, _ = self._strict_grade(sandbox, context, tmp, collected, standard=standard)
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
                    *harbor_steps.stage_commands(
                        self.steps[i], self.environment.workdir, pack_files
                    ),
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
        with users.running_as(oracle, self.agent_user):  # as the agent's commands run
            for command in commands:
                oracle.execute(command, timeout=self.timeout_s)
        oracle.stop_processes()
        with tempfile.TemporaryDirectory(prefix="thundersync-reference-") as tmp:
            collected = self._gather(oracle, context, Path(tmp), keep=False)
            grade, seen = self._strict_grade(oracle, context, Path(tmp), collected, standard=None)
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
        launcher = None if seen.processes or self.output_checked else seen.launcher
        if launcher is not None:
            return reference.ReferenceRun(
                None,
                f"its verifier names Python ({launcher}) but the witness saw no Python process "
                "of its run (a test script that sets its own PYTHONPATH or environment, or runs "
                "`python -I`): a pass could not be proven, and a task whose verifier checks "
                "outputs alone declares [metadata] output_checked = true",
                grade.reward,
            )
        return reference.ReferenceRun(seen.reference(), None, grade.reward)

    def _python_named(self, pristine: work.WorkTree) -> str | None:
        """The first Python launcher the verifier's files name, or the work folder's scripts
        they name (``watch.python_named``, ``watch.work_files_named``; a ``Makefile``, a
        shell script, a file with a ``#!`` line; not a data file a test greps): a script that
        hands over to ``make`` or ``/app/run_tests.sh`` names no Python itself."""
        texts = []
        for host, rel in self.test_uploads():
            try:
                text = host.read_text(encoding="utf-8", errors="replace")
            except OSError:
                continue
            found = watch.python_named(rel, text)
            if found is not None:
                return found
            texts.append(text)
        workdir = self.environment.workdir
        named = watch.work_files_named(texts, workdir, pristine.entries)
        for rel, text in pristine.read_many(named, 256 * 1024).items():
            runnable = text.startswith("#!") or rel.endswith((".sh", ".bash")) or "make" in rel
            found = watch.python_named(rel, text) if runnable else None
            if found is not None:
                return f"{found}, in {posixpath.join(workdir, rel)}"
        return None

    def _strict_grade(
        self,
        sandbox: Sandbox,
        context: GradingContext,
        tmp: Path,
        collected: Collected,
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
        held = standard.test_files() if isinstance(standard, witness.Reference) else frozenset()
        reasons = strict.tamper_reasons(workdir, pristine, agent_work, modules, held)
        reasons = sorted([*reasons, *work.link_reasons(workdir, pristine, agent_work)])
        placed, refused = collected
        if context.strict:  # the artifacts it places are judged as the work folder's files
            found = tamper.path_findings(collection.restored_paths(placed))
            reasons = sorted([*reasons, *(f"{f.path}: {f.reason} (an artifact)" for f in found)])
        report: dict[str, object] = {
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
            try:  # its work and what the hooks and it published: do they fit a fresh sandbox?
                work.import_work(target, workdir, agent_work)
                collection.restore(target, placed)
            except work.WorkExportError as err:
                failure = {"agent_failure": str(err), "reason": str(err)}
                return Grade(reward=0.0, details={**report, **failure}), None
            if refused:
                report["artifacts_not_placed"] = refused
            proof = standard if isinstance(standard, witness.Reference) else None
            grade, seen = self._run_tests(target, pinned=context.strict, standard=proof)
            if seen is not None and standard is None:  # the reference run: what it edits
                seen.work_changed = frozenset(
                    p for paths in agent_work.changed_since(pristine) for p in paths
                )
                seen.launcher = self._python_named(pristine)
                seen.written |= _written(target, workdir, tmp, agent_work) or set()
                seen.written |= witness.outputs_read(
                    seen, lambda path: agent_work.file_digest(path, workdir)
                )
            elif held and seen is not None and grade.reward > 0:
                after = _written(target, workdir, tmp, agent_work)
                if after is None:
                    rewrote = [
                        f"{workdir}: the test run left the work folder unreadable, so whether "
                        "it rewrote the task's own test files is unknown"
                    ]
                else:  # by any program: a shell's printf as much as Python's json.dump
                    rewrote = [
                        f"{posixpath.join(workdir, p)}: the test run rewrote one of the task's "
                        "own test files"
                        for p in sorted(after & held)
                    ]
                if rewrote:
                    caught = {
                        "tamper_suspected": True,
                        "tamper_reasons": sorted([*reasons, *rewrote]),
                        "reason": "strict grading: the task's test files changed in the test run",
                    }
                    return Grade(0.0, details={**grade.details, **report, **caught}), seen
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
        watched = watch.prepare(sandbox, paths.verifier, workdir) if pinned else None
        if self.verifier_user is not None:  # as Harbor does: its user writes the reward there
            sandbox.execute(own(f"chmod a+rwx {paths.verifier}"), timeout=60)
        with users.running_as(sandbox, self.verifier_user):
            result = grading.run_script(
                sandbox,
                paths,
                script,
                self.test_timeout_s,
                self.test_env,
                prefix=prefix,
                suffix=watched.exports(self.test_env) if watched is not None else "",
            )
        if self.format == "tb1":
            grade = grading.grade_tb1(result, self.test_timeout_s)
        else:
            grade = grading.grade_harbor(
                sandbox, paths, result, self.test_timeout_s, self.reward_key
            )
        if watched is None or grade.infra_failure:
            return grade, None
        seen = witness.observe(sandbox, watched)
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


def _written(sandbox: Sandbox, workdir: str, tmp: Path, before: work.WorkTree) -> set[str] | None:
    """The work folder's files the test run changed, by any program (a shell's ``awk`` as
    much as Python, whose writes the witness records): the run's output, not the tests'
    (a stale report the tests regenerate, red team 2026-12-07). None where the folder cannot
    be read again: what the run did to the task's test files is unknown, and a graded
    run's pass is not proven."""
    try:
        after = work.export_work(sandbox, workdir, tmp, "after-tests.tar")
    except work.WorkExportError:
        return None
    return {p for paths in after.changed_since(before) for p in paths}
