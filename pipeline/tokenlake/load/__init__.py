"""Stage 3, load: write Parquet, commit manifests, the lake's layout, the step scheduler."""

from __future__ import annotations
