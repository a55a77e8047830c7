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
