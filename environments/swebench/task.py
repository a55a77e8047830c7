"""A SWE-bench instance as a Task: the issue as the prompt, the official eval flow as grading."""

from __future__ import annotations

import base64
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from environments.actions import SUBMIT_WORD
from environments.sandboxes.protocol import AgentBrokeSandbox, Sandbox, SandboxError, SandboxSpec
from environments.swebench.audit import (
    PINNED_ENV,
    BaseTree,
    git_state_reasons,
    patch_reasons,
    restore_command,
)
from environments.swebench.grading import grade_log, make_spec, patch_paths
from environments.swebench.instance import SWEBenchInstance
from environments.swebench.patch import AgentFailure, AgentRepo, diff_in, export_repo, git_state
from environments.swebench.repository import RepoSource, repo_source
from environments.swebench.transfer import read_text, write_text
from environments.tamper import importable_modules
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
_HOOKS_OFF_ENV = "GIT_CONFIG_PARAMETERS=\"'core.hooksPath=/dev/null' 'core.fsmonitor='\""
"""For the eval script: its own ``export GIT_CONFIG_COUNT=...`` (snapshot instances) would
override settings passed that way; GIT_CONFIG_PARAMETERS (what ``git -c`` uses) survives."""
PATCH_FILE = f"{SCRATCH}/model.patch"
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
        broke) scores 0 with ``details["agent_failure"]``; only the engine's and the new
        sandbox's failures are infrastructure failures.

        Every grade's details report ``tamper_suspected`` and ``tamper_reasons``
        (``environments.swebench.audit``) and ``strict``. With ``context.strict`` (the default
        for training) a suspected grade scores 0, the task's test files are restored to the
        base commit before the eval script runs, and the script runs with a pinned
        environment (``audit.PINNED_ENV``). Rewards are exactly 0.0 or 1.0.

        There is no grading without a context: the agent's own sandbox is never trusted to
        run the tests. A caller holding only a sandbox passes ``GradingContext(lambda:
        make_sandbox(task.sandbox_spec(kind), kind=kind))``.
        """
        reasons: list[str] = []
        try:
            sandbox.stop_processes()
            with tempfile.TemporaryDirectory(prefix="thundersync-swebench-") as tmp:
                agent = export_repo(sandbox, TESTBED, Path(tmp))
                grade = self._grade_in_fresh_sandbox(context, agent, Path(tmp), reasons)
        except (AgentFailure, AgentBrokeSandbox) as exc:
            failure = {"agent_failure": str(exc), "error": str(exc)}
            grade = Grade(0.0, details={"resolved": False, **failure})
        except SandboxError as exc:
            grade = Grade(0.0, infra_failure=True, details={"error": f"sandbox: {exc}"})
        return _audited(grade, reasons, strict=context.strict)

    def _grade_in_fresh_sandbox(
        self, context: GradingContext, agent: AgentRepo, host_dir: Path, reasons: list[str]
    ) -> Grade:
        """The official flow in a new sandbox; appends the audit's findings to ``reasons``
        as soon as they are known (a patch that does not apply is still reported)."""
        sandbox = context.fresh_sandbox()
        try:
            self.setup(sandbox)
            sandbox.execute(f"mkdir -p {SCRATCH}", timeout=60)
            chunk = self.sandbox_spec().max_output_bytes * 3 // 4 - 1024
            patch = diff_in(
                sandbox,
                agent,
                testbed=TESTBED,
                base_commit=self.instance.base_commit,
                scratch=SCRATCH,
                out=PATCH_FILE,
                max_bytes=MAX_PATCH_BYTES,
                chunk_bytes=max(chunk, 1024),
            )
            text = patch.decode("utf-8", errors="replace")
            base = BaseTree(sandbox, self.instance.base_commit, scratch=SCRATCH)
            modules = importable_modules(sandbox)
            reasons += patch_reasons(self.instance, text, base, modules)
            try:
                fresh_git = git_state(sandbox, TESTBED, host_dir)
            except AgentFailure as exc:  # a sandbox just set up: not the agent's doing
                raise SandboxError(f"the fresh sandbox's repository: {exc}") from exc
            reasons += git_state_reasons(set(agent.git_state), set(fresh_git))
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
            if context.strict:
                restored = sandbox.execute(restore_command(self.instance, TESTBED), timeout=300)
                if restored.exit_code != 0:
                    raise SandboxError(f"restoring the task's test files: {restored.output}")
            return self._run_eval(sandbox, text, strict=context.strict)
        finally:
            sandbox.close()

    def _run_eval(self, sandbox: Sandbox, patch: str, *, strict: bool) -> Grade:
        script, log = f"{SCRATCH}/eval.sh", f"{SCRATCH}/test_output.txt"
        write_text(sandbox, script, make_spec(self.instance).eval_script)
        env = f"{PINNED_ENV} " if strict else ""
        result = sandbox.execute(
            f"{_HOOKS_OFF_ENV} {env}bash {script} > {log} 2>&1", timeout=self.eval_timeout_s
        )
        chunk = self.sandbox_spec().max_output_bytes * 3 // 4 - 1024
        text = read_text(sandbox, log, chunk_bytes=max(chunk, 1024))
        changed = sorted(patch_paths(patch))
        return grade_log(self.instance, text, changed_files=changed, timed_out=result.timed_out)

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
