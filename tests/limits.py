"""Running code in a child process under a memory limit and a time limit.

The limit is `RLIMIT_AS` (address space) by default; `RLIMIT_DATA` counts only memory the
process can write, not what libraries merely reserve (DuckDB and pyarrow reserve ~1.5 GiB of
address space, more with more cores), so it suits a child that runs the whole CLI.

A test of a memory or time bound must see the process exit normally with its one line, never
die of a signal, a MemoryError or the memory jail; `subprocess.TimeoutExpired` fails the test
when it hangs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def run_limited(
    code: str, memory: int, timeout: float, kind: str = "RLIMIT_AS"
) -> subprocess.CompletedProcess[str]:
    """`python -c code` with at most `memory` bytes of `kind` memory and `timeout` seconds."""
    limited = f"import resource\nresource.setrlimit(resource.{kind}, ({memory}, {memory}))\n{code}"
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", limited],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def run_cli_limited(
    args: list[str], memory: int, timeout: float, kind: str = "RLIMIT_AS"
) -> subprocess.CompletedProcess[str]:
    """`tokenlake ARGS` (the CLI, as `python -m tokenlake` runs it) under the same limits."""
    code = (
        f"import sys\nsys.argv = ['tokenlake', *{args!r}]\nfrom tokenlake.cli import main\nmain()\n"
    )
    return run_limited(code, memory, timeout, kind)


def cli_process(*args: str) -> tuple[int, str, list[str]]:
    """`tokenlake ARGS` in a process of its own (4 GiB of writable memory, 120 s): what it prints,
    a reader's warnings included (they go to its stderr by `logging`, which an in-process
    runner under pytest does not capture)."""
    done = run_cli_limited(list(args), 4 << 30, 120, "RLIMIT_DATA")
    return done.returncode, done.stdout, done.stderr.splitlines()
