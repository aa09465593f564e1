"""The one reader of the lake's own Parquet files (a step's tables, its rollups, a run's side
tables), for every store: what each caller does with an unreadable file differs (verify names
it, a rebuild skips the step), the reading itself does not."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq

from tokenlake.errors import LakeError
from tokenlake.store.base import Store


class UnreadableLakeFile(LakeError):
    """A lake file pyarrow cannot read: truncated, another program's bytes, not a regular file,
    or an OS error (`cause`; `reason` is what it said)."""

    def __init__(self, url: str, cause: Exception) -> None:
        self.cause = cause
        self.reason = str(cause)
        super().__init__(url, f"cannot be read ({self.reason})")


def read_table(store: Store, name: str) -> pa.Table:
    """The lake file `name` (as a manifest lists it) as one Arrow table.

    Raises:
        UnreadableLakeFile: The file cannot be read as Parquet.
    """
    try:
        where, filesystem = store.arrow_source(name)
        return pq.read_table(where, filesystem=filesystem)
    except (OSError, pa.ArrowException) as exc:
        raise UnreadableLakeFile(store.url(name), exc) from exc
