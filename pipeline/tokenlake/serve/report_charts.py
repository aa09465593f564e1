"""Vega-Lite specs of the report's charts, written as the dicts altair made of them.

Charts name their data (`{"name": ...}`); the page holds each dataset once and hands it to
every chart that uses it. Every chart colours by run, each run in its one colour of the lake
(`RunScale`, from `tokenlake.serve.run_colours`, as in the explorer), with a legend that
lists every selected run, and lets a click on the legend toggle a run; breakdowns by step
carry a step selector.

The specs are plain dicts, keys in the order altair wrote them: building them with altair cost
a report ~0.3 CPU-s to import it and ~25 ms a chart to build, copy and serialise its objects.
`tests/serve/test_report_chart_specs.py` compares each with what altair makes of the same
chart (`tests/serve/report_charts_altair.py`), and the browser tests draw them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from tokenlake.serve.report_data import ALL_STEPS

ScaleType = Literal["linear", "symlog"]  # y scales of the per-step charts

# The Vega-Lite version the specs are written for, and so the one the page bundles.
VEGA_LITE_VERSION = "v6.4.1"
SCHEMA_URL = f"https://vega.github.io/schema/vega-lite/{VEGA_LITE_VERSION}.json"
GREY = "#9a9a9a"
ALARM = "#d62728"
STRIP_WIDTH = 100  # response tokens per row of a strip
CELL = 7  # pixels per strip cell
LATEST = "latest"  # each run's own latest step
_CONFIG = {"view": {"continuousWidth": 300, "continuousHeight": 300}}


@dataclass(frozen=True)
class RunScale:
    """The selected runs by their legend labels, with each run's colour: every chart's colour
    scale, so that a run has the same colour whichever runs a chart's rows hold."""

    labels: tuple[str, ...]
    colours: tuple[str, ...]


@dataclass(frozen=True)
class Chart:
    """One chart of the page: a Vega-Lite spec and the datasets it reads."""

    id: str
    spec: dict[str, Any]
    datasets: tuple[str, ...]
    renderer: str = "svg"
    # A fixed-width chart (a facet, a strip) that the page narrows to its card, keeping this
    # many pixels for axes; 0: the chart's width is its container's (or fixed).
    fit: int = 0
    aspect: bool = False  # when narrowed, the height shrinks alike (a strip's square cells)


def per_step(
    runs: RunScale,
    chart_id: str,
    dataset: str,
    fields: dict[str, str],
    title: str,
    unit: str,
    threshold: tuple[float, str] | None = None,
    scale: ScaleType = "linear",
    baseline: float | None = None,
    domain: tuple[float, float] | None = None,
) -> Chart:
    """Line chart of one or more columns per step; several columns differ by dash.

    A series (run × column) of a single point carries its value as a label beside the point,
    and an axis whose values are all equal is given a `domain` around them, so one eval step
    reads as its value.

    Args:
        runs: The selected runs' labels and colours.
        chart_id: Element id on the page.
        dataset: Named dataset with `run`, `rollout_id` and the columns.
        fields: Column -> legend label.
        title: Chart title.
        unit: Unit shown on the y axis, e.g. "nats".
        threshold: (value, label) of an alarm rule, or None.
        scale: y scale type: "linear", or "symlog" for values spanning decades (0 allowed).
        baseline: The value the y axis starts from (0 for a drift size, 1 for a ratio), or
            None to fit the values.
        domain: A fixed y domain (for values that are all equal), or None.
    """
    transform: list[dict[str, Any]] = [
        {"fold": list(fields), "as": ["column", "value"]},
        {"calculate": _label_expression(fields), "as": "measure"},
        {"filter": "isValid(datum.value) && isFinite(datum.value)"},
        {"joinaggregate": [{"op": "count", "as": "points"}], "groupby": ["run", "measure"]},
    ]
    if domain is not None:
        y_scale: dict[str, Any] = {"domain": list(domain), "type": scale}
    elif baseline is None or baseline == 0:
        y_scale = {"type": scale, "zero": baseline == 0}
    else:
        y_scale = {"domainMin": baseline, "type": scale}
    encoding: dict[str, Any] = {
        "color": _run_color_spec(runs),
        "opacity": _FADED_SPEC,
        "tooltip": [
            {"field": "run", "type": "nominal"},
            {"field": "rollout_id", "title": "step", "type": "quantitative"},
            {"field": "measure", "title": "metric", "type": "nominal"},
            {"field": "value", "format": ".4~g", "title": unit, "type": "quantitative"},
        ],
        "x": {
            "axis": {"format": "d", "labelExpr": _WHOLE_STEPS, "tickMinStep": 1},
            "field": "rollout_id",
            "title": "step",
            "type": "quantitative",
        },
        "y": {
            "field": "value",
            "scale": y_scale,
            "title": f"{title} ({unit})",
            "type": "quantitative",
        },
    }
    if len(fields) > 1:
        encoding["strokeDash"] = {"field": "measure", "title": "metric", "type": "nominal"}
        encoding = dict(sorted(encoding.items()))
    line = {
        "mark": {"type": "line", "point": True},
        "encoding": encoding,
        "name": _LINE_VIEW,
        "transform": transform,
    }
    lone = {
        "mark": {"type": "text", "align": "left", "dx": 7, "fontWeight": "bold"},
        "encoding": {
            "color": _run_color_spec(runs),
            "opacity": _FADED_SPEC,
            "text": {"field": "value", "format": ".4~g", "type": "quantitative"},
            "x": {"field": "rollout_id", "type": "quantitative"},
            "y": {"field": "value", "type": "quantitative"},
        },
        "transform": [*transform, {"filter": "datum.points === 1"}],
    }
    data = {"name": dataset}
    if threshold is None:  # every layer reads the dataset: named once, for all
        head: dict[str, Any] = {"layer": [line, lone], "data": data}
    else:
        line, lone = {"data": data, **line}, {"data": data, **lone}
        head = {"layer": [line, lone, _threshold_rule(*threshold)]}
    spec = {
        "config": _CONFIG,
        **head,
        "height": 200,
        "params": [{**_RUN_TOGGLE_SPEC, "views": [_LINE_VIEW]}],
        "title": title,
        "width": "container",
        "$schema": SCHEMA_URL,
    }
    return Chart(chart_id, spec, (dataset,))


