"""`tokenlake report`: one self-contained HTML page with a lake's health and drift charts.

Reads the catalog's views only (`tokenlake.serve.report_data`), draws with Vega-Lite specs
(`tokenlake.serve.report_charts`) and writes one file that inlines every script and style
(`tokenlake.serve.report_html`). Sections, in order: a per-run summary, runs, audits, reward health per step, drift per
step, where the drift is, worst tokens and samples.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenlake.errors import LakeError, OutputError, UsageError, lake_read_error, shown
from tokenlake.layout import temporary_path
from tokenlake.serve import report_charts as rc
from tokenlake.serve import report_data as rd
from tokenlake.serve import report_html as rh
from tokenlake.serve.query import cache_footers, read_lake
from tokenlake.serve.run_colours import run_colours
from tokenlake.steps import StepSelection, as_selection
from tokenlake.store.base import Store
from tokenlake.store.local import atomic_write
from tokenlake.terminal import plural

if TYPE_CHECKING:
    import duckdb

WORST_SAMPLES = 10  # samples with a per-token strip, per run
TOP_TOKENS = 10  # tokens per step in "Top drifting tokens"
OPEN_STRIPS = 3  # strips of a run shown open; the rest are folded under one line
# What keeps a page under 5 MB at any step count (docs/report.md): the per-step charts show at
# most SERIES_STEPS steps, the charts by step (breakdowns, heatmap, top tokens) at most
# BREAKDOWN_STEPS, evenly spaced over the selected steps, the first and each run's last kept.
SERIES_STEPS = 500
BREAKDOWN_STEPS = 12
# The datasets of each kind (their rows pooled over all steps, `step` = 'all', are all kept).
SERIES_DATASETS = ("step_stats", "eval_reward", "drift_steps")
BREAKDOWN_DATASETS = (
    "by_position", "by_prob", "by_turn", "by_staleness", "by_token_staleness", "histogram",
    "top_tokens",
)  # fmt: skip


@dataclass(frozen=True)
class ReportSummary:
    """What `build_report` wrote."""

    path: Path
    runs: tuple[str, ...]
    size: int  # bytes
    seconds: float


@dataclass
class _Page:
    """The page under construction: section HTML, charts, datasets."""

    sel: rd.Selection
    runs: rc.RunScale
    sections: list[str] = field(default_factory=list)
    charts: list[rc.Chart] = field(default_factory=list)
    strips: list[dict[str, Any]] = field(default_factory=list)
    datasets: dict[str, rd.Rows] = field(default_factory=dict)
    # Per kind ("series", "breakdowns"): (steps shown, steps selected) where some were left out.
    thinned: dict[str, tuple[int, int]] = field(default_factory=dict)

    def add(self, datasets: dict[str, rd.Rows]) -> None:
        """Take `datasets`, their steps thinned to the page's bounds."""
        for kind, names, bound in (
            ("series", SERIES_DATASETS, SERIES_STEPS),
            ("breakdowns", BREAKDOWN_DATASETS, BREAKDOWN_STEPS),
        ):
            thinned = _thin([name for name in names if name in datasets], datasets, bound)
            if thinned is not None:
                self.thinned[kind] = thinned
        self.datasets.update(datasets)

    def chart(self, chart: rc.Chart) -> str:
        self.charts.append(chart)
        return rh.chart_div(chart)


def _thin(names: list[str], datasets: dict[str, rd.Rows], bound: int) -> tuple[int, int] | None:
    """Keep in `datasets[names]` only the rows of `bound` steps spread over theirs, and each
    run's last step ("each run's latest" of the top tokens reads it); rows of no step (pooled
    over all steps) stay. Returns (steps kept, steps there were), or None when all are kept."""
    last: dict[str, int] = {}
    for name in names:
        for row in datasets[name]:
            if row.get("rollout_id") is not None:
                last[row["run"]] = max(last.get(row["run"], row["rollout_id"]), row["rollout_id"])
    steps = sorted({row["rollout_id"] for name in names for row in datasets[name]
                    if row.get("rollout_id") is not None})  # fmt: skip
    kept = set(spread(steps, bound)) | set(last.values())
    if len(kept) == len(steps):
        return None
    for name in names:
        datasets[name] = [row for row in datasets[name]
                          if row.get("rollout_id") is None or row["rollout_id"] in kept]  # fmt: skip
    return len(kept), len(steps)


