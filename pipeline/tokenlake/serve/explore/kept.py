"""What the explorer's pages reuse, read once per catalog version (by `data.kept_rows`):
every run, every step, the one-row-per-step views `step_stats` and `drift_steps` (whole, and
as the run-over-steps page charts them, with each eval step's reward), the runs page's rows
(pooled from the per-step rows: `RunLevel`, read by the first runs page alone) and the served
manifests that say where each step's files are.

`drift_steps` holds each step's change from the run's previous step (window functions over
the run's steps), so a filter on one step cannot reach its files before the windows: read for
one step it costs what the whole lake's read costs. Read once, a step page picks its row from
memory. A new catalog version (an extraction committed a step) is read again, but for the
per-step rows the runs page pools (`drift_steps`' and the step counts), which `step_rows`
keeps per step identity and reads for the new steps only. What is kept is one row per step
(and per prompt group), so it grows with the lake's steps and groups, never with its tokens.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from tokenlake.store import manifest

T = TypeVar("T")
Row = dict[str, Any]
StepKey = tuple[str, int]


@dataclass(frozen=True)
class RunLevel:
    """One catalog version's runs page (`data.runs_page`) and the per-step rows it is pooled
    from: read by its first runs page, which needs no more; `Kept` reuses them."""

    runs: tuple[str, ...]  # sorted: the order that gives each run its colour
    step_counts: list[Row]  # per step: its samples and reward sums (`data.STEP_COUNTS_SQL`)
    drift_steps: list[Row]
    run_rows: list[Row]  # the runs page's runs, without their audits


@dataclass(frozen=True)
class Kept:
    """One catalog version's runs, steps and per-step rows."""

    runs: tuple[str, ...]  # sorted: the order that gives each run its colour
    steps: dict[str, list[Row]]  # run -> its steps as {rollout_id, evaluation}, in order
    step_stats: dict[StepKey, Row]
    drift_steps: dict[StepKey, Row]
    # (run, step, evaluation) -> the step's `group_stats` rows by group_index (a step has
    # at most as many groups as samples).
    groups: dict[tuple[str, int, bool], list[Row]]
    # The run-over-steps page's datasets (`report_data.step_datasets`) of every run, each
    # list ordered by run then step: a page picks its runs' rows.
    step_datasets: dict[str, list[Row]]
    # The manifests as served (`serve.served`): where each step's files are, for a page that
    # reads one step's files only (`catalog.step_view_queries`).
    records: list[manifest.RunManifest]
    # The views and macros the step page reads, through every one they read
    # (`data.step_page_tables`): the one-step TEMP views it needs are of these.
    step_tables: frozenset[str]
    # Per rollup that depends on `drift_settings`, the digest of the catalog's (the pages'
    # cursors never change them): a one-step TEMP view of a rollup computed under those reads
    # its file without the fallback to the tokens (`rollups.catalog_views`).
    settings_digests: dict[str, str]


class KeptByVersion(Generic[T]):
    """What `reader` reads of the latest catalog version asked for (a `Kept`, a `RunLevel`),
    read by the first request of that version; requests that arrive while it is read wait for
    it rather than read it again."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._kept: tuple[int, T] | None = None

    def get(self, version: int, reader: Callable[[], T]) -> T:
        with self._lock:
            if self._kept is not None and version < self._kept[0]:
                return reader()  # a request that began before the catalog changed
            if self._kept is None or version > self._kept[0]:
                self._kept = (version, reader())
            return self._kept[1]
