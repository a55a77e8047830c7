"""A SWE-bench instance as a Task: the issue as the prompt, the official eval flow as grading."""

from __future__ import annotations

import base64
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from environments.actions import SUBMIT_WORD
from environments.proof import reference, watch, witness
from environments.sandboxes.protocol import (
    AgentBrokeSandbox,
    GraderSetupError,
    Sandbox,
    SandboxError,
    SandboxSpec,
    bash_read_whole,
)
from environments.swebench import proof, tree_audit
from environments.swebench.audit import (
    PINNED_ENV,
    BaseTree,
    git_state_reasons,
    patch_reasons,
    restore_command,
    task_test_files,
    task_test_folders,
)
from environments.swebench.control_run import CONTROL_RUNS, REACHED
from environments.swebench.grading import LOG_TAIL_CHARS, grade_log, make_spec, patch_paths
from environments.swebench.instance import SWEBenchInstance
from environments.swebench.patch import AgentFailure, AgentRepo, diff_in, export_repo, git_state
from environments.swebench.repository import RepoSource, repo_source
from environments.swebench.transfer import (
    MAX_READ_BYTES,
    CommandFailed,
    file_size,
    read_bytes,
    read_text,
    write_text,
)
from environments.tamper import GIT_HOOKS_OFF, importable_modules
from environments.tasks import Grade, GradingContext

