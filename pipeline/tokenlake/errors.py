"""Typed errors, one class per stage. Each stores the facts and builds its message from them.

The CLI turns any `PipelineError` into one line, ``Error: <message>``, and exit code 1.
"""

from __future__ import annotations

import errno
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path, PurePath
from typing import Any

# The errors `Path.is_file` takes for "no file there" rather than raising.
NO_FILE_ERRNOS = (errno.ENOENT, errno.ENOTDIR, errno.EBADF, errno.ELOOP)

# How many characters of a dump value a message quotes: a 2 MB string must not make a 2 MB
# "one-line" error, and control characters must not rewrite the user's terminal. 60 shows
# any real value (a number, a field name, a dtype) whole and the start of a hostile one.
SHOWN_CHARS = 60
# A path is quoted up to this many characters: the user must find the file, so real paths
# (a dump directory plus a file name) show whole; the bound only stops a hostile name.
SHOWN_PATH_CHARS = 1000
# str() refuses integers over 4 300 digits (sys.int_max_str_digits); stay well below.
_MAX_SHOWN_INT_BITS = 13_000


# What DuckDB raises (a RuntimeError) when a Ctrl-C arrives while it runs a query: it takes
# the signal itself, so Python never raises KeyboardInterrupt there.
DUCKDB_INTERRUPTED = "Query interrupted"


@contextmanager
def ctrl_c_from_duckdb() -> Iterator[None]:
    """Give a Ctrl-C that landed in a DuckDB query back as KeyboardInterrupt, so that no
    catch-all (a step's "one step's bug is one line") takes it for an error and carries on.
    """
    try:
        yield
    except RuntimeError as exc:
        if str(exc) == DUCKDB_INTERRUPTED:
            raise KeyboardInterrupt from exc
        raise


def duckdb_problem(exc: Exception) -> str:
    r"""The first line of a DuckDB error, escaped, as one line of a message: DuckDB adds lines
    of hints (candidate names, `union_by_name`), and a lake's bytes can put control
    characters into what it quotes.

    Examples:
        >>> duckdb_problem(ValueError('Failed to read file "x": bad.\nCandidate names: \x1b'))
        'Failed to read file "x": bad'
    """
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    # It names files, so as long as a path may be; its full stop is the message's to put.
    return shown(lines[0].rstrip("."), SHOWN_PATH_CHARS, literal=False)


def lake_read_error(location: str, reader: str, exc: Exception) -> LakeError:
    """The one line for a DuckDB error while `reader` ("the report", "a query") read the lake
    at `location`: the OS refused a file (the fix: access rights), or its files failed the
    read (damaged, or another program's), and verify names them."""
    problem = duckdb_problem(exc)
    if problem.endswith(": Permission denied"):  # DuckDB's text for EACCES; nothing is damaged
        return LakeError(
            location,
            f"{reader} cannot read it: {problem}; give your user access to the lake's files"
            " (`chmod -R u+rX LAKE`, or `chown` them to your user)",
        )
    return LakeError(
        location,
        f"{reader} cannot read it: {problem}; `tokenlake verify LAKE` names the damaged files",
    )