def spread(steps: Sequence[int], bound: int) -> list[int]:
    """At most `bound` of `steps` (sorted), evenly spaced, the first and the last kept.

    Examples:
        >>> spread(list(range(10)), 4)
        [0, 3, 6, 9]
        >>> spread([2, 5], 4)
        [2, 5]
        >>> spread(list(range(300)), 2)
        [0, 299]
    """
    if len(steps) <= bound:
        return list(steps)
    if bound < 2:
        return list(steps[-bound:]) if bound > 0 else []
    last = len(steps) - 1
    return [steps[round(i * last / (bound - 1))] for i in range(bound)]


def build_report(
    store: Store,
    out: Path,
    runs: Sequence[str] = (),
    steps: Sequence[int] | StepSelection | None = None,
    worst: int = WORST_SAMPLES,
) -> ReportSummary:
    """Write the report of `runs` (default: all) and `steps` (default: all) to `out`.

    `steps` is what `tokenlake.steps.as_selection` takes (step ids, a range, `"0-9,12"`, the
    CLI's lazy `--steps` ranges), matched against the steps the lake has; `runs` run names
    (one name: that run).

    Raises:
        LakeError: The lake has no catalog.
        UsageError: A run is not in the lake.
        OutputError: `out` cannot be written.
    """
    started = time.perf_counter()
    out = Path(out)
    # The Python API's arguments, read as the other calls read them (`--steps` text, one run
    # name), before any work.
    steps = as_selection(steps)
    runs = (runs,) if isinstance(runs, str) else runs
    if isinstance(worst, bool) or not isinstance(worst, int) or worst < 0:
        raise UsageError(f"worst is {shown(worst)}; give a whole number of samples from 0.")
    _check_output(out)
    with ThreadPoolExecutor(max_workers=1) as pool:
        bundle = pool.submit(rh.vega_bundle)  # ~2 s in vl-convert, beside the queries
        page = _collect(store, runs, steps, worst)
        text = rh.page(
            f"tokenlake report: {', '.join(page.sel.runs) or 'no runs'}",
            _header(store, page.sel),
            page.sections,
            _payload(page),
            bundle.result(),
        )

    def write(temporary: Path) -> None:
        temporary.write_text(text, encoding="utf-8")

    try:  # never half a report: written beside `out`, then renamed into place
        atomic_write(out, write)
    except LakeError as exc:
        reason = getattr(exc.__cause__, "strerror", None) or exc.problem
        raise OutputError(out, reason) from exc
    return ReportSummary(out, page.sel.runs, out.stat().st_size, time.perf_counter() - started)


def _check_output(out: Path) -> None:
    """Fail before any work when `out` cannot be written (a directory, a missing or read-only
    folder): a probe file beside it is created and removed."""
    if out.is_dir():
        raise OutputError(out, "it is a directory")
    probe = temporary_path(out.parent)
    try:
        probe.open("w").close()
    except OSError as exc:
        raise OutputError(out, exc.strerror or str(exc)) from exc
    probe.unlink(missing_ok=True)


def _step_ranges(steps: Sequence[int] | StepSelection | None) -> tuple[tuple[int, int], ...] | None:
    """Inclusive ranges from step ids or a `--steps` selection (never expanded: `0-10**10`).

    Examples:
        >>> _step_ranges([3, 1])
        ((1, 1), (3, 3))
    """
    if steps is None:
        return None
    ranges = getattr(steps, "ranges", None)
    if ranges is not None:
        return tuple(ranges)
    return tuple((step, step) for step in sorted(set(steps)))  # type: ignore[arg-type]


