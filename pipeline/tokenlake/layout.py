"""The lake's layout, owned in one place: the only module that names files inside a lake.

What these names look like is described once, for users, in docs/columns.md ("Layout");
tests/store/test_lake.py checks that description against the names made here.

Every local file is written by `store.local.atomic_write` (a temporary name `.tokenlake-<pid>-<hex8>.tmp`
that no other program uses, then `os.replace`), and the sweeps delete only names this scheme
made (`made_here`): a lake may share its folder with other files, and they are never touched.

The stores (pipeline/tokenlake/store/: `LocalStore` for a directory, `ObjectStore` for an
object-store URL, both implementing `store.base.Store`) turn these names into storage; modules
outside them use only relative names (`new_name`, `manifest_name`) and the store's methods.
"""

from __future__ import annotations

import os
import re
import secrets
from pathlib import Path

from tokenlake import schema
from tokenlake.errors import SHOWN_PATH_CHARS, UsageError, shown

# Where a lake is, as a user gives it: a directory, or an object-store URL (`s3://bucket/lake`).
Location = Path | str

MANIFEST_DIR = "_manifest"
USER_VIEWS_DIR = "views"
LOCK_FILE = ".tokenlake.lock"
CATALOG_FILE = "tokenlake.duckdb"
# The folder of a miles or slime dump's rollouts: a location holding it is a dump, never a lake.
ROLLOUT_DIR = "rollout_data"
# A run name is a file name (`<run>.json`, `run=<run>`); most file systems hold 255 bytes.
MAX_RUN_NAME_BYTES = 250

_FORBIDDEN_IN_RUN_NAME = re.compile(r"[/\\=%\x00-\x1f\x7f]")
# DuckDB expands these in a file path (a glob), so a run name holding one reads other files.
_GLOB_CHARACTERS = re.compile(r"[?*\[\]{}]")
# What `new_file` names, and temporary names of `atomic_write` (DuckDB adds `.wal`): ASCII digits
# only, and `\Z`, not `$` (which also matches before a final newline, a name tokenlake never makes).
_DATA_FILE = re.compile(r"^(?:train|eval|run|vocab|metrics)(?:-[0-9a-f]{8})?\.parquet\Z")
_TEMPORARY = re.compile(r"^\.tokenlake-([0-9]+)-[0-9a-f]{8}\.tmp(?:\.wal)?\Z")
# A step id as partition_dir writes it (`str` of an int from 0): no sign, no leading zero.
_STEP_FOLDER = re.compile(rf"^{schema.ROLLOUT_ID}=(?:0|[1-9][0-9]*)\Z")


def is_run_name(name: str) -> bool:
    """Whether `check_run_name` takes `name`.

    Examples:
        >>> is_run_name("grpo"), is_run_name("x*y")
        (True, False)
    """
    try:
        check_run_name(name)
    except UsageError:
        return False
    return True


def check_run_name(name: str) -> str:
    """The one validation of a run name, for every command that takes one.

    A run name becomes a directory (`run=<name>`) and a file name (`<name>.json`), and
    appears in file paths DuckDB reads; quotes, spaces and unicode are fine.

    Examples:
        >>> check_run_name("qwen 'grpo' ü")
        "qwen 'grpo' ü"
    """
    if not isinstance(name, str):  # the Python API's argument
        raise UsageError(f"Run name {shown(name)} is not a string.")
    quoted = shown(name, literal=False)
    if not name or name.startswith(".") or _FORBIDDEN_IN_RUN_NAME.search(name):
        raise UsageError(
            f"Run name `{quoted}` cannot be a partition directory: it must be non-empty,"
            " not start with `.`, and contain no `/`, `\\`, `=`, `%` or control characters."
            " Choose another with --run-name."
        )
    glob = _GLOB_CHARACTERS.search(name)
    if glob:
        raise UsageError(
            f"Run name `{quoted}` holds `{glob.group()}`, which DuckDB reads as a file"
            " pattern (`? * [ ] { }` are not allowed). Choose another with --run-name."
        )
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a directory name in another encoding (surrogate escapes)
        raise UsageError(
            f"Run name `{quoted}` is not valid UTF-8 (the dump directory's name is in"
            " another encoding). Choose another with --run-name."
        ) from None
    if size > MAX_RUN_NAME_BYTES:
        raise UsageError(
            f"Run name `{quoted}` is {size} bytes long; the limit is"
            f" {MAX_RUN_NAME_BYTES} bytes (UTF-8), as it becomes a file name."
            " Choose another with --run-name."
        )
    return name


