"""Tools around the product: the dump generator and the benchmark."""

from __future__ import annotations
