"""A killed extraction leaves no worker behind: each spawned worker ends once its parent is gone
(a worker holds both ends of its task pipe, so it would otherwise wait for work forever)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from tokenlake.generator import synth

pytestmark = pytest.mark.slow  # generates a dump and starts worker processes


def _children(pid: int) -> list[int]:
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            found += [int(c) for c in (task / "children").read_text().split()]
        except FileNotFoundError:  # a thread that ended since the listing (it started none)
            continue
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_workers_end_when_their_extraction_is_killed(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    # 6 steps and eval 0: three jobs for three workers, two of them spawned processes
    synth.write_dump(dump, replace(synth.PRESETS["example"], steps=6))
    command = [sys.executable, "-m", "tokenlake", "extract", str(dump), "--lake",
               str(tmp_path / "lake"), "--workers", "3", "--silent"]  # fmt: skip
    parent = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    workers: list[int] = []
    while len(workers) < 2 and parent.poll() is None:  # the two spawned workers are up
        assert time.monotonic() < deadline
        workers = [c for c in _children(parent.pid) if "spawn_main" in _cmdline(c)]
        time.sleep(0.01)
    if parent.poll() is not None:
        pytest.fail("the extraction ended before its workers could be seen")
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 60  # they look for their parent once a second
    while any(_alive(w) for w in workers):
        assert time.monotonic() < deadline, [w for w in workers if _alive(w)]
        time.sleep(0.05)


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except FileNotFoundError:
        return ""
