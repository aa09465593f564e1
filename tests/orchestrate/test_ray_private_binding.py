"""`--executor ray` without an address starts a private Ray that listens on 127.0.0.1 only.

The extraction runs in a subprocess with its own Ray temp folder (`RAY_TMPDIR`) and no
`RAY_ADDRESS`, so Ray's rule finds no cluster to join and starts one. When the first step is
written, the subprocess lists the listening TCP sockets of itself and every process below it
(Ray's GCS, raylet, agents and workers), from /proc, and prints them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

pytest.importorskip("ray")

pytestmark = pytest.mark.slow  # starts a Ray instance

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run
    from tokenlake.store.local import LocalStore

    def descendants(root):
        children = {}
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/stat") as handle:
                        parent = int(handle.read().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                children.setdefault(parent, []).append(int(entry))
        found, todo = set(), [root]
        while todo:
            pid = todo.pop()
            found.add(pid)
            todo += children.get(pid, [])
        return found

    def socket_inodes(pid):
        inodes = set()
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            pass
        return inodes

    def address(hex_ip):
        raw = bytes.fromhex(hex_ip)
        if len(raw) == 4:
            return ".".join(str(b) for b in raw[::-1])
        words = [raw[i:i + 4][::-1] for i in range(0, 16, 4)]  # /proc's byte order
        flat = b"".join(words)
        if flat[:12] == bytes(10) + b"\\xff\\xff":
            return "::ffff:" + ".".join(str(b) for b in flat[12:])
        return ":".join(flat[i:i + 2].hex() for i in range(0, 16, 2))

    def listening():
        inodes = set().union(*(socket_inodes(pid) for pid in descendants(os.getpid())))
        found = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with open(table) as handle:
                for line in handle.readlines()[1:]:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                        found.add(address(fields[1].split(":")[0]))
        return sorted(found)

    seen = []
    def on_step(result):
        if not seen:
            seen.append(listening())

    extract_run(sys.argv[1], LocalStore(sys.argv[2]), ExtractOptions(run_name="ex", executor="ray"), progress=on_step)
    print(json.dumps(seen[0]))
    """
)


def test_a_private_ray_listens_on_loopback_only(tmp_path: Path) -> None:
    from tokenlake.generator import synth

    dump = tmp_path / "dump"
    synth.write_dump(dump, synth.PRESETS["example"])
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    # A folder of its own (no cluster of this machine's to join), short enough for Ray's
    # socket paths (107 bytes).
    with tempfile.TemporaryDirectory(prefix="tl-ray-", dir="/tmp") as ray_tmp:
        env["RAY_TMPDIR"] = ray_tmp
        done = subprocess.run(
            [sys.executable, "-c", SCRIPT, str(dump), str(tmp_path / "lake")],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert done.returncode == 0, done.stderr
    addresses = json.loads(done.stdout.splitlines()[-1])
    assert addresses, "no listening socket found: the check would pass vacuously"
    assert set(addresses) <= {"127.0.0.1", "::ffff:127.0.0.1"}, addresses