def shown(value: Any, limit: int = SHOWN_CHARS, *, literal: bool = True) -> str:
    r"""A dump value as a message quotes it: escaped, and cut after `limit` characters.

    The one way tokenlake quotes a value it did not choose (a dump's, a file name, a user's
    argument) in a message. Strings and bytes appear as Python literals, so `'7'` and `7`
    differ and control and unprintable characters are escaped (`\x1b`, `\n`, `\udc80`);
    numbers as they are; containers and other objects by their kind only, since their repr
    can be huge, slow or endlessly recursive. With `literal=False`, for a name the message
    already puts in backticks, a string appears as its text with the same escapes but no
    quotes; a path always does. A cut is marked `…`. Call sites pass a `limit` other than
    `SHOWN_CHARS` only with a comment saying why.

    Examples:
        >>> print(shown("zero"), shown(6.7), shown(None), shown(2**70))
        'zero' 6.7 None 1180591620717411303424
        >>> print(shown("\x1b[2J" + "x" * 70))
        '\x1b[2Jxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'…
        >>> print(shown("run\n'1'\udce9", literal=False), shown("a" * 100, 5, literal=False))
        run\n'1'\udce9 aaaaa…
        >>> from pathlib import Path
        >>> print(shown(Path("dump/x\r.pt")))
        dump/x\r.pt
        >>> import numpy as np
        >>> print(shown([1, [2]]), "/", shown(np.zeros((2, 3))), "/", shown(10**5000))
        a list of 2 entries / a float64 array of shape (2, 3) / an integer of 16610 bits
    """
    # A numpy value exists only once numpy is imported: a command that never needs numpy
    # (`tag`, `query`) does not import it to quote a string.
    np = sys.modules.get("numpy")
    if np is None:
        return _shown_plain(value, limit, literal)
    if isinstance(value, np.generic) and not isinstance(value, np.void):
        value = value.item()  # numpy scalars read like the Python value they hold
    if isinstance(value, np.ndarray):
        return f"{_article(str(value.dtype))} {value.dtype} array of shape {value.shape}"
    return _shown_plain(value, limit, literal)


def _shown_plain(value: Any, limit: int, literal: bool) -> str:
    """`shown` of a value that is no numpy array or scalar."""
    if value is None or isinstance(value, bool | float | complex):
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > _MAX_SHOWN_INT_BITS:
            return f"an integer of {value.bit_length()} bits"
        text = str(value)
        return text if len(text) <= limit else text[:limit] + "…"
    if isinstance(value, PurePath) or (isinstance(value, str) and not literal):
        text = str(value)
        return _escaped(text[:limit]) + ("…" if len(text) > limit else "")
    if isinstance(value, str | bytes | bytearray):
        return repr(value[:limit]) + ("…" if len(value) > limit else "")
    name = type(value).__name__
    if isinstance(value, list | tuple | dict | set | frozenset):
        return f"{_article(name)} {name} of {len(value)} entries"
    return f"{_article(name)} {name}"


def _escaped(text: str) -> str:
    """`text` with each unprintable character escaped as a string literal would show it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeio" else "a"  # "a uint8", "an int64", "an object"


class PipelineError(Exception):
    """Base of every error tokenlake raises on purpose."""


class DumpNotFoundError(PipelineError):
    """The dump directory (or a file in it) does not exist or is not a miles dump."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"`{self.path}` {reason}")


class DumpFileError(PipelineError):
    """A `.pt` file cannot be read: truncated, not a torch file, or still being written."""

    def __init__(self, path: Path | str, reason: str, *, still_writing: bool = False) -> None:
        self.path = str(path)
        self.reason = reason
        self.still_writing = still_writing
        hint = (
            " It was modified less than a minute ago and is probably still being written;"
            " extract again later."
            if still_writing
            else ""
        )
        super().__init__(f"Cannot read `{self.path}`: {reason}.{hint}")


class StepNotReadyError(PipelineError):
    """A step its framework is still writing (prime-rl's step folder without `STABLE`): not
    yet, never read half; extracting again once it is complete picks it up."""

    still_writing = True  # the step's line says "not yet", not "replace the file"

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"`{self.path}` {reason}; extract again once it is there")


class UnsafePickleError(DumpFileError):
    """A pickle references a global outside tokenlake's allow-list; nothing from it was run."""

    def __init__(self, path: Path | str, global_name: str) -> None:
        self.global_name = global_name
        super().__init__(
            path,
            f"its pickle references `{global_name}`, which is not on tokenlake's allow-list"
            " of safe classes (nothing from the file was executed)",
        )


class DumpFormatError(PipelineError):
    """A file loads but its content breaks the dump format (keys, lengths, joins)."""

    def __init__(self, path: Path | str, problem: str, *, sample: str | None = None) -> None:
        self.path = str(path)
        self.problem = problem
        self.sample = sample
        where = f" ({sample})" if sample else ""
        super().__init__(f"`{self.path}`{where}: {problem}")


