"""A SWE-bench instance as a Task: the issue as the prompt, the official eval flow as grading."""

from __future__ import annotations

import base64
import shlex
from dataclasses import dataclass, field

from environments.actions import SUBMIT_WORD
from environments.sandboxes.protocol import Sandbox, SandboxError, SandboxSpec
from environments.swebench.grading import grade_log, make_spec
from environments.swebench.instance import SWEBenchInstance
from environments.swebench.snapshot import commit_script
from environments.swebench.transfer import read_text, write_text
from environments.tasks import Grade

TESTBED = "/testbed"
SCRATCH = f"{TESTBED}/.git/thundersync-eval"
"""Grading files live inside ``.git``: persistent in every sandbox, invisible to git and tests."""
OFFICIAL_IMAGE_PATH = (
    "/opt/miniconda3/envs/testbed/bin:/opt/miniconda3/bin:"
    "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
)
_GIT = "git -c safe.directory='*'"
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
    copied to /testbed and committed by ``setup`` as the base commit. Grading runs the
    instance's eval script (through swebench's TestSpec, anti-spoofing included) in the
    agent's sandbox and grades the log with swebench.
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

    def sandbox_spec(self) -> SandboxSpec:
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

    def grade(self, sandbox: Sandbox) -> Grade:
        """Run the eval script in ``sandbox`` (the agent's final state) and grade its log."""
        script, log = f"{SCRATCH}/eval.sh", f"{SCRATCH}/test_output.txt"
        try:
            changed = self._changed_files(sandbox)
            if changed is None:
                return Grade(0.0, details={"resolved": False, "error": _BROKEN_REPO})
            write_text(sandbox, script, make_spec(self.instance).eval_script)
            result = sandbox.execute(f"bash {script} > {log} 2>&1", timeout=self.eval_timeout_s)
            chunk = self.sandbox_spec().max_output_bytes * 3 // 4 - 1024
            text = read_text(sandbox, log, chunk_bytes=max(chunk, 1024))
        except SandboxError as exc:
            return Grade(0.0, infra_failure=True, details={"error": f"sandbox: {exc}"})
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

    def _changed_files(self, sandbox: Sandbox) -> list[str] | None:
        base = self.instance.base_commit
        result = sandbox.execute(
            f"cd {TESTBED} && {_GIT} diff --name-only {base} && "
            f"{_GIT} ls-files --others --exclude-standard",
            timeout=120,
        )
        if result.exit_code != 0:
            return None
        return [line for line in result.output.splitlines() if line.strip()]
