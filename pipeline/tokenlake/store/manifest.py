"""Per-run manifests: which Parquet files make up the lake, and what they were made from.

`LAKE/_manifest/<run>.json` is the commit point of an extraction. A step's new files are
written under fresh names first; only when the manifest (replaced atomically) lists them do
they become part of the lake. The catalog is built from the manifests, so a crash at any moment
leaves the lake as the last manifest describes it; files no manifest lists are leftovers that
the next extraction deletes. (The leading underscore hides the folder from Hive readers.)
"""

from __future__ import annotations

import hashlib
import json
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenlake import bounded, schema
from tokenlake.errors import (
    SHOWN_PATH_CHARS,
    BoundedReadError,
    DamagedManifestError,
    LakeError,
    shown,
)
from tokenlake.layout import MANIFEST_DIR as MANIFEST_DIR
from tokenlake.layout import (
    check_listed,
    is_run_name,
    manifest_name,
    step_label,
    temporary_owner,
)
from tokenlake.processes import process_alive
from tokenlake.steps import INT64_MAX
from tokenlake.store.base import Store
from tokenlake.store.parquet import IDENTITY

if TYPE_CHECKING:
    import numpy as np
    import pyarrow as pa

MANIFEST_VERSION = 1
# A manifest is ~250 bytes per step: 64 MiB holds ~250 000 steps, more than any run has.
MAX_MANIFEST_BYTES = 64 * bounded.MiB
MAX_MANIFEST_DEPTH = 16  # a manifest nests 4 levels (run, steps, step, sources)
MAX_MANIFEST_INT_DIGITS = 20  # every integer in a manifest fits int64 (19 digits and a sign)
_WHAT = "a run manifest"


@dataclass(frozen=True)
class SourceFile:
    """Identity of a dump file at extraction time (name relative to the dump root)."""

    name: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, root: Path) -> SourceFile:
        stat = path.stat()
        return cls(str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns)


@dataclass
class StepRecord:
    """One extracted rollout file (a train step or an eval file) of a run."""

    rollout_id: int
    evaluation: bool
    sources: list[SourceFile]
    files: dict[str, str]  # table -> path relative to the lake
    samples: int
    tokens: int
    train_files: int
    checksum: str  # blake2b of the token ids and loss masks, in row order
    # The `schema.SCHEMA_VERSION` its files were written with; manifests from before this
    # field existed were all version 1. A step of another version is extracted again.
    schema_version: int = 1
    # What its rollup files (`files`, one per `schema.ROLLUP_TABLES`) were computed with: the
    # digest of tokenlake's SQL (`serve.rollups.rollup_version`; "" for a step without
    # rollups), and per rollup that depends on `drift_settings`, the digest of those settings.
    rollup_version: str = ""
    rollup_settings: dict[str, str] = field(default_factory=dict)
    # What the step's files lacked when it was extracted (`read.completeness`: missing rank
    # files, a short batch), once they had settled; None: complete, or not judged (older
    # manifests).
    incomplete: str | None = None
    # Per table of `files`, the file's size and footer digest as written
    # (`store.parquet.footer_identity`); a step written before this field has none.
    identities: dict[str, str] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return step_label(self.rollout_id, self.evaluation)


@dataclass(frozen=True)
class MetricsSource:
    """How far a metrics stream (name under `DUMP/dashboard/`) has been read.

    `head` is the blake2b of its first `min(offset, HEAD_BYTES)` bytes: a file rewritten
    in place (not only shrunk) no longer matches, and is read again from byte 0.
    """

    offset: int
    head: str
    # The offset lies inside a line skipped as too long (no newline yet): skip on to it.
    inside_long: bool = False


