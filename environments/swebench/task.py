"""A SWE-bench instance as a Task: the issue as the prompt, the official eval flow as grading."""

from __future__ import annotations

import base64
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from environments.actions import SUBMIT_WORD
from environments.sandboxes.protocol import Sandbox, SandboxError, SandboxSpec
from environments.swebench.grading import grade_log, make_spec, patch_paths
from environments.swebench.instance import SWEBenchInstance
from environments.swebench.snapshot import commit_script
from environments.swebench.transfer import read_bytes, read_text, write_bytes, write_text
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
    copied to /testbed and committed by ``setup`` as the base commit. Grading applies the
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "task_id", self.instance.instance_id)
        text = INSTRUCTION.format(
            testbed=TESTBED,
            problem_statement=self.instance.problem_statement.strip(),
            submit=SUBMIT_WORD,
        )
        object.__setattr__(self, "instruction", text)

    def sandbox_spec(self, kind: str | None = None) -> SandboxSpec:
        if self.instance.repo_snapshot is not None:
            return SandboxSpec(
                image=_base_image(), files=self.instance.repo_snapshot, workdir=TESTBED
            )
        return SandboxSpec(
            image=self.instance.image,
            workdir=TESTBED,
            memory_mb=4096,
            env={"PATH": OFFICIAL_IMAGE_PATH},
        )

    def setup(self, sandbox: Sandbox) -> None:
        """Commit a snapshot as the base commit; check that /testbed is at the base commit.

        Raises SandboxError when it is not (an image without the repository, e.g. an official
        instance in bubblewrap, or a snapshot edited since its instance was built), so that
        grading can later blame a missing repository on the agent.
        """
        snapshot = self.instance.repo_snapshot
        script = commit_script() if snapshot is not None else f"{_GIT} rev-parse HEAD"
        result = sandbox.execute(f"cd {TESTBED} && {script}", timeout=120)
        lines = result.output.strip().splitlines()
        head = lines[-1] if lines else ""
        if result.exit_code == 0 and head == self.instance.base_commit:
            return
        where = f"{self.instance.source}: instance {self.task_id!r}"
        if snapshot is not None:
            problem = f"committing the snapshot {snapshot} gave {head!r}"
            fix = "regenerate the instance"
        else:
            problem = f"{TESTBED} is at {head!r}"
            fix = f"run it in Docker with the image {self.instance.image}"
        raise SandboxError(
            f"{where}: {problem} (exit {result.exit_code}), expected base_commit "
            f"{self.instance.base_commit}: {fix}"
        )

    def grade(self, sandbox: Sandbox, context: GradingContext | None = None) -> Grade:
        """Grade the agent's patch: ``git diff`` of its tracked and new, non-ignored files
        against the base commit, taken from ``sandbox`` with git hooks and fsmonitor off.

        With a context (ShellEnv passes one; its ``fresh_sandbox`` makes a sandbox like the
        episode's), the official harness's flow: set up a new sandbox, ``git apply`` the
        patch there (one that does not apply scores 0), run the eval script, grade its log.
        Nothing else the agent left behind (git hooks and config, ignored files, processes,
        edits outside the repository) reaches the tests. The new sandbox is closed on return.

        Without it (a fallback, not official-equivalent): the eval script runs in ``sandbox``
        itself with git hooks removed and hooks and fsmonitor disabled; other tampering with
        the repository's git config or the environment is not ruled out.
        """
        try:
            patch = self._extract_patch(sandbox)
            if context is None:
                return self._run_eval(sandbox, patch)
            return self._grade_in_fresh_sandbox(context.fresh_sandbox, patch)
        except _BadPatch as exc:
            return Grade(0.0, details={"resolved": False, "error": str(exc)})
        except SandboxError as exc:
            return Grade(0.0, infra_failure=True, details={"error": f"sandbox: {exc}"})

    def _grade_in_fresh_sandbox(self, make: Callable[[], Sandbox], patch: bytes) -> Grade:
        sandbox = make()
        try:
            self.setup(sandbox)
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
            return self._run_eval(sandbox, patch)
        finally:
            sandbox.close()

    def _run_eval(self, sandbox: Sandbox, patch: bytes) -> Grade:
        script, log = f"{SCRATCH}/eval.sh", f"{SCRATCH}/test_output.txt"
        write_text(sandbox, script, make_spec(self.instance).eval_script)
        result = sandbox.execute(
            f"rm -rf {TESTBED}/.git/hooks; {_HOOKS_OFF_ENV} bash {script} > {log} 2>&1",
            timeout=self.eval_timeout_s,
        )
        chunk = self.sandbox_spec().max_output_bytes * 3 // 4 - 1024
        text = read_text(sandbox, log, chunk_bytes=max(chunk, 1024))
        changed = sorted(patch_paths(patch.decode("utf-8", errors="replace")))
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
            "diff --cached --binary --no-color --no-ext-diff --no-textconv "
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


class _BadPatch(Exception):
    """The agent left no gradable patch: its 0, not an infrastructure failure."""
