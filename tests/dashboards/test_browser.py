"""The dashboard in a real browser: Debian's Chromium, headless, driven by Playwright through its
executable path (no browser is downloaded). On a finished tiny run and on a run in progress:
every view renders with data, the leaderboard sorts and filters, a lineage edge opens the member,
the elite's export downloads and loads, the page updates while the run goes, and the console
stays free of errors.

Screenshots of every view are written to $EVO_SCREENSHOTS (docs/img when refreshing the docs:
`EVO_SCREENSHOTS=docs/img pytest tests/dashboards/test_browser.py`, which also makes the shown
run larger), else to a temporary directory.
"""

from __future__ import annotations

import csv
import io
import json
import os
import sqlite3
import subprocess
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import agents
from evo.leaderboard import leaderboard_rows, render
from evo.runstore import RunStore
from tests.conftest import REPO, TOY_EXPERIMENT, evo_command, run_evo
from tests.dashboards.conftest import serve

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]

if not CHROMIUM.is_file() and not os.environ.get("EVO_SKIP_BROWSER_TESTS"):
    raise RuntimeError(f"{CHROMIUM} is missing: the dashboard's browser tests drive Debian's chromium "
                       "(scripts/test.sh installs it; or apt-get install chromium; EVO_SKIP_BROWSER_TESTS=1 skips them)")
pytestmark = pytest.mark.skipif(bool(os.environ.get("EVO_SKIP_BROWSER_TESTS")), reason="EVO_SKIP_BROWSER_TESTS is set")


