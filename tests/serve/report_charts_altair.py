"""The report's charts as altair built them before they were written as Vega-Lite dicts:
the oracle of tests/serve/test_report_chart_specs.py (each dict builder of
`tokenlake.serve.report_charts` must give what its altair builder here gives)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec

import altair as alt

from tokenlake.serve.report_charts import CELL, GREY, LATEST, STRIP_WIDTH, Chart, RunScale
from tokenlake.serve.report_data import ALL_STEPS

P = ParamSpec("P")


def _run_toggle() -> Any:
    return alt.selection_point(fields=["run_label"], bind="legend", name="pick_run")


def _run_color(runs: RunScale) -> alt.Color:
    # `run_label`: the run's name, shortened where runs share a long prefix or suffix
    # (report_html.short_runs); tooltips give the whole `run`. The domain is every selected
    # run, not the chart's rows, so the legend lists them all and no run's colour shifts.
    return alt.Color(
        "run_label:N",
        title="run",
        scale=alt.Scale(domain=list(runs.labels), range=list(runs.colours)),
        legend=alt.Legend(symbolLimit=0),  # 0: no limit (Vega-Lite cuts long legends)
    )


def _faded(toggle: Any) -> alt.OpacityValue:
    # A channel object, not `alt.condition`'s plain dict: `encode` turns a dict or a shorthand
    # string into a channel with `from_dict`, which indexes every schema class each call
    # (~10 ms; a second per report). Every encoding here is given as a channel object so.
    return alt.OpacityValue(**alt.condition(toggle, alt.value(1.0), alt.value(0.12)))


def _finish(
    chart: Any,
    chart_id: str,
    datasets: Sequence[str],
    renderer: str = "svg",
    fit: int = 0,
    aspect: bool = False,
) -> Chart:
    # Not validated against the Vega-Lite schema on every build (~1.5 CPU-s on bench): the specs
    # are fixed by this module, and the browser test draws each of them.
    spec = chart.to_dict(validate=False)
    return Chart(chart_id, spec, tuple(datasets), renderer, fit, aspect)


def _unvalidated(build: Callable[P, Chart]) -> Callable[P, Chart]:
    """`build` with altair's check of every object against the Vega-Lite schema as it is made
    turned off (~0.2 CPU-s a report): the specs are fixed by this module, and the browser test
    draws each of them."""

    @functools.wraps(build)
    def unvalidated(*args: P.args, **kwargs: P.kwargs) -> Chart:
        with alt.utils.schemapi.debug_mode(False):
            return build(*args, **kwargs)

    return unvalidated


@_unvalidated
def position_heatmap(chart_id: str) -> Chart:
    """Step × response-position heatmap of mean |δ|, one panel per run (covered tokens only)."""
    chart = (
        alt.Chart(alt.NamedData("by_position"))
        .transform_calculate(positions="datum.position_low + '–' + datum.position_high")
        .mark_rect()
        .encode(
            x=alt.X("rollout_id:O", title="step"),
            y=alt.Y(
                "positions:O",
                title="position (log2 bins)",  # fits a panel's height
                sort=alt.EncodingSortField("position_bucket", order="ascending"),
            ),
            color=alt.Color(
                "mean_abs_lp_diff:Q", title="mean |δ| (nats)", scale=alt.Scale(scheme="viridis")
            ),
            # Run names above each panel, left-aligned: beside it, long names took the width.
            row=alt.Row(
                "run_label:N",
                title=None,
                header=alt.Header(
                    labelOrient="top", labelAngle=0, labelAlign="left", labelAnchor="start"
                ),
            ),
            tooltip=_breakdown_tooltip("positions", "positions"),
        )
        .properties(title="Mean |δ| by step and response position", width=640, height=160)
    )
    return _finish(chart, chart_id, ["by_position"], fit=110)


def _breakdown_tooltip(field: str, title: str) -> list[alt.Tooltip]:
    return [
        alt.Tooltip("run:N"),
        alt.Tooltip("step:N", title="step"),
        alt.Tooltip(f"{field}:N", title=title),
        alt.Tooltip("tokens:Q", title="tokens", format=","),
        alt.Tooltip("mean_abs_lp_diff:Q", title="mean |δ| (nats)", format=".4~g"),
        alt.Tooltip("k3_kl:Q", title="k3 KL (nats)", format=".4~g"),
        alt.Tooltip("k3_share:Q", title="share of the step's k3", format=".1%"),
    ]


def _step_selector(steps: Sequence[int], first: str = ALL_STEPS) -> Any:
    """A step picker over the rows' text `step`; `first` (all steps pooled, or each run's
    latest) is the default, so no run is hidden by a step it lacks."""
    options = [first, *(str(step) for step in sorted(set(steps)))]
    labels = {ALL_STEPS: "all steps", LATEST: "each run's latest"}
    return alt.param(
        name="step",
        value=first,
        bind=alt.binding_select(
            options=options, labels=[labels.get(o, f"step {o}") for o in options], name="step "
        ),
    )


@_unvalidated
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
    """
    toggle = _run_toggle()
    step = _step_selector(steps)
    field, x_title, sort_by = x
    sort = alt.EncodingSortField(sort_by, order="ascending") if sort_by else "ascending"
    chart = (
        alt.Chart(alt.NamedData(dataset))
        .transform_filter(filter_expr)
        .transform_filter(alt.datum.step == step)
        .mark_line(point=True)
        .encode(
            x=alt.X(f"{field}:O", title=x_title, sort=sort),
            y=alt.Y(f"{y}:Q", title=y_title),
            color=_run_color(runs),
            opacity=_faded(toggle),
            tooltip=_breakdown_tooltip(field, x_title),
            **(extra or {}),
        )
        .add_params(toggle, step)
        .properties(title=title, width="container", height=220)
    )
    return _finish(chart, chart_id, [dataset])


