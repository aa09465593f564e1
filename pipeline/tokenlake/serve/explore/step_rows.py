"""The per-step rows the runs page is pooled from (`data.STEP_COUNTS_SQL`'s and `drift_steps`'),
kept per step identity, so that a new catalog version reads only the steps it has not seen and
a new server on an unchanged lake reads none.

A step's identity digests everything its rows are computed from: its served manifest record
(its files and their footer identities, the rollups' version and settings), its run's framework
(which its reward and drift gate follow), tokenlake's SQL and this code, and the
versions of tokenlake and DuckDB. A re-extracted step has new files, hence a new identity.

`drift_steps` holds each step's change from the run's previous step (window functions over the
run's steps): a step's row read alone has those columns wrong, so they are computed again over
every kept row (`with_windows`, the view's window in Python) each time the rows are put together.

What is kept is also written to the user's private cache, `$TOKENLAKE_CACHE/explorer/<lake>/`
(folders of mode 0700, checked as pipeline/tokenlake/store/private_cache.py checks them), as
one Arrow IPC file of rows: data only, never SQL or code, read without following a link and
only up to `MAX_FILE_BYTES`. A file that cannot be read is ignored (its steps are read again).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import stat
import threading
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenlake import __version__, bounded
from tokenlake.errors import CacheError, LakeError
from tokenlake.serve import rollups
from tokenlake.store.local import atomic_write
from tokenlake.store.private_cache import cache_root, forget_least_used, private_folder

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

    from tokenlake.store import manifest
    from tokenlake.store.base import Store

log = logging.getLogger(__name__)

StepId = tuple[str, int, bool]  # run, rollout_id, evaluation
Row = dict[str, Any]

FOLDER = "explorer"
FILE = "step-rows-1.arrow"  # a new name when what the file holds changes
MAX_FILE_BYTES = 256 * bounded.MiB  # ~1 kB a step: far more steps than any lake has
MAX_LAKES = 64  # lakes whose rows are kept, the ones served last

# `drift_steps`' columns computed over the run's previous step, and the column each is of.
WINDOWED = {
    "prev_rollout_id": "rollout_id",
    "mean_abs_lp_diff_tm_change": "mean_abs_lp_diff_tm",
    "mean_abs_lp_diff_smtm_change": "mean_abs_lp_diff_smtm",
    "k3_kl_change": "k3_kl",
    "mult_prob_error_change": "mult_prob_error",
    "ess_change": "ess",
}


def with_windows(drift: list[Row]) -> list[Row]:
    """`drift_steps`' rows (each read with its own steps only) by run and step, with their
    windowed columns (`WINDOWED`) computed over every row as the view's window computes them:
    the run's previous row, NULL for a run's first, and a difference NULL where either side
    is (IEEE subtraction, as DuckDB's: NaN and infinities alike)."""
    found: list[Row] = []
    for row in sorted(drift, key=lambda row: (row["run"], row["rollout_id"])):
        previous = found[-1] if found and found[-1]["run"] == row["run"] else None
        row = dict(row)
        for column, of in WINDOWED.items():
            before = None if previous is None else previous[of]
            if column == "prev_rollout_id":
                row[column] = before
            else:
                row[column] = None if before is None or row[of] is None else row[of] - before
        found.append(row)
    return found


def step_identities(
    store: Store, records: list[manifest.RunManifest], runs: dict[str, str]
) -> dict[StepId, str]:
    """Each served step's identity (`records`: the manifests as served; `runs`: each run's
    `runs_rows`)."""
    import duckdb

    common = hashlib.blake2b(digest_size=16)
    for part in (FILE, __version__, duckdb.__version__, rollups.rollup_version(), store.location):
        common.update(f"{part}\0".encode("utf-8", "surrogatepass"))
    common.update(Path(__file__).read_bytes())
    common.update((Path(__file__).parent / "data.py").read_bytes())  # STEP_COUNTS_SQL
    found: dict[StepId, str] = {}
    for record in records:
        run = common.copy()
        run.update(json.dumps([record.run, runs.get(record.run)]).encode("utf-8", "surrogatepass"))
        for step in record.steps.values():
            digest = run.copy()
            text = json.dumps(vars(step), sort_keys=True, default=vars)
            digest.update(text.encode("utf-8", "surrogatepass"))
            found[(record.run, step.rollout_id, step.evaluation)] = digest.hexdigest()
    return found


# What of a run's `runs` row a step's identity digests: its framework, the only column of
# `runs` that `drift_steps` and `data.STEP_COUNTS_SQL` read (each extraction writes the row
# again, with the run's new step counts; a test checks that those read no other).
RUNS_ROWS_SQL = "SELECT run, framework FROM runs"


def runs_rows(con: duckdb.DuckDBPyConnection) -> dict[str, str]:
    """Each run's `RUNS_ROWS_SQL` values as text, from the catalog `con` reads."""
    return {str(r[0]): json.dumps(r[1:]) for r in con.execute(RUNS_ROWS_SQL).fetchall()}


@dataclasses.dataclass
class _Read:
    """One step's rows: its `STEP_COUNTS_SQL` row and its `drift_steps` row (windows not yet
    computed). A kept step has a row of counts; its drift row is None when it has none (an
    evaluation step)."""

    counts: Row | None
    drift: Row | None


# Reads the chosen steps' rows: (STEP_COUNTS_SQL's rows, drift_steps' rows), as Arrow tables;
# None chooses every step of the catalog.
Reader = Callable[[Collection[StepId] | None], "tuple[pa.Table, pa.Table]"]


class StepRowsKept:
    """The per-step rows of every step identity a server has read, for all its catalog
    versions; `folder` (None: none) is where they are kept across servers."""

    def __init__(self, folder: Path | None) -> None:
        self._lock = threading.Lock()
        self._folder = folder
        self._loaded = False
        self._rows: dict[str, _Read] = {}
        self._schemas: tuple[pa.Schema, pa.Schema] | None = None

    @classmethod
    def of_lake(cls, store: Store) -> StepRowsKept:
        """Rows kept in the user's cache folder for this lake (none when there is no private
        cache folder)."""
        return cls(lake_folder(store))

    def tables(self, identities: dict[StepId, str], read: Reader) -> tuple[pa.Table, pa.Table]:
        """Every step's `STEP_COUNTS_SQL` row and `drift_steps` row (`with_windows`), each in
        its query's order (by run, step and evaluation), reading with `read` the steps of
        `identities` not kept."""
        with self._lock:
            if not self._loaded:
                self._load()
            missing = {key: name for key, name in identities.items() if name not in self._rows}
            chosen = None if self._schemas is None or len(missing) == len(identities) else missing
            if missing or self._schemas is None:
                counts, drift = read(chosen)
                self._schemas = (counts.schema, drift.schema)
                self._add(missing, counts, drift)
            before = len(self._rows)
            self._rows = {
                name: self._rows[name] for name in identities.values() if name in self._rows
            }
            if missing or len(self._rows) < before:  # steps read, or steps no longer served
                self._save()
            return self._assembled(identities)

    def forget(self, steps: Collection[StepId], identities: dict[StepId, str]) -> None:
        """Drop the kept rows of `steps` (as if they had been extracted again), here and in
        the cache folder."""
        with self._lock:
            if not self._loaded:
                self._load()
            for key in steps:
                self._rows.pop(identities.get(key, ""), None)
            self._save()

    def _add(self, missing: dict[StepId, str], counts: pa.Table, drift: pa.Table) -> None:
        found = {name: _Read(None, None) for name in missing.values()}
        for row in counts.to_pylist():
            name = missing.get((row["run"], row["rollout_id"], row["evaluation"]))
            if name is not None:
                found[name].counts = row
        for row in drift.to_pylist():
            name = missing.get((row["run"], row["rollout_id"], False))
            if name is not None:
                found[name].drift = row
        # A step without a row of counts is not in the catalog read: the manifests were read
        # after it was built, and an extraction landed the step between. Not kept: read again.
        self._rows.update({name: rows for name, rows in found.items() if rows.counts is not None})

    def _assembled(self, identities: dict[StepId, str]) -> tuple[pa.Table, pa.Table]:
        import pyarrow as pa

        assert self._schemas is not None
        kept = [self._rows[name] for name in identities.values() if name in self._rows]
        counted = [r.counts for r in kept if r.counts is not None]
        counted.sort(key=lambda row: (row["run"], row["rollout_id"], row["evaluation"]))
        drift = with_windows([r.drift for r in kept if r.drift is not None])
        return (
            pa.Table.from_pylist(counted, schema=self._schemas[0]),
            pa.Table.from_pylist(drift, schema=self._schemas[1]),
        )

    # --- the copy in the user's cache ------------------------------------------------------

    def _load(self) -> None:
        self._loaded = True
        if self._folder is None:
            return
        try:
            table = _read_file(self._folder / FILE)
        except (OSError, ValueError, CacheError) as exc:
            log.info("the explorer's kept step rows are read again: %s", exc)
            return
        except Exception as exc:  # noqa: BLE001 - pyarrow's own errors: the rows are read again
            log.info("the explorer's kept step rows are read again: %s", exc)
            return
        if table is None:
            return
        import pyarrow as pa

        schemas = tuple(pa.schema(list(table.schema.field(n).type)) for n in ("counts", "drift"))
        self._schemas = (schemas[0], schemas[1])
        for row in table.to_pylist():
            if row["counts"] is not None:  # one without was kept by an older tokenlake (`_add`)
                self._rows[row["step_identity"]] = _Read(row["counts"], row["drift"])

    def _save(self) -> None:
        if self._folder is None or self._schemas is None:
            return
        import pyarrow as pa

        counts, drift = (pa.struct(list(s)) for s in self._schemas)
        table = pa.table(
            {
                "step_identity": pa.array(list(self._rows), pa.string()),
                "counts": pa.array([r.counts for r in self._rows.values()], counts),
                "drift": pa.array([r.drift for r in self._rows.values()], drift),
            }
        )
        try:
            _write_file(self._folder, table)
        except (OSError, LakeError) as exc:
            log.info("the explorer's step rows are not kept: %s", exc)


def lake_folder(store: Store) -> Path | None:
    """This lake's folder in the user's cache (None where there is no private one)."""
    name = hashlib.blake2b(str(store.location).encode("utf-8", "surrogatepass"), digest_size=16)
    try:
        top = private_folder(private_folder(cache_root(), root=True) / FOLDER)
        folder = private_folder(top / name.hexdigest())
        os.utime(folder)  # used now: the lakes used last are the ones kept
        forget_least_used(top, MAX_LAKES)
        return folder
    except (CacheError, OSError) as exc:
        log.info("the explorer's step rows are not kept: %s", exc)
        return None


def _read_file(path: Path) -> pa.Table | None:
    """The kept rows' file (None: there is none), never through a link, at most
    `MAX_FILE_BYTES`."""
    import pyarrow as pa
    import pyarrow.ipc

    try:
        handle = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    with _closing(handle):
        info = os.fstat(handle)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise ValueError(f"{path} is not a file tokenlake wrote")
        if info.st_size > MAX_FILE_BYTES:
            raise ValueError(f"{path} is larger than {MAX_FILE_BYTES} bytes")
        with os.fdopen(os.dup(handle), "rb") as stream:
            raw = stream.read(MAX_FILE_BYTES + 1)
    table = pyarrow.ipc.open_file(pa.BufferReader(raw)).read_all()
    if table.column_names != ["step_identity", "counts", "drift"]:
        raise ValueError(f"{path} does not hold the explorer's step rows")
    return table


@contextmanager
def _closing(handle: int) -> Iterator[int]:
    try:
        yield handle
    finally:
        os.close(handle)


def _write_file(folder: Path, table: pa.Table) -> None:
    """Replace the kept rows' file at once (a reader sees the old one or the new one)."""
    import pyarrow.ipc

    def write(temporary: Path) -> None:
        with pyarrow.ipc.new_file(str(temporary), table.schema) as writer:
            writer.write_table(table)

    atomic_write(folder / FILE, write)
