"""The charts' specs, written as dicts, are the ones altair builds of the same chart: the
oracles are the altair code they replaced (`_altair_per_step` below, the others in
report_charts_altair.py). Only the name altair gives a layered chart's line view (a digest of
its objects) differs, and the legend toggle names that view in each alike."""

from __future__ import annotations

import json
from typing import Any

import altair as alt
import pytest

from tests.serve import report_charts_altair as oracle
from tokenlake.serve import report_charts as rc

RUNS = rc.RunScale(("qwen-bf16", "qwen-fp8"), ("#1f77b4", "#ff7f0e"))


def _altair_per_step(
    runs: rc.RunScale,
    dataset: str,
    fields: dict[str, str],
    title: str,
    unit: str,
    threshold: tuple[float, str] | None = None,
    scale: str = "linear",
    baseline: float | None = None,
    domain: tuple[float, float] | None = None,
) -> dict[str, Any]:
    toggle = alt.selection_point(fields=["run_label"], bind="legend", name="pick_run")
    color = alt.Color(
        "run_label:N",
        title="run",
        scale=alt.Scale(domain=list(runs.labels), range=list(runs.colours)),
        legend=alt.Legend(symbolLimit=0),
    )
    faded = alt.OpacityValue(**alt.condition(toggle, alt.value(1.0), alt.value(0.12)))
    whole = "floor(datum.value) === datum.value ? datum.label : ''"
    step_axis = alt.X(
        "rollout_id:Q", title="step", axis=alt.Axis(tickMinStep=1, format="d", labelExpr=whole)
    )
    labels = "".join(f"datum.column === '{n}' ? '{label}' : " for n, label in fields.items())
    base = (
        alt.Chart(alt.NamedData(dataset))
        .transform_fold(list(fields), as_=["column", "value"])
        .transform_calculate(measure=labels + "datum.column")
        .transform_filter("isValid(datum.value) && isFinite(datum.value)")
        .transform_joinaggregate(points="count()", groupby=["run", "measure"])
    )
    if domain is not None:
        y_scale = alt.Scale(type=scale, domain=list(domain))
    elif baseline is None or baseline == 0:
        y_scale = alt.Scale(type=scale, zero=baseline == 0)
    else:
        y_scale = alt.Scale(type=scale, domainMin=baseline)
    encoding: dict[str, Any] = {
        "x": step_axis,
        "y": alt.Y("value:Q", title=f"{title} ({unit})", scale=y_scale),
        "color": color,
        "opacity": faded,
        "tooltip": [
            alt.Tooltip("run:N"),
            alt.Tooltip("rollout_id:Q", title="step"),
            alt.Tooltip("measure:N", title="metric"),
            alt.Tooltip("value:Q", title=unit, format=".4~g"),
        ],
    }
    if len(fields) > 1:
        encoding["strokeDash"] = alt.StrokeDash("measure:N", title="metric")
    line = base.mark_line(point=True).encode(**encoding).add_params(toggle)
    lone = (
        base.transform_filter("datum.points === 1")
        .mark_text(align="left", dx=7, fontWeight="bold")
        .encode(
            x=alt.X("rollout_id:Q"),
            y=alt.Y("value:Q"),
            text=alt.Text("value:Q", format=".4~g"),
            color=color,
            opacity=faded,
        )
    )
    layers = [line, lone]
    if threshold:
        data = alt.Data(values=[{"threshold": threshold[0], "label": threshold[1]}])
        rule = (
            alt.Chart(data)
            .mark_rule(color=rc.ALARM, strokeDash=[5, 4])
            .encode(y=alt.Y("threshold:Q"))
        )
        text = (
            alt.Chart(data)
            .mark_text(color=rc.ALARM, align="left", baseline="bottom", dx=4, dy=-2)
            .encode(y=alt.Y("threshold:Q"), x=alt.XValue(0), text=alt.Text("label:N"))
        )
        layers.append(rule + text)
    chart = alt.layer(*layers).properties(title=title, width="container", height=200)
    with alt.utils.schemapi.debug_mode(False):
        return chart.to_dict(validate=False)