def _collect(
    store: Store,
    runs: Sequence[str],
    steps: Sequence[int] | StepSelection | None,
    worst: int,
) -> _Page:
    import duckdb

    def read(con: duckdb.DuckDBPyConnection) -> _Page:
        cache_footers(con)
        return _sections(con, runs, steps, worst)

    try:
        return read_lake(store, read)
    except duckdb.Error as exc:  # the report's own SQL failing is the lake's files failing it
        raise lake_read_error(str(store.location), "the report", exc) from exc


def _sections(
    con: duckdb.DuckDBPyConnection,
    runs: Sequence[str],
    steps: Sequence[int] | StepSelection | None,
    worst: int,
) -> _Page:
    con.execute("SET enable_progress_bar = false")  # no bar on the CLI's terminal
    sel = rd.Selection(rd.resolve_runs(con, runs), _step_ranges(steps))
    rd.require_selected_steps(con, sel, str(as_selection(steps)))
    colours = run_colours(str(run) for (run,) in con.execute("SELECT run FROM runs").fetchall())
    rd.restrict(con, sel)
    rd.cache_views(con)
    labels = rh.short_runs(sel.runs)
    scale = rc.RunScale(tuple(labels[r] for r in sel.runs), tuple(colours[r] for r in sel.runs))
    page = _Page(sel, scale)
    page.sections.append(_summary_section(rd.run_summary(con, sel)))
    page.sections.append(_runs_section(rd.runs_overview(con, sel)))
    page.sections.append(_audits_section(rd.audits(con, sel)))
    page.add(rd.step_datasets(con, sel))
    limits = rd.settings(con)
    page.sections.append(_reward_section(page, limits))
    page.sections.append(_drift_section(page, limits))
    half_width = rd.fit_histogram(con, sel)
    page.add(rd.breakdown_datasets(con, sel))
    page.sections.append(_where_section(page, half_width))
    page.add(rd.worst_tokens(con, sel, TOP_TOKENS))
    samples = rd.worst_samples(con, sel, worst)
    page.sections.append(_worst_section(page, rd.strip_tokens(con, samples)))
    return page


def _header(store: Store, sel: rd.Selection) -> str:
    steps = "all steps" if sel.steps is None else f"steps {_ranges(sel.steps)}"
    now = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return (
        f"<h1>tokenlake report</h1><p>Lake {rh.cell(str(store.location))}; runs "
        f"{rh.cell(', '.join(sel.runs) or 'none')}; {steps}; generated {now}.</p>"
        "<p>δ = train − rollout log-prob of a loss-covered token (nats). Click a legend entry"
        " to pick a run (shift-click for more); hover for values.</p>"
    )


def _ranges(ranges: Sequence[tuple[int, int]]) -> str:
    """`0-3,7` from inclusive step ranges.

    Examples:
        >>> _ranges([(0, 3), (7, 7)])
        '0-3,7'
    """
    parts = [str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges]
    return ",".join(parts) or "none"


def _payload(page: _Page) -> dict[str, Any]:
    used = {name for chart in page.charts for name in chart.datasets}
    labels = rh.short_runs(page.sel.runs)  # what legends show: `run` stays whole for tooltips
    datasets = {
        name: [{**row, "run_label": labels.get(row["run"], row["run"])} for row in rows]
        for name, rows in page.datasets.items()
        if name in used
    }
    return {
        "datasets": datasets,
        "charts": [vars(chart) for chart in page.charts],
        "strips": page.strips,
    }


# The summary table's columns: (heading, `run_summary` column).
SUMMARY_COLUMNS = (
    ("run", "run"),
    ("tokens", "tokens"),
    ("mean |δ| (nats)", "mean_abs_lp_diff"),
    ("k3 KL (nats)", "k3_kl"),
    ("lowest ESS", "ess_min"),
    ("at step", "ess_min_step"),
    ("reward mean", "reward_mean"),
    ("eval reward mean", "eval_reward_mean"),
)
SUMMARY_NOTE = (
    "Over every selected training step: mean |δ| and k3 KL are means over all the steps'"
    " loss-covered tokens (each step's mean weighted by its tokens), ESS is the lowest step's,"
    " rewards are means over all selected samples (training raw reward, eval reward)."
)


