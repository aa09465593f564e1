"""Read the miles dashboard telemetry of a dump: `dashboard/meta.json` and the metrics stream.

With `--use-miles-dashboard`, miles' dashboard collector (`miles/dashboard/store.py`) writes

- `DUMP/dashboard/meta.json` once: ``{"run_name", "start_ts" (epoch seconds), "args" (a
  curated subset of the run's arguments), "schema_version": 1}``;
- `DUMP/dashboard/metrics.jsonl`, append-only while the run trains: one tracking payload per
  line, ``{"ts": float, "step_key": str|null, "step": int|null, "metrics": {name: value}}``,
  the same payloads miles logs to W&B. An hourly-partitioned form,
  `dashboard/metrics/YYYYMMDD_HH.jsonl`, is read too (after the flat file, by name).

Both readers are pure (they never write, never raise on bad content) and treat every byte as
attacker-controlled: a malformed file or line becomes one warning naming it, the rest is kept.

What a metrics value becomes (`value` is DOUBLE):

- int and float: kept; NaN, +inf and -inf are kept as such (a NaN `train/grad_norm` is a fact
  about the run, find it with `isnan(value)`); ints beyond 2**53 are rounded to the nearest
  double, ints beyond the double range are skipped and counted.
- bool: 1.0 / 0.0 (as W&B charts them).
- string, null, list, object: skipped and counted (`MetricsRead.skipped`).

A line is refused whole (counted in `bad_lines`, the first few named in `warnings` by byte
offset) when it is not a JSON object, is longer than `MAX_LINE_BYTES`, or its `ts` (finite,
1970..9999), `step_key` (string or null), `step` (int64 or null) or `metrics` (object) has
the wrong type. A half-written last line (no newline yet) is not an error: it is left for a
later read, and the offsets returned point just after the last complete line; once it is
longer than `MAX_LINE_BYTES` it is skipped (one warning) and the offset moves past it, so it is
never read again (`MetricsRead.inside_long`: the rest of it, up to its newline, is skipped too).
One read takes at most `MAX_READ_BYTES` of lines; the caller reads on from the offsets.

Text that UTF-8 cannot hold (a lone surrogate `\\udcff` escape in a metric name, a `step_key`
or meta.json) is stored with U+FFFD in its place, as everywhere in tokenlake.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from tokenlake import bounded, schema
from tokenlake.errors import SHOWN_PATH_CHARS, BoundedReadError, UsageError, shown
from tokenlake.read import prime_rl
from tokenlake.read.dump import Dump
from tokenlake.read.jsontext import clean_text

META_FILE = "meta.json"
METRICS_FILE = "metrics.jsonl"
METRICS_PARTITION_DIR = "metrics"
# prime-rl's FileMonitor stream, `OUTPUT_DIR/metrics.jsonl`, named relative to `dashboard/`
# as every stream is (pipeline/tokenlake/read/prime_rl.py turns its lines into payloads).
PRIME_RL_METRICS = f"../{prime_rl.METRICS_FILE}"
META_SCHEMA_VERSION = 1

MAX_META_BYTES = 1 << 20  # meta.json is a few hundred bytes; anything past 1 MiB is not miles'
MAX_META_DEPTH = 64  # miles' meta.json nests 2 levels
MAX_LINE_BYTES = 1 << 20  # one tracking payload is a few KiB
# Lines taken by one read: its rows (at most ~6 x these bytes of memory, measured with
# `"m1":1` metrics; ~3 x for real payloads) are written to the lake before the next read.
MAX_READ_BYTES = 128 << 20
BATCH_ROWS = 65536  # rows per Arrow batch: bounds the Python objects alive at once
MAX_LINE_WARNINGS = 5  # per file; the rest is one "... more" line
MAX_TS = 253402300800.0  # 10000-01-01: past it a timestamp does not fit TIMESTAMPTZ readers
ARGS_STRING_COLUMNS = (
    schema.WANDB_PROJECT,
    schema.WANDB_GROUP,
    schema.WANDB_RUN_ID,
    schema.HF_CHECKPOINT,
)


def _finite_float(text: str) -> float | None:
    """`parse_float` for meta.json: `1e999` parses to inf, which JSON cannot hold again."""
    value = float(text)
    return value if math.isfinite(value) else None


def _no_constant(_: str) -> None:
    """`parse_constant` for meta.json: NaN and ±Infinity are not JSON; read them as null."""
    return None


def _empty_meta() -> dict[str, Any]:
    return {name: None for name in schema.RUN_META_SCHEMA.names}


def _load_meta(path: Path, dump_root: Path) -> tuple[Any, str | None]:
    """The parsed JSON of meta.json, or the reason it cannot be read."""
    try:
        text = bounded.read_file(path, MAX_META_BYTES, "a dashboard `meta.json`", within=dump_root)
    except BoundedReadError as exc:
        return None, exc.problem
    try:
        return bounded.loads(
            text, MAX_META_DEPTH, parse_float=_finite_float, parse_constant=_no_constant
        ), None
    except bounded.JsonTooDeep as exc:
        return None, f"is {exc}"
    except ValueError as exc:
        return None, f"is not valid JSON ({str(exc).splitlines()[0][:120]})"


def _start_ts(value: Any) -> datetime | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if not 0 <= value < MAX_TS:
        return None
    return datetime.fromtimestamp(value, timezone.utc)


def read_run_meta(dump_root: Path | str) -> tuple[dict[str, Any], list[str]]:
    """The `runs` columns that `DUMP/dashboard/meta.json` fills, and warnings.

    Args:
        dump_root: The `--dump-details` directory (only read).

    Returns:
        A dict with every column of `schema.RUN_META_SCHEMA` except `tags_json` (that one
        comes from the user, see `tokenlake.tags`): `start_ts` (aware UTC datetime),
        `wandb_project`, `wandb_group`, `wandb_run_id`, `hf_checkpoint` (str) and `args_json`
        (the whole `args` object as JSON, keys sorted). Absent file: all None, no warning.
        A malformed file or field: None there, and one warning naming the file.

    Examples:
        >>> read_run_meta("/nonexistent")
        ({'start_ts': None, 'wandb_project': None, 'wandb_group': None, 'wandb_run_id': None, 'hf_checkpoint': None, 'args_json': None}, [])
    """
    path = Dump(Path(dump_root)).dashboard_dir / META_FILE
    meta = _empty_meta()
    del meta[schema.TAGS_JSON]
    if not path.exists() and not path.is_symlink():
        return meta, []
    data, problem = _load_meta(path, Path(dump_root))
    if problem is None and not isinstance(data, dict):
        problem = f"holds a JSON {type(data).__name__}, not an object"
    if problem is not None:
        return meta, [
            f"`{shown(path, SHOWN_PATH_CHARS)}` {problem}; its run metadata is left NULL."
        ]
    return meta, _fill_meta(meta, data, path)


def _fill_meta(meta: dict[str, Any], data: dict[str, Any], path: Path) -> list[str]:
    """Copy the known fields of a parsed meta.json into `meta`; returns the warnings."""
    problems: list[str] = []
    version = data.get("schema_version", META_SCHEMA_VERSION)
    if version != META_SCHEMA_VERSION:
        problems.append(f"`schema_version` is {shown(version)}; read as version 1")
    if "start_ts" in data:
        meta[schema.START_TS] = _start_ts(data["start_ts"])
        if meta[schema.START_TS] is None:
            problems.append("`start_ts` is not epoch seconds; left NULL")
    args = data.get("args", {})
    if not isinstance(args, dict):
        problems.append("`args` is not an object; left NULL")
        args = {}
    for name in ARGS_STRING_COLUMNS:
        value = args.get(name)
        if value is not None and not isinstance(value, str):
            problems.append(f"`args.{name}` is not a string; left NULL")
            value = None
        meta[name] = None if value is None else clean_text(value)
    if "args" in data and isinstance(data["args"], dict):
        meta[schema.ARGS_JSON] = clean_text(json.dumps(args, sort_keys=True, ensure_ascii=False))
    return [f"`{shown(path, SHOWN_PATH_CHARS)}`: {problem}." for problem in problems]


# ---------------------------------------------------------------------------------------------
# metrics.jsonl
# ---------------------------------------------------------------------------------------------


@dataclass
class MetricsRead:
    """What `read_metrics` returns.

    Attributes:
        table: Long-format rows, `schema.METRICS_SCHEMA` (no `run` column: the caller's
            partition adds it).
        skipped: Values that are not numbers (strings, null, lists, objects, out-of-range ints).
        bad_lines: Complete lines refused whole.
        offsets: For each file read (name relative to `dashboard/`), the byte offset just after
            its last complete line: pass it back as `start_offset` to read only newer lines.
        restarted: Files that were shorter than the offset given, so read from byte 0 again
            (the file was replaced; rows read from it before must be dropped).
        warnings: One line per problem, naming the file and byte offset.
        inside_long: Files whose offset lies inside a line skipped as too long (no newline
            yet): pass them back as `inside_long` so that its rest is skipped too.
        more: Files that hold complete lines past their offset that this read left for the
            next (`MAX_READ_BYTES`).
    """

    table: pa.Table
    skipped: int = 0
    bad_lines: int = 0
    offsets: dict[str, int] = field(default_factory=dict)
    restarted: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    inside_long: set[str] = field(default_factory=set)
    more: set[str] = field(default_factory=set)

    @property
    def end_offset(self) -> int:
        """The offset of the one file read (0 if none): the single-file form of `offsets`."""
        return next(iter(self.offsets.values()), 0)


def metrics_files(dump_root: Path | str) -> dict[str, Path]:
    """The dump's metrics streams in reading order, keyed by their name under `dashboard/`.

    The flat `metrics.jsonl` first (miles' layout), then `metrics/*.jsonl` by name (hourly
    partitions `YYYYMMDD_HH.jsonl` sort by time). Only regular files: a device or a FIFO in
    an attacker's dump would never end. A prime-rl run's `metrics.jsonl` (beside its
    `token_exports/`) comes first, as `PRIME_RL_METRICS`.
    """
    root = Dump(Path(dump_root)).dashboard_dir
    found: dict[str, Path] = {}
    prime_rl_metrics = root.parent / prime_rl.METRICS_FILE
    if (root.parent / prime_rl.EXPORT_DIR).is_dir() and prime_rl_metrics.is_file():
        found[PRIME_RL_METRICS] = prime_rl_metrics
    if (root / METRICS_FILE).is_file():
        found[METRICS_FILE] = root / METRICS_FILE
    partitions = root / METRICS_PARTITION_DIR
    if partitions.is_dir():
        for path in sorted(partitions.glob("*.jsonl")):
            if path.is_file():
                found[f"{METRICS_PARTITION_DIR}/{path.name}"] = path
    return found


class _Columns:
    """The rows read so far: Python lists, turned into Arrow every `BATCH_ROWS` rows."""

    def __init__(self) -> None:
        self.batches: list[pa.RecordBatch] = []
        self._clear()

    def _clear(self) -> None:
        self.step_key: list[str | None] = []
        self.step: list[int | None] = []
        self.metric: list[str] = []
        self.value: list[float] = []
        self.ts: list[float] = []

    def add(self, record: dict[str, Any]) -> int:
        """Append the numeric values of one validated record; returns the count skipped."""
        skipped = 0
        key = record.get("step_key")  # absent is null, as `_record_problem` allows
        key = None if key is None else clean_text(key)
        for name, raw in record["metrics"].items():
            value = _as_double(raw)
            if value is None:
                skipped += 1
                continue
            self.step_key.append(key)
            self.step.append(record.get("step"))
            self.metric.append(clean_text(name))
            self.value.append(value)
            self.ts.append(record["ts"])
        if len(self.metric) >= BATCH_ROWS:
            self._flush()
        return skipped

    def _flush(self) -> None:
        micros = np.rint(np.asarray(self.ts, dtype=np.float64) * 1e6).astype(np.int64)
        arrays = [
            pa.array(self.step_key, pa.string()),
            pa.array(self.step, pa.int64()),
            pa.array(self.metric, pa.string()),
            pa.array(self.value, pa.float64()),
            pa.array(micros, pa.timestamp("us", tz="UTC")),
        ]
        self.batches.append(pa.RecordBatch.from_arrays(arrays, schema=schema.METRICS_SCHEMA))
        self._clear()

    def table(self) -> pa.Table:
        if self.metric:
            self._flush()
        return pa.Table.from_batches(self.batches, schema=schema.METRICS_SCHEMA)


def _as_double(raw: Any) -> float | None:
    """The DOUBLE a metrics value becomes, or None when it is skipped (see module docstring)."""
    if isinstance(raw, bool):
        return 1.0 if raw else 0.0
    if isinstance(raw, float):
        return raw
    if isinstance(raw, int):
        try:
            return float(raw)
        except OverflowError:
            return None
    return None


def _record_problem(record: Any) -> str | None:
    """Why a parsed line is not a miles tracking payload, or None if it is one."""
    if not isinstance(record, dict):
        return f"a JSON {type(record).__name__}, not an object"
    ts = record.get("ts")
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts < MAX_TS:
        return "`ts` is not epoch seconds"
    if not isinstance(record.get("step_key"), (str, type(None))):
        return "`step_key` is not a string or null"
    step = record.get("step")
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        return "`step` is not an integer or null"
    if step is not None and not -(2**63) <= step < 2**63:
        return "`step` does not fit int64"
    if not isinstance(record.get("metrics"), dict):
        return "`metrics` is not an object"
    return None


def _take_line(
    line: bytes | None, columns: _Columns, out: MetricsRead, prime: bool = False
) -> str | None:
    """Add one complete line's values to `columns` (`prime`: a line of prime-rl's stream);
    returns why it was refused, if it was."""
    if line is None:
        return f"longer than {MAX_LINE_BYTES} bytes"
    if not line.strip():
        return None  # a blank line carries nothing and harms nothing
    try:
        record = json.loads(line)
    except (ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
        return f"not valid JSON ({str(exc).splitlines()[0][:80]})"
    if prime:
        record = prime_rl.tracking_payload(record)
    problem = _record_problem(record)
    if problem is None:
        out.skipped += columns.add(record)
    return problem


def _read_file(path: Path, name: str, start: int, budget: int, state: _Reading) -> int:
    """Read the complete lines of one metrics file from byte `start` on, at most `budget`
    bytes of them; returns how many bytes were consumed."""
    out, bad, where = state.out, [], shown(path, SHOWN_PATH_CHARS)
    end, resumed = start, name in state.inside_long
    try:
        with bounded.open_regular(path, within=state.dump_root) as handle:
            size = os.fstat(handle.fileno()).st_size  # lines appended meanwhile wait for later
            if start > size:
                out.warnings.append(
                    f"`{where}` is shorter than the {start} bytes read before;"
                    " read again from the start."
                )
                out.restarted.append(name)
                start = end = 0
                resumed = False
            stop = min(size, start + budget)
            for line in bounded.lines(handle, start, stop, MAX_LINE_BYTES, inside_long=resumed):
                if line.text is not None and not line.complete:
                    break  # not written to its end yet (or cut by the budget): a later read
                end = line.end
                if line.text is None and not line.complete:
                    out.inside_long.add(name)  # its rest, when written, is skipped too
                if line.text is None and line.start == start and resumed:
                    continue  # the rest of a line already reported
                problem = _take_line(line.text, state.columns, out, name == PRIME_RL_METRICS)
                if problem:
                    bad.append(f"`{where}` at byte {line.start}: {problem}; line skipped.")
            if end < size and stop < size:
                out.more.add(name)
    except BoundedReadError as exc:
        out.warnings.append(f"`{where}` {exc.problem}; skipped.")
    except OSError as exc:
        out.warnings.append(f"`{where}` cannot be read ({exc.strerror}); skipped.")
    out.offsets[name] = end
    out.bad_lines += len(bad)
    out.warnings.extend(bad[:MAX_LINE_WARNINGS])
    if len(bad) > MAX_LINE_WARNINGS:
        out.warnings.append(f"`{where}`: {len(bad) - MAX_LINE_WARNINGS} more bad lines skipped.")
    return max(0, end - start)


@dataclass
class _Reading:
    """One `read_metrics` call: its rows, its result, and the files it resumes inside a long
    line."""

    columns: _Columns
    out: MetricsRead
    inside_long: Container[str]
    dump_root: Path | None = None  # a link out of it is not read


def read_metrics(
    source: Path | str,
    start_offset: int | Mapping[str, int] = 0,
    inside_long: Container[str] = (),
) -> MetricsRead:
    """The logged metrics of a dump (or of one metrics file) in long format.

    Args:
        source: A `--dump-details` directory (reads `metrics_files(source)`) or one
            `.jsonl` file. Only read.
        start_offset: Where to resume: for a file, a byte offset; for a dump directory, a
            mapping from names under `dashboard/` to offsets (`MetricsRead.offsets` of the
            previous read; files not in it are read from the start).
        inside_long: `MetricsRead.inside_long` of the previous read.

    Returns:
        A `MetricsRead`; an absent source gives an empty table and no warning.

    Raises:
        UsageError: An int `start_offset` other than 0 for a dump directory.

    Examples:
        >>> read_metrics("/nonexistent").table.num_rows
        0
    """
    source = Path(source)
    if source.is_dir():
        files = metrics_files(source)
        if isinstance(start_offset, int) and start_offset != 0:
            raise UsageError(
                f"`start_offset` {start_offset} for the dump directory `{source}`: give a"
                " mapping of file names to offsets (`MetricsRead.offsets`)."
            )
        starts = {} if isinstance(start_offset, int) else dict(start_offset)
    else:
        files = {source.name: source} if source.is_file() else {}
        starts = {source.name: start_offset if isinstance(start_offset, int) else 0}
    state = _Reading(
        _Columns(),
        MetricsRead(schema.METRICS_SCHEMA.empty_table()),
        inside_long,
        source if source.is_dir() else None,
    )
    budget = MAX_READ_BYTES
    for name, path in files.items():
        start = max(0, starts.get(name, 0))
        if budget <= 0:  # the next read goes on from here
            state.out.offsets[name] = start
            state.out.more.add(name)
            if name in inside_long:
                state.out.inside_long.add(name)
            continue
        budget -= _read_file(path, name, start, budget, state)
    state.out.table = state.columns.table()
    return state.out