def temporary_path(folder: Path) -> Path:
    """A temporary name in `folder` that is unmistakably tokenlake's."""
    return folder / f".tokenlake-{os.getpid()}-{secrets.token_hex(4)}.tmp"


def table_dir(table: str) -> str:
    """Relative directory of a table: its name, or `rollups/<name>` for a rollup.

    Examples:
        >>> table_dir("tokens"), table_dir("drift_step_parts")
        ('tokens', 'rollups/drift_step_parts')
    """
    return f"{schema.ROLLUP_DIR}/{table}" if table in schema.ROLLUP_TABLES else table


def table_dir_parts(table: str) -> tuple[str, ...]:
    """`table_dir` as path parts."""
    return tuple(table_dir(table).split("/"))


# The lake's own top-level folders: nothing else at the top is tokenlake's.
TOP_LEVEL_DIRS = (*schema.TABLES, schema.ROLLUP_DIR, MANIFEST_DIR)


def partition_dir(table: str, run: str, rollout_id: int | None = None) -> str:
    """Relative directory of one partition.

    Examples:
        >>> partition_dir("tokens", "qwen", 3)
        'tokens/run=qwen/rollout_id=3'
        >>> partition_dir("runs", "qwen")
        'runs/run=qwen'
        >>> partition_dir("drift_step_parts", "qwen", 3)
        'rollups/drift_step_parts/run=qwen/rollout_id=3'
    """
    if schema.ROLLOUT_ID not in schema.TABLE_PARTITIONS[table]:
        return f"{table_dir(table)}/{schema.RUN}={run}"
    return f"{table_dir(table)}/{schema.RUN}={run}/{schema.ROLLOUT_ID}={rollout_id}"


def partition_patterns(table: str) -> dict[str, str]:
    """Partition column -> regular expression whose group 1 is its value in a file's path.

    Anchored at the path's end, on the lake's own layout only: the lake's location may hold
    `key=value` folders too (`/data/run=ghost/lake`), which must not count.

    Examples:
        >>> import re
        >>> path = "/x/run=ghost/lake/tokens/run=qwen/rollout_id=7/train-0a1b2c3d.parquet"
        >>> [re.search(p, path).group(1) for p in partition_patterns("tokens").values()]
        ['qwen', '7']
    """
    columns = schema.TABLE_PARTITIONS[table]
    segments = [f"{col}=([^/]*)" for col in columns]
    patterns = {}
    for i, col in enumerate(columns):
        parts = [
            seg if j == i else seg.replace("([^/]*)", "[^/]*") for j, seg in enumerate(segments)
        ]
        patterns[col] = "/" + "/".join(parts) + "/[^/]*$"
    return patterns


_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def is_url(location: Location) -> bool:
    """Whether a lake location names an object store (`s3://b/p`), not a local directory.

    `file://` URLs and plain paths are local.

    Examples:
        >>> is_url("s3://bucket/lake"), is_url("file:///tmp/lake"), is_url("lake")
        (True, False, False)
    """
    match = _URL.match(str(location)) if isinstance(location, str) else None
    return match is not None and match.group(1).lower() != "file"


def local_path(location: Location) -> Path:
    """A local lake location as a Path (`file:///x` is `/x`)."""
    text = str(location)
    return Path(text[len("file://") :] if text.lower().startswith("file://") else text)


def step_label(rollout_id: int, evaluation: bool) -> str:
    """`eval_3` or `3`: how a step is named in file names, the manifest and messages."""
    return f"eval_{rollout_id}" if evaluation else str(rollout_id)


def manifest_name(run: str) -> str:
    """Relative name of a run's manifest (the commit point)."""
    return f"{MANIFEST_DIR}/{check_run_name(run)}.json"


def new_name(
    table: str, run: str, stem: str, rollout_id: int | None = None, generation: str | None = None
) -> str:
    """A fresh relative file name in a partition (the manifest decides when it counts).

    `generation` (8 hex digits) names the files of one step alike; default: a new one.
    """
    folder = partition_dir(table, check_run_name(run), rollout_id)
    return f"{folder}/{stem}-{generation or secrets.token_hex(4)}.parquet"