def _summary_section(rows: rd.Rows) -> str:
    title = "1. Summary"
    if not rows:
        return rh.section("summary", title, [rh.note("The lake has no runs yet.")])
    table = rh.table(
        [heading for heading, _ in SUMMARY_COLUMNS],
        [[row[column] for _, column in SUMMARY_COLUMNS] for row in rows],
    )
    return rh.section("summary", title, [table, rh.note(SUMMARY_NOTE)])


def _runs_section(rows: rd.Rows) -> str:
    columns = ["run", "steps", "eval_steps", "samples", "tokens", "source_dir", "extracted_at",
               "tool", "schema_version"]  # fmt: skip
    if not rows:
        return rh.section("runs", "2. Runs", [rh.note("The lake has no runs yet.")])
    body = [rh.table(columns, [[row[c] for c in columns] for row in rows])]
    return rh.section("runs", "2. Runs", body)


# How an audit that returned rows is shown, by its severity (as `tokenlake audit` labels it).
_AUDIT_LABELS = {"error": ("fail", "FAIL"), "warning": ("warn", "WARN"), "info": ("info", "INFO")}


def _audits_section(results: list[rd.AuditSection]) -> str:
    failed = [r for r in results if r.count and r.severity == "error"]
    warned = [r for r in results if r.count and r.severity == "warning"]
    body = [
        f'<p class="{"fail" if failed else "pass"}">{len(failed)} of {len(results)} audits '
        f"fail and {len(warned)} warn in the selected runs and steps.</p>"
    ]
    order = {"error": 0, "warning": 1, "info": 2}
    for result in sorted(results, key=lambda r: (r.count == 0, order[r.severity], r.name)):
        css, label = _AUDIT_LABELS[result.severity]
        status = (
            f'<span class="{css}">{label} ({result.count:,} rows)</span>'
            if result.count
            else ('<span class="pass">PASS</span>')
        )
        body.append(
            f'<div class="audit">{status} <code>{rh.cell(result.name)}</code> '
            f"[{result.severity}]: {rh.cell(result.description)}</div>"
        )
        if result.count:
            rows = plural(len(result.rows), "row")
            body.append(rh.folded(rows, [rh.table(result.columns, result.rows)]))
            if result.count > len(result.rows):
                body.append(rh.note(f"First {len(result.rows)} of {result.count:,} rows."))
    return rh.section("audits", "3. Audits", body)


def _has(rows: rd.Rows, column: str) -> bool:
    return any(row.get(column) is not None for row in rows)


def _per_step(page: _Page, chart_id: str, dataset: str, fields: dict[str, str],
              title: str, unit: str, **kwargs: Any) -> str:  # fmt: skip
    if not any(_has(page.datasets[dataset], name) for name in fields):
        return rh.note(f"{title}: no values in the selected runs and steps.")
    threshold = kwargs.pop("threshold", None)
    if threshold is not None and _off_scale(page.datasets[dataset], fields, threshold[0]):
        # A rule far above every value would flatten the lines to the axis: it is named, not drawn.
        title, threshold = f"{title} (alarm at {threshold[0]:.4g}, far above)", None
    rule = threshold[0] if threshold else None
    domain = _flat_domain(_values(page.datasets[dataset], fields), kwargs.get("baseline"), rule)
    return page.chart(
        rc.per_step(
            page.runs,
            chart_id,
            dataset,
            fields,
            title,
            unit,
            threshold=threshold,
            domain=domain,
            **kwargs,
        )  # fmt: skip
    )


def _values(rows: rd.Rows, fields: dict[str, str]) -> list[float]:
    return [row[name] for row in rows for name in fields if row.get(name) is not None]


