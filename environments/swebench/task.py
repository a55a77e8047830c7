"""A SWE-bench instance as a Task: the issue as the prompt, the official eval flow as grading."""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass, field

from environments.actions import SUBMIT_WORD
from environments.sandboxes.protocol import Sandbox, SandboxError, SandboxSpec
from environments.swebench.audit import (
    PINNED_ENV,
    BaseTree,
    git_state,
    git_state_reasons,
    patch_reasons,
    restore_command,
)
from environments.swebench.grading import grade_log, make_spec, patch_paths
from environments.swebench.instance import SWEBenchInstance
from environments.swebench.repository import RepoSource, repo_source
from environments.swebench.transfer import read_bytes, read_text, write_bytes, write_text
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
_GIT_NO_USER_CONFIG = "GIT_CONFIG_GLOBAL=/dev/null GIT_CONFIG_NOSYSTEM=1"
_HOOKS_OFF_ENV = "GIT_CONFIG_PARAMETERS=\"'core.hooksPath=/dev/null' 'core.fsmonitor='\""
"""For the eval script: its own ``export GIT_CONFIG_COUNT=...`` (snapshot instances) would
override settings passed that way; GIT_CONFIG_PARAMETERS (what ``git -c`` uses) survives."""
PATCH_FILE = f"{SCRATCH}/model.patch"
MAX_PATCH_BYTES = 16 * 1024 * 1024
_PATCH_DELIMITER = "THUNDERSYNC_GOLD_PATCH_EOF"
_BROKEN_REPO = (
    "git diff against the base commit failed after the episode: the agent broke the "
    "repository (e.g. removed .git), which scores 0, like a patch that does not apply"
)

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
        raise SandboxError(
            f"{self.instance.source}: instance {self.task_id!r}: {TESTBED} is at {head!r} "
            f"after setup (exit {result.exit_code}), expected base_commit "
            f"{self.instance.base_commit}: {self.repo.mismatch_hint()}"
        )

    def grade(self, sandbox: Sandbox, context: GradingContext) -> Grade:
        """Grade the agent's patch as the official harness does: ``git diff`` of its tracked
        and new, non-ignored files against the base commit, taken from ``sandbox`` with git
        hooks and fsmonitor off; a new sandbox from ``context.fresh_sandbox`` set up; the
        patch applied there with ``git apply`` (one that does not apply scores 0); the eval
        script run; its log graded by swebench. Nothing else the agent left behind (git hooks
        and config, ignored files, processes, edits outside the repository) reaches the tests.
        The new sandbox is closed on return.

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
            patch = self._extract_patch(sandbox)
            agent_git = git_state(sandbox, TESTBED)
            grade = self._grade_in_fresh_sandbox(context, patch, agent_git, reasons)
        except _BadPatch as exc:
            grade = Grade(0.0, details={"resolved": False, "error": str(exc)})
        except SandboxError as exc:
            grade = Grade(0.0, infra_failure=True, details={"error": f"sandbox: {exc}"})
        return _audited(grade, reasons, strict=context.strict)

    def _grade_in_fresh_sandbox(
        self, context: GradingContext, patch: bytes, agent_git: set[str], reasons: list[str]
    ) -> Grade:
        """The official flow in a new sandbox; appends the audit's findings to ``reasons``
        as soon as they are known (a patch that does not apply is still reported)."""
        sandbox = context.fresh_sandbox()
        try:
            self.setup(sandbox)
            text = patch.decode("utf-8", errors="replace")
            base = BaseTree(sandbox, self.instance.base_commit, scratch=SCRATCH)
            sandbox.execute(f"mkdir -p {SCRATCH}", timeout=60)
            modules = importable_modules(sandbox)
            reasons += patch_reasons(self.instance, text, base, modules)
            reasons += git_state_reasons(agent_git, git_state(sandbox, TESTBED))
            if patch:
                write_bytes(sandbox, PATCH_FILE, patch)
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

    def _extract_patch(self, sandbox: Sandbox) -> bytes:
        """The agent's patch; _BadPatch when git fails (the agent broke the repository) or
        the patch is over MAX_PATCH_BYTES.

        A throwaway index built from the base commit, so the agent's own index (e.g.
        ``--skip-worktree`` bits) cannot hide edits; ``.gitignore`` and ``.git/info/exclude``
        do hide new files, as in the official harness's ``git add -A && git diff --cached``.
        """
        base = self.instance.base_commit
        index, out = f"{SCRATCH}/index", PATCH_FILE
        diff = (
            "diff --cached --binary --no-color --no-ext-diff --no-textconv --no-renames "
            f"--src-prefix=a/ --dst-prefix=b/ {base}"
        )
        result = sandbox.execute(
            f"cd {TESTBED} && rm -rf {SCRATCH} && mkdir -p {SCRATCH} && "
            f"export GIT_INDEX_FILE={index} {_GIT_NO_USER_CONFIG} && "
            f"{_GIT_NO_HOOKS} read-tree {base} && {_GIT_NO_HOOKS} add -A && "
            f"{_GIT_NO_HOOKS} {diff} > {out}",
            timeout=300,
        )
        if result.timed_out:
            raise SandboxError("extracting the agent's patch timed out")
        if result.exit_code != 0:
            raise _BadPatch(f"{_BROKEN_REPO}: {result.output[-500:]}")
        size = sandbox.execute(f"stat -c %s {out}", timeout=60).output.strip()
        if size.isdigit() and int(size) > MAX_PATCH_BYTES:
            raise _BadPatch(f"the agent's patch is {size} bytes, over {MAX_PATCH_BYTES}")
        chunk = self.sandbox_spec().max_output_bytes * 3 // 4 - 1024
        return read_bytes(sandbox, out, chunk_bytes=max(chunk, 1024))

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


class _BadPatch(Exception):
    """The agent left no gradable patch: its 0, not an infrastructure failure."""
