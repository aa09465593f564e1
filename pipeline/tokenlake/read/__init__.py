"""Stage 1, read: discover a dump and load its files (the allow-listed .pt reader), validate values."""

from __future__ import annotations