def _flat_domain(
    values: list[float], baseline: float | None, rule: float | None
) -> tuple[float, float] | None:
    """A y domain for values that are all equal (one eval step, a fraction that stays 0), which
    an axis fitted to them would collapse to a point: from the baseline (default zero) to the
    value, the alarm rule included; one unit wide when that is a point. None when they differ.

    Examples:
        >>> _flat_domain([0.4375], None, None)
        (0.0, 0.4375)
        >>> _flat_domain([0.0, 0.0], 0, 0.2)
        (0.0, 0.2)
        >>> _flat_domain([1.0], 1, None)
        (1.0, 2.0)
        >>> _flat_domain([0.1, 0.2], None, None) is None
        True
    """
    if len(set(values)) != 1:
        return None
    ends = [float(baseline or 0), values[0], *([] if rule is None else [rule])]
    low, high = min(ends), max(ends)
    return (low, high) if high > low else (low, low + 1.0)


# An alarm rule more than this many times the largest value is left out of the chart's scale.
OFF_SCALE = 20.0


def _off_scale(rows: rd.Rows, fields: dict[str, str], threshold: float) -> bool:
    """Whether `threshold` lies far above every finite value of `fields` in `rows`.

    Examples:
        >>> _off_scale([{"k3": 0.001}, {"k3": None}], {"k3": "TM"}, 1.0)
        True
        >>> _off_scale([{"k3": 0.2}], {"k3": "TM"}, 1.0)
        False
    """
    values = [abs(row[name]) for row in rows for name in fields if row.get(name) is not None]
    return bool(values) and threshold > 0 and threshold > OFF_SCALE * max(values)


THINNED = {
    "series": "{selected:,} steps selected: the per-step charts show {shown:,} of them, evenly"
    " spaced (the first and the last kept), so that the page stays small.",
    "breakdowns": "{selected:,} steps selected: the charts by step offer {shown:,} of them,"
    ' evenly spaced (the first and each run\'s last kept); "all steps" pools every selected'
    " step.",
}


def _thinned_note(page: _Page, kind: str) -> list[str]:
    if kind not in page.thinned:
        return []
    shown, selected = page.thinned[kind]
    return [rh.note(THINNED[kind].format(shown=shown, selected=selected))]


def _single_step_note(rows: rd.Rows) -> list[str]:
    steps = {row["rollout_id"] for row in rows}
    if len(steps) == 1:
        return [rh.note("Only one training step: each per-step chart shows single points.")]
    return []


def _reward_section(page: _Page, limits: dict[str, Any]) -> str:
    rows = page.datasets["step_stats"]
    if not rows:
        return rh.section("reward", "4. Reward health per step", [rh.note("No training steps.")])
    charts = [
        _per_step(page, "reward-mean", "step_stats", {"reward_mean": "mean"}, "Reward mean", "reward"),
        _per_step(page, "reward-std", "step_stats", {"reward_std": "std"}, "Reward std", "reward"),
        _per_step(page, "zero-std", "step_stats", {"zero_std_group_frac": "groups"},
                  "Zero-std group fraction", "fraction",
                  threshold=(limits["alarm_zero_std_group_frac"], "alarm")),
        _per_step(page, "truncated", "step_stats", {"truncated_frac": "samples"},
                  "Truncated fraction", "fraction",
                  threshold=(limits["alarm_truncated_frac"], "alarm")),
        _per_step(page, "length", "step_stats", {"response_length_mean": "mean"},
                  "Response length", "tokens"),
    ]  # fmt: skip
    if page.datasets["eval_reward"]:
        charts.append(
            _per_step(
                page,
                "eval-reward",
                "eval_reward",
                {"eval_reward_mean": "eval"},
                "Eval reward mean",
                "reward",
            )  # fmt: skip
        )
    else:
        charts.append(rh.note("Eval reward: no eval files in the selected runs and steps."))
    body = _single_step_note(rows) + _thinned_note(page, "series")
    body += ['<div class="grid">', *charts, "</div>"]
    return rh.section("reward", "4. Reward health per step", body)


