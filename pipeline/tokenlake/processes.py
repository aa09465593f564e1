"""Processes of this host: whether one runs (for sweeps and lock take-overs), and the test-only
crash points that stop a command between two of its writes."""

from __future__ import annotations

import os
import signal

# Test-only: the name of a crash point (`crash_point`) at which the process signals itself, so
# that tests can stop `extract`, `drop`, `tag` and `views` at each step. Never set it otherwise.
KILL_VARIABLE = "TOKENLAKE_TEST_KILL_AT"
# Test-only: the signal sent there, `KILL` (the default), `INT` (a Ctrl-C) or `TERM`.
KILL_SIGNAL_VARIABLE = "TOKENLAKE_TEST_KILL_SIGNAL"


def crash_point(name: str) -> None:
    """Test-only: send this process `$TOKENLAKE_TEST_KILL_SIGNAL` (default SIGKILL) here when
    `$TOKENLAKE_TEST_KILL_AT` is `name` (e.g. `drop:emptied`); a no-op otherwise. Marks each
    step of a multi-file operation. A SIGINT or SIGTERM sent from the main thread is handled
    before the next line runs, so the moment it lands is exact."""
    if os.environ.get(KILL_VARIABLE) == name:
        chosen = os.environ.get(KILL_SIGNAL_VARIABLE, "KILL")
        os.kill(os.getpid(), getattr(signal, f"SIG{chosen}", signal.SIGKILL))


def process_alive(pid: object) -> bool:
    """Whether a process of this host runs (a pid that is not one counts as running: the
    safe answer for a sweep or a lock takeover).

    Examples:
        >>> process_alive(os.getpid()), process_alive("x")
        (True, True)
    """
    if not isinstance(pid, int) or isinstance(pid, bool) or pid <= 0 or pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # e.g. another user's process
        return True
    return True
