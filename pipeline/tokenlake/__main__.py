"""`python -m tokenlake` is the `tokenlake` command."""

from __future__ import annotations

from tokenlake.cli import main

main()