def _drift_section(page: _Page, limits: dict[str, Any]) -> str:
    rows = page.datasets["drift_steps"]
    if not _has(rows, "mean_abs_lp_diff_tm"):
        note = rh.note("No loss-covered token with both log-probs: the dump has no drift data.")
        return rh.section("drift", "5. Drift per step", [note])
    charts = [
        _per_step(page, "mean-abs", "drift_steps",
                  {"mean_abs_lp_diff_tm": "TM", "mean_abs_lp_diff_smtm": "SMTM"}, "Mean |δ|",
                  "nats", threshold=(limits["alarm_mean_abs_lp_diff_smtm"], "alarm (SMTM)"),
                  baseline=0),
        _per_step(page, "p99", "drift_steps", {"p99_abs_lp_diff": "p99"}, "p99 |δ|", "nats",
                  baseline=0),
        _per_step(page, "k3", "drift_steps", {"k3_kl": "TM", "k3_kl_smtm": "SMTM"}, "k3 KL",
                  "nats", threshold=(limits["alarm_k3_kl"], "alarm (TM)"), baseline=0),
        # Sequence χ² reaches 1e15 where token χ² is below 1: never one axis for both.
        _per_step(page, "chi2-token", "drift_steps", {"chi2_token": "token"}, "Token χ²",
                  "ratio", baseline=0),
        _per_step(page, "chi2-seq", "drift_steps", {"chi2_seq": "sequence"},
                  "Sequence χ² (symlog scale)", "ratio", baseline=0, scale="symlog"),
        _per_step(page, "ess", "drift_steps", {"ess": "ESS"}, "Effective sample size",
                  "fraction", threshold=(limits["alarm_ess_min"], "alarm (min)"), baseline=0),
        # exp(|δ|) is 1 without drift: the axis starts there.
        _per_step(page, "mult-prob", "drift_steps", {"mult_prob_error": "TM"},
                  "Mean exp(|δ|)", "ratio",
                  threshold=(limits["alarm_mult_prob_error"], "alarm"), baseline=1),
    ]  # fmt: skip
    body = _single_step_note(rows) + _thinned_note(page, "series")
    body += ['<div class="grid">', *charts, "</div>"]
    return rh.section("drift", "5. Drift per step", body + _rejection_charts(page, limits))


# What each rejection rule of drift_steps removes, with the drift_settings it reads.
REJECTION_TEXT = {
    "veto": "a sample with any token r < {veto_min_ratio:g}",
    "outlier": "a token with r outside [{outlier_min_ratio:g}, {outlier_max_ratio:g}]",
    "geo_reject": "a sample with exp(mean δ) outside [{geo_band_low:g}, {geo_band_high:g}]",
    "seq_ratio_reject": "a sample with exp(Σδ) outside [{seq_ratio_low:g}, {seq_ratio_high:g}]",
    "icepop": "a token with r outside [{icepop_low:g}, {icepop_high:g}]",
}
GEO_NOTE = (
    "geo_reject's band is tight by design: a sample's mean δ must stay within about ±{:.2g}"
    " nats, so under ordinary bf16 noise many samples leave it; a high fraction alone is not"
    " an alarm."
)


def _rejection_charts(page: _Page, limits: dict[str, Any]) -> list[str]:
    """One small chart per rejection rule (tokens and samples it removes), each titled by its
    rule, after a line per rule saying what it rejects."""
    lines = [f"{rule}: rejects {REJECTION_TEXT[rule].format(**limits)}." for rule in
             rd.REJECTION_RULES]  # fmt: skip
    band = max(abs(math.log(limits["geo_band_low"])), abs(math.log(limits["geo_band_high"])))
    charts = [
        _per_step(page, f"reject-{rule.replace('_', '-')}", "drift_steps",
                  {f"{rule}_token_frac": "tokens", f"{rule}_seq_frac": "samples"},
                  f"Rejected by {rule}", "fraction", baseline=0)
        for rule in rd.REJECTION_RULES
    ]  # fmt: skip
    return [
        "<h3>Rejected tokens and samples, by rule</h3>",
        '<ul class="rules">', *(f"<li>{rh.cell(line)}</li>" for line in lines), "</ul>",
        rh.note(GEO_NOTE.format(band)),
        '<div class="grid small">', *charts, "</div>",
    ]  # fmt: skip


