"""The comparison's plots (matplotlib, PNG): accuracy against the training clock and against
the step, the step-time breakdown, and one step's timeline per mode as a Gantt chart."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from harness.curves import accuracy_on_grid
from harness.intervals import median_ci
from thundersync.training.run_metrics import read_metrics

COLORS = {"sync": "#4c72b0", "streaming": "#dd8452"}


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _color(mode: str) -> str:
    return COLORS.get(mode, "#55a868")


def write_plots(results: dict[str, Any], runs: list[Any], out: Path) -> list[Path]:
    """Write the four plots into ``out``; returns their paths."""
    initial = results.get("initial_accuracy")
    return [
        *(
            _accuracy_plot(
                runs, out / name, by_step=by_step, target=results["target"], initial=initial
            )
            for name, by_step in (("accuracy_vs_time.png", False), ("accuracy_vs_step.png", True))
        ),
        _breakdown_plot(results, out / "step_breakdown.png"),
        _timeline_plot(runs, out / "step_timeline.png"),
    ]


def _accuracy_plot(
    runs: list[Any], path: Path, *, by_step: bool, target: float, initial: float | None = None
) -> Path:
    """Each mode's accuracy curve (the median of its seeds', with the CI band), the target,
    and the initial model's accuracy marked at step 0 (every curve starts there)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.2))
    modes: dict[str, list[Any]] = {}
    for run in runs:
        modes.setdefault(run.mode, []).append(run)
    for mode, mode_runs in modes.items():
        if by_step:
            grid = sorted({p.step for r in mode_runs for p in r.curve})
            curves = [[_at_step(r.curve, s) for s in grid] for r in mode_runs]
        else:
            end = max(p.time_s for r in mode_runs for p in r.curve)
            grid = [end * i / 100 for i in range(101)]
            curves = [accuracy_on_grid(r.curve, grid) for r in mode_runs]
        stats = [median_ci([c[i] for c in curves if c[i] is not None]) for i in range(len(grid))]
        median = [s["median"] for s in stats]
        lo = [s["ci"][0] if s["ci"][0] is not None else s["median"] for s in stats]
        hi = [s["ci"][1] if s["ci"][1] is not None else s["median"] for s in stats]
        ax.plot(
            grid,
            median,
            label=series_label(mode, len(mode_runs)),
            color=_color(mode),
            drawstyle="steps-post",
        )
        ax.fill_between(grid, lo, hi, color=_color(mode), alpha=0.2, step="post")
    ax.axhline(target, color="gray", linestyle="--", linewidth=1, label=f"target {target:g}")
    if initial is not None:
        ax.plot(
            [0],
            [initial],
            marker="o",
            color="black",
            linestyle="none",
            zorder=3,
            label=f"step 0 (initial model): {initial:.2f}",
        )
    ax.set_xlabel("optimizer step" if by_step else "training time (s, evaluation excluded)")
    ax.set_ylabel("held-out accuracy")
    ax.set_ylim(-0.02, 1.02)
    several = any(len(r) > 1 for r in modes.values())
    ax.set_title(
        "accuracy per step (same updates: curves coincide)"
        if by_step
        else "accuracy vs wall-clock"
        + (" (band: 95% CI of the median, the sign test's)" if several else "")
    )
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def series_label(mode: str, seeds: int) -> str:
    """A mode's legend entry: its one seed's curve, or the median of its seeds'."""
    return f"{mode} (1 seed)" if seeds == 1 else f"{mode} (median of {seeds} seeds)"


def _at_step(curve: list[Any], step: int) -> float | None:
    known = [p for p in curve if p.step <= step]
    return max(known, key=lambda p: p.step).accuracy if known else None


