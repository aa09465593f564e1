"""Stage 2, transform: a step's values as Arrow tables, nothing read or written.

`tables.py` builds a step's `tokens` and `samples` tables from what its format's reader gives
(`tokenlake.read.formats.read_step`); `flatten.py` makes their columns over whole arrays,
`summary.py` one sample's scalar `samples` columns.
"""

from __future__ import annotations
