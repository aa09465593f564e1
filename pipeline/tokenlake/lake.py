"""The lake, as its user holds it: `tokenlake.Lake`, which every CLI command is a few lines
over, and `tokenlake.open_lake(path)`, a notebook's checked way in.

Reading: SQL through its DuckDB catalog (`.sql`), and the tables as polars
LazyFrames over exactly the Parquet files the run manifests list (`.tokens`, `.samples`,
`.runs`, `.metrics`), never a glob, so leftovers of a crashed extraction are never read. It
takes no lock to read: an extraction may run meanwhile, in this process (`.extract`) or
another one.

Consistency: each call reads the manifests once, so a frame holds the files of one manifest
snapshot per run (the previous extraction's or the new one's, never a mix). An extraction
deletes superseded files only after it has committed the new manifest; a call that finds a
listed file gone reads the manifests again, once. A LazyFrame is lazy: collect it soon, or
call the method again after an extraction (see docs/python.md).

Examples:
    >>> import tempfile
    >>> from pathlib import Path
    >>> import tokenlake
    >>> from tokenlake.generator import synth
    >>> folder = Path(tempfile.mkdtemp())
    >>> synth.write_dump(folder / "dump", synth.PRESETS["example"])
    >>> lake = tokenlake.open_lake(folder / "lake", create=True)
    >>> lake.extract(folder / "dump", run_name="demo", tags={"precision": "fp8"}).counts["new"]
    4
    >>> lake.sql("SELECT count(*) AS n FROM tokens").fetchall()
    [(4079,)]
    >>> step0 = lake.tokens(run="demo", steps=[0], columns=["evaluation", "lp_diff"])
    >>> step0.group_by("evaluation").len().sort("evaluation").collect().rows()  # train, eval
    [(False, 1234), (True, 709)]
    >>> lake.sql("SELECT rollout_id, n_samples FROM step_stats ORDER BY 1").pl().rows()
    [(0, 32), (1, 32), (2, 32)]
    >>> lake.runs().select("run", "tags_json").collect().rows()
    [('demo', '{"precision": "fp8"}')]
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenlake import schema
from tokenlake.errors import LakeError, UnknownRunError, UsageError
from tokenlake.layout import Location
from tokenlake.serve.served import served_records
from tokenlake.steps import StepSelection, as_selection, describe_ids
from tokenlake.store import is_dump, manifest, require_lake, store_at
from tokenlake.store.base import Store

if TYPE_CHECKING:
    import duckdb
    import polars as pl
    import pyarrow as pa

    from tokenlake.orchestrate.extract import ExtractOptions, ExtractSummary
    from tokenlake.orchestrate.follow import FollowState
    from tokenlake.orchestrate.maintain import TagResult, ViewsResult
    from tokenlake.orchestrate.progress import ProgressCallback, Reporter
    from tokenlake.orchestrate.verify import Problem
    from tokenlake.serve.audit import AuditResult
    from tokenlake.serve.report import ReportSummary

log = logging.getLogger(__name__)


def open_lake(location: Location, *, create: bool = False) -> Lake:
    """The lake at `location`, checked: a notebook's way in (and for `.extract`).

    Args:
        location: The lake root (the `--lake` of `tokenlake extract`), or an object-store URL.
        create: Allow a folder that is not a lake yet (its first `.extract` makes it one).

    Raises:
        LakeError: `location` is not a lake (and `create` is false), or is a dump.

    Examples:
        >>> open_lake("/nonexistent/lake")
        Traceback (most recent call last):
        ...
        tokenlake.errors.LakeError: Lake `/nonexistent/lake`: is not a lake: it has no `_manifest/`; run `tokenlake extract` first
    """
    lake = Lake(location)
    if not create or is_dump(lake.store):
        require_lake(lake.store)  # says what the location is instead
    return lake


class Lake:
    """A lake: the one object every `tokenlake` command and a Python user hold.

    Its location is resolved once into a store (`tokenlake.store.store_at`: a directory or
    an object-store prefix), which every operation is handed; nothing is read or checked until
    an operation runs, and each says in its own words what is wrong (`open_lake` checks at
    once). Reading takes no lock; writing (`extract`, `follow`, `drop`, `tag`, `build_views`)
    takes the lake's writer lock while it runs. Use it as a context manager, or `close()` it,
    to release the catalog connection of `sql`.
    """

    def __init__(self, location: Location | Store) -> None:
        self.store = store_at(location)
        self._con: duckdb.DuckDBPyConnection | None = None
        self._con_stamp: object = None

    def __repr__(self) -> str:
        return f"Lake({str(self.store)!r})"

    def __enter__(self) -> Lake:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def root(self) -> Path | str:
        """The lake's absolute path (or its URL on an object store)."""
        return self.store.location

    # --- SQL ---------------------------------------------------------------------------------

    def sql(
        self, query: str, params: Sequence[object] | Mapping[str, object] | None = None
    ) -> duckdb.DuckDBPyRelation:
        """Run SQL against the catalog (every view of docs/views.md, and the user's views),
        with `params` bound to its `?` / `$1` / `$name` placeholders (never pasted in).

        Returns a DuckDB relation: `.pl()` (polars), `.df()` (pandas), `.arrow()`,
        `.fetchall()`. The catalog is opened read-only, and opened again when an extraction
        has replaced it since the last call (relations of earlier calls then stop working:
        run `.sql` again).
        """
        return self._connection().sql(query, params=params)

    def close(self) -> None:
        """Close the catalog connection (the next `.sql` opens it again)."""
        if self._con is not None:
            self._con.close()
        self._con, self._con_stamp = None, None

    def _connection(self) -> duckdb.DuckDBPyConnection:
        from tokenlake.serve import catalog

        stamp = self.store.catalog_stamp()
        if self._con is None or stamp != self._con_stamp:
            self.close()  # one connection per file: DuckDB caches databases by path
            self._con = catalog.connect(self.store)
            self._con_stamp = stamp
        return self._con

    # --- frames ------------------------------------------------------------------------------

    def tokens(
        self,
        run: str | Iterable[str] | None = None,
        steps: str | int | Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pl.LazyFrame:
        """The `tokens` table (train and eval rows) as a polars LazyFrame.

        Args:
            run: One run name, several, or None for every run; a run the lake lacks is an
                `UnknownRunError`, as in the CLI.
            steps: Only these `rollout_id`s (their train and eval files), as `--steps` takes
                them (`"0-9,12"`) or as ints or a range; None for all. A selection of no
                step of the lake is a `UsageError`.
            columns: Only these columns of `tokens` (besides `run`, `rollout_id`, always
                first); None for all.
        """
        return self._frame(schema.TOKENS, run, steps, columns)

    def samples(
        self,
        run: str | Iterable[str] | None = None,
        steps: str | int | Iterable[int] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pl.LazyFrame:
        """The `samples` table as a polars LazyFrame (arguments as in `tokens`)."""
        return self._frame(schema.SAMPLES, run, steps, columns)

    def runs(self) -> pl.LazyFrame:
        """The `runs` table (one row per run) as a polars LazyFrame."""
        return self._frame(schema.RUNS, None, None, None)

    def metrics(self, run: str | Iterable[str] | None = None) -> pl.LazyFrame:
        """The `metrics` table (logged metrics, long format) as a polars LazyFrame."""
        return self._frame(schema.METRICS, run, None, None)

    def _frame(
        self,
        table: str,
        run: object,
        steps: object,
        columns: Sequence[str] | None,
    ) -> pl.LazyFrame:
        runs = self._known_runs(run)
        wanted = as_selection(steps)
        names = _columns(table, columns)
        for _attempt in (1, 2):
            listed = _listed_files(self.store, table, runs, wanted)
            if wanted is not None and wanted.ranges and not listed:  # asked, and none is there
                raise self._no_step_error(wanted, runs)
            if all(self.store.exists(name) for name, _ in listed):
                return self.store.scan(table, listed, names)
            log.info("a listed file vanished (an extraction committed meanwhile); reading again")
        gone = next(name for name, _ in listed if not self.store.exists(name))
        raise LakeError(
            self.store.url(gone), "is listed by its run's manifest but is gone; read again"
        )

    def _known_runs(self, run: object) -> set[str] | None:
        """The runs asked for, each one the lake has (else `UnknownRunError`, as the CLI's)."""
        if run is None:
            return None
        names = [run] if isinstance(run, str) else list(run) if isinstance(run, Iterable) else [run]
        known = self.store.manifest_runs()
        for name in names:
            if not isinstance(name, str) or name not in known:
                raise UnknownRunError(str(name), known)
        return set(names)

    def _no_step_error(self, wanted: StepSelection, runs: set[str] | None) -> UsageError:
        records = [r for r in manifest.load_all(self.store) if runs is None or r.run in runs]
        ids = sorted({s.rollout_id for r in records for s in r.steps.values()})
        return UsageError(
            f"--steps `{wanted}` selects no step of the lake; its steps are {describe_ids(ids)}."
        )

    # --- writing -----------------------------------------------------------------------------

    def extract(
        self,
        dump: Path | str,
        options: ExtractOptions | None = None,
        *,
        progress: ProgressCallback | Reporter | None = None,
        **fields: Any,
    ) -> ExtractSummary:
        """Extract a dump into this lake (`tokenlake extract`): `options`, or its fields by
        name (`run_name`, `steps`, `workers`, `replace`, `tags`, ...: `ExtractOptions`)."""
        self.close()
        with rollup_connection_started():
            from tokenlake.orchestrate.extract import extract_run

        return extract_run(
            _dump_source(dump), self.store, _options(options, fields), progress=progress
        )

    def follow(
        self,
        dump: Path | str,
        options: ExtractOptions | None = None,
        *,
        on_round: Callable[[ExtractSummary], None] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        **fields: Any,
    ) -> FollowState:
        """Follow a live run (`tokenlake extract --follow`): extract each step once complete,
        every `poll_seconds`, until `should_stop()` or Ctrl-C; `on_round` sees each round."""
        from tokenlake.orchestrate.follow import follow_run

        self.close()
        chosen = _options(options, {"follow": True, **fields})
        return follow_run(
            _dump_source(dump), self.store, chosen, on_round=on_round, should_stop=should_stop
        )

    def drop(self, run: str) -> None:
        """Remove one run: its files, its manifest and its rows in every view."""
        from tokenlake.orchestrate.extract import drop_run

        self.close()
        drop_run(self.store, run)

    def tag(
        self,
        run: str,
        set_tags: dict[str, str],
        remove: Sequence[str] = (),
    ) -> TagResult:
        """Set or remove a run's tags without reading its dump (`tokenlake tag`): its tags
        after (`.tags`) and the catalog's warnings (`.warnings`, a skipped user view each)."""
        from tokenlake.orchestrate.maintain import tag_run

        self.close()
        # A string is refused there, not taken as its letters.
        return tag_run(
            self.store, run, set_tags, remove if isinstance(remove, str) else tuple(remove)
        )

    def build_views(self, recompute: bool = False) -> ViewsResult:
        """Compute the rollups steps lack (`recompute`: every step's) from their tokens and
        rebuild `tokenlake.duckdb` from the manifests and the views (`tokenlake views`): the
        catalog's path or URL (`.catalog`), how many steps got new rollups
        (`.rollups_computed`) and one line per skipped user view or step (`.warnings`)."""
        from tokenlake.orchestrate.maintain import rebuild_views

        self.close()
        return rebuild_views(self.store, recompute)

    # --- checking ----------------------------------------------------------------------------

    def verify(self, run: str | None = None, deep: bool = False) -> tuple[int, list[Problem]]:
        """Reconcile the lake with its manifests and dumps (`tokenlake verify`; `deep`: also
        each step's rollups against its tokens): the number of steps checked and the problems
        found."""
        from tokenlake.orchestrate.verify import verify_lake

        return verify_lake(self.store, run, deep)

    def audit(self, settings: Mapping[str, float] | None = None) -> list[AuditResult]:
        """Run the health checks of sql/audits/ (`tokenlake audit`), with `drift_settings`
        overrides."""
        from tokenlake.serve.audit import run_audits

        return run_audits(self.store, settings)

    def report(
        self,
        output: Path,
        runs: Sequence[str] = (),
        steps: Sequence[int] | StepSelection | None = None,
        worst: int = 10,
    ) -> ReportSummary:
        """Write the self-contained HTML report (`tokenlake report`)."""
        from tokenlake.serve.report import build_report

        return build_report(self.store, output, runs, steps, worst)

    def serve(
        self,
        host: str = "127.0.0.1",
        port: int = 8765,
        announce: Callable[[str], None] = print,
    ) -> None:
        """Serve the explorer over this lake (`tokenlake serve`) until Ctrl-C; `announce`
        receives its URL once (with the token when `host` is not a loopback address)."""
        from tokenlake.serve.explore.server import ServeOptions, serve_forever

        serve_forever(self.store, ServeOptions(host=host, port=port), announce)

    def query(self, sql: str, settings: Mapping[str, float] | None = None) -> pa.Table:
        """Run one query with `drift_settings` overrides (`tokenlake query`): an Arrow table."""
        from tokenlake.serve.query import run_query

        return run_query(self.store, sql, settings)

    def query_text(
        self, sql: str, fmt: str = "table", settings: Mapping[str, float] | None = None
    ) -> str | bytes:
        """The query's result as `tokenlake query --format fmt` prints it (`table`, `csv`,
        `json`: text; `parquet`: bytes)."""
        from tokenlake.serve.query import render_query

        return render_query(self.store, sql, fmt, settings)


def _options(options: ExtractOptions | None, fields: Mapping[str, Any]) -> ExtractOptions:
    """`options` with `fields` replaced (a misspelled field is a TypeError), checked."""
    from tokenlake.orchestrate.extract import ExtractOptions

    return dataclasses.replace(options or ExtractOptions(), **fields).check()


@contextlib.contextmanager
def rollup_connection_started() -> Iterator[None]:
    """Start making the connection an extraction computes its rollups with (DuckDB's import
    and the binding of the views they read, ~0.2 s, mostly outside the GIL) while the block
    imports the rest of extraction's code, with a Ctrl-C held until both have imported what
    they need (`rollups.step_connection_imported` says why), then raised."""
    from tokenlake.serve import rollups
    from tokenlake.threads import sigint_held

    with sigint_held():
        rollups.prepare_step_connection()
        yield
        rollups.step_connection_imported()


def _dump_source(dump: Path | str) -> Path | str:
    from tokenlake.read.remote.remote_dump import is_remote

    return dump if is_remote(dump) else Path(dump)  # a Path would fold a URL's `//`


def _columns(table: str, columns: Sequence[str] | None) -> list[str]:
    """The table's file columns to read, checked against the schema (one name: that column,
    not its letters)."""
    names = schema.TABLE_SCHEMAS[table].names
    if columns is None:
        return list(names)
    if isinstance(columns, str):
        columns = [columns]
    unknown = [c for c in columns if c not in names and c not in schema.TABLE_PARTITIONS[table]]
    if unknown:
        raise LakeError(Path(table), f"has no column `{unknown[0]}` (columns: {', '.join(names)})")
    return [c for c in names if c in columns]


def _listed_files(
    store: Store, table: str, runs: set[str] | None, steps: StepSelection | None
) -> list[tuple[str, dict[str, Any]]]:
    """(file relative to the lake, partition values) of every file the manifests list: one
    read of each manifest."""
    listing = None if store.local_catalog is not None else store.reading_filesystem()
    records, unserved = served_records(store, manifest.load_all(store), listing)
    for line in unserved:  # a planted link or a changed file: its step or run, not the lake
        log.warning("%s", line)
    listed: list[tuple[str, dict[str, Any]]] = []
    for record in records:
        if runs is not None and record.run not in runs:
            continue
        if schema.ROLLOUT_ID not in schema.TABLE_PARTITIONS[table]:
            listed += [(n, {schema.RUN: record.run}) for n in record.files(table)]
            continue
        ordered = sorted(record.steps.values(), key=lambda s: (s.rollout_id, s.evaluation))
        for step in ordered:
            if table in step.files and (steps is None or step.rollout_id in steps):
                partition = {schema.RUN: record.run, schema.ROLLOUT_ID: step.rollout_id}
                listed.append((step.files[table], partition))
    return listed
