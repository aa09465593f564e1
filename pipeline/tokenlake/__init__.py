"""tokenlake: miles `--dump-details` directories as a token-level Parquet lake with DuckDB views.

The Python API (docs/python.md): `tokenlake.open_lake(path)` returns a `tokenlake.Lake`
with `.sql(query)`, `.runs()`, `.tokens(...)`, `.samples(...)`, `.metrics(...)` and
`.extract(dump, ...)`. Both names are imported on first use, so `import tokenlake` (and the
`tokenlake` command) stays light.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
__all__ = ["Lake", "open_lake"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from tokenlake import lake as api

        return getattr(api, name)
    raise AttributeError(f"module 'tokenlake' has no attribute {name!r}")