TESTBED = "/testbed"
SCRATCH = f"{TESTBED}/.git/thundersync-eval"
"""Grading files live inside ``.git``: persistent in every sandbox, invisible to git and tests."""
OFFICIAL_IMAGE_PATH = (
    "/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:"
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
_GIT = "git -c safe.directory='*'"
_GIT_NO_HOOKS = f"{_GIT} -c core.hooksPath=/dev/null -c core.fsmonitor="
_HOOKS_OFF_ENV = f'GIT_CONFIG_PARAMETERS="{GIT_HOOKS_OFF}"'
"""For the eval script: its own ``export GIT_CONFIG_COUNT=...`` (snapshot instances) would
override settings passed that way; GIT_CONFIG_PARAMETERS (what ``git -c`` uses) survives."""
PATCH_FILE = f"{SCRATCH}/model.patch"
TREE_BEFORE = f"{SCRATCH}/tree-before.json"
TREE_AFTER = f"{SCRATCH}/tree-after.json"
MAX_LOG_BYTES = MAX_READ_BYTES
"""The largest eval log graded; a larger one is the agent's 0 with its tail (its code printed
it: nothing before the tests prints more than a few megabytes)."""
MAX_PATCH_BYTES = 16 * 1024 * 1024
_PATCH_DELIMITER = "THUNDERSYNC_GOLD_PATCH_EOF"

INSTRUCTION = """\
You are working in a git repository at {testbed}, checked out at the commit where the issue \
below was reported. Resolve the issue by editing the repository's source code. Do not change \
the existing tests; hidden tests will check your fix.

<issue>
{problem_statement}
</issue>

Work with shell commands. Each reply must hold exactly one command in a fenced block:
```bash
<command>
```
Its output comes back to you. Files persist between commands; shell state (cd, variables) \
does not. When you are done, reply with:
```bash
{submit}
```"""


def _base_image() -> str:
    try:
        from environments.sandboxes import BASE_IMAGE
    except ImportError:
        return "thundersync/base:bookworm"
    return BASE_IMAGE


@dataclass(frozen=True, slots=True)
class SWEBenchTask:
    """One SWE-bench instance (matches ``environments.tasks.Task``).

    Sandbox: the official image with the repository at /testbed, or, for an instance with a
    ``repo_snapshot``, the project's base image (Docker) or bubblewrap with the snapshot
    brought to /testbed at the base commit by ``setup`` (``repo``: the strategy for the
    row's kind of snapshot, ``environments.swebench.repository``). Grading applies the
    agent's patch in a fresh sandbox, runs the instance's eval script there (through
    swebench's TestSpec, anti-spoofing included) and grades the log with swebench.
    """

    instance: SWEBenchInstance
    max_turns: int = 50
    timeout_s: float = 120.0
    """Per-command timeout for the agent's tool calls."""
    eval_timeout_s: float = 1800.0
    """Timeout for the whole eval script (the official harness's default)."""
    task_id: str = field(init=False)
    instruction: str = field(init=False)
    repo: RepoSource = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        instance = self.instance
        object.__setattr__(self, "task_id", instance.instance_id)
        where = f"{instance.source}: instance {instance.instance_id!r}"
        source = repo_source(
            instance.repo_snapshot,
            image=instance.image,
            base_commit=instance.base_commit,
            where=where,
        )
        object.__setattr__(self, "repo", source)
        text = INSTRUCTION.format(
            testbed=TESTBED,
            problem_statement=self.instance.problem_statement.strip(),
            submit=SUBMIT_WORD,
        )
        object.__setattr__(self, "instruction", text)

    def sandbox_spec(self, kind: str | None = None) -> SandboxSpec:
        files = self.repo.files()
        if files is not None:
            return SandboxSpec(image=_base_image(), files=files, workdir=TESTBED)
        return SandboxSpec(
            image=self.instance.image,
            workdir=TESTBED,
            memory_mb=4096,
            env={"PATH": OFFICIAL_IMAGE_PATH},
        )

    def setup(self, sandbox: Sandbox) -> None:
        """Bring /testbed to the base commit (commit a plain snapshot, check out a repository
        or bundle) and check that HEAD is the base commit.

        Raises SandboxError when it is not (an image without the repository, e.g. an official
        instance in bubblewrap, or a snapshot edited since its row was made), so that
        grading can later blame a missing repository on the agent.
        """
        result = sandbox.execute(f"cd {TESTBED} && {self.repo.setup_script()}", timeout=300)
        lines = result.output.strip().splitlines()
        head = lines[-1] if lines else ""
        if result.exit_code == 0 and head == self.instance.base_commit:
            return
        where = f"{self.instance.source}: instance {self.task_id!r}"
        if result.timed_out:  # the machine, not evidence of a changed or missing repository
            raise SandboxError(f"{where}: setting up {TESTBED} timed out")
        failed = "" if result.exit_code == 0 else f" ({result.output.strip()[-300:]!r})"
        raise SandboxError(
            f"{where}: {TESTBED} is at {head!r} after setup (exit {result.exit_code}){failed}, "
            f"expected base_commit {self.instance.base_commit}: {self.repo.mismatch_hint()}"
        )

    def grade(self, sandbox: Sandbox, context: GradingContext) -> Grade:
        """Grade the agent's patch as the official harness does: ``git diff`` of its tracked
        and new, non-ignored files against the base commit; a new sandbox from
        ``context.fresh_sandbox`` set up; the patch applied there with ``git apply`` (one that
        does not apply scores 0); the eval script run; its log graded by swebench. Nothing
        else the agent left behind (git hooks and config, ignored files, processes, edits
        outside the repository) reaches the tests. The new sandbox is closed on return.

        No program of the agent's sandbox takes part (``environments.swebench.patch``): every
        process in it is killed from outside (``stop_processes``), the engine takes its
        repository out, and the diff is made by the new sandbox's git. What the agent can
        cause (no ``.git``, an unreadable tree, a patch over MAX_PATCH_BYTES, a sandbox it
        broke, an eval log over MAX_LOG_BYTES) scores 0 with ``details["agent_failure"]``;
        only the engine's and the new sandbox's failures are infrastructure failures. A log
        that did not reach the tests is one only when a control run of the script on the
        base commit fails too (``_confirmed``); else the agent's patch stopped them.

        Every grade's details report ``tamper_suspected`` and ``tamper_reasons``
        (``environments.swebench.audit``, and ``tree_audit`` for what appeared during the eval
        script, before its test command) and ``strict``. With ``context.strict`` (the default
        for training) a suspected grade scores 0, the task's test files are restored to the
        base commit before the eval script runs, the script runs with a pinned environment
        (``audit.PINNED_ENV``), watched, and a resolved log counts only where the witness saw
        the instance's tests pass as they pass in the gold patch's run (``proof``; an instance
        without that standard is an infrastructure failure). Rewards are exactly 0.0 or 1.0.

        There is no grading without a context: the agent's own sandbox is never trusted to
        run the tests. A caller holding only a sandbox passes ``GradingContext(lambda:
        make_sandbox(task.sandbox_spec(kind), kind=kind))``.
        """
        reasons: list[str] = []
        kind = context.sandbox_kind or f"{type(sandbox).__module__}.{type(sandbox).__qualname__}"
        try:
            sandbox.stop_processes()
            standard = self._standard(context, kind) if context.strict else None
            with tempfile.TemporaryDirectory(prefix="thundersync-swebench-") as tmp:
                agent = export_repo(sandbox, TESTBED, Path(tmp))
                grade = self._grade_in_fresh_sandbox(
                    context, agent, Path(tmp), reasons, kind=kind, standard=standard
                )
        except (AgentFailure, AgentBrokeSandbox) as exc:
            failure = {"agent_failure": str(exc), "error": str(exc)}
            grade = Grade(0.0, details={"resolved": False, **failure})
        except SandboxError as exc:
            grade = Grade(0.0, infra_failure=True, details={"error": f"sandbox: {exc}"})
        return _audited(grade, reasons, strict=context.strict)

    def _grade_in_fresh_sandbox(
        self,
        context: GradingContext,
        agent: AgentRepo,
        host_dir: Path,
        reasons: list[str],
        *,
        kind: str,
        standard: witness.Reference | Grade | None,
    ) -> Grade:
        """The official flow in a new sandbox; appends the audit's findings to ``reasons``
        as soon as they are known (a patch that does not apply is still reported). A log that
        did not reach the tests is then judged by a control run (``_confirmed``). ``standard``
        (strict): what a resolved log is proven against, or the grade every attempt gets where
        there is none (``_standard``; an attempt the audit flags still scores its 0)."""
        sandbox = context.fresh_sandbox()
        try:
            self.setup(sandbox)
            sandbox.execute(f"mkdir -p {SCRATCH}", timeout=60)
            patch = diff_in(
                sandbox,
                agent,
                testbed=TESTBED,
                base_commit=self.instance.base_commit,
                scratch=SCRATCH,
                out=PATCH_FILE,
                max_bytes=MAX_PATCH_BYTES,
                chunk_bytes=self._chunk_bytes(),
            )
            text = patch.decode("utf-8", errors="replace")
            base = BaseTree(
                sandbox, self.instance.base_commit, scratch=SCRATCH, chunk_bytes=self._chunk_bytes()
            )
            modules = importable_modules(sandbox)
            reasons += patch_reasons(self.instance, text, base, modules)
            try:
                fresh_git = git_state(sandbox, TESTBED, host_dir)
            except AgentFailure as exc:  # a sandbox just set up: not the agent's doing
                raise SandboxError(f"the fresh sandbox's repository: {exc}") from exc
            reasons += git_state_reasons(set(agent.git_state), set(fresh_git))
            if isinstance(standard, Grade):
                return Grade(0.0, infra_failure=not reasons, details=standard.details)
            if patch:
                applied = sandbox.execute(
                    f"cd {TESTBED} && {_GIT_NO_HOOKS} apply --verbose {PATCH_FILE}", timeout=300
                )
                if applied.timed_out:
                    raise SandboxError("git apply of the agent's patch timed out")
                if applied.exit_code != 0:
                    problem = f"the agent's patch does not apply: {applied.output[-1000:]}"
                    details = {"resolved": False, "patch_successfully_applied": False}
                    return Grade(0.0, details={**details, "error": problem})
            grade, _ = self._run_eval(
                sandbox, text, strict=context.strict, modules=modules, standard=standard
            )
            reasons += grade.details.pop("eval_reasons", [])
        finally:
            sandbox.close()
        if grade.infra_failure:  # a log that never reached the tests: who stopped it?
            return self._confirmed(grade, context, kind)
        return grade

    def _chunk_bytes(self) -> int:
        """One read's size: its base64 well under the sandbox's output limit."""
        return max(self.sandbox_spec().max_output_bytes * 3 // 4 - 1024, 1024)

    def _run_eval(
        self,
        sandbox: Sandbox,
        patch: str,
        *,
        strict: bool,
        modules: frozenset[str],
        standard: witness.Reference | Grade | None = None,
        watched: bool = False,
    ) -> tuple[Grade, witness.Observation | None]:
        """Run the eval script in ``sandbox`` (the repository as grading left it) and grade
        its log. An infrastructure grade here means only that the log did not show the tests
        running, or (strict) that the task's test files could not be restored over the
        agent's patch (``_confirmed`` decides whose failure it was). ``details["eval_reasons"]``
        holds the tree audit's findings (``tree_audit``) and, for a resolved log, why the
        witness's records do not prove it against ``standard`` (``proof``), for the caller to
        take out. The witness watches the run (strict) when there is a ``standard`` to prove or
        the run is ``watched`` (the reference run); what it saw is returned beside the grade.

        From the moment the script starts, the agent's code runs in ``sandbox``: what a command
        then fails to read from it (the log, the tree record) is never by itself an
        infrastructure failure; only the engine's own failures (SandboxError) are."""
        if strict:
            restored = sandbox.execute(restore_command(self.instance, TESTBED), timeout=300)
            if restored.timed_out or restored.exit_code != 0:  # over the agent's patch
                how = "timed out" if restored.timed_out else f"failed: {restored.output[-500:]}"
                problem = f"restoring the task's test files {how}"
                return Grade(0.0, infra_failure=True, details={"error": problem}), None
        script, log = f"{SCRATCH}/eval.sh", f"{SCRATCH}/test_output.txt"
        chunk = self._chunk_bytes()
        found: list[str] = []
        folders = task_test_folders(task_test_files(self.instance))
        before = tree_audit.record(
            sandbox, TESTBED, TREE_BEFORE, chunk_bytes=chunk, test_folders=folders
        )
        recorder = tree_audit.injected(TESTBED, TREE_AFTER, before.site_dirs, folders)
        seen_by = _watch(sandbox) if strict and (watched or standard is not None) else None
        if seen_by is not None:  # the test command's own environment, as the script made it
            recorder += f"{proof.watch_command(seen_by)}\n"
        text, audited = tree_audit.with_audit(make_spec(self.instance).eval_script, recorder)
        write_text(sandbox, script, text)
        env = f"{PINNED_ENV} " if strict else ""
        paths = tree_audit.script_env(TESTBED, TREE_AFTER)
        result = sandbox.execute(
            f"{_HOOKS_OFF_ENV} {env}{paths} {bash_read_whole(script)} > {log} 2>&1",
            timeout=self.eval_timeout_s,
        )
        grade = self._graded_log(sandbox, log, patch, timed_out=result.timed_out, chunk=chunk)
        seen = witness.observe(sandbox, seen_by) if seen_by and not grade.infra_failure else None
        if seen is not None and grade.reward == 1.0 and isinstance(standard, witness.Reference):
            found += proof.contradictions(seen, standard, TESTBED)
        after = tree_audit.read_after(sandbox, TREE_AFTER, chunk_bytes=chunk) if audited else None
        reached = not grade.infra_failure and "timed_out" not in grade.details
        if after is not None or (audited and reached and "agent_failure" not in grade.details):
            own = patch_paths(self.instance.test_patch)
            found += tree_audit.reasons(
                before, after, task_paths=own, test_folders=folders, modules=modules
            )
        details = {**grade.details, "eval_reasons": found}
        return Grade(grade.reward, grade.infra_failure, details), seen

    def _graded_log(
        self, sandbox: Sandbox, log: str, patch: str, *, timed_out: bool, chunk: int
    ) -> Grade:
        """The eval log graded by swebench (``grade_log``), read after the agent's code ran.
        Over ``MAX_LOG_BYTES`` (the code under test printed it: a debug print in a loop), it
        is the agent's 0 with its tail, read alone; a log the sandbox's commands cannot read
        (removed, replaced) gives an infrastructure grade for ``_confirmed`` to judge."""
        try:
            size = file_size(sandbox, log)
            if size > MAX_LOG_BYTES or timed_out:
                tail_bytes = read_bytes(
                    sandbox, log, chunk_bytes=chunk, start=size - 4 * LOG_TAIL_CHARS
                )
                tail = tail_bytes.decode("utf-8", errors="replace")[-LOG_TAIL_CHARS:]
                if timed_out:
                    return grade_log(self.instance, tail, timed_out=True)
                failure = (
                    f"the eval log is {size} bytes, over {MAX_LOG_BYTES}: the code under test "
                    "printed more than grading reads"
                )
                details = {"resolved": False, "agent_failure": failure, "error": failure}
                return Grade(0.0, details={**details, "log_tail": tail})
            text = read_text(sandbox, log, chunk_bytes=chunk)
        except CommandFailed as exc:
            if timed_out:
                return grade_log(self.instance, "", timed_out=True)
            problem = f"the eval log could not be read: {exc}"
            return Grade(0.0, infra_failure=True, details={"error": problem, "log_tail": ""})
        changed = sorted(patch_paths(patch))
        return grade_log(self.instance, text, changed_files=changed)

    def _confirmed(self, grade: Grade, context: GradingContext, kind: str) -> Grade:
        """``grade`` (a log that did not show the tests running) labelled by a control run:
        the same eval script on the base commit, without the agent's patch (``control``).
        When the control fails too, the instance or the machine is at fault: an
        infrastructure failure, as before. When it reaches the tests, the agent's patch (its
        ``setup.py`` at install time, its code truncating the log) stopped them: its 0."""
        key = (self.instance, context.strict, kind, self.eval_timeout_s)
        control = CONTROL_RUNS.outcome(key, lambda: self._control(context))
        problem = grade.details.get("error", "")
        if control != REACHED:
            return Grade(0.0, infra_failure=True, details={**grade.details, "control_run": control})
        failure = (
            f"{problem} with the agent's patch, while a control run of the same eval script on "
            "the base commit, without it, reached the tests: the agent's patch stopped them"
        )
        details = {**grade.details, "resolved": False, "agent_failure": failure, "error": failure}
        return Grade(0.0, details={**details, "control_run": "reached the tests"})

    def _control(self, context: GradingContext) -> str:
        """Run the eval script on the base commit in a fresh sandbox: ``REACHED``, or the
        problem its log shows (the instance's own). SandboxError when the machine could not
        tell (the sandbox failed, the script timed out, the log too large): nothing kept."""
        sandbox = context.fresh_sandbox()
        try:
            self.setup(sandbox)
            sandbox.execute(f"mkdir -p {SCRATCH}", timeout=60)
            grade, _ = self._run_eval(sandbox, "", strict=context.strict, modules=frozenset())
        finally:
            sandbox.close()
        if grade.details.get("timed_out") or "agent_failure" in grade.details:
            problem = grade.details.get("agent_failure") or "its eval script timed out"
            raise SandboxError(f"the control run on the base commit cannot tell: {problem}")
        return str(grade.details["error"]) if grade.infra_failure else REACHED

    def _standard(self, context: GradingContext, kind: str) -> witness.Reference | Grade:
        """What a strict pass is proven against: the reference run's standard (``proof``;
        cached per instance and sandbox ``kind``), or the grade every attempt gets where there
        is none (an infrastructure failure: the instance's, not the agent's)."""
        key = proof.run_key(self.instance, kind)
        run = reference.reference_run(key, lambda: self._run_reference(context))
        if run.reference is not None:
            return run.reference
        error = (
            f"strict grading cannot prove a pass on instance {self.task_id}: {run.error} "
            "(`eval --agent oracle --strict` shows why; grade it without --strict)"
        )
        unwatched = {"unwatched": True} if "unwatched" in str(run.error) else {}
        return Grade(0.0, infra_failure=True, details={"error": error, **unwatched})

    def _run_reference(self, context: GradingContext) -> reference.ReferenceRun:
        """The gold patch applied in a fresh sandbox and its eval script run strictly, watched
        (``proof.reference_run`` turns that into the standard). A run that cannot tell (the
        sandbox failed, the script did not reach the tests or timed out) raises SandboxError:
        nothing is cached."""
        sandbox = context.fresh_sandbox()
        try:
            self.setup(sandbox)
            sandbox.execute(f"mkdir -p {SCRATCH}", timeout=60)
            for command in self.reference_solution():
                applied = sandbox.execute(command, timeout=300)
                if applied.exit_code != 0:
                    why = f"its gold patch does not apply: {applied.output.strip()[-300:]}"
                    return reference.ReferenceRun(None, why)
            modules = importable_modules(sandbox)
            grade, seen = self._run_eval(
                sandbox, self.instance.patch, strict=True, modules=modules, watched=True
            )
        finally:
            sandbox.close()
        if grade.infra_failure or grade.details.get("timed_out") or seen is None:
            problem = grade.details.get("error") or "it timed out"
            raise SandboxError(f"the gold patch's strict run on {self.task_id}: {problem}")
        flagged = grade.details.pop("eval_reasons", [])
        return proof.reference_run(self.instance, grade, flagged, seen)

    def reference_solution(self) -> list[str]:
        """One command applying the gold patch with ``git apply`` (base64-wrapped when the
        patch holds a fence or the heredoc delimiter, which would break the action text)."""
        patch = self.instance.patch
        patch += "" if patch.endswith("\n") else "\n"
        apply = f"cd {TESTBED} && {_GIT} apply --verbose"
        if "```" in patch or _PATCH_DELIMITER in patch:
            encoded = base64.b64encode(patch.encode()).decode()
            return [f"printf %s {shlex.quote(encoded)} | base64 -d | ({apply} -)"]
        return [f"{apply} - <<'{_PATCH_DELIMITER}'\n{patch}{_PATCH_DELIMITER}"]


def _watch(sandbox: Sandbox) -> watch.Witness:
    """The witness prepared in a fresh grading sandbox (nothing of the agent's has run there
    yet: a failure is the sandbox's)."""
    try:
        return watch.prepare(sandbox, proof.BESIDE, TESTBED)
    except GraderSetupError as exc:
        raise SandboxError(f"the witness of the eval script: {exc}") from exc


def _audited(grade: Grade, reasons: list[str], *, strict: bool) -> Grade:
    """``grade`` with the audit in its details; in strict mode a suspected one scores 0."""
    details = {
        **grade.details,
        "tamper_suspected": bool(reasons),
        "tamper_reasons": list(reasons),
        "strict": strict,
    }
    resolved = grade.reward == 1.0 and not (strict and reasons)
    return Grade(1.0 if resolved else 0.0, infra_failure=grade.infra_failure, details=details)
