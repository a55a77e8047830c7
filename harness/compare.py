"""``thundersync compare``: one workload under sync, async(k) and streaming, several seeds.

Every (mode, seed) run is a ``thundersync train`` process saving a checkpoint every
``eval_every`` steps; after all runs, each checkpoint is evaluated on one held-out task set
(the same for every run), so evaluation never competes with training and the training clock
excludes it. Runs alternate their mode order from seed to seed, so slow drift of a shared
machine does not favour one mode. The report: time to the target accuracy and accuracy at a
fixed budget, each as a median with a distribution-free CI over seeds, speed-ups over sync, the
step-time breakdown, idle fractions, staleness and T*/T (docs/design.md §4, §7).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field

from harness import compare_report, compare_resume, policy_eval
from harness.curves import Point
from leaderboard.store import Entry, Store, suite_version
from thundersync.cli_output import Progress
from thundersync.declared import (
    DOCSTRINGS,
    PositiveFloat,
    PositiveInt,
    Text,
    check_fields,
    non_finite,
)
from thundersync.models import build_tiny_model
from thundersync.protocol.strict_json import dumps_refusing
from thundersync.training.config import TrainConfig
from thundersync.training.modes import REGISTRY, baseline_mode, mode_from_label
from thundersync.training.run_folder import clear_run_folder, run_folder_problem, survey
from thundersync.training.run_metrics import read_metrics

Accuracy = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]
COMPARE_FLAGS = {
    "seeds": "--seeds",
    "target": "--target",
    "budget_s": "--budget-s",
    "eval_every": "--eval-every",
    "eval_tasks": "--eval-tasks",
    "eval_samples": "--eval-samples",
    "eval_env_kwargs": "--eval-env-kwargs",
    "modes": "--modes",
    "out": "--out",
    "leaderboard_db": "--db",
}
"""The comparison's own fields and their flags."""


@dataclass(frozen=True, slots=True)
class CompareConfig:
    """One comparison (``results.json`` holds it)."""

    __pydantic_config__ = DOCSTRINGS

    train: TrainConfig
    """The workload: every run uses it, with its own mode, seed and run folder."""
    modes: Annotated[tuple[Text, ...], Field(min_length=1)] = tuple(c.name for c in REGISTRY)
    """Mode labels: sync, streaming, async (with ``train.staleness``) or async-k<K>."""
    seeds: PositiveInt = 3
    """Runs per mode, seeds ``train.seed``, ``train.seed + 1``, ..."""
    target: Accuracy = 0.8
    """Held-out accuracy whose time-to-reach is compared."""
    budget_s: PositiveFloat | None = None
    """Training seconds at which accuracy is compared (None: the shortest run's length)."""
    eval_every: PositiveInt = 2
    """Evaluate a checkpoint every this many steps."""
    eval_tasks: PositiveInt = 32
    """Held-out tasks (drawn once, the same for every run)."""
    eval_samples: PositiveInt = 1
    """Attempts per held-out task."""
    eval_env_kwargs: dict[str, Any] | None = None
    """Env keyword arguments for the evaluation (None: the training's; e.g. the same env
    without its latency knobs, since evaluation time is not measured)."""
    out: Text = "runs/compare"
    """Folder for results.json, plots and the runs."""
    leaderboard: bool = True
    """Append the comparison to the leaderboard."""
    leaderboard_db: Text | None = None
    """Leaderboard file (None: ``$THUNDERSYNC_LEADERBOARD`` or runs/leaderboard.sqlite)."""

    def __post_init__(self) -> None:
        check_fields(self, flags=COMPARE_FLAGS)  # types and ranges, as declared
        where = non_finite(self.eval_env_kwargs)
        if where is not None:
            raise ValueError(f"--eval-env-kwargs: {where} is NaN or infinite (not strict JSON)")
        for mode in self.modes:
            mode_config(self.train, mode, 0, Path(self.out), 1)
        baseline = baseline_mode()
        if not any(mode_from_label(m, staleness=1).baseline for m in self.modes):
            raise ValueError(
                f"--modes must include {baseline.label} (speed-ups are relative to it)"
            )


@dataclass(slots=True)
class Run:
    """One (mode, seed) training run and its evaluated checkpoints."""

    mode: str
    seed: int
    folder: Path
    curve: list[Point] = field(default_factory=list)


