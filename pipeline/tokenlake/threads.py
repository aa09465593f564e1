"""Ctrl-C held where it must not cut in, and threads whose end a Ctrl-C cannot hide.

`Thread.join` interrupted by a Ctrl-C marks a thread that still runs as ended on Python 3.11
(its handling of bpo-45274 releases the lock the running thread holds): afterwards neither
`join` nor the interpreter's exit waits for that thread. A DuckDB statement left running in it
as Python exits aborts the process ("terminate called after throwing an instance of ''"), and
its connection cannot be closed meanwhile ("connection is busy with another call"). So the
threads tokenlake waits for set an Event as they end, and the waits are on that Event, which a
Ctrl-C interrupts without marking anything.
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager


class Background:
    """`target()` run in a thread of its own (not a daemon: a process that exits meanwhile
    waits for it), whose end the caller waits for with `wait` or `wait_out`."""

    def __init__(self, target: Callable[[], None], name: str) -> None:
        self._ended = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(target,), name=name)
        self._thread.start()

    def _run(self, target: Callable[[], None]) -> None:
        try:
            target()
        finally:
            self._ended.set()

    @property
    def ended(self) -> bool:
        return self._ended.is_set()

    def wait(self) -> None:
        """Until the thread has ended; a Ctrl-C meanwhile is raised, the thread runs on."""
        self._ended.wait()

    def wait_out(self, stop: Callable[[], None]) -> None:
        """`stop()` (such as interrupting the thread's DuckDB statement), then wait until the
        thread has ended, calling `stop()` again at each Ctrl-C meanwhile: for a caller that
        is already on its way out (an error or a Ctrl-C in flight), which must not leave the
        thread running."""
        stop()
        while not self._ended.is_set():
            try:
                self._ended.wait()
            except KeyboardInterrupt:
                stop()


@contextmanager
def sigint_deferred() -> Iterator[list[bool]]:
    """Hold a Ctrl-C until the block ends: the yielded list is non-empty if one came.

    Publishing (manifest, catalog, vocab) is short and must finish: an interrupt inside it
    would abort DuckDB's catalog build or even an extension import. Only the main thread can
    set handlers; elsewhere Python delivers no KeyboardInterrupt anyway.
    """
    received: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield received
        return
    previous = signal.signal(signal.SIGINT, lambda *_: received.append(True))
    try:
        yield received
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def sigint_held() -> Iterator[None]:
    """Run the block to its end with a Ctrl-C held, then raise it (KeyboardInterrupt) if one
    came: for work a Ctrl-C must not cut in the middle of, whose caller still stops."""
    with sigint_deferred() as received:
        yield
    if received:
        raise KeyboardInterrupt
