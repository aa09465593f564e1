"""Stage 3, load: the only writer of the lake's Parquet files (`write.py`) and the per-run side
files, the `runs` row, `vocab` and `metrics` (`lake_files.py`). Manifests and stores are
`tokenlake.store`; the lake's names `tokenlake.layout`.
"""

from __future__ import annotations