def check_listed(name: object, table: str, run: str, rollout_id: int | None = None) -> str:
    """A file name as a manifest of `run` lists it for `table`, or ValueError unless it is a
    name `new_name` makes in that run's own partition (the step's, for tokens and samples).

    A manifest is shared storage: one that lists another run's file would double its rows,
    and one that lists a path outside the lake would make readers open it.

    Examples:
        >>> check_listed("tokens/run=a/rollout_id=3/train-0a1b2c3d.parquet", "tokens", "a", 3)
        'tokens/run=a/rollout_id=3/train-0a1b2c3d.parquet'
        >>> check_listed("tokens/run=b/rollout_id=3/train-0a1b2c3d.parquet", "tokens", "a", 3)
        Traceback (most recent call last):
        ...
        ValueError: it lists `tokens/run=b/rollout_id=3/train-0a1b2c3d.parquet` for `tokens`, which is not a file of this run's partition `tokens/run=a/rollout_id=3`
    """
    check_relative(name)
    assert isinstance(name, str)
    folder = partition_dir(table, run, rollout_id)
    folder_of, _, file_name = name.rpartition("/")
    if folder_of != folder or not _DATA_FILE.match(file_name):
        # Path-length limits: the user must see which file and which partition.
        raise ValueError(
            f"it lists `{shown(name, SHOWN_PATH_CHARS, literal=False)}` for `{table}`, which is"
            f" not a file of this run's partition `{shown(folder, SHOWN_PATH_CHARS, literal=False)}`"
        )
    return name


def check_relative(relative: object) -> str:
    """A file name as a manifest lists it, or ValueError if it lies outside the lake.

    Examples:
        >>> check_relative("tokens/run=a/rollout_id=3/train-0a1b2c3d.parquet")
        'tokens/run=a/rollout_id=3/train-0a1b2c3d.parquet'
        >>> check_relative("tokens/../../etc/passwd")
        Traceback (most recent call last):
        ...
        ValueError: it lists `tokens/../../etc/passwd`, which lies outside the lake
        >>> check_relative("/etc/passwd")
        Traceback (most recent call last):
        ...
        ValueError: it lists `/etc/passwd`, which lies outside the lake
    """
    # As text, not a Path: every reader checks every listed file, and pathlib cost most of it.
    # An absolute path starts with `/`; `..` is a part of the path as it is of its Path's parts.
    if isinstance(relative, str) and not relative.startswith("/"):
        if ".." not in relative.split("/"):
            return relative
    raise ValueError(f"it lists `{str(relative)[:80]}`, which lies outside the lake")


def relative_parts(relative: str) -> list[str]:
    """The folders and file of a name `check_relative` accepted, as `PurePosixPath.parts`
    gives them (no empty part, no `.`), without building a path.

    Examples:
        >>> relative_parts("tokens//run=a/./x.parquet")
        ['tokens', 'run=a', 'x.parquet']
    """
    return [part for part in relative.split("/") if part and part != "."]


def is_data_file(name: str) -> bool:
    """Whether a file name in a partition is one `new_name` makes."""
    return bool(_DATA_FILE.match(name))


def is_run_folder(name: str) -> bool:
    """Whether a folder name in a table's folder is one `partition_dir` makes for a run
    (`run=<name>`).

    Examples:
        >>> is_run_folder("run=qwen"), is_run_folder("qwen")
        (True, False)
    """
    return name.startswith(f"{schema.RUN}=")


def is_partition_folder(name: str) -> bool:
    """Whether a folder name is one `partition_dir` makes below a run's folder
    (`rollout_id=<n>`): the only folders a sweep enters or removes there.

    Examples:
        >>> is_partition_folder("rollout_id=12"), is_partition_folder("backup")
        (True, False)
    """
    return bool(_STEP_FOLDER.match(name))


def made_here(name: str) -> bool:
    """Whether a file name in a partition is one this scheme makes (data or temporary)."""
    return bool(_DATA_FILE.match(name) or _TEMPORARY.match(name))


def temporary_owner(name: str) -> int | None:
    """The pid in one of tokenlake's temporary names, else None."""
    match = _TEMPORARY.match(name)
    return int(match.group(1)) if match else None
