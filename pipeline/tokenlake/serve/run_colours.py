"""One colour per run, the same on every chart of the report and of the explorer.

A run's colour is fixed by its place among all the runs of the lake, sorted by name, so it
does not change with the runs a page or a report selects, nor from one chart to the next:
the report writes it into every chart's colour scale, the explorer's server hands it to the
page. Twenty colours (Vega's tableau10, then ten more of tableau20 and category20b); a lake
of more runs uses them again from the start.
"""

from __future__ import annotations

from collections.abc import Iterable

PALETTE = (
    "#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2", "#b279a2", "#eeca3b", "#9d755d",
    "#ff9da6", "#bab0ac", "#1f77b4", "#8c564b", "#17becf", "#bcbd22", "#7f7f7f", "#d62728",
    "#2ca02c", "#9467bd", "#e377c2", "#393b79",
)  # fmt: skip


def run_colours(lake_runs: Iterable[str]) -> dict[str, str]:
    """Each run's colour, from every run of the lake (not only the ones shown).

    Examples:
        >>> run_colours(["b", "a"])
        {'a': '#4c78a8', 'b': '#f58518'}
        >>> run_colours(f"r{i:02d}" for i in range(21))["r20"] == PALETTE[0]
        True
    """
    return {run: PALETTE[i % len(PALETTE)] for i, run in enumerate(sorted(set(lake_runs)))}
