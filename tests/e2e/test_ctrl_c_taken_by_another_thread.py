"""The kernel hands a Ctrl-C (SIGINT) to any thread of the process that does not block it;
when another thread takes it, Python raises KeyboardInterrupt in the main thread only once that
thread runs Python again. So the main thread's waits on tokenlake's threads (`threads.wait_for`)
end at a Ctrl-C whichever thread took it: waiting without a timeout, they never did.

Each case runs in a process of its own (a wait that never ends must not hang the suite): a
thread sends itself SIGINT once the main thread waits for it, then runs on until released.
"""

from __future__ import annotations

import subprocess
import sys

PATIENCE = 120.0  # seconds: only a wait that never ends takes this long

THREAD = """
import signal, sys, threading, time
from tokenlake.threads import Background

release = threading.Event()

def main_thread_waits():
    frame = sys._current_frames()[threading.main_thread().ident]
    names = [frame.f_code.co_name]
    while frame.f_back:
        frame = frame.f_back
        names.append(frame.f_code.co_name)
    return names[0] == "wait" and "start" not in names

def target():
    while not main_thread_waits():
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGINT)
    release.wait()

background = Background(target, "takes-the-ctrl-c")
"""


def _run(script: str) -> tuple[int, str, str]:
    done = subprocess.run(
        [sys.executable, "-c", THREAD + script], capture_output=True, text=True, timeout=PATIENCE
    )
    return done.returncode, done.stdout, done.stderr


def test_wait_raises_a_ctrl_c_another_thread_took_while_the_thread_runs_on() -> None:
    script = """
try:
    background.wait()
except KeyboardInterrupt:
    print("Ctrl-C raised; the thread still runs:", not background.ended, flush=True)
    release.set()
"""
    assert _run(script) == (0, "Ctrl-C raised; the thread still runs: True\n", "")


def test_wait_out_stops_the_thread_again_at_a_ctrl_c_another_thread_took() -> None:
    script = """
stops = []

def stop():  # the thread ends at the second stop, the one a Ctrl-C asks for
    stops.append(True)
    if len(stops) == 2:
        release.set()

background.wait_out(stop)
print("stops:", len(stops), "ended:", background.ended, flush=True)
"""
    assert _run(script) == (0, "stops: 2 ended: True\n", "")