@dataclass
class RunManifest:
    """Everything the lake holds for one run."""

    run: str
    source_dir: str
    steps: dict[str, StepRecord] = field(default_factory=dict)
    runs_file: str | None = None
    vocab_file: str | None = None
    vocab_source: SourceFile | None = None  # the tokenizer file it was built from
    version: int = MANIFEST_VERSION
    # The user's tags (`--tag`, `--meta`, `tokenlake tag`): kept across re-extractions.
    tags: dict[str, str] = field(default_factory=dict)
    # `metrics` files (one per batch of new lines) and how far each stream was read.
    metrics_files: list[str] = field(default_factory=list)
    metrics_sources: dict[str, MetricsSource] = field(default_factory=dict)
    # Per side file listed (`runs`, `vocab`, `metrics`), its identity as written
    # (`store.parquet.footer_identity`); a side file written before this field has none.
    side_identities: dict[str, str] = field(default_factory=dict)
    meta_source: SourceFile | None = None  # the dashboard/meta.json the runs row was made from

    def side_files(self) -> list[str]:
        """The run's side files (`runs`, `vocab`, `metrics`) as listed."""
        return [name for table in schema.SIDE_TABLES for name in self.files(table)]

    def files(self, table: str) -> list[str]:
        """Relative paths of one table's files, in step order."""
        if table == schema.RUNS:
            return [self.runs_file] if self.runs_file else []
        if table == schema.VOCAB:
            return [self.vocab_file] if self.vocab_file else []
        if table == schema.METRICS:
            return list(self.metrics_files)
        ordered = sorted(self.steps.values(), key=lambda s: (s.rollout_id, s.evaluation))
        return [s.files[table] for s in ordered if table in s.files]


def load_manifest(store: Store, run: str) -> RunManifest | None:
    """The run's manifest, or None if the run was never extracted into this lake."""
    name = manifest_name(run)
    if not store.exists(name):
        return None
    return _load(store.label(name), lambda: store.read_bytes(name, MAX_MANIFEST_BYTES, _WHAT))


def load_all(store: Store) -> list[RunManifest]:
    """Every run's manifest, by run name."""
    return [load_listed(store, run) for run in store.manifest_runs()]


def leftovers(store: Store, records: list[RunManifest] | None = None) -> list[str]:
    """Files the naming scheme made that no manifest lists (what an interrupted extraction
    left, or a file it superseded), other than temporaries a running tokenlake still writes.

    Args:
        records: Every run's manifest (`load_all`), if the caller has just loaded them.

    A damaged manifest raises (DamagedManifestError): what it lists is unknown, so nothing
    counts as a leftover then.
    """
    if records is None:
        records = load_all(store)
    listed = {name for r in records for table in schema.LAKE_TABLES for name in r.files(table)}
    made = store.made_files()
    return sorted(name for name in made if name not in listed and not _in_flight(name))


def _in_flight(name: str) -> bool:
    """Whether a lake file is the temporary of a tokenlake process that still runs."""
    owner = temporary_owner(name.rsplit("/", 1)[-1])
    return owner is not None and process_alive(owner)


def load_listed(store: Store, run: str) -> RunManifest:
    """A manifest `manifest_runs` listed (a hand-made bad file name fails in parsing)."""
    name = f"{MANIFEST_DIR}/{run}.json"
    return _load(store.label(name), lambda: store.read_bytes(name, MAX_MANIFEST_BYTES, _WHAT))


def _load(where: str, read: Callable[[], bytes]) -> RunManifest:
    """Parse what `read` returns; a file that is not a regular file, or too large, is a
    damaged manifest."""
    try:
        raw = read()
    except BoundedReadError as exc:
        if exc.problem.startswith("cannot be read"):
            raise LakeError(where, exc.problem) from exc
        folder = exc.problem.startswith(f"is {bounded.kind_of(stat.S_IFDIR)},")
        raise _damaged(where, f"it {exc.problem}", folder=folder) from exc
    parsed = _PARSED.get()
    if parsed is None:
        return parse_manifest(where, raw)
    record = parsed.get((where, raw))
    if record is None:
        record = parsed[(where, raw)] = parse_manifest(where, raw)
    return record


# Within `parsed_once`, each manifest parsed, by its name and its exact bytes.
_PARSED: ContextVar[dict[tuple[str, bytes], RunManifest] | None] = ContextVar(
    "tokenlake_parsed_manifests", default=None
)