def _breakdown_plot(results: dict[str, Any], path: Path) -> Path:
    """Per mode: the step's wall time beside what each worker was busy for during it (the
    engine, the learner) and what one episode spent in tools and in grading (those run
    concurrently across episodes, so they are per episode, not summed)."""
    plt = _pyplot()
    # the legend goes below the axes: inside them, with bars of every height in every group,
    # no corner is free and "best" puts it over a bar
    fig, ax = plt.subplots(figsize=(8, 4.8), layout="constrained")
    names = list(results["modes"])
    bars = (
        ("step time", lambda m: m.get("step_time_s", 0.0)),
        ("engine busy", lambda m: _busy(m, "engine")),
        ("learner busy", lambda m: _busy(m, "backward") + _busy(m, "step")),
        ("tools, per episode", lambda m: m.get("tool_s_per_episode", 0.0)),
        ("grading, per episode", lambda m: m.get("grading_s_per_episode", 0.0)),
        ("weight sync", lambda m: _busy(m, "weight_publish") + _busy(m, "weight_sync")),
    )
    width = 0.8 / len(bars)
    for j, (label, value) in enumerate(bars):
        xs = [i + (j - len(bars) / 2 + 0.5) * width for i in range(len(names))]
        ax.bar(
            xs,
            [value(results["modes"][n]) for n in names],
            width=width,
            label=label,
            color="#bbbbbb" if j == 0 else f"C{j - 1}",
        )
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("seconds per step (median over steps and seeds)")
    ax.set_title("where a step's time goes")
    fig.legend(fontsize=7, ncol=3, loc="outside lower center")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _busy(mode: dict[str, Any], name: str) -> float:
    """Seconds per step a worker spent on ``name`` (its fraction of the training time, at
    the median step)."""
    fraction = mode.get("breakdown_fraction", {}).get(name) or 0.0
    return fraction * mode.get("step_time_s", 0.0)


def _timeline_plot(runs: list[Any], path: Path) -> Path:
    shown: dict[str, Any] = {}
    for run in sorted(runs, key=lambda r: r.seed):
        shown.setdefault(run.mode, run)
    return timeline_plot({mode: run.folder for mode, run in shown.items()}, path)


def timeline_plot(folders: dict[str, Path], path: Path, step: int | None = None) -> Path:
    """One step of each run (its middle step by default) as a Gantt chart, the runs one above
    the other on one time axis, so that a longer step looks longer."""
    plt = _pyplot()
    shown = {mode: _one_step(folder, step) for mode, folder in folders.items()}
    longest = max((end - start for _, start, end, _ in shown.values()), default=0.0)
    fig, axes = plt.subplots(
        len(shown), 1, figsize=(8, 1.6 + 1.6 * len(shown)), squeeze=False, sharex=True
    )
    for ax, (mode, (spans, start, end, chosen)) in zip(axes[:, 0], shown.items()):
        rows = ["engine", "tools", "grading", "teacher", "learner"]
        row_of = {
            "engine": "engine",
            "tool": "tools",
            "grading": "grading",
            "teacher": "teacher",
            "backward": "learner",
            "step": "learner",
            "optimizer": "learner",
            "weight_publish": "learner",
        }
        for s in spans:
            row = row_of.get(s["name"])
            if row is None:
                continue
            y = rows.index(row)
            ax.broken_barh(
                [(s["started"] - start, max(s["finished"] - s["started"], 1e-3))],
                (y - 0.35, 0.7),
                color=f"C{y}",
                alpha=0.5,
            )
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlim(0, max(longest, 1e-3))
        ax.set_title(
            f"{mode}: step {chosen['step']} of {chosen['of']} ({end - start:.2f} s, "
            "tools and grading summed over concurrent episodes)",
            fontsize=9,
        )
    axes[-1, 0].set_xlabel("seconds from the batch's start")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _one_step(
    folder: Path, step: int | None = None
) -> tuple[list[dict[str, Any]], float, float, dict[str, int]]:
    """The spans of one step of the run (its middle one by default; steps counted from 1),
    with its window and which step it is (``step``, ``of``: the run's last step)."""
    metrics = read_metrics(folder / "metrics.jsonl")
    chosen = [m for m in metrics if m["step"] == step]
    if step is not None and not chosen:
        raise ValueError(
            f"{folder}: no step {step} (steps {metrics[0]['step']}..{metrics[-1]['step']})"
        )
    m = chosen[0] if chosen else metrics[len(metrics) // 2]
    start, end = m["submitted_at"], m["finished_at"]
    spans = [json.loads(x) for x in (folder / "spans.jsonl").read_text().splitlines()]
    shown = [s for s in spans if s["finished"] >= start and s["started"] <= end]
    return shown, start, end, {"step": m["step"], "of": metrics[-1]["step"]}
