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
``Grade(infra_failure=True)``, never a plain 0.

Grading, as the official harness does it, sees only the agent's patch: ``git add -A`` into a
throwaway index and ``git diff --cached --binary <base_commit>`` in the agent's sandbox, with
git hooks, fsmonitor and user config off (so tracked edits and new files count; files git
ignores, through ``.gitignore`` or ``.git/info/exclude``, do not). ShellEnv passes the task a
``fresh_sandbox`` factory: the patch is applied there with ``git apply`` (a patch that does
not apply, or a repository the agent broke, scores 0) and the eval script runs there, so git
hooks, config, ignored files, leftover processes and edits outside the repository never reach
the tests. ``grade(sandbox)`` without the factory is a fallback that runs the eval in the
agent's sandbox with hooks removed and disabled; it is not official-equivalent.

Offline instances: the field ``repo_snapshot``. Instead of an official image
(``swebench/sweb.eval.x86_64.<id>:latest``, ``__`` written ``_1776_``), a row may carry
``repo_snapshot``: a path, relative to the file holding the row (or absolute), of a folder with
the repository's files at the base commit, as plain files without ``.git``. Such an instance
runs in the project's base image (Docker) or in bubblewrap, with the folder copied to
``/testbed``; ``setup`` then commits it with a fixed author, date and message
(``snapshot.commit_script``), which makes the commit hash a function of the files alone: the
row's ``base_commit`` must be that hash (``snapshot.snapshot_commit`` computes it), so its
eval script can name the base commit as the official ones do. ``image`` is then optional.
See ``environments/fixtures/swebench/README.md`` for the shipped instances.
"""

from __future__ import annotations

from environments.swebench.dataset import SWEBenchTaskSet, load_instances, looks_like_swebench
from environments.swebench.instance import SWEBenchInstance
from environments.swebench.task import SWEBenchTask

__all__ = [
    "SWEBenchInstance",
    "SWEBenchTask",
    "SWEBenchTaskSet",
    "load_instances",
    "looks_like_swebench",
]