def mode_config(base: TrainConfig, mode: str, seed: int, folder: Path, every: int) -> TrainConfig:
    """The run's TrainConfig: ``async-k2`` is async with staleness 2; ``early_start`` is the
    streaming runs' only (the other modes have no backward to start early)."""
    chosen = mode_from_label(mode, staleness=base.staleness)
    return replace(
        base,
        **chosen.train_fields(),
        seed=seed,
        out=str(folder),
        checkpoint_every=every,
        keep_checkpoints=10_000,
        early_start=base.early_start and chosen.starts_backward_before_step,
    )


def mode_name(mode: str, base: TrainConfig) -> str:
    """The results key: the mode's label (sync, streaming, async-k<K>)."""
    return mode_from_label(mode, staleness=base.staleness).label


def train_run(config: TrainConfig, label: str, progress: Progress | None = None) -> None:
    """Run ``thundersync train`` for ``config``, its progress lines prefixed with ``label``
    (said through ``progress``: above its bar on a terminal)."""
    say = progress.say if progress is not None else _say
    folder = Path(config.out)
    folder.mkdir(parents=True, exist_ok=True)
    config_file = folder / "requested-config.json"
    config_file.write_text(dumps_refusing(config.to_dict(), what=str(config_file), indent=2))
    command = [sys.executable, "-m", "thundersync.cli", "train", "--config", str(config_file)]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        tail: list[str] = []
        for line in proc.stdout or ():
            tail = (tail + [line.rstrip()])[-20:]
            say(f"[{label}] {line.rstrip()}")
        proc.wait()
    if proc.returncode != 0:
        raise RuntimeError(
            f"compare: run {label} failed (exit {proc.returncode}):\n" + "\n".join(tail)
        )


def _say(text: str) -> None:
    print(f"compare: {text}", file=sys.stderr, flush=True)


def checkpoints(folder: Path) -> list[tuple[int, float, Path]]:
    """(completed steps, training seconds, checkpoint folder) of a finished run. A checkpoint
    whose step the run's metrics.jsonl lacks is another run's (``out_problem`` keeps a
    comparison from starting in a folder holding one): a RuntimeError naming it."""
    times = {m["step"]: m["time_s"] for m in read_metrics(folder / "metrics.jsonl")}
    found = []
    for path in sorted((folder / "checkpoints").glob("step-*")):
        steps = int(path.name.split("-")[1])
        if steps not in times:
            raise RuntimeError(
                f"compare: {path}: {folder / 'metrics.jsonl'} has no step {steps}: the "
                "checkpoint is another run's"
            )
        found.append((steps, times[steps], path))
    return found


def evaluate_runs(runs: list[Run], config: CompareConfig) -> tuple[float, list[str]]:
    """Fill every run's curve (its initial model's accuracy at step 0 first); returns that
    initial accuracy and the held-out task ids."""
    import gymnasium

    import environments  # noqa: F401  (registers the built-in envs)

    base = config.train

    kwargs = base.env_kwargs if config.eval_env_kwargs is None else config.eval_env_kwargs

    def make_env() -> Any:
        return gymnasium.make(base.env, **{"sandbox": base.sandbox, **kwargs})

    selection = policy_eval.eval_tasks(
        base.env, {"sandbox": base.sandbox, **kwargs}, config.eval_tasks, seed=base.seed
    )
    if selection.note:
        print(f"compare: {selection.note}", file=sys.stderr, flush=True)
    tasks = list(selection.tasks)
    initial = base.model or str(runs[0].folder / "init-model")
    found = {id(run): checkpoints(run.folder) for run in runs}
    total = 1 + sum(len(f) for f in found.values())
    what = f"on {len(tasks)} held-out tasks × {config.eval_samples} samples"
    with (
        Progress("compare", total, "evaluations") as progress,
        policy_eval.PolicyEvaluator(  # on the engine the runs sampled with
            initial,
            seed=base.seed,
            max_new_tokens=base.max_new_tokens,
            device=base.device,
            engine=base.engine,
            dtype=base.dtype,
        ) as judge,
    ):
        progress.phase(f"evaluating the initial model {what}")
        start = accuracy(judge.run(tasks, make_env, k=config.eval_samples))
        progress.advance()
        for run in runs:
            run.curve = [Point(0, 0.0, start)]
            for steps, time_s, path in found[id(run)]:
                progress.quietly(f"evaluating {run.mode} seed {run.seed} step {steps} {what}")
                judge.load(path)
                score = accuracy(judge.run(tasks, make_env, k=config.eval_samples))
                run.curve.append(Point(steps, time_s, score))
                progress.advance()
            progress.say(
                f"evaluated {run.mode} seed {run.seed} at steps "
                + ", ".join(f"{p.step}: {p.accuracy:.2f}" for p in run.curve)
            )
    return start, [task.task_id for task in tasks]