# The legend's run toggle, and the opacity it gives each run's marks; `_LINE_VIEW` names the
# view of a layered chart the toggle belongs to.
_RUN_TOGGLE_SPEC = {
    "name": "pick_run",
    "select": {"type": "point", "fields": ["run_label"]},
    "bind": "legend",
}
_FADED_SPEC = {"condition": {"param": "pick_run", "value": 1.0}, "value": 0.12}
_WHOLE_STEPS = "floor(datum.value) === datum.value ? datum.label : ''"
_LINE_VIEW = "view_line"


def _run_color_spec(runs: RunScale) -> dict[str, Any]:
    return {
        "field": "run_label",
        "legend": {"symbolLimit": 0},
        "scale": {"domain": list(runs.labels), "range": list(runs.colours)},
        "title": "run",
        "type": "nominal",
    }


def _threshold_rule(value: float, label: str) -> dict[str, Any]:
    rule = {
        "mark": {"type": "rule", "color": ALARM, "strokeDash": [5, 4]},
        "encoding": {"y": {"field": "threshold", "type": "quantitative"}},
    }
    text = {
        "mark": {
            "type": "text",
            "align": "left",
            "baseline": "bottom",
            "color": ALARM,
            "dx": 4,
            "dy": -2,
        },
        "encoding": {
            "text": {"field": "label", "type": "nominal"},
            "x": {"value": 0},
            "y": {"field": "threshold", "type": "quantitative"},
        },
    }
    return {"layer": [rule, text], "data": {"values": [{"threshold": value, "label": label}]}}


def _label_expression(fields: dict[str, str]) -> str:
    """Vega expression mapping a folded column name to its label."""
    cases = "".join(f"datum.column === '{name}' ? '{label}' : " for name, label in fields.items())
    return cases + "datum.column"


def _chart(
    data: str, mark: dict[str, Any], encoding: dict[str, Any], **rest: Any
) -> dict[str, Any]:
    """A one-view chart's spec: its other properties (`rest`) in name order, as altair writes
    them (encoding channels too)."""
    return {
        "config": _CONFIG,
        "data": {"name": data},
        "mark": mark,
        "encoding": dict(sorted(encoding.items())),
        **dict(sorted(rest.items())),
        "$schema": SCHEMA_URL,
    }


def _tooltip(
    field: str, kind: str, title: str | None = None, fmt: str | None = None
) -> dict[str, Any]:
    """A tooltip entry (`kind`: "nominal" or "quantitative")."""
    entry: dict[str, Any] = {"field": field}
    if fmt is not None:
        entry["format"] = fmt
    if title is not None:
        entry["title"] = title
    entry["type"] = kind
    return entry


