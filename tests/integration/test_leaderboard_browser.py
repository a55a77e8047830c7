"""The leaderboard page as a person sees it, rendered in headless Chromium — the tables' rows,
every plot loaded, no console errors, a screenshot. The page is the demo's
(``$THUNDERSYNC_DEMO_OUT``, set by CI after ``make demo``) or, without one, a real small
comparison and evaluation made here. Expected rows come from the leaderboard file itself."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

CHROMIUM = next(
    (
        p
        for p in ("/usr/bin/chromium", "/usr/lib/chromium/chromium-headless-shell")
        if Path(p).is_file()
    ),
    None,
)
FLAGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def cli(*args: str) -> subprocess.CompletedProcess:
    done = subprocess.run(
        [sys.executable, "-m", "thundersync.cli", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> tuple[Path, Path]:
    """(the page's folder, its leaderboard file)."""
    demo = os.environ.get("THUNDERSYNC_DEMO_OUT")
    if demo:
        out = Path(demo).resolve()
        return out / "leaderboard", out / "leaderboard.sqlite"
    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap missing")
    root = tmp_path_factory.mktemp("leaderboard")
    db = str(root / "lb.sqlite")
    cli(
        "compare",
        "--modes",
        "sync,streaming",
        "--seeds",
        "1",
        "--steps",
        "2",
        "--eval-every",
        "1",
        "--eval-tasks",
        "4",
        "--tasks-per-step",
        "2",
        "--group-size",
        "2",
        "--max-new-tokens",
        "8",
        "--out",
        str(root / "compare"),
        "--db",
        db,
    )
    cli("eval", "--suite", "toy-sum", "--agent", "oracle", "--db", db)
    cli("leaderboard", "--db", db, "--html", str(root / "site"))
    return root / "site", Path(db)


def test_the_page_shows_every_row_and_plot_without_console_errors(site, tmp_path, monkeypatch):
    from leaderboard.store import Store

    folder, db = site
    with Store(db) as store:
        entries = store.entries()
    evals = [e for e in entries if e.kind == "eval"]
    compares = [e for e in entries if e.kind == "compare"]
    modes = sorted(mode for e in compares for mode in e.metrics["modes"])
    plots = sum(len(e.artifacts.get("plots", [])) for e in compares)
    assert evals and compares and plots == 4 * len(compares)
    missing = "no Chromium: apt-get install chromium" if CHROMIUM is None else None
    try:
        from playwright import sync_api
    except ImportError:
        missing = missing or "no playwright: pip install -e '.[browser]'"
    if missing:  # CI sets THUNDERSYNC_REQUIRE_BROWSER: there a missing browser is a failure
        (pytest.fail if os.environ.get("THUNDERSYNC_REQUIRE_BROWSER") else pytest.skip)(missing)
    for name in ("HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    errors: list[str] = []
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto((folder / "index.html").as_uri())
            eval_rows = page.locator("#evaluations tbody tr").count()
            mode_rows = page.locator("#comparisons tbody tr").all_inner_texts()
            images = page.eval_on_selector_all(
                "img", "imgs => imgs.map(i => [i.getAttribute('src'), i.naturalWidth])"
            )
            page.screenshot(path=str(tmp_path / "leaderboard.png"), full_page=True)
        finally:
            browser.close()
    assert eval_rows == len(evals)
    assert sorted(row.split("\t")[2] for row in mode_rows) == modes
    assert len(images) == plots and all(width > 0 for _, width in images), images
    assert errors == []
    assert (tmp_path / "leaderboard.png").stat().st_size > 10_000
