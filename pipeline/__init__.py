"""tokenlake: miles `--dump-details` directories as a token-level Parquet lake with DuckDB views."""

from __future__ import annotations

__version__ = "0.1.0"
