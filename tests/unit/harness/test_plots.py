"""compare's accuracy plots say what each curve is: one seed's run, or the median of several."""

from __future__ import annotations

from types import SimpleNamespace

import harness.plots as plots
from harness.curves import Point


def legends(monkeypatch, runs, tmp_path, *, by_step: bool) -> tuple[list[str], str]:
    figures = []
    real = plots._pyplot()
    monkeypatch.setattr(
        plots, "_pyplot", lambda: SimpleNamespace(subplots=real.subplots, close=figures.append)
    )
    plots._accuracy_plot(runs, tmp_path / "p.png", by_step=by_step, target=0.6)
    ax = figures[0].axes[0]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    real.close(figures[0])
    return texts, ax.get_title()


def run(mode: str, seed: int) -> SimpleNamespace:
    curve = [Point(0, 0.0, 0.1), Point(1, 1.0, 0.2), Point(2, 2.0, 0.5 + seed / 10)]
    return SimpleNamespace(mode=mode, seed=seed, curve=curve)


def test_one_seed_is_not_called_a_median(monkeypatch, tmp_path):
    texts, title = legends(
        monkeypatch, [run("sync", 0), run("streaming", 0)], tmp_path, by_step=False
    )
    assert texts == ["sync (1 seed)", "streaming (1 seed)", "target 0.6"]
    assert "median" not in title
    texts, title = legends(monkeypatch, [run("sync", 0), run("sync", 1)], tmp_path, by_step=False)
    assert texts[0] == "sync (median of 2 seeds)" and "CI of the median" in title


def _captured(monkeypatch) -> list:
    """The figures the plots close (``plots._pyplot().close`` records them instead)."""
    figures: list = []
    real = plots._pyplot()
    monkeypatch.setattr(
        plots,
        "_pyplot",
        lambda: SimpleNamespace(subplots=real.subplots, figure=real.figure, close=figures.append),
    )
    return figures


def _mode(step: float, engine: float, learner: float, grading: float) -> dict:
    fractions = {"engine": engine / step, "backward": learner / step, "weight_publish": 0.01}
    return {
        "step_time_s": step,
        "breakdown_fraction": fractions,
        "tool_s_per_episode": 0.3,
        "grading_s_per_episode": grading,
    }


def test_the_breakdown_legend_covers_no_bar(monkeypatch, tmp_path):
    """Three modes of a long-grading workload: bars of every height in every group, so no
    corner inside the axes is free for a legend to sit in."""
    figures = _captured(monkeypatch)
    modes = {
        "sync": _mode(3.8, 3.0, 0.8, 3.5),
        "async-k1": _mode(3.5, 3.4, 1.9, 3.6),
        "streaming": _mode(3.0, 2.9, 2.8, 3.4),
    }
    plots._breakdown_plot({"modes": modes}, tmp_path / "b.png")
    figure = figures[0]
    figure.canvas.draw()
    renderer = figure.canvas.get_renderer()
    legends = [*figure.legends, *(ax.get_legend() for ax in figure.axes if ax.get_legend())]
    assert len(legends) == 1
    box = legends[0].get_window_extent(renderer)
    bars = [patch for ax in figure.axes for patch in ax.patches]
    assert len(bars) == 6 * len(modes)
    covered = [bar for bar in bars if bar.get_window_extent(renderer).overlaps(box)]
    assert not covered, f"the legend covers {len(covered)} bar(s)"


def _run_folder(folder, start: float, duration: float, mode: str):
    """A run folder of one step of ``duration`` seconds, with an engine span across it."""
    import json

    folder.mkdir()
    metric = {"step": 1, "step_base": 1, "mode": mode, "submitted_at": start}
    metric["finished_at"] = start + duration
    (folder / "metrics.jsonl").write_text(json.dumps(metric) + "\n")
    span = {"name": "engine", "started": start, "finished": start + duration, "worker": "e"}
    (folder / "spans.jsonl").write_text(json.dumps(span) + "\n")
    return folder


def test_the_timeline_panels_share_one_time_axis(monkeypatch, tmp_path):
    """Each panel is one mode's step: on one time axis a 4 s step looks twice as long as a 2 s
    one, as it is; on axes of their own both would fill the width."""
    figures = _captured(monkeypatch)
    folders = {
        "sync": _run_folder(tmp_path / "sync", 10.0, 4.0, "sync"),
        "streaming": _run_folder(tmp_path / "streaming", 50.0, 2.0, "streaming"),
    }
    plots.timeline_plot(folders, tmp_path / "t.png")
    axes = figures[0].axes
    assert len(axes) == 2
    assert axes[0].get_xlim() == axes[1].get_xlim() == (0.0, 4.0)
    assert axes[0].get_shared_x_axes().joined(axes[0], axes[1])


def test_the_accuracy_plots_mark_the_initial_models_accuracy_at_step_0(monkeypatch, tmp_path):
    real = plots._pyplot()
    figures = _captured(monkeypatch)
    for by_step in (False, True):
        plots._accuracy_plot(
            [run("sync", 0)], tmp_path / "a.png", by_step=by_step, target=0.6, initial=0.1
        )
    assert len(figures) == 2
    for figure in figures:
        ax = figure.axes[0]
        texts = [t.get_text() for t in ax.get_legend().get_texts()]
        assert "step 0 (initial model): 0.10" in texts
        mark = next(line for line in ax.get_lines() if line.get_label().startswith("step 0"))
        assert list(mark.get_xdata()) == [0] and list(mark.get_ydata()) == [0.1]
        curve = ax.get_lines()[0]  # the median curve starts at the initial accuracy, not at 0
        assert curve.get_xdata()[0] == 0 and curve.get_ydata()[0] == 0.1
        real.close(figure)
