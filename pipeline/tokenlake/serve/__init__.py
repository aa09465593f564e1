"""Stage 4, serve: the DuckDB catalog and its views, queries, audits, the Python API, the report."""

from __future__ import annotations