# ---- fixtures ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = os.environ.get("EVO_SCREENSHOTS")
    path = Path(target) if target else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def runs(toy_runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The finished run the views are checked on: the shared toy run, or (for the docs' screenshots)
    a larger one of the same toy experiment."""
    if not os.environ.get("EVO_SCREENSHOTS"):
        return toy_runs
    cwd = tmp_path_factory.mktemp("demo")
    text = TOY_EXPERIMENT.read_text().replace("size = 4", "size = 8").replace("generations = 3", "generations = 10")
    (cwd / "toy.toml").write_text(text.replace("tournament_size = 2", "tournament_size = 3"))
    run_evo(["run", "toy.toml", "--backend", "inline", "--quiet"], cwd, check=True, timeout=600)
    return cwd / "runs"


@pytest.fixture(scope="module")
def site(runs: Path) -> Iterator[str]:
    with serve(runs, poll_ms=400) as base:
        yield base


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        ctx = p.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=str(CHROMIUM), args=FLAGS, headless=True,
            accept_downloads=True, viewport={"width": 1280, "height": 800})
        yield ctx
        ctx.close()


class Page:
    """A browser tab that records every console error and uncaught exception."""

    def __init__(self, context: object) -> None:
        self.page = context.new_page()
        self.errors: list[str] = []
        self.page.on("console", lambda m: self.errors.append(f"console.{m.type}: {m.text}") if m.type == "error" else None)
        self.page.on("pageerror", lambda e: self.errors.append(f"uncaught: {e}"))
        # the console names no URL for a failed load: record which one it was
        self.page.on("response", lambda r: self.errors.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
        self.page.set_default_timeout(60_000)


@pytest.fixture
def tab(context: object) -> Iterator[Page]:
    t = Page(context)
    yield t
    t.page.close()
    assert t.errors == [], "the browser console reported errors"


def db(run_dir: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(run_dir / "run.sqlite") as conn:
        return conn.execute(sql).fetchall()


def members_in_table(page: object) -> list[int]:
    return [int(x) for x in page.eval_on_selector_all("#leaderboard tbody tr", "rows => rows.map(r => r.dataset.member)")]


# ---- a finished run ----------------------------------------------------------------------------------------------
def test_every_view_renders_with_data(site: str, runs: Path, tab: Page, shots: Path) -> None:
    page, run = tab.page, runs / "toy"
    size = db(run, "SELECT COUNT(*) FROM evaluations WHERE generation = (SELECT MAX(generation) FROM generations)")[0][0]
    n_evals = db(run, "SELECT COUNT(*) FROM evaluations")[0][0]
    n_members = db(run, "SELECT COUNT(*) FROM members")[0][0]
    page.goto(f"{site}/#/")
    page.wait_for_selector("#runs tbody tr[data-run=toy]")
    assert "completed" in page.inner_text("#runs tbody tr[data-run=toy]")
    page.screenshot(path=shots / "dashboard-runs.png")

    page.click("#runs a[href='#/run/toy']")
    page.wait_for_selector("#leaderboard tbody tr")
    assert len(members_in_table(page)) == size
    assert page.inner_text("#fact-generations").startswith(str(db(run, "SELECT COUNT(*) FROM generations")[0][0]))
    page.screenshot(path=shots / "dashboard-leaderboard.png", full_page=True)

    page.click("#tab-fitness")
    page.wait_for_function(f"document.querySelectorAll('#fitness-chart .scatterlayer .point').length >= {n_evals}")
    page.screenshot(path=shots / "dashboard-fitness.png", full_page=True)

    page.click("#tab-lineage")
    page.wait_for_function(f"document.querySelectorAll('#lineage-chart .scatterlayer .point').length >= {n_members}")
    page.screenshot(path=shots / "dashboard-lineage.png", full_page=True)

    page.click("#tab-schedule")
    page.wait_for_selector("#schedule-chart .scatterlayer .trace")
    chain = page.eval_on_selector_all("#schedule-chain a", "links => links.map(a => a.textContent)")
    elite = db(run, "SELECT best_idx FROM generations ORDER BY generation DESC LIMIT 1")[0][0]
    assert chain[0] == str(elite) and chain[-1] == str(elite)  # "the elite (member E) ... ancestry: F → … → E"
    page.screenshot(path=shots / "dashboard-schedule.png", full_page=True)

    page.click("#tab-parallel")
    page.wait_for_selector("#parallel-chart .parcoords")
    dims = page.evaluate("() => document.getElementById('parallel-chart')._fullData[0].dimensions.map(d => d.label)")
    assert dims[-1] == "score" and len(dims) >= 2
    page.screenshot(path=shots / "dashboard-parallel.png", full_page=True)

    page.click("#tab-mutations")
    page.wait_for_selector("#mutations-table tbody tr")
    groups = page.eval_on_selector_all("#mutations-table tbody tr", "rows => rows.map(r => r.cells[0].textContent)")
    kinds = {k for (k,) in db(run, "SELECT m.kind FROM mutations m JOIN evaluations e "  # children evaluated so far
                                   "ON e.idx = m.child AND e.generation = m.generation")}
    assert {g.split(":")[0] for g in groups} == kinds
    assert page.locator("#mutations-chart .boxlayer .trace").count() == len(groups)
    page.screenshot(path=shots / "dashboard-mutations.png", full_page=True)

    page.goto(f"{site}/#/run/toy/member/{elite}")
    page.wait_for_selector("#member-evaluations tbody tr")
    digests = db(run, f"SELECT digest FROM evaluations WHERE idx = {elite} ORDER BY generation")
    cells = page.eval_on_selector_all("#member-evaluations td.digest", "cells => cells.map(c => c.title)")
    assert cells == [d for (d,) in digests]
    assert f"Member {elite}" in page.inner_text("#member-title")
    page.wait_for_selector("#member-train .scatterlayer .point")
    page.screenshot(path=shots / "dashboard-member.png", full_page=True)


def test_leaderboard_sorts_filters_and_downloads_csv(site: str, runs: Path, tab: Page, tmp_path: Path) -> None:
    page = tab.page
    page.goto(f"{site}/#/run/toy/leaderboard")
    page.wait_for_selector("#leaderboard tbody tr")
    by_rank = members_in_table(page)
    page.click("#leaderboard th[data-key=member]")  # numbers sort largest first on the first click
    assert members_in_table(page) == sorted(by_rank, reverse=True)
    page.click("#leaderboard th[data-key=member]")
    assert members_in_table(page) == sorted(by_rank)
    page.click("#leaderboard th[data-key=rank]")
    page.click("#leaderboard th[data-key=rank]")
    assert members_in_table(page) == by_rank

    page.fill("#lb-filter", f"member={by_rank[1]}")
    assert members_in_table(page) == [by_rank[1]]
    page.fill("#lb-filter", f"member>={min(by_rank)} member<{max(by_rank)}")
    assert sorted(members_in_table(page)) == sorted(by_rank)[:-1]
    page.fill("#lb-filter", "no such text anywhere")
    assert members_in_table(page) == []
    page.fill("#lb-filter", "")

    headers = page.eval_on_selector_all("#leaderboard th", "hs => hs.map(h => h.textContent)")
    assert "weight_decay" not in headers  # the same in every member: hidden by default
    page.check("#lb-all")
    assert "weight_decay" in page.eval_on_selector_all("#leaderboard th", "hs => hs.map(h => h.textContent)")
    page.uncheck("#lb-all")

    with page.expect_download() as download:
        page.click("#lb-csv")
    path = tmp_path / "leaderboard.csv"
    download.value.save_as(path)
    store = RunStore.open("toy", runs, read_only=True)
    assert path.read_text() == render(leaderboard_rows(store), "csv")
    assert [int(r["member"]) for r in csv.DictReader(io.StringIO(path.read_text()))] == by_rank


def _point_on_screen(page: object, chart: str, meta: str) -> dict:
    """Viewport coordinates of the first point of the chart's trace tagged `meta`, scrolled into view."""
    js = """([chart, meta]) => {
        const gd = document.getElementById(chart), t = gd._fullData.find(d => d.meta === meta), fl = gd._fullLayout;
        const box = gd.getBoundingClientRect();
        return {x: box.left + fl._size.l + fl.xaxis.l2p(t.x[0]), y: box.top + fl._size.t + fl.yaxis.l2p(t.y[0]),
                member: t.customdata[0]};
    }"""
    p = page.evaluate(js, [chart, meta])
    page.evaluate("y => window.scrollBy(0, y - 400)", p["y"])
    return page.evaluate(js, [chart, meta])


def test_lineage_edge_and_node_open_the_member(site: str, runs: Path, tab: Page) -> None:
    page = tab.page
    page.goto(f"{site}/#/run/toy/lineage")
    page.wait_for_selector("#lineage-chart .scatterlayer .point")
    edge = _point_on_screen(page, "lineage-chart", "edge")
    parent = db(runs / "toy", f"SELECT parent FROM members WHERE idx = {edge['member']}")[0][0]
    assert parent is not None
    page.mouse.move(edge["x"], edge["y"])
    page.mouse.click(edge["x"], edge["y"])
    page.wait_for_function(f"location.hash === '#/run/toy/member/{edge['member']}'")
    page.wait_for_selector("#member-title")
    assert f"from member {parent}" in page.inner_text("#member-title")

    page.go_back()
    page.wait_for_selector("#lineage-chart .scatterlayer .point")
    node = _point_on_screen(page, "lineage-chart", "node")
    page.mouse.move(node["x"], node["y"])
    page.mouse.click(node["x"], node["y"])
    page.wait_for_function(f"location.hash === '#/run/toy/member/{node['member']}'")


def test_elite_export_downloads_and_loads(site: str, runs: Path, tab: Page, tmp_path: Path) -> None:
    page = tab.page
    page.goto(f"{site}/#/run/toy")
    page.wait_for_selector("#export-elite")
    with page.expect_download() as download:
        page.click("#export-elite")
    archive = tmp_path / "elite.zip"
    download.value.save_as(archive)
    zipfile.ZipFile(archive).extractall(tmp_path / "elite")
    agent = agents.load(tmp_path / "elite")
    top = leaderboard_rows(RunStore.open("toy", runs, read_only=True))[0]
    assert agent.index == top["member"]
    assert agent.evaluate().fitness == pytest.approx(top["fitness"], abs=1e-7)
    assert json.loads((tmp_path / "elite" / "config.json").read_text())["info"]["run"] == "toy"


# ---- a run in progress ---------------------------------------------------------------------------------------------
def test_page_updates_while_the_run_progresses(tab: Page, tmp_path: Path, shots: Path) -> None:
    (tmp_path / "live.toml").write_text(TOY_EXPERIMENT.read_text().replace('name = "toy"', 'name = "live"'))
    # each member trains for at least 0.4 s: a generation takes 1.6 s or more, which the page (polling
    # every 0.25 s) sees however fast the machine is
    env = {**os.environ, "PYTHONPATH": str(REPO), "RAY_AUTH_MODE": "disabled", "EVO_TOY_TRAIN_SLEEP": "0.4"}
    proc = subprocess.Popen([*evo_command(), "run", "live.toml", "--backend", "inline", "--quiet"], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    page = tab.page
    try:
        deadline = time.monotonic() + 120
        while not (tmp_path / "runs" / "live" / "run.sqlite").is_file():
            assert proc.poll() is None and time.monotonic() < deadline, "the run did not start"
            time.sleep(0.1)
        with serve(tmp_path / "runs", poll_ms=250) as base:
            page.goto(f"{base}/#/run/live/leaderboard")
            page.wait_for_selector("#fact-generations")
            page.evaluate("window.__sameDocument = true")
            seen = []
            while proc.poll() is None or not seen or seen[-1] < 3:
                done = int(page.evaluate("document.body.dataset.generations || '0'"))
                if not seen or done != seen[-1]:
                    seen.append(done)
                    if done == 1:
                        page.wait_for_selector("#leaderboard tbody tr")
                        page.screenshot(path=shots / "dashboard-live.png")
                assert time.monotonic() < deadline + 240, f"the page saw generations {seen}"
                time.sleep(0.1)
            page.wait_for_function("document.querySelector('#run-header .status').textContent === 'completed'")
            assert page.evaluate("window.__sameDocument") is True  # updated in place, never reloaded
            assert len(members_in_table(page)) == 4
            page.goto("about:blank")  # stop polling before the server goes (a poll after it is a refused load)
    finally:
        if proc.poll() is None:
            proc.kill()
        out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err[-2000:]
    assert seen == sorted(seen) and len(set(seen) - {0}) >= 2, f"the page saw generations {seen}: expected it to follow the run"


def test_screenshots_are_small(shots: Path) -> None:
    """The docs keep each view's picture; they must stay small enough for the repository."""
    pictures = sorted(shots.glob("dashboard-*.png"))
    assert pictures, "the view tests wrote no screenshots"
    for p in pictures:
        assert p.stat().st_size < 600_000, f"{p} is {p.stat().st_size} bytes"
