"""Stage 2, transform: join train rows to samples (TP/PP/CP), flatten to Arrow tables."""

from __future__ import annotations