@contextmanager
def parsed_once() -> Iterator[None]:
    """Within it, a manifest is parsed once: a load that reads the same bytes again gets the
    record parsed from them (the same object: the caller only reads it). A command that
    reads the manifests in several places (verify: its checks, the leftovers, the catalog's
    digest) parses them once; one whose bytes changed is parsed again."""
    token = _PARSED.set({})
    try:
        yield
    finally:
        _PARSED.reset(token)


def save_manifest(store: Store, manifest: RunManifest) -> None:
    """Replace the run's manifest atomically (temporary file, fsync, rename; one PUT on an
    object store). The identities of side files it no longer lists are dropped from it."""
    listed = set(manifest.side_files())
    manifest.side_identities = {
        name: identity for name, identity in manifest.side_identities.items() if name in listed
    }
    store.put_bytes(
        manifest_name(manifest.run),
        manifest_bytes(manifest),
        durable=True,
        problem="manifest cannot be written",
    )


def manifest_bytes(manifest: RunManifest) -> bytes:
    """The manifest as JSON: its fields one per line in their order, its steps one per line.

    Linear in the manifest's size: each record is encoded by json's C encoder straight from
    the dataclasses' own attributes (no deep copy, no indenting encoder, which is pure Python).
    One line per step keeps the file readable and greppable.
    """
    lines = []
    for name in (f.name for f in fields(RunManifest)):
        if name == "steps":
            steps = ",\n".join(f"  {_json(k)}: {_json(v)}" for k, v in manifest.steps.items())
            lines.append(f' "steps": {{\n{steps}\n }}' if steps else ' "steps": {}')
        else:
            lines.append(f" {_json(name)}: {_json(getattr(manifest, name))}")
    return ("{\n" + ",\n".join(lines) + "\n}").encode("utf-8")


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, default=_dataclass_fields)


def _dataclass_fields(value: Any) -> dict[str, Any]:
    """A manifest's nested records (steps, sources) as JSON objects, their fields in order."""
    if isinstance(value, StepRecord) and value.incomplete is None:
        # a complete step's entry reads as before the field existed
        return {k: v for k, v in vars(value).items() if k != "incomplete"}
    if is_dataclass(value) and not isinstance(value, type):
        return vars(value)
    raise TypeError(f"a manifest holds a {type(value).__name__}, not a JSON value")


class _LongInteger(ValueError):
    def __init__(self, digits: int) -> None:
        self.digits = digits
        super().__init__(f"it holds an integer of {digits:,} digits")


def _manifest_int(text: str) -> int:
    """`parse_int` of a manifest: Python refuses more than 4 300 digits with a ValueError
    that advises `sys.set_int_max_str_digits`; no manifest integer has more than 20."""
    if len(text) > MAX_MANIFEST_INT_DIGITS:
        raise _LongInteger(len(text.lstrip("-")))
    return int(text)