def position_heatmap(chart_id: str) -> Chart:
    """Step × response-position heatmap of mean |δ|, one panel per run (covered tokens only)."""
    encoding = {
        "x": {"field": "rollout_id", "title": "step", "type": "ordinal"},
        "y": {
            "field": "positions",
            "sort": {"field": "position_bucket", "order": "ascending"},
            "title": "position (log2 bins)",  # fits a panel's height
            "type": "ordinal",
        },
        "color": {
            "field": "mean_abs_lp_diff",
            "scale": {"scheme": "viridis"},
            "title": "mean |δ| (nats)",
            "type": "quantitative",
        },
        # Run names above each panel, left-aligned: beside it, long names took the width.
        "row": {
            "field": "run_label",
            "header": {
                "labelAlign": "left",
                "labelAnchor": "start",
                "labelAngle": 0,
                "labelOrient": "top",
            },
            "title": None,
            "type": "nominal",
        },
        "tooltip": _breakdown_tooltip("positions", "positions"),
    }
    spec = _chart(
        "by_position",
        {"type": "rect"},
        encoding,
        height=160,
        title="Mean |δ| by step and response position",
        transform=[
            {"calculate": "datum.position_low + '–' + datum.position_high", "as": "positions"}
        ],
        width=640,
    )
    return Chart(chart_id, spec, ("by_position",), fit=110)


def _breakdown_tooltip(field: str, title: str) -> list[dict[str, Any]]:
    return [
        _tooltip("run", "nominal"),
        _tooltip("step", "nominal", "step"),
        _tooltip(field, "nominal", title),
        _tooltip("tokens", "quantitative", "tokens", ","),
        _tooltip("mean_abs_lp_diff", "quantitative", "mean |δ| (nats)", ".4~g"),
        _tooltip("k3_kl", "quantitative", "k3 KL (nats)", ".4~g"),
        _tooltip("k3_share", "quantitative", "share of the step's k3", ".1%"),
    ]


def _step_selector(steps: Sequence[int], first: str = ALL_STEPS) -> dict[str, Any]:
    """A step picker over the rows' text `step`; `first` (all steps pooled, or each run's
    latest) is the default, so no run is hidden by a step it lacks."""
    options = [first, *(str(step) for step in sorted(set(steps)))]
    labels = {ALL_STEPS: "all steps", LATEST: "each run's latest"}
    return {
        "name": "step",
        "bind": {
            "input": "select",
            "options": options,
            "labels": [labels.get(o, f"step {o}") for o in options],
            "name": "step ",
        },
        "value": first,
    }


# The filter keeping the picked step's rows (`_step_selector`).
_PICKED_STEP = {"filter": "(datum.step === step)"}


def by_step_selected(
    runs: RunScale,
    chart_id: str,
    dataset: str,
    steps: Sequence[int],
    x: tuple[str, str, str | None],
    title: str,
    filter_expr: str = "true",
    y: str = "mean_abs_lp_diff",
    y_title: str = "mean |δ| (nats)",
    extra: dict[str, Any] | None = None,
) -> Chart:
    """Line chart over a breakdown's buckets for the step picked in a selector, runs overlaid.

    `x` is (column, axis title, column to sort by or None); the column is drawn as ordinal.
    `extra`: more encoding channels, as Vega-Lite writes them.
    """
    field, x_title, sort_by = x
    sort = {"field": sort_by, "order": "ascending"} if sort_by else "ascending"
    encoding = {
        "x": {"field": field, "sort": sort, "title": x_title, "type": "ordinal"},
        "y": {"field": y, "title": y_title, "type": "quantitative"},
        "color": _run_color_spec(runs),
        "opacity": _FADED_SPEC,
        "tooltip": _breakdown_tooltip(field, x_title),
        **(extra or {}),
    }
    spec = _chart(
        dataset,
        {"type": "line", "point": True},
        encoding,
        height=220,
        params=[_RUN_TOGGLE_SPEC, _step_selector(steps)],
        title=title,
        transform=[{"filter": filter_expr}, _PICKED_STEP],
        width="container",
    )
    return Chart(chart_id, spec, (dataset,))