# The report's own kinds of per-step chart (report.py), and each y-scale branch.
CASES = [
    ({"reward_mean": "mean"}, {}),
    ({"k3_kl": "TM", "k3_kl_smtm": "SMTM"}, {"threshold": (0.01, "alarm 0.01")}),
    ({"chi2_token": "token"}, {"scale": "symlog", "baseline": 0.0}),
    ({"ess": "ESS"}, {"baseline": 1.0, "threshold": (0.3, "ess 0.3")}),
    ({"mult_prob_error": "TM", "x'y": "it's"}, {"domain": (0.5, 1.5)}),
]


@pytest.mark.parametrize(("fields", "options"), CASES)
def test_a_per_step_chart_is_what_altair_makes_of_it(
    fields: dict[str, str], options: dict[str, Any]
) -> None:
    chart = rc.per_step(RUNS, "chart-id", "drift_steps", fields, "k3 KL", "nats", **options)
    expected = _altair_per_step(RUNS, "drift_steps", fields, "k3 KL", "nats", **options)
    (altair_view,) = expected["params"][0]["views"]
    assert altair_view.startswith("view_")
    named = json.dumps(expected).replace(altair_view, rc._LINE_VIEW)
    assert json.dumps(chart.spec) == named  # the same keys, in the same order
    assert (chart.id, chart.datasets, chart.renderer, chart.fit, chart.aspect) == (
        "chart-id",
        ("drift_steps",),
        "svg",
        0,
        False,
    )


def _same(chart: rc.Chart, expected: rc.Chart) -> None:
    assert json.dumps(chart.spec) == json.dumps(expected.spec)  # the same keys, in order
    assert (chart.id, chart.datasets, chart.renderer, chart.fit, chart.aspect) == (
        expected.id,
        expected.datasets,
        expected.renderer,
        expected.fit,
        expected.aspect,
    )


STEPS = [3, 0, 1, 1]


def test_the_breakdown_charts_are_what_altair_makes_of_them() -> None:
    prob = (RUNS, "by-prob", "by_prob", STEPS, ("label", "rollout probability", "bucket"))
    _same(
        rc.by_step_selected(*prob, "Mean |δ| by prob", "datum.dimension === 'rollout_prob'"),
        oracle.by_step_selected(*prob, "Mean |δ| by prob", "datum.dimension === 'rollout_prob'"),
    )
    turn = (RUNS, "by-turn", "by_turn", [0], ("turn_index", "turn", None), "Mean |δ| by turn")
    dash = {"field": "mixed_version", "title": "mixed version", "type": "nominal"}
    _same(
        rc.by_step_selected(*turn, extra={"strokeDash": dash}),
        oracle.by_step_selected(
            *turn, extra={"strokeDash": alt.StrokeDash("mixed_version:N", title="mixed version")}
        ),
    )
    _same(rc.position_heatmap("heatmap"), oracle.position_heatmap("heatmap"))
    outside = ["Beyond ±0.05 nats (the end bins), all steps:", "a: 2 of 2,000 tokens (0.1 %)"]
    _same(
        rc.histogram(RUNS, "histogram", STEPS, 0.05, outside),
        oracle.histogram(RUNS, "histogram", STEPS, 0.05, outside),
    )
    _same(rc.top_tokens(RUNS, "top", STEPS), oracle.top_tokens(RUNS, "top", STEPS))


@pytest.mark.parametrize("tokens", [0, 37, 100, 250])
def test_a_strip_is_what_altair_makes_of_it(tokens: int) -> None:
    _same(
        rc.strip("strip-1", "strip_1", tokens, 1.5), oracle.strip("strip-1", "strip_1", tokens, 1.5)
    )


def test_the_specs_are_of_the_vega_lite_altair_writes_for() -> None:
    assert (rc.VEGA_LITE_VERSION, rc.SCHEMA_URL) == (alt.SCHEMA_VERSION, alt.SCHEMA_URL)
