"""SWE-bench: official-schema instances as tasks, graded by the swebench package itself.

Instances are rows in the official SWE-bench schema (``instance_id``, ``repo``,
``base_commit``, ``patch``, ``test_patch``, ``problem_statement``, ``FAIL_TO_PASS``,
``PASS_TO_PASS`` as lists or JSON-encoded lists, ``version``, ``environment_setup_commit``,
``created_at``, ``hints_text``) with the swebench 5.x fields ``eval_script``, ``log_parser``,
``eval_type`` and ``image``; :func:`load_instances` reads them from a ``.json`` (list of rows),
``.jsonl`` or ``.parquet`` file, a folder of such files, or a Hub dataset name, and validates
every row (a bad one raises ``TaskFormatError`` naming the file, instance and field).

The agent works in the repository at ``/testbed``. The reward is 1 iff swebench's
``get_eval_report`` says resolved (every FAIL_TO_PASS and PASS_TO_PASS test passes) on the log
of the instance's eval script, run through swebench's own ``make_test_spec`` (which adds the
test exit-code anti-spoofing line). A grader that could not run gives
``Grade(infra_failure=True)``, never a plain 0; a log that did not reach the tests is one only
when a control run of the same script on the base commit, without the agent's patch, fails too
(``control.py``: once per instance), else it is the agent's 0. So is a log over 64 MiB.

Grading, as the official harness does it, sees only the agent's patch: ``git add -A`` into a
throwaway index and ``git diff --cached --binary --no-renames <base_commit>``, with git hooks,
fsmonitor and user config off (so tracked edits and new files count; files git ignores,
through ``.gitignore`` or ``.git/info/exclude``, do not). No program of the agent's sandbox,
which the agent could have replaced, makes or reads that patch: its processes are killed from
outside, the sandbox engine takes its repository out (without the object store), and the
fresh sandbox's git diffs it (``environments.swebench.patch``). The task needs
the ``GradingContext`` ShellEnv passes: the patch is applied with ``git apply`` in a sandbox
from its ``fresh_sandbox`` factory (a patch that does not apply, or a repository the agent
broke, scores 0) and the eval script runs there, so git hooks, config, ignored files,
leftover processes and edits outside the repository never reach the tests. There is no
in-place grading in the agent's own sandbox.

Strict grading (``context.strict``, the default for training; ``environments.swebench.audit``)
adds to that flow: the diff is audited with ``environments.tamper``'s rules (conftest.py,
pytest configuration judged section by section, new modules shadowing pytest, start-up hooks,
plugin entry points, shell rc and git config files) and for changes to the task's test files
and test folders, the agent's git hooks and risky git config are compared with a fresh
repository's, the task's test files are restored to the base commit, and the eval script runs
with ``PYTHONPATH``, ``LD_PRELOAD``, ``PYTHONSTARTUP`` and the like unset. The eval script itself
records the tree just before its test command (``tree_audit.py``): what an install step's
``setup.py`` planted there that the diff did not show (a ``conftest.py``, a ``.pth`` hook...)
is reported like the diff's findings, in both modes. Every grade's
details hold ``tamper_suspected`` (bool), ``tamper_reasons`` (list of strings) and ``strict``;
non-strict grading reports them and scores as the official harness does, strict grading
scores a suspected patch 0. Rewards are exactly 0.0 or 1.0.

Offline instances: the field ``repo_snapshot``. Instead of an official image
(``swebench/sweb.eval.x86_64.<id>:latest``, ``__`` written ``_1776_``), a row may carry
``repo_snapshot``: a path, relative to the file holding the row (or absolute), of

- a folder of plain files without ``.git``, the repository at the base commit: ``setup``
  commits it with a fixed author, date and message (``snapshot.commit_script``), which makes
  the commit hash a function of the files alone, and the row's ``base_commit`` must be that
  hash (``snapshot.snapshot_commit`` computes it);
- a git repository (a folder with ``.git``) or a git bundle file (``git bundle create FILE
  --all``) holding the row's real ``base_commit``: its history up to that commit, and nothing
  else of it (no later commits, tags, remotes, hooks, config or uncommitted files), is checked
  out at ``/testbed``.

The path must resolve, after following links, inside the folder of the file holding the row
(a row cannot send host files such as ``/`` into the agent's sandbox): ``load_instances(...,
snapshot_root=FOLDER)``, or the environment variable ``THUNDERSYNC_SWEBENCH_SNAPSHOT_ROOT``,
allows one more folder. Such an instance runs in the project's base image (Docker) or in
bubblewrap; ``image`` is then optional. See ``environments/fixtures/swebench/README.md``.
"""

from __future__ import annotations

from environments.swebench.dataset import load_instances, looks_like_swebench
from environments.swebench.instance import SWEBenchInstance
from environments.swebench.task import SWEBenchTask

__all__ = [
    "SWEBenchInstance",
    "SWEBenchTask",
    "load_instances",
    "looks_like_swebench",
]
