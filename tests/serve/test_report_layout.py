"""The report's page fits its window at 1280 and at 420 px wide (a phone): no horizontal
scroll, every chart and its legend inside its card, no title drawn over another, long run
names cut to the part that tells them apart. In headless Chromium, offline, with
test_report.py's DevTools helpers; the screenshots are written to the test's folder, or to
$TOKENLAKE_SCREENSHOTS (`TOKENLAKE_SCREENSHOTS=docs pytest tests/serve/test_report_layout.py`
makes docs/report.md's).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import os
import time
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.serve.test_report import _browser, _open_offline, _problems, _wait_rendered
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve.report import build_report

pytestmark = pytest.mark.slow

RUNS = ("qwen3-30b-a3b-grpo-bf16-lr1e-6-0", "qwen3-30b-a3b-grpo-fp8-lr1e-6-0")
WIDTHS = (1280, 420)
SHOT_HEIGHT = 2200  # pixels of the page's top in each screenshot

# Per card: its box, the boxes of what it drew, and its overlapping title texts.
_LAYOUT = """JSON.stringify({
  page: {scrollWidth: document.documentElement.scrollWidth, width: window.innerWidth},
  cards: [...document.querySelectorAll('.chart, .strip, .wide')].map(card => {
    const box = card.getBoundingClientRect();
    const drawn = [...card.querySelectorAll(':scope svg, :scope canvas')]
      .map(e => e.getBoundingClientRect()).filter(r => r.width > 0);
    const titles = [...card.querySelectorAll(
      '.role-axis-title text, .role-title-text text, .role-title-subtitle text,'
      + ' .role-header-label text, .role-legend-title text, .role-legend-label text')]
      .map(t => ({text: t.textContent, r: t.getBoundingClientRect()}));
    const overlaps = [];
    titles.forEach((a, i) => titles.slice(i + 1).forEach(b => {
      const x = Math.min(a.r.right, b.r.right) - Math.max(a.r.left, b.r.left);
      const y = Math.min(a.r.bottom, b.r.bottom) - Math.max(a.r.top, b.r.top);
      if (x > 1 && y > 1) overlaps.push([a.text, b.text]);
    }));
    return {id: card.id || card.className, left: box.left, right: box.right,
            drawnLeft: Math.min(...drawn.map(r => r.left)),
            drawnRight: Math.max(...drawn.map(r => r.right)), overlaps,
            legend: [...card.querySelectorAll('.role-legend-label text')].map(t => t.textContent)};
  }),
})"""


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> Path:
    """Two runs whose long names differ only in the middle (bf16 / fp8)."""
    root = tmp_path_factory.mktemp("layout")
    synth.write_dump(root / "a", synth.PRESETS["example"])
    synth.write_dump(root / "b", dataclasses.replace(synth.PRESETS["example"], seed=1))
    for folder, run in zip(("a", "b"), RUNS, strict=True):
        extract_run(root / folder, store_of(root / "lake"), ExtractOptions(run_name=run, workers=1))
    build_report(store_of(root / "lake"), root / "report.html", worst=2)
    return root / "report.html"


@pytest.fixture(scope="module")
def layouts(report, tmp_path_factory) -> dict[int, dict]:
    shots = Path(os.environ.get("TOKENLAKE_SCREENSHOTS") or tmp_path_factory.mktemp("shots"))
    found = {}
    with _browser(tmp_path_factory.mktemp("profile")) as tools:
        for width in WIDTHS:
            tools.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                       deviceScaleFactor=1, mobile=False)  # fmt: skip
            _open_offline(tools, report)
            deadline = time.monotonic() + 120
            while tools.evaluate("document.readyState + document.URL") != (
                "complete" + report.as_uri()
            ):
                assert time.monotonic() < deadline, "the page did not load"
                time.sleep(0.1)
            assert _wait_rendered(tools) == "done", _problems(tools.events)
            found[width] = json.loads(tools.evaluate(_LAYOUT))
            # The page's top (summary, runs, audits, the first charts): the whole page is
            # ~0.8 MB of PNG per width.
            top = {"x": 0, "y": 0, "width": width, "height": SHOT_HEIGHT, "scale": 1}
            shot = tools.send("Page.captureScreenshot", format="png", clip=top,
                              captureBeyondViewport=True)  # fmt: skip
            (shots / f"report-{width}.png").write_bytes(base64.b64decode(shot["data"]))
            tools.evaluate("document.documentElement.dataset.rendered = 'next'")
        assert _problems(tools.events) == []
    return found


@pytest.mark.parametrize("width", WIDTHS)
def test_the_page_never_scrolls_sideways(layouts, width):
    page = layouts[width]["page"]
    assert page["width"] == width and page["scrollWidth"] <= width


@pytest.mark.parametrize("width", WIDTHS)
def test_every_chart_and_legend_stays_in_its_card(layouts, width):
    cards = layouts[width]["cards"]
    assert len(cards) > 20
    outside = [c["id"] for c in cards
               if c["drawnLeft"] < c["left"] - 1 or c["drawnRight"] > c["right"] + 1]  # fmt: skip
    assert outside == []


@pytest.mark.parametrize("width", WIDTHS)
def test_no_title_is_drawn_over_another(layouts, width):
    assert {c["id"]: c["overlaps"] for c in layouts[width]["cards"] if c["overlaps"]} == {}


def test_legends_show_what_tells_the_runs_apart(layouts):
    legends = [c["legend"] for c in layouts[420]["cards"] if c["id"] == "mean-abs"]
    assert legends == [["…bf16…", "…fp8…", "SMTM", "TM"]]


def test_a_wider_window_draws_fitted_charts_wider_again(report, tmp_path):
    """A strip fitted at 420 px is drawn at its full width after a resize to 1280 px, as wide
    as on a page opened at 1280 px."""
    widths = []
    with _browser(tmp_path / "profile") as tools:
        for width, load in ((420, True), (1280, False), (1280, True)):
            tools.evaluate("document.documentElement.dataset.rendered = 'resizing'")
            tools.send("Emulation.setDeviceMetricsOverride", width=width, height=900,
                       deviceScaleFactor=1, mobile=False)  # fmt: skip
            if load:
                _open_offline(tools, report)
            deadline = time.monotonic() + 120
            while tools.evaluate("document.documentElement.dataset.rendered") != "done":
                assert time.monotonic() < deadline, "the page did not redraw"
                time.sleep(0.1)
            widths.append(tools.evaluate(
                "document.querySelector('#strip-0 canvas').getBoundingClientRect().width"))  # fmt: skip
    fitted, resized, fresh = widths
    assert fitted < 400 < resized == fresh