def accuracy(groups: list[list[Any]]) -> float:
    """Mean over tasks of the mean reward of their scored (non-infra) attempts."""
    per_task = []
    for attempts in groups:
        scored = [a.reward for a in attempts if not a.infra_failure]
        if scored:
            per_task.append(sum(scored) / len(scored))
    return sum(per_task) / len(per_task) if per_task else 0.0


COMPARE_WRITES = frozenset(
    {
        "results.json",
        "accuracy_vs_time.png",
        "accuracy_vs_step.png",
        "step_breakdown.png",
        "step_timeline.png",
        "init-model",
        "runs",
    }
)
"""Every top-level name a comparison writes in its ``--out`` (``runs/`` holds one run folder
per mode and seed)."""


def run_folders(config: CompareConfig) -> list[Path]:
    """The comparison's run folders, one per (mode, seed), as ``run_compare`` names them."""
    return [folder for folder, _, _ in _runs(config)]


def requested_settings(config: CompareConfig) -> dict[Path, dict[str, Any]]:
    """Each run folder of the comparison and the settings ``run_compare`` requests for it
    (its ``requested-config.json``, as read back)."""
    train = _with_init_model(config).train
    settings = {}
    for folder, mode, seed in _runs(config):
        run = mode_config(train, mode, seed, folder, config.eval_every)
        settings[folder] = json.loads(dumps_refusing(run.to_dict(), what=str(folder)))
    return settings


def _runs(config: CompareConfig) -> list[tuple[Path, str, int]]:
    """(run folder, mode, seed) in the order the runs train: modes reversed every other seed."""
    out = []
    for i in range(config.seeds):
        seed = config.train.seed + i
        for mode in config.modes if i % 2 == 0 else tuple(reversed(config.modes)):
            name = mode_name(mode, config.train)
            out.append((Path(config.out) / "runs" / f"{name}-seed{seed}", mode, seed))
    return out


def _with_init_model(config: CompareConfig) -> CompareConfig:
    """Every run starts from the same model: without ``--model``, a tiny one built once in
    ``OUT/init-model`` (by ``run_compare``)."""
    if config.train.model is not None:
        return config
    return replace(config, train=replace(config.train, model=str(Path(config.out) / "init-model")))


def out_problem(config: CompareConfig, *, overwrite: bool, resume: bool = False) -> str | None:
    """Why the comparison may not start in ``config.out`` (one line saying what to do), or
    None; checked before the first run trains. A folder holding a comparison (its
    results.json, or a run in ``runs/``, which a killed comparison leaves) is refused, or
    with ``overwrite`` replaced, but only when it holds nothing a comparison does not write
    (``thundersync.training.run_folder``: a run folder is created once)."""

    out = Path(config.out)
    run = survey(out)
    if run.holds_run:  # a train run's folder: not a comparison's, whatever the flags
        return f"--out {out} holds {run.described()}, not a comparison: choose another --out"
    foreign: list[str] = []
    previous: list[str] = []
    if out.is_dir():
        for entry in sorted(out.iterdir(), key=lambda p: p.name):
            if entry.name not in COMPARE_WRITES and not entry.name.startswith(".write-probe-"):
                foreign.append(entry.name + ("/" if entry.is_dir() else ""))
        runs = out / "runs"
        for entry in sorted(runs.iterdir(), key=lambda p: p.name) if runs.is_dir() else ():
            contents = survey(entry)
            if not entry.is_dir():
                foreign.append(f"runs/{entry.name}")
            foreign.extend(f"runs/{entry.name}/{name}" for name in contents.foreign)
            if contents.holds_run:
                previous.append(entry.name)
        if runs.exists() and not runs.is_dir():
            foreign.append("runs")
    if resume:
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            return f"--out {out}: --resume found files a comparison does not write ({shown})"
        return compare_resume.resume_problem(requested_settings(config), out / "runs")
    if (out / "results.json").exists() or previous:
        held = ", ".join(previous[:3]) + (", ..." if len(previous) > 3 else "")
        what = "results.json" + (f" and runs {held}" if previous else "")
        if not overwrite:
            return (
                f"--out {out} holds a comparison ({what}): --overwrite to replace it, or "
                "another --out"
            )
        if foreign:
            shown = ", ".join(foreign[:3]) + (", ..." if len(foreign) > 3 else "")
            return (
                f"--out {out} holds a comparison ({what}) and files a comparison does not "
                f"write ({shown}): --overwrite removes only a comparison's own files; remove "
                "those or choose another --out"
            )
        for path in (config.train.model, config.train.teacher):
            if path and Path(os.path.abspath(path)).is_relative_to(os.path.abspath(out)):
                return (
                    f"--out {out}: --overwrite would remove {path}, a model the runs need; "
                    "copy it elsewhere or choose another --out"
                )
        return None
    for folder in run_folders(config):  # a name a run writes, held by something else
        problem = run_folder_problem(folder, option="--out")
        if problem:
            return problem
    return None


