"""The report's charts read as their numbers, checked where the reader sees them: in headless
Chromium (offline, with test_report.py's DevTools helpers), from each drawn chart's scales,
axis labels and text marks."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.serve.test_report import _browser, _open_offline, _problems, _wait_rendered
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve.query import run_query
from tokenlake.serve.report import build_report
from tokenlake.serve.report_data import nice_ceiling

pytestmark = pytest.mark.slow

# Per chart: the y scale's domain and type, the y axis labels, the text marks drawn.
_PROBE = """JSON.stringify(Object.fromEntries(Object.entries(window.reportViews).map(([id, v]) => {
  const e = document.getElementById(id);
  let y = null;
  let x = null;
  try { y = {domain: v.scale('y').domain(), type: v.scale('y').type}; } catch (err) {}
  try { x = {domain: v.scale('x').domain(), type: v.scale('x').type}; } catch (err) {}
  const texts = (selector) => [...e.querySelectorAll(selector)].map(t => t.textContent);
  const yAxis = [...e.querySelectorAll('.role-axis')].filter(
    a => (a.getAttribute('aria-label') || '').startsWith('Y-axis'));
  const yLabels = yAxis.flatMap(a => [...a.querySelectorAll('.role-axis-label text')]
    .map(t => t.textContent));
  const marks = [], title = [];
  (function titles(node) {
    if (!node || !node.items) return;
    if (node.role === 'title-text' || node.role === 'title-subtitle') {
      node.items.forEach(i => [].concat(i.text).forEach(line => title.push(line)));
    }
    node.items.forEach(titles);
  })(v.scenegraph().root);
  (function walk(node) {
    if (!node || !node.items) return;
    if (node.marktype && node.marktype !== 'group' && node.role === 'mark') {
      node.items.forEach(i => i.datum && marks.push({mark: node.marktype, ...i.datum}));
      return;
    }
    node.items.forEach(walk);
  })(v.scenegraph().root);
  return [id, {x, y, yLabels, texts: texts('.role-mark text'), title, marks: marks.slice(0, 400),
               signals: Object.fromEntries(['step'].filter(n => { try { v.signal(n); return true; }
                 catch (err) { return false; } }).map(n => [n, v.signal(n)]))}];
})))"""


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    """The example (steps 0-2, one eval step: 0) and a CP multi-turn run of steps 0-1 only."""
    root = tmp_path_factory.mktemp("read-true")
    synth.write_dump(root / "example", synth.PRESETS["example"])
    short = dataclasses.replace(synth.PRESETS["cp-thd"], multi_turn=True, steps=2)
    synth.write_dump(root / "cp", short)
    extract_run(
        root / "example", store_of(root / "lake"), ExtractOptions(run_name="example", workers=1)
    )
    extract_run(
        root / "cp", store_of(root / "lake"), ExtractOptions(run_name="cp-short", workers=1)
    )
    return root / "lake"


# The pages drawn: both runs, and the example alone (its one eval step is its only point).
PAGES = {"both": (), "example": ("example",)}


@pytest.fixture(scope="module")
def pages(lake, tmp_path_factory) -> dict[str, dict]:
    """What each page of `PAGES` drew, by chart id, in one browser."""
    folder = tmp_path_factory.mktemp("pages")
    facts = {}
    with _browser(tmp_path_factory.mktemp("profile")) as tools:
        for name, runs in PAGES.items():
            out = folder / f"{name}.html"
            build_report(store_of(lake), out, runs=runs, worst=2)
            _open_offline(tools, out)
            deadline = time.monotonic() + 120
            while tools.evaluate("document.URL") != out.as_uri():
                assert time.monotonic() < deadline, "the page did not load"
                time.sleep(0.1)
            assert _wait_rendered(tools) == "done", _problems(tools.events)
            facts[name] = json.loads(tools.evaluate(_PROBE))
            facts[name]["strip labels"] = tools.evaluate(
                "[...document.querySelectorAll('.strip-label')].map(p => p.textContent)"
            )
        assert _problems(tools.events) == []
    return facts


@pytest.fixture(scope="module")
def drawn(pages) -> dict:
    return pages["both"]


def _value(lake: Path, sql: str) -> float:
    return run_query(store_of(lake), sql).column(0)[0].as_py()


def test_a_single_eval_step_reads_as_its_value(lake, pages):
    sql = "SELECT avg(reward) FROM sample_stats WHERE evaluation AND run = '{}'"
    example, short = (_value(lake, sql.format(run)) for run in ("example", "cp-short"))
    assert f"{example:.4g}" == "0.4375"  # the figure: one eval step, one point
    alone = pages["example"]["eval-reward"]
    assert alone["y"]["domain"] == [0, 0.45]  # from zero past the point, not collapsed on it
    assert alone["yLabels"] == ["0.0", "0.1", "0.2", "0.3", "0.4"]
    assert alone["texts"] == ["0.4375"]  # the point says its value
    both = pages["both"]["eval-reward"]
    low, high = both["y"]["domain"]
    assert low <= min(example, short) and max(example, short) <= high
    assert sorted(both["texts"]) == sorted([f"{example:.4g}", f"{short:.4g}"])


def test_sequence_and_token_chi2_never_share_an_axis(lake, drawn):
    assert "chi2" not in drawn
    token = _value(lake, "SELECT max(abs(chi2_token)) FROM drift_steps")
    low, high = drawn["chi2-token"]["y"]["domain"]
    assert low <= 0 and token <= high <= 2 * token
    assert drawn["chi2-token"]["y"]["type"] == "linear"
    assert drawn["chi2-seq"]["y"]["type"] == "symlog"  # decades apart, zero allowed


@pytest.mark.parametrize(
    ("chart", "start"),
    [("mean-abs", 0), ("p99", 0), ("k3", 0), ("ess", 0), ("reject-veto", 0),
     ("reject-geo-reject", 0), ("mult-prob", 1)],
)  # fmt: skip
def test_drift_axes_start_at_zero_or_at_no_drift(drawn, chart, start):
    assert drawn[chart]["y"]["domain"][0] == start
    assert float(drawn[chart]["yLabels"][0]) == start  # the lowest label the reader sees


def _runs_drawn(chart: dict) -> set[str]:
    return {m["run"] for m in chart["marks"] if "run" in m}


BREAKDOWNS = ["by-prob", "by-entropy", "by-turn", "by-staleness", "histogram"]


@pytest.mark.parametrize("chart", BREAKDOWNS)
def test_breakdowns_default_to_all_steps_pooled(drawn, chart):
    # cp-short lacks step 2, the lake's last: a default of the last step hid it.
    assert drawn[chart]["signals"]["step"] == "all"
    assert _runs_drawn(drawn[chart]) == {"example", "cp-short"}
    assert {m["step"] for m in drawn[chart]["marks"] if "step" in m} == {"all"}


def test_pooled_breakdown_is_the_mean_over_every_token(lake, drawn):
    rows = run_query(
        store_of(lake),
        "SELECT run, turn_index, count(*) AS n, avg(abs_lp_diff) AS m FROM drift_tokens "
        "GROUP BY ALL",
    ).to_pylist()
    expected = {(r["run"], r["turn_index"]): (r["n"], r["m"]) for r in rows}
    points = {
        (m["run"], m["turn_index"]): (m["tokens"], m["mean_abs_lp_diff"])
        for m in drawn["by-turn"]["marks"]
        if m["mark"] == "symbol"
    }
    assert points.keys() == expected.keys()
    for key, (tokens, mean) in expected.items():
        assert points[key][0] == tokens and points[key][1] == pytest.approx(mean, rel=1e-12)


def test_top_tokens_default_to_each_runs_latest_step(drawn):
    chart = drawn["top-tokens"]
    assert chart["signals"]["step"] == "latest"
    steps = {(m["run"], m["rollout_id"]) for m in chart["marks"] if m["mark"] == "rect"}
    assert steps == {("example", 2), ("cp-short", 1)}


def test_the_first_worst_sample_carries_most_of_its_runs_drift(lake, drawn):
    best = run_query(
        store_of(lake),
        "SELECT sample_index, tokens, tokens * mean_abs_lp_diff / sum(tokens * mean_abs_lp_diff)"
        " OVER (PARTITION BY run, rollout_id) AS share FROM drift_samples WHERE run = 'cp-short'"
        " ORDER BY share DESC LIMIT 1",
    ).to_pylist()[0]
    labels = [label for label in drawn["strip labels"] if label.startswith("cp-short ·")]
    assert labels, "no strip of cp-short drawn"
    title = labels[0]
    assert (
        f"sample {best['sample_index']} · {100 * best['share']:.3g} % of the step's Σ|δ|" in title
    )
    assert f"over {best['tokens']} tokens" in title


def test_the_histogram_spans_the_data_and_counts_the_tails(lake, drawn):
    p99 = _value(lake, "SELECT max(p99_abs_lp_diff) FROM drift_steps")
    half = nice_ceiling(p99)
    assert p99 <= half < 2.5 * p99
    chart = drawn["histogram"]
    low, high = chart["x"]["domain"]
    # The data's range, the low end bin drawn one bin wide: never the fixed ±0.1 of before.
    assert -half * 51 / 50 <= low < high <= half and max(-low, high) >= p99
    tails = run_query(
        store_of(lake),
        f"SELECT run, count(*) FILTER (WHERE abs(lp_diff) >= {half}) AS n, count(*) AS total "
        "FROM drift_tokens GROUP BY run ORDER BY run",
    ).to_pylist()
    assert chart["title"][0] == "Histogram of δ (log scale)"
    assert chart["title"][1] == f"Beyond ±{half:g} nats (the end bins), all steps:"
    lines = chart["title"][2:]
    assert [line.split(":")[0] for line in lines] == ["cp-short", "example"]
    for line, row in zip(lines, tails, strict=True):
        assert line.startswith(f"{row['run']}: {row['n']:,} of {row['total']:,} tokens (")


RULES = ["veto", "outlier", "geo_reject", "seq_ratio_reject", "icepop"]


def test_each_rejection_rule_has_its_own_chart(drawn):
    assert "reject-token" not in drawn and "reject-seq" not in drawn
    for rule in RULES:
        chart = drawn[f"reject-{rule.replace('_', '-')}"]
        assert chart["title"] == [f"Rejected by {rule}"]
        assert {m["measure"] for m in chart["marks"] if "measure" in m} == {"tokens", "samples"}
        assert _runs_drawn(chart) == {"example", "cp-short"}
