"""``compare --resume``: a killed comparison goes on from the runs it finished.

A comparison is many training runs (modes × seeds) and then one evaluation of all of them; a
comparison killed in its fortieth minute (Ctrl-C, a crashed rollout worker, a reboot) used to
leave only ``--overwrite``. With ``--resume`` each run that reached its last step is kept
as it is (its checkpoints, metrics and spans are what the evaluation reads), and each run that
did not is trained again from its first step: a run's times are only comparable when it ran
without a restart in the middle, so a half run is not continued. Every kept or restarted run
must have been requested with exactly the settings this command would give it (its
``requested-config.json``), or the command is refused naming the first field that differs:
mixing two workloads in one comparison would compare nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from thundersync.training.run_folder import clear_run_folder, survey

REQUESTED = "requested-config.json"


def finished(folder: Path, steps: int) -> bool:
    """Whether the run in ``folder`` reached step ``steps``: its checkpoint for that step is
    there and its metrics.jsonl records the step."""
    if not (folder / "checkpoints" / f"step-{steps:06d}").is_dir():
        return False
    try:
        lines = (folder / "metrics.jsonl").read_text().splitlines()
    except OSError:
        return False
    for line in lines:
        try:
            if json.loads(line).get("step") == steps:
                return True
        except (json.JSONDecodeError, AttributeError):
            continue
    return False


def resume_problem(requested: dict[Path, dict[str, Any]], runs: Path) -> str | None:
    """Why ``--resume`` may not go on in ``runs`` (one line), or None. ``requested`` maps each
    run folder of this comparison to the settings this command gives it."""
    if not runs.is_dir():
        return f"--resume: {runs} holds no runs of a comparison to resume; drop --resume"
    ours = set(requested)
    for entry in sorted(runs.iterdir(), key=lambda p: p.name):
        if entry not in ours:
            return (
                f"--resume: {entry} is not one of this comparison's runs (other --modes, "
                "--seeds or --seed than the first command's?)"
            )
    for folder, settings in requested.items():
        if not folder.exists():
            continue
        try:
            before = json.loads((folder / REQUESTED).read_text())
        except (OSError, json.JSONDecodeError):
            if survey(folder).holds_run:
                return f"--resume: {folder / REQUESTED} is missing or unreadable"
            continue
        changed = sorted(k for k in set(before) | set(settings) if before.get(k) != settings.get(k))
        if changed:
            key = changed[0]
            return (
                f"--resume: {folder.name} was requested with {key}={before.get(key)!r}, this "
                f"command gives {key}={settings.get(key)!r}; resume with the first command's "
                "settings, or --overwrite"
            )
    return None


def restart(folder: Path) -> None:
    """Empty a run folder whose run did not finish, before it is trained again."""
    clear_run_folder(folder)