class SampleValueError(PipelineError):
    """A value of one rollout sample is out of its type or range (dump-format.md 2.3).

    Raised where the value is read, which may not know the file or the sample's position;
    `tokenlake.read.validate.located` turns it into a `DumpFormatError` naming both.
    """

    def __init__(self, field: str, problem: str) -> None:
        self.field = field
        self.problem = problem
        self.position: int | None = None  # batch position, once known
        super().__init__(f"`{field}` {problem}")


class BoundedReadError(PipelineError):
    """A small file tokenlake reads whole (a sidecar, a manifest, a tags file) is not a regular
    file, is larger than its stated limit, or holds JSON nested deeper than its limit; nothing
    of it was used. `size` and `limit` are set when it is too large."""

    def __init__(
        self, path: Path | str, problem: str, *, size: int | None = None, limit: int | None = None
    ) -> None:
        self.path = str(path)
        self.problem = problem
        self.size = size
        self.limit = limit
        super().__init__(f"`{self.path}` {problem}")


class UnreadableError(BoundedReadError):
    """The operating system refused a file or folder: permission denied, missing, a directory
    where a file should be, an I/O error. Its content is not at fault, so the message names
    what the OS said and the fix (access rights, the disk), never "corrupt" or "remove".

    A `BoundedReadError` too: every reader that turns an unreadable small file into a warning
    (a tokenizer, a trajectory, a dashboard file) says this line.

    Examples:
        >>> import errno
        >>> print(UnreadableError("d/1_2.pt", OSError(errno.EACCES, "Permission denied")))
        `d/1_2.pt` cannot be read: permission denied (the OS says: [Errno 13] Permission denied); give your user access: `chmod u+r` on it and `chmod u+x` on each folder above it, or `chown` it to your user
        >>> print(UnreadableError("lake/_manifest", OSError(errno.EIO, "I/O error"), "written"))
        `lake/_manifest` cannot be written: an input/output error (the OS says: [Errno 5] I/O error); check the disk or the network file system it is on (`dmesg`)
    """

    def __init__(self, path: Path | str, exc: OSError, action: str = "read") -> None:
        self.errno = exc.errno
        self.os_said = f"[Errno {exc.errno}] {exc.strerror}" if exc.errno else str(exc)
        self.what, self.fix = _os_problem(exc.errno, action)
        self.action = action
        super().__init__(
            path, f"cannot be {action}: {self.what} (the OS says: {self.os_said}); {self.fix}"
        )


# The OS's refusals of a file or folder whose content is not at fault.
REFUSALS = frozenset(
    {
        errno.EPERM,
        errno.ENOENT,
        errno.EIO,
        errno.EACCES,
        errno.ENOTDIR,
        errno.EISDIR,
        errno.EROFS,
    }
)


def _os_problem(code: int | None, action: str) -> tuple[str, str]:
    """What an OS error number means for a file tokenlake needs, and the fix."""
    if code == errno.EROFS:
        return "its file system is read-only", "give a location on a writable file system"
    if code in (errno.EACCES, errno.EPERM):
        right = "w" if action == "written" else "r"
        folder = action in ("listed", "opened")  # a folder's entries need x as well as r
        fix = f"`chmod u+{right}{'x' if folder else ''}` on it"
        return "permission denied", (
            f"give your user access: {fix} and `chmod u+x` on each folder above it, or `chown`"
            " it to your user"
        )
    if code == errno.ENOENT:
        return "it does not exist", "check the path, and that nothing moves or deletes it meanwhile"
    if code == errno.EISDIR:
        return "it is a directory where a file should be", (
            "put the file back under this name; the directory is not tokenlake's"
        )
    if code == errno.ENOTDIR:
        return "a folder of its path is a file", "put the folder back under that name"
    if code == errno.EIO:
        return (
            "an input/output error",
            "check the disk or the network file system it is on (`dmesg`)",
        )
    return "the operating system refused it", "fix what the OS says"