def _outside(rows: rd.Rows, half_width: float, runs: Sequence[str]) -> list[str]:
    """The histogram's subtitle: per run, the tokens of all the steps beyond ± `half_width`,
    in its end bins; runs by their legend labels (`report_html.short_runs`), lines short
    enough for a phone-width chart.

    Examples:
        >>> rows = [{"run": "a", "step": "all", "bin": -51, "tokens": 2},
        ...         {"run": "a", "step": "all", "bin": 0, "tokens": 1998},
        ...         {"run": "a", "step": "0", "bin": 0, "tokens": 1998}]
        >>> _outside(rows, 0.05, ["a"])
        ['Beyond ±0.05 nats (the end bins), all steps:', 'a: 2 of 2,000 tokens (0.1 %)']
    """
    totals: dict[str, list[int]] = {}
    for row in rows:
        if row["step"] == rd.ALL_STEPS:
            counts = totals.setdefault(row["run"], [0, 0])
            counts[0] += row["tokens"] if row["bin"] in rd.TAIL_BINS else 0
            counts[1] += row["tokens"]
    labels = rh.short_runs(runs)
    return [f"Beyond ±{half_width:g} nats (the end bins), all steps:"] + [
        f"{labels.get(run, run)}: {tail:,} of {plural(total, 'token')} ({100 * tail / total:.3g} %)"
        for run, (tail, total) in totals.items()
    ]


def _where_section(page: _Page, half_width: float) -> str:
    data = page.datasets
    title = "6. Where the drift is"
    if not data["by_position"]:
        return rh.section("where", title, [rh.note("No loss-covered token with both log-probs.")])
    steps = [row["rollout_id"] for row in data["by_position"]]
    body = [
        *_thinned_note(page, "breakdowns"),
        '<div class="wide">', page.chart(rc.position_heatmap("heatmap")), "</div>",
        '<div class="grid">',
        page.chart(rc.by_step_selected(page.runs,
            "by-prob", "by_prob", steps, ("label", "rollout probability", "bucket"),
            "Mean |δ| by rollout probability", "datum.dimension === 'rollout_prob'")),
    ]  # fmt: skip
    if any(row["dimension"] == "entropy" for row in data["by_prob"]):
        body.append(page.chart(rc.by_step_selected(page.runs,
            "by-entropy", "by_prob", steps, ("label", "actor entropy (nats)", "bucket"),
            "Mean |δ| by actor entropy", "datum.dimension === 'entropy'")))  # fmt: skip
    else:
        body.append(rh.note("By entropy: the dump has no entropy."))
    body.append(page.chart(rc.by_step_selected(page.runs,
        "by-turn", "by_turn", steps, ("turn_index", "turn (segment of the response)", None),
        "Mean |δ| by turn")))  # fmt: skip
    body.append(page.chart(rc.by_step_selected(page.runs,
        "by-staleness", "by_staleness", steps, ("staleness", "staleness (steps)", None),
        "Mean |δ| by staleness", extra={"strokeDash": {
            "field": "mixed_version", "title": "mixed version", "type": "nominal"}})))  # fmt: skip
    if data["by_token_staleness"]:  # dumps that say which weights generated each token
        body.append(page.chart(rc.by_step_selected(page.runs,
            "by-token-staleness", "by_token_staleness", steps,
            ("token_staleness", "token staleness (steps behind the weights that generated it)",
             None), "Mean |δ| by token staleness")))  # fmt: skip
    outside = _outside(data["histogram"], half_width, page.sel.runs)
    body += [page.chart(rc.histogram(page.runs, "histogram", steps, half_width, outside)), "</div>"]
    return rh.section("where", title, body)