def parse_manifest(where: str, raw: bytes) -> RunManifest:
    """A manifest's bytes (`where` names it in messages)."""
    path = Path(where)
    try:
        data = bounded.loads(raw.decode("utf-8"), MAX_MANIFEST_DEPTH, parse_int=_manifest_int)
    except bounded.JsonTooDeep as exc:
        raise _damaged(where, f"it is {exc}") from exc
    except _LongInteger as exc:
        raise _damaged(where, str(exc)) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise _damaged(where, f"it is not JSON ({exc})") from exc
    if not isinstance(data, dict):
        raise _damaged(where, "it is not a JSON object")
    lone = _lone_surrogate(data) if _SURROGATE_ESCAPE.search(raw) else None
    if lone is not None:
        raise _damaged(where, f"it holds {shown(lone)}, text UTF-8 cannot hold (a lone surrogate)")
    version = data.get("version")
    if isinstance(version, bool) or version != MANIFEST_VERSION:
        raise LakeError(
            where, f"manifest version {shown(data.get('version'))} is not {MANIFEST_VERSION}"
        )
    try:
        return _from_json(path, data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise _damaged(where, _what_is_wrong(exc)) from exc


# JSON's escape of a UTF-16 surrogate: a lone one parses into a str that UTF-8 cannot encode.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _lone_surrogate(value: Any) -> str | None:
    """The first text (key or value) in parsed JSON that UTF-8 cannot encode, or None.
    tokenlake never writes one; every command that digests or writes a manifest encodes it.
    (Parsed JSON is at most `MAX_MANIFEST_DEPTH` deep.)"""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return value
        return None
    parts = [*value.keys(), *value.values()] if isinstance(value, dict) else value
    for part in parts if isinstance(parts, list) else ():
        found = _lone_surrogate(part)
        if found is not None:
            return found
    return None


def _damaged(where: str, problem: str, folder: bool = False) -> DamagedManifestError:
    """The error of a damaged manifest at `where`, with the way out its file name (and kind:
    a `folder`) allows."""
    return DamagedManifestError(
        where, problem, droppable=is_run_name(Path(where).stem), folder=folder
    )


def _what_is_wrong(exc: Exception) -> str:
    if isinstance(exc, KeyError):
        return f"key `{exc.args[0]}` is missing"
    text = str(exc)
    unknown = text.partition("unexpected keyword argument ")[2]
    if unknown:
        return f"key `{unknown.strip(chr(39))}` is unknown"
    missing = text.partition("missing 1 required positional argument: ")[2]
    if missing:
        return f"key `{missing.strip(chr(39))}` is missing"
    if isinstance(exc, ValueError):
        return text
    return f"a value has the wrong type ({text[:120]})"


def _fields(cls: type, data: Any) -> dict[str, Any]:
    """`data` as keyword arguments of a dataclass: a dict with exactly its field names."""
    if not isinstance(data, dict):
        raise TypeError(f"expected an object for {cls.__name__}, got {type(data).__name__}")
    names = _FIELD_NAMES.get(cls)
    if names is None:  # once per class: a manifest has a record per step and per source
        names = _FIELD_NAMES[cls] = frozenset(f.name for f in fields(cls))
    if not names.issuperset(data):
        raise TypeError(f"unexpected keyword argument '{min(set(data) - names)}'")
    return data


_FIELD_NAMES: dict[type, frozenset[str]] = {}


def _object(value: Any, key: str) -> dict[Any, Any]:
    if not isinstance(value, dict):
        raise TypeError(f"`{key}` is not an object")
    return value


def _list(value: Any, key: str) -> list[Any]:
    if not isinstance(value, list):
        raise TypeError(f"`{key}` is not a list")
    return list(value)


def _string_map(value: Any, key: str) -> dict[str, str]:
    items = _object(value, key)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in items.items()):
        raise TypeError(f"`{key}` holds a value that is not a string")
    return dict(items)


def _from_json(path: Path, data: dict[str, Any]) -> RunManifest:
    _fields(RunManifest, data)
    steps = {}
    for key, step in data["steps"].items():
        step = dict(_fields(StepRecord, step))
        sources = [SourceFile(**_fields(SourceFile, s)) for s in step.pop("sources")]
        steps[key] = StepRecord(sources=sources, **step)
        if not isinstance(steps[key].files, dict):
            raise TypeError("`files` is not an object")
        _check_incomplete(steps[key].incomplete)
    vocab_source = data.get("vocab_source")
    meta_source = data.get("meta_source")
    record = RunManifest(
        run=data["run"],
        source_dir=data["source_dir"],
        steps=steps,
        runs_file=data.get("runs_file"),
        vocab_file=data.get("vocab_file"),
        vocab_source=SourceFile(**_fields(SourceFile, vocab_source)) if vocab_source else None,
        version=data["version"],
        meta_source=SourceFile(**_fields(SourceFile, meta_source)) if meta_source else None,
        tags=_string_map(data.get("tags", {}), "tags"),
        metrics_files=_list(data.get("metrics_files", []), "metrics_files"),
        metrics_sources={
            str(name): _metrics_source(name, source)
            for name, source in _object(data.get("metrics_sources", {}), "metrics_sources").items()
        },
        side_identities=_string_map(data.get("side_identities", {}), "side_identities"),
    )
    if not isinstance(record.source_dir, str):  # verify reads it as a place
        raise TypeError("`source_dir` is not a string")
    if record.run != path.stem:
        raise ValueError(f"its `run` is not `{path.stem}`, the name of the file")
    _check_steps(record.steps)
    for name, source in (
        ("vocab_source", record.vocab_source),
        ("meta_source", record.meta_source),
    ):
        if source is not None:
            _check_source(source, f"its `{name}`:")
    _check_own_files(record)
    return record