@_unvalidated
def histogram(
    runs: RunScale, chart_id: str, steps: Sequence[int], half_width: float, outside: Sequence[str]
) -> Chart:
    """δ distribution of the picked step, a step line per run, log-scale fraction.

    The bins cover ± `half_width` (nats, from the data); `outside` (one line per run: how many
    tokens lie beyond, in the two end bins) is the chart's subtitle.
    """
    toggle = _run_toggle()
    step = _step_selector(steps)
    chart = (
        alt.Chart(alt.NamedData("histogram"))
        .transform_filter(alt.datum.step == step)
        .mark_line(interpolate="step-after", point=alt.OverlayMarkDef(size=12))
        .encode(
            x=alt.X(
                "x_low:Q",
                title=f"δ = train − rollout log-prob (nats, bins of {half_width / 50:.3g})",
            ),
            y=alt.Y(
                "fraction:Q", title="fraction of the step's tokens", scale=alt.Scale(type="log")
            ),
            color=_run_color(runs),
            opacity=_faded(toggle),
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("step:N", title="step"),
                alt.Tooltip("label:N", title="δ bin (nats)"),
                alt.Tooltip("tokens:Q", format=","),
                alt.Tooltip("fraction:Q", format=".3~%"),
            ],
        )
        .add_params(toggle, step)
        .properties(
            title=alt.TitleParams("Histogram of δ (log scale)", subtitle=list(outside)),
            width="container",
            height=240,
        )
    )
    return _finish(chart, chart_id, ["histogram"])


@_unvalidated
def top_tokens(runs: RunScale, chart_id: str, steps: Sequence[int]) -> Chart:
    """The tokens carrying most of the picked step's k3, one bar per run."""
    toggle = _run_toggle()
    step = _step_selector(steps, LATEST)
    chart = (
        alt.Chart(alt.NamedData("top_tokens"))
        .transform_filter(f"{step.name} === '{LATEST}' ? datum.latest : datum.step === {step.name}")
        .mark_bar()
        .encode(
            y=alt.Y("label:N", title="token", sort="-x"),
            yOffset=alt.YOffset("run_label:N"),
            x=alt.X("k3_share:Q", title="share of the step's k3 KL (fraction)"),
            color=_run_color(runs),
            opacity=_faded(toggle),
            tooltip=[
                alt.Tooltip("run:N"),
                alt.Tooltip("rollout_id:Q", title="step"),
                alt.Tooltip("label:N", title="token"),
                alt.Tooltip("token_id:Q", title="token id"),
                alt.Tooltip("tokens:Q", title="occurrences", format=","),
                alt.Tooltip("mean_abs_lp_diff:Q", title="mean |δ| (nats)", format=".4~g"),
                alt.Tooltip("k3_share:Q", title="k3 share", format=".1%"),
            ],
        )
        .add_params(toggle, step)
        .properties(title="Top drifting tokens (by share of k3 KL)", width="container")
    )
    return _finish(chart, chart_id, ["top_tokens"])


@_unvalidated
def strip(chart_id: str, dataset: str, tokens: int, limit: float) -> Chart:
    """One sample's per-token strip: a cell per response token coloured by δ, masked grey.
    Its label is the page's (HTML wraps on a narrow window, a chart title would not).

    `limit` (nats) bounds the colour scale to [-limit, limit], the same for every strip.
    """
    rows = max(1, -(-tokens // STRIP_WIDTH))
    width = min(tokens, STRIP_WIDTH) or 1
    colour = alt.condition(
        "datum.status !== 3",
        alt.value(GREY),
        alt.Color(
            "delta:Q",
            title="δ (nats)",
            scale=alt.Scale(scheme="redblue", reverse=True, domain=[-limit, limit]),
        ),
    )
    chart = (
        alt.Chart(alt.NamedData(dataset))
        .transform_calculate(
            col=f"datum.position % {STRIP_WIDTH}", row=f"floor(datum.position / {STRIP_WIDTH})"
        )
        .transform_calculate(col_end="datum.col + 0.92", row_end="datum.row + 0.92")
        # "show": a masked token (δ null) keeps its cell; the default would drop it.
        .mark_rect(invalid="show")
        .encode(
            x=alt.X("col:Q", axis=None, scale=alt.Scale(domain=[0, width], nice=False)),
            x2=alt.X2("col_end:Q"),
            y=alt.Y(
                "row:Q", axis=None, scale=alt.Scale(domain=[0, rows], reverse=True, nice=False)
            ),
            y2=alt.Y2("row_end:Q"),
            color=colour,
            tooltip=[
                alt.Tooltip("position:Q", title="position"),
                alt.Tooltip("token:N", title="token"),
                alt.Tooltip("train:Q", title="train log-prob (nats)", format=".5~g"),
                alt.Tooltip("rollout:Q", title="rollout log-prob (nats)", format=".5~g"),
                alt.Tooltip("delta:Q", title="δ (nats)", format=".5~g"),
                alt.Tooltip("state:N", title="loss"),
            ],
        )
        .properties(width=width * CELL, height=rows * CELL)
    )
    return _finish(chart, chart_id, [dataset], renderer="canvas", fit=1, aspect=True)