def histogram(
    runs: RunScale, chart_id: str, steps: Sequence[int], half_width: float, outside: Sequence[str]
) -> Chart:
    """δ distribution of the picked step, a step line per run, log-scale fraction.

    The bins cover ± `half_width` (nats, from the data); `outside` (one line per run: how many
    tokens lie beyond, in the two end bins) is the chart's subtitle.
    """
    encoding = {
        "x": {
            "field": "x_low",
            "title": f"δ = train − rollout log-prob (nats, bins of {half_width / 50:.3g})",
            "type": "quantitative",
        },
        "y": {
            "field": "fraction",
            "scale": {"type": "log"},
            "title": "fraction of the step's tokens",
            "type": "quantitative",
        },
        "color": _run_color_spec(runs),
        "opacity": _FADED_SPEC,
        "tooltip": [
            _tooltip("run", "nominal"),
            _tooltip("step", "nominal", "step"),
            _tooltip("label", "nominal", "δ bin (nats)"),
            _tooltip("tokens", "quantitative", fmt=","),
            _tooltip("fraction", "quantitative", fmt=".3~%"),
        ],
    }
    spec = _chart(
        "histogram",
        {"type": "line", "interpolate": "step-after", "point": {"size": 12}},
        encoding,
        height=240,
        params=[_RUN_TOGGLE_SPEC, _step_selector(steps)],
        title={"text": "Histogram of δ (log scale)", "subtitle": list(outside)},
        transform=[_PICKED_STEP],
        width="container",
    )
    return Chart(chart_id, spec, ("histogram",))


def top_tokens(runs: RunScale, chart_id: str, steps: Sequence[int]) -> Chart:
    """The tokens carrying most of the picked step's k3, one bar per run."""
    encoding = {
        "y": {"field": "label", "sort": "-x", "title": "token", "type": "nominal"},
        "yOffset": {"field": "run_label", "type": "nominal"},
        "x": {
            "field": "k3_share",
            "title": "share of the step's k3 KL (fraction)",
            "type": "quantitative",
        },
        "color": _run_color_spec(runs),
        "opacity": _FADED_SPEC,
        "tooltip": [
            _tooltip("run", "nominal"),
            _tooltip("rollout_id", "quantitative", "step"),
            _tooltip("label", "nominal", "token"),
            _tooltip("token_id", "quantitative", "token id"),
            _tooltip("tokens", "quantitative", "occurrences", ","),
            _tooltip("mean_abs_lp_diff", "quantitative", "mean |δ| (nats)", ".4~g"),
            _tooltip("k3_share", "quantitative", "k3 share", ".1%"),
        ],
    }
    spec = _chart(
        "top_tokens",
        {"type": "bar"},
        encoding,
        params=[_RUN_TOGGLE_SPEC, _step_selector(steps, LATEST)],
        title="Top drifting tokens (by share of k3 KL)",
        transform=[{"filter": f"step === '{LATEST}' ? datum.latest : datum.step === step"}],
        width="container",
    )
    return Chart(chart_id, spec, ("top_tokens",))


def strip(chart_id: str, dataset: str, tokens: int, limit: float) -> Chart:
    """One sample's per-token strip: a cell per response token coloured by δ, masked grey.
    Its label is the page's (HTML wraps on a narrow window, a chart title would not).

    `limit` (nats) bounds the colour scale to [-limit, limit], the same for every strip.
    """
    rows = max(1, -(-tokens // STRIP_WIDTH))
    width = min(tokens, STRIP_WIDTH) or 1
    encoding = {
        "x": {
            "axis": None,
            "field": "col",
            "scale": {"domain": [0, width], "nice": False},
            "type": "quantitative",
        },
        "x2": {"field": "col_end"},
        "y": {
            "axis": None,
            "field": "row",
            "scale": {"domain": [0, rows], "nice": False, "reverse": True},
            "type": "quantitative",
        },
        "y2": {"field": "row_end"},
        "color": {
            "condition": {"test": "datum.status !== 3", "value": GREY},
            "field": "delta",
            "scale": {"domain": [-limit, limit], "reverse": True, "scheme": "redblue"},
            "title": "δ (nats)",
            "type": "quantitative",
        },
        "tooltip": [
            _tooltip("position", "quantitative", "position"),
            _tooltip("token", "nominal", "token"),
            _tooltip("train", "quantitative", "train log-prob (nats)", ".5~g"),
            _tooltip("rollout", "quantitative", "rollout log-prob (nats)", ".5~g"),
            _tooltip("delta", "quantitative", "δ (nats)", ".5~g"),
            _tooltip("state", "nominal", "loss"),
        ],
    }
    spec = _chart(
        dataset,
        # "show": a masked token (δ null) keeps its cell; the default would drop it.
        {"type": "rect", "invalid": "show"},
        encoding,
        height=rows * CELL,
        transform=[
            {"calculate": f"datum.position % {STRIP_WIDTH}", "as": "col"},
            {"calculate": f"floor(datum.position / {STRIP_WIDTH})", "as": "row"},
            {"calculate": "datum.col + 0.92", "as": "col_end"},
            {"calculate": "datum.row + 0.92", "as": "row_end"},
        ],
        width=width * CELL,
    )
    return Chart(chart_id, spec, (dataset,), renderer="canvas", fit=1, aspect=True)