def _check_whole(value: Any, what: str, low: int = 0) -> None:
    """`value` is an int from `low` to int64's largest, not a bool, float or text
    (ValueError naming `what`): the catalog, `verify` and extraction compare, sort, count and
    write them into int64 columns."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64_MAX:
        raise ValueError(
            f"{what} is {shown(value)}, not a whole number from {low:,} to {INT64_MAX:,}"
        )


def _check_text(value: Any, what: str) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{what} is {shown(value)}, not a text")


def _check_flag(value: Any, what: str) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{what} is {shown(value)}, not true or false")


def _check_steps(steps: dict[str, StepRecord]) -> None:
    """Each step record holds values of the types tokenlake writes, under its own label
    (ValueError): two records of one step, each listing files of its partition, would serve
    its rows twice."""
    keys: dict[str, str] = {}
    for key, step in steps.items():
        shown_key = shown(key, literal=False)
        where = f"its step `{shown_key}`:"
        _check_whole(step.rollout_id, f"{where} `rollout_id`")
        _check_flag(step.evaluation, f"{where} `evaluation`")
        for name in ("samples", "tokens", "train_files", "schema_version"):
            _check_whole(getattr(step, name), f"{where} `{name}`")
        _check_text(step.checksum, f"{where} `checksum`")
        for source in step.sources:
            _check_source(source, f"{where} a source's")
        if step.key in keys:
            raise ValueError(
                f"it lists step `{step.key}` twice (as `{keys[step.key]}` and `{shown_key}`)"
            )
        if key != step.key:
            raise ValueError(f"it lists step `{step.key}` under the key `{shown_key}`")
        keys[step.key] = shown_key


def _check_source(source: SourceFile, where: str) -> None:
    """A dump file's identity holds a name, a size and a modification time (ValueError)."""
    _check_text(source.name, f"{where} `name`")
    _check_whole(source.size, f"{where} `size`")
    _check_whole(source.mtime_ns, f"{where} `mtime_ns`", -INT64_MAX - 1)  # before 1970: < 0


def _metrics_source(name: str, data: Any) -> MetricsSource:
    """A metrics stream's read position, of the types tokenlake writes (ValueError)."""
    source = MetricsSource(**_fields(MetricsSource, data))
    where = f"its `metrics_sources` entry `{shown(name, literal=False)}`:"
    _check_whole(source.offset, f"{where} `offset`")
    _check_text(source.head, f"{where} `head`")
    _check_flag(source.inside_long, f"{where} `inside_long`")
    return source


_DIGEST = re.compile(r"[0-9a-f]{32}")
# What tokenlake writes in a step's `incomplete`: one short line of printable text.
_INCOMPLETE = re.compile(r"[^\x00-\x1f\x7f]{1,500}")


def _check_incomplete(value: Any) -> None:
    """A step's `incomplete` is None or one line tokenlake writes (the catalog quotes it)."""
    if value is not None and not (isinstance(value, str) and _INCOMPLETE.fullmatch(value)):
        raise ValueError(f"a step's `incomplete` is {shown(value)}, not a line of text")


def _check_rollup_keys(step: StepRecord) -> None:
    """A step's rollup digests are what tokenlake writes: hex digests, keyed by rollups
    (ValueError). The catalog writes them into SQL as literals."""
    if not isinstance(step.rollup_version, str) or not (
        step.rollup_version == "" or _DIGEST.fullmatch(step.rollup_version)
    ):
        raise ValueError("a step's `rollup_version` is not a digest")
    settings = _string_map(step.rollup_settings, "rollup_settings")
    for rollup, digest in settings.items():
        if rollup not in schema.ROLLUP_TABLES or not _DIGEST.fullmatch(digest):
            raise ValueError(f"a step's `rollup_settings` holds {shown(rollup)}: {shown(digest)}")


