"""`python -m pipeline` is the `tokenlake` command."""

from __future__ import annotations

from pipeline.cli import main

main()