class LakeError(PipelineError):
    """The lake directory cannot be written or its content is inconsistent."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"Lake `{self.path}`: {problem}")


class CacheError(PipelineError):
    """A folder of tokenlake's cache (`$TOKENLAKE_CACHE`) is not one only the user can write."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"Cache `{self.path}`: {problem}")


class DamagedManifestError(LakeError):
    """A run manifest (`_manifest/<run>.json`) cannot be read as one; `droppable`: its file
    name is a run name, which `drop` and `extract` take (else removing the file is the way out);
    `folder`: it is a folder, which neither replaces (removing it is the way out).
    """

    def __init__(
        self, path: Path | str, problem: str, *, droppable: bool = True, folder: bool = False
    ) -> None:
        self.run = Path(path).stem
        if folder:  # both replace the manifest by a rename, which a folder refuses
            way_out = (
                "It is no file tokenlake wrote, and no tokenlake command replaces it: remove it"
            )
        elif droppable:
            way_out = f"Remove the run with `tokenlake drop LAKE {self.run}` or extract it again"
        else:  # `drop` and `extract` refuse the name: neither is a way out
            way_out = (
                "Its name is no run name tokenlake makes, so no tokenlake command replaces it:"
                " remove the file"
            )
        super().__init__(path, f"manifest is damaged: {problem}. {way_out}")


class InstallError(PipelineError):
    """The installed package lacks a file it reads at run time (a view, a macro, an audit)."""

    def __init__(self, what: str, where: Path | str) -> None:
        self.what = what
        self.where = str(where)
        super().__init__(
            f"This tokenlake installation has no {what} (looked in `{self.where}`): the package"
            " is incomplete. Reinstall it: `pip install --force-reinstall tokenlake`"
        )


class UsageError(PipelineError):
    """An argument is malformed (a step range, a run name)."""


class UnknownRunError(UsageError):
    """A run asked for is not in the lake; `known` are the runs it has, by name."""

    def __init__(self, run: str, known: Sequence[str]) -> None:
        self.run = run
        self.known = tuple(known)
        listed = ", ".join(f"`{shown(name, literal=False)}`" for name in self.known) or "none"
        super().__init__(f"Unknown run `{shown(run, literal=False)}`; the lake has runs: {listed}")


class InternalError(AssertionError):
    """tokenlake broke one of its own rules: a bug in tokenlake, never a fault of the input.

    Deliberately not a `PipelineError`, so nothing presents it as a problem of the user's data
    or lake; an extraction step that raises it is reported as a tokenlake bug
    (`tokenlake.orchestrate.step.bug_text`), and `--debug` shows its traceback.
    """


class RowKeysError(InternalError):
    """Rows built for a table have a key that is not one of its schema's columns, or lack one.

    `pa.Table.from_pylist(rows, schema=...)` would drop the key and fill its column with NULL
    without a word; `tokenlake.schema.table_from_rows` raises this instead.
    """

    def __init__(self, table: str, row: int, unknown: list[str], missing: list[str]) -> None:
        self.table = table
        self.row = row
        self.unknown = unknown
        self.missing = missing
        problems = [
            _listed("unknown key", unknown),
            _listed("missing column", missing),
        ]
        super().__init__(
            f"Row {row} built for table `{table}` does not match the table's schema: "
            + "; ".join(p for p in problems if p)
        )


def _listed(what: str, names: list[str]) -> str:
    """`what` (plural for several) and the names in backticks; empty for no names.

    Examples:
        >>> _listed("missing column", ["a", "b"]), _listed("unknown key", [])
        ('missing columns `a`, `b`', '')
    """
    if not names:
        return ""
    quoted = ", ".join(f"`{shown(name, literal=False)}`" for name in names)
    return f"{what}{'s' if len(names) > 1 else ''} {quoted}"


class OutputError(PipelineError):
    """An output file (e.g. the report) cannot be written."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"Cannot write `{self.path}`: {reason}")
