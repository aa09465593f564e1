"""The report speaks the explorer's chart vocabulary: one colour per run on every chart, the
run's colour of the lake (`tokenlake.serve.run_colours`) whichever runs are selected, legends
that list every run (eleven here), a run's strips beyond the first three folded, and a page
whose steps are thinned to a bound, so that its size stops growing with the step count.

Drawn in headless Chromium (offline, test_report.py's DevTools helpers) where the reader sees
the colours: each chart's own colour scale and legend.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.serve.test_report import _browser, _open_offline, _problems, _wait_rendered
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import report
from tokenlake.serve.report import build_report
from tokenlake.serve.run_colours import PALETTE, run_colours

pytestmark = pytest.mark.slow

RUNS = tuple(f"run-{i:02d}" for i in range(11))  # more than the seven a legend showed
SMALL = dataclasses.replace(
    synth.PRESETS["example"], prompts_per_step=2, samples_per_prompt=2, response_length=(1, 16),
    dp=1, tp=1, multi_turn=False, removed_positions=(),
)  # fmt: skip

# Per chart whose colour is the run: the colour its scale gives each run, its legend's labels.
_COLOURS = """JSON.stringify(Object.fromEntries(Object.entries(window.reportViews).flatMap(([id, v]) => {
  let scale = null;
  try { scale = v.scale('color'); } catch (err) { return []; }
  if (!scale || !scale.domain().some(d => typeof d === 'string' && d.startsWith('run-'))) return [];
  const card = document.getElementById(id);
  const labels = [...card.querySelectorAll('.role-legend-label text')];
  const legend = labels.map(t => t.textContent).filter(t => t.startsWith('run-'));
  // labels drawn past the card's edges: cut off for the reader
  const box = card.getBoundingClientRect();
  const outside = labels.filter(t => { const r = t.getBoundingClientRect();
    return r.left < box.left - 1 || r.right > box.right + 1; }).map(t => t.textContent);
  return [[id, {colours: Object.fromEntries(scale.domain().map(d => [d, scale(d)])), legend,
                outside}]];
})))"""


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("colours")
    synth.write_dump(root / "dump", dataclasses.replace(SMALL, steps=2))
    for run in RUNS:
        extract_run(root / "dump", store_of(root / "lake"), ExtractOptions(run_name=run, workers=1))
    return root / "lake"


@pytest.fixture(scope="module")
def pages(lake, tmp_path_factory) -> dict[str, dict]:
    """Per report (every run; two of them), what its charts drew and its folded parts."""
    folder = tmp_path_factory.mktemp("pages")
    found = {}
    with _browser(tmp_path_factory.mktemp("profile")) as tools:
        for name, runs in {"all": (), "two": ("run-09", "run-03")}.items():
            out = folder / f"{name}.html"
            build_report(store_of(lake), out, runs=runs, worst=5)
            _open_offline(tools, out)
            deadline = time.monotonic() + 120
            while tools.evaluate("document.URL") != out.as_uri():
                assert time.monotonic() < deadline, "the page did not load"
                time.sleep(0.1)
            assert _wait_rendered(tools) == "done", _problems(tools.events)
            found[name] = {
                "charts": json.loads(tools.evaluate(_COLOURS)),
                "folded": tools.evaluate(
                    "[...document.querySelectorAll('#worst details.folded')].map(d =>"
                    " [d.open, d.querySelector('summary').textContent,"
                    " d.querySelectorAll('.strip').length])"
                ),
                "open strips": tools.evaluate(
                    "document.querySelectorAll('#worst .strip:not(details .strip)').length"
                ),
            }
        assert _problems(tools.events) == []
    return found


def test_every_chart_gives_each_run_the_lakes_colour_for_it(pages):
    lake_colours = run_colours(RUNS)
    assert lake_colours["run-00"] == PALETTE[0] and lake_colours["run-10"] == PALETTE[10]
    charts = pages["all"]["charts"]
    assert {"reward-mean", "mean-abs", "k3", "by-prob", "by-turn", "histogram", "top-tokens"} <= (
        set(charts)
    )
    for chart, drawn in charts.items():
        assert drawn["colours"] == lake_colours, chart


def test_a_run_keeps_its_colour_when_the_report_selects_other_runs(pages):
    lake_colours = run_colours(RUNS)
    for chart, drawn in pages["two"]["charts"].items():
        assert drawn["colours"] == {
            "run-03": lake_colours["run-03"],
            "run-09": lake_colours["run-09"],
        }, chart
    assert lake_colours["run-03"] != lake_colours["run-09"]


def test_legends_list_every_run(pages):
    legends = {chart: drawn["legend"] for chart, drawn in pages["all"]["charts"].items()}
    assert legends["mean-abs"] == list(RUNS)
    assert legends["histogram"] == list(RUNS)
    assert all(legend == list(RUNS) for legend in legends.values()), legends
    outside = {chart: drawn["outside"] for chart, drawn in pages["all"]["charts"].items()}
    assert outside == {chart: [] for chart in outside}  # every label inside its card


def test_a_runs_strips_beyond_the_first_three_are_folded(pages):
    # five worst samples a run: three drawn open, two under one closed line per run
    assert pages["two"]["open strips"] == 6
    assert pages["two"]["folded"] == [
        [False, "2 more worst samples of run-03", 2],
        [False, "2 more worst samples of run-09", 2],
    ]


def _payload(page: Path) -> dict:
    text = page.read_text(encoding="utf-8")
    found = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S
    )
    assert found
    return json.loads(found.group(1))


def _steps(payload: dict, dataset: str) -> list[int]:
    return sorted(
        {r["rollout_id"] for r in payload["datasets"][dataset] if r.get("rollout_id") is not None}
    )


def test_a_report_of_many_steps_shows_a_bounded_number_of_them(tmp_path, monkeypatch):
    # The bounds made small, so that a small lake has more steps than they allow.
    monkeypatch.setattr(report, "SERIES_STEPS", 5)
    monkeypatch.setattr(report, "BREAKDOWN_STEPS", 3)
    synth.write_dump(tmp_path / "dump", dataclasses.replace(SMALL, steps=9, eval_steps=()))
    extract_run(
        tmp_path / "dump", store_of(tmp_path / "lake"), ExtractOptions(run_name="long", workers=1)
    )
    out = tmp_path / "r.html"
    build_report(store_of(tmp_path / "lake"), out, worst=1)
    payload = _payload(out)
    assert _steps(payload, "drift_steps") == _steps(payload, "step_stats") == [0, 2, 4, 6, 8]
    for dataset in ("by_position", "by_prob", "histogram", "top_tokens"):
        assert _steps(payload, dataset) == [0, 4, 8], dataset
    pooled = [r for r in payload["datasets"]["histogram"] if r["step"] == "all"]
    assert sum(r["tokens"] for r in pooled) == sum(
        r["tokens"] for r in payload["datasets"]["histogram"] if r["step"] != "all"
    ) + _tokens_of_left_out_steps(tmp_path / "lake", [1, 2, 3, 5, 6, 7])  # every step pooled
    # a whole response's strip carries no position array, and no text without a vocabulary
    (strip,) = payload["strips"]
    assert sorted(strip["cells"]) == ["delta", "rollout", "status", "token_id", "train"]
    html = out.read_text(encoding="utf-8")
    assert (
        "9 steps selected: the per-step charts show 5 of them, evenly spaced (the first and the"
        " last kept), so that the page stays small."
    ) in html
    assert (
        "9 steps selected: the charts by step offer 3 of them, evenly spaced (the first and each"
        " run&#x27;s last kept); &quot;all steps&quot; pools every selected step."
    ) in html


def _tokens_of_left_out_steps(lake: Path, steps: list[int]) -> int:
    from tokenlake.serve.query import run_query

    listed = ", ".join(map(str, steps))
    table = run_query(
        store_of(lake),
        f"SELECT sum(tokens) AS n FROM drift_histogram WHERE rollout_id IN ({listed})",
    )
    return int(table.column("n")[0].as_py())