def clear_outputs(config: CompareConfig) -> None:
    """Remove a previous comparison's files from ``config.out`` (``--overwrite``, after
    ``out_problem`` found nothing else there). The folder itself stays; a run folder is
    emptied by ``clear_run_folder`` and removed only when nothing is left in it."""

    out = Path(config.out)
    runs = out / "runs"
    for folder in sorted(runs.iterdir()) if runs.is_dir() else ():
        if folder.is_dir():
            clear_run_folder(folder)
            if not any(folder.iterdir()):
                folder.rmdir()
    if runs.is_dir() and not any(runs.iterdir()):
        runs.rmdir()
    for name in COMPARE_WRITES - {"runs"}:
        path = out / name
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif path.exists() or path.is_symlink():
            path.unlink()


def run_compare(config: CompareConfig, *, resume: bool = False) -> dict[str, Any]:
    """Train every (mode, seed), evaluate, summarise, plot; returns the results. With
    ``resume`` a run that reached its last step is kept and one that did not is trained
    again from its first (``harness.compare_resume``)."""

    out = Path(config.out)
    runs: list[Run] = []
    config = _with_init_model(config)
    steps = config.train.steps
    if config.train.model == str(out / "init-model") and not (out / "init-model").is_dir():
        build_tiny_model(out / "init-model")
    kept = {f for f, _, _ in _runs(config) if resume and compare_resume.finished(f, steps)}
    for folder in sorted(kept):
        _say(f"{folder.name}: kept, it finished before (--resume)")
    with Progress("compare", len(_runs(config)) - len(kept), "runs") as progress:
        for folder, mode, seed in _runs(config):
            name = mode_name(mode, config.train)
            runs.append(Run(name, seed, folder))
            if folder in kept:  # the progress counts the runs this command trains
                continue
            if resume and folder.exists():
                compare_resume.restart(folder)
            progress.phase(
                f"training {name} seed {seed} (run {progress.done + 1}/{progress.total})"
            )
            train_run(
                mode_config(config.train, mode, seed, folder, config.eval_every),
                f"{name} seed {seed}",
                progress,
            )
            progress.advance()
    initial, task_ids = evaluate_runs(runs, config)
    with Progress("compare", 1, "outputs") as progress:  # plotting takes seconds, not silently
        progress.phase(f"writing {out / 'results.json'} and the plots")
        results = compare_report.summarize(runs, config, initial)
        compare_report.write_outputs(results, runs, config)
        progress.advance()
    if config.leaderboard:
        record(results, config, task_ids)
    return results


def record(results: dict[str, Any], config: CompareConfig, task_ids: list[str]) -> None:
    """One leaderboard row for the comparison (per mode: its headline statistics)."""

    keys = ("time_to_target_s", "accuracy_at_budget", "speedup_vs_sync", "final_accuracy")
    metrics = {
        "target": results["target"],
        "budget_s": results["budget_s"],
        "modes": {name: {k: m[k] for k in keys} for name, m in results["modes"].items()},
    }
    entry = Entry(
        kind="compare",
        suite=config.train.env,
        suite_version=suite_version(task_ids),
        subject=",".join(results["modes"]),
        metrics=metrics,
        config=results["config"],
        checkpoint=config.train.model,
        artifacts={"plots": results["plots"], "results": str(Path(config.out) / "results.json")},
    )
    with Store(config.leaderboard_db) as store:
        entry_id = store.append(entry)
    print(f"compare: leaderboard row #{entry_id} in {store.path}", file=sys.stderr, flush=True)