def _worst_section(page: _Page, strips: list[dict[str, Any]]) -> str:
    title = "7. Worst tokens and samples"
    data = page.datasets
    if not data["top_tokens"]:
        return rh.section("worst", title, [rh.note("No loss-covered token with both log-probs.")])
    steps = [row["rollout_id"] for row in data["top_tokens"]]
    body = [
        '<div class="wide">',
        page.chart(rc.top_tokens(page.runs, "top-tokens", steps)),
        "</div>",
        "<h3>Worst samples by share of their step's Σ|δ|</h3>",
        "<p>A sample's share is its tokens × mean |δ| over the sum of that over its step's"
        " samples: where the step's drift is, so a 1-token sample with a large |δ| does not"
        " lead.</p>",
        "<p>One cell per response token, coloured by δ (blue below 0, red above);"
        ' <span class="legend-grey"></span> grey cells are masked (loss mask 0) or have no'
        " finite log-prob pair. Rows of 100 tokens.</p>",
    ]
    # One colour scale for every strip: ± the largest |δ| among the samples shown.
    limit = max((s["max_abs_lp_diff"] or 0.0 for s in strips), default=0.0) or 1.0
    shown: dict[str, int] = {}
    folded: dict[str, list[str]] = {}
    for index, sample in enumerate(strips):
        strip = _strip(page, index, sample, limit)
        run = sample["run"]
        shown[run] = shown.get(run, 0) + 1
        if shown[run] <= OPEN_STRIPS:
            body.append(strip)
        else:  # a long page otherwise: ten strips for each of many runs
            folded.setdefault(run, []).append(strip)
    for run, more in folded.items():
        summary = f"{plural(len(more), 'more worst sample')} of {run}"
        body.append(rh.folded(summary, more))
    return rh.section("worst", title, body)


def _percent(share: float | None) -> str:
    """A share as a percentage for a label.

    Examples:
        >>> [_percent(0.0321), _percent(1.0), _percent(None)]
        ['3.21 %', '100 %', '— %']
    """
    return "— %" if share is None else f"{100 * share:.3g} %"


def _compact(cells: dict[str, list[Any]]) -> dict[str, list[Any]]:
    """A strip's arrays without the two that say nothing: `position` when it is 0, 1, 2, ...
    (a whole response) and `text` when no token has one (no vocabulary): a fifth of a long
    strip's bytes (report.js reads them as the index and no text).

    Examples:
        >>> _compact({"position": [0, 1], "text": [None, None], "status": [3, 0]})
        {'status': [3, 0]}
        >>> _compact({"position": [0, 2], "text": ["a", None], "status": [3, 0]})
        {'position': [0, 2], 'text': ['a', None], 'status': [3, 0]}
    """
    kept = dict(cells)
    if kept.get("position") == list(range(len(kept.get("position", [])))):
        del kept["position"]
    if all(text is None for text in kept.get("text", [])):
        kept.pop("text", None)
    return kept


def _strip(page: _Page, index: int, sample: dict[str, Any], limit: float) -> str:
    cells = sample["cells"]
    label = (
        f"{sample['run']} · step {sample['rollout_id']} · sample {sample['sample_index']}"
        f" · {_percent(sample['abs_share'])} of the step's Σ|δ|"
        f" · mean |δ| {sample['mean_abs_lp_diff']:.4g} nats over"
        f" {plural(sample['tokens'], 'token')} · {plural(len(cells['position']), 'response token')}"
    )
    chart = rc.strip(f"strip-{index}", f"strip_{index}", len(cells["position"]), limit)
    page.strips.append({**vars(chart), "cells": _compact(cells)})
    keys = " ".join(
        f'data-{name}="{int(sample[key])}"'
        for name, key in (("rollout-id", "rollout_id"), ("batch-position", "batch_position"))
    )
    return (
        f'<div class="card strip-card"><p class="strip-label">{rh.cell(label)}</p>'
        f'<div class="strip" id="{chart.id}" data-run="{rh.cell(sample["run"])}" {keys}></div>'
        "</div>"
    )
