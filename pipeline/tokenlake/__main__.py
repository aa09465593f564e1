"""`python -m tokenlake` is the `tokenlake` command; `run` is also the installed script's entry."""

from __future__ import annotations

import sys


def run() -> None:
    """The command. A Ctrl-C while its modules load (a few tenths of a second) ends it as one
    during a command does, with click's `Aborted!` and exit 1, not with a traceback; one
    while DuckDB is imported, wherever a command first imports it, waits until it is."""
    try:
        from tokenlake.threads import hold_ctrl_c_while_importing

        hold_ctrl_c_while_importing(["duckdb"])
        from tokenlake.cli import main
    except KeyboardInterrupt:
        sys.stderr.write("\nAborted!\n")
        raise SystemExit(1) from None
    main()


if __name__ == "__main__":
    run()