def _check_identities(step: StepRecord) -> None:
    """A step's file identities are what tokenlake writes, keyed by its tables (ValueError)."""
    step_tables = (*schema.STEP_TABLES, *schema.ROLLUP_TABLES)
    for table, identity in _string_map(step.identities, "identities").items():
        if table not in step_tables or not IDENTITY.fullmatch(identity):
            raise ValueError(f"a step's `identities` holds {shown(table)}: {shown(identity)}")


def _check_side_identities(record: RunManifest) -> None:
    """A run's side-file identities are what tokenlake writes, each of a side file it lists
    (ValueError)."""
    listed = set(record.side_files())
    for name, identity in record.side_identities.items():
        if name not in listed or not IDENTITY.fullmatch(identity):
            raise ValueError(f"its `side_identities` holds {shown(name)}: {shown(identity)}")


def _check_own_files(record: RunManifest) -> None:
    """A manifest lists only files of its own run's partitions, each once (ValueError)."""
    listed: list[str] = []
    step_tables = (*schema.STEP_TABLES, *schema.ROLLUP_TABLES)
    for step in record.steps.values():
        _check_rollup_keys(step)
        _check_identities(step)
        for table, name in step.files.items():
            if table not in step_tables:
                raise ValueError(f"a step lists a file for {shown(table)}, not a step table")
            listed.append(check_listed(name, table, record.run, step.rollout_id))
    for table in schema.SIDE_TABLES:
        listed += [check_listed(name, table, record.run) for name in record.files(table)]
    _check_side_identities(record)
    seen: set[str] = set()
    for name in listed:  # the same file twice would count its rows twice
        if name in seen:  # a path: shown whole, as the user must find it
            raise ValueError(f"it lists `{shown(name, SHOWN_PATH_CHARS, literal=False)}` twice")
        seen.add(name)


def tokens_checksum(tokens: pa.Table) -> str:
    """blake2b of token ids and loss masks in row order (nulls as -1); `verify` recomputes it.

    Examples:
        >>> import pyarrow as pa
        >>> mask = pa.chunked_array([pa.array([1, None], pa.int8()), pa.array([5, 0, None], pa.int8())[1:]])
        >>> tokens = pa.table({"token_id": pa.array([7, 8, 9, 10]), "loss_mask": mask})
        >>> expected = hashlib.blake2b(bytes(pa.array([7, 8, 9, 10]).buffers()[1]), digest_size=16)
        >>> expected.update(bytes([1, 255, 0, 255]))  # -1 as int8
        >>> tokens_checksum(tokens) == expected.hexdigest()
        True
    """
    import numpy as np

    digest = hashlib.blake2b(digest_size=16)
    # The arrays' own buffers are hashed (contiguous numpy arrays), never copied to bytes.
    digest.update(np.ascontiguousarray(tokens.column(schema.TOKEN_ID).to_numpy()).data)
    mask = _nulls_as(tokens.column(schema.LOSS_MASK), -1)
    digest.update(np.ascontiguousarray(mask.astype(np.int8, copy=False)).data)
    return digest.hexdigest()


def _nulls_as(column: pa.ChunkedArray, fill: int) -> np.ndarray:
    """The column's values with `fill` for each NULL, as `fill_null(fill).to_numpy()` gives
    them, from each chunk's validity bitmap: `fill_null` imports pyarrow.compute (~50 ms of a
    `verify`)."""
    import numpy as np

    parts = []
    for chunk in column.chunks:
        values = chunk.to_numpy(zero_copy_only=False)
        bitmap = chunk.buffers()[0] if chunk.null_count else None
        if chunk.null_count and bitmap is None:  # a column of the NULL type
            values = np.full(len(chunk), fill)
        elif bitmap is not None:
            bits = np.frombuffer(bitmap, dtype=np.uint8)
            valid = np.unpackbits(bits, bitorder="little")[chunk.offset : chunk.offset + len(chunk)]
            values = np.where(valid.astype(bool), values, fill)
        parts.append(values)
    return np.concatenate(parts) if parts else column.to_numpy()
