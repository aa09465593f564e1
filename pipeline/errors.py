"""Typed errors, one class per stage. Each stores the facts and builds its message from them.

The CLI turns any `PipelineError` into one line, ``Error: <message>``, and exit code 1.
"""

from __future__ import annotations

from pathlib import Path


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


class LakeError(PipelineError):
    """The lake directory cannot be written or its content is inconsistent."""

    def __init__(self, path: Path | str, problem: str) -> None:
        self.path = str(path)
        self.problem = problem
        super().__init__(f"Lake `{self.path}`: {problem}")


class UsageError(PipelineError):
    """An argument is malformed (a step range, a run name)."""


class OutputError(PipelineError):
    """An output file (e.g. the report) cannot be written."""

    def __init__(self, path: Path | str, reason: str) -> None:
        self.path = str(path)
        self.reason = reason
        super().__init__(f"Cannot write `{self.path}`: {reason}")
