"""Ctrl-C held where it must not cut in, and threads whose end a Ctrl-C cannot hide.

`Thread.join` interrupted by a Ctrl-C marks a thread that still runs as ended on Python 3.11
(its handling of bpo-45274 releases the lock the running thread holds): afterwards neither
`join` nor the interpreter's exit waits for that thread. A DuckDB statement left running in it
as Python exits aborts the process ("terminate called after throwing an instance of ''"), and
its connection cannot be closed meanwhile ("connection is busy with another call"). So the
threads tokenlake waits for set an Event as they end, and the waits are on that Event, which a
Ctrl-C interrupts without marking anything.

The kernel hands a Ctrl-C (SIGINT) to any thread of the process that does not block it, and
when a thread other than the main one takes it, Python raises KeyboardInterrupt in the main
thread only once that thread runs Python again: a main thread blocked on a lock without a
timeout never does. So the main thread's waits are made in slices (`wait_for`).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:  # `importlib.abc` imports `importlib.resources`: 14 ms a command
    from importlib.abc import Loader
    from importlib.machinery import ModuleSpec
    from types import ModuleType


# The longest a Ctrl-C that another thread took waits before the main thread raises it.
WAKE_SECONDS = 0.2


def wait_for(event: threading.Event) -> None:
    """Until `event` is set; a Ctrl-C meanwhile is raised (whichever thread took it)."""
    while not event.wait(WAKE_SECONDS):
        pass


def until_ctrl_c() -> None:
    """Wait for a Ctrl-C (raised as KeyboardInterrupt): a server's main thread."""
    wait_for(threading.Event())


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
        wait_for(self._ended)

    def wait_out(self, stop: Callable[[], None]) -> None:
        """`stop()` (such as interrupting the thread's DuckDB statement), then wait until the
        thread has ended, calling `stop()` again at each Ctrl-C meanwhile: for a caller that
        is already on its way out (an error or a Ctrl-C in flight), which must not leave the
        thread running."""
        stop()
        while not self._ended.is_set():
            try:
                wait_for(self._ended)
            except KeyboardInterrupt:
                stop()


@contextmanager
def sigint_deferred() -> Iterator[list[bool]]:
    """Hold a Ctrl-C until the block ends: the yielded list is non-empty if one came.

    Publishing (manifest, catalog, vocab) is short and must finish: an interrupt inside it
    would abort DuckDB's catalog build or even an extension import. Only the main thread can
    set handlers; elsewhere Python delivers no KeyboardInterrupt anyway. Within a block that
    holds a Ctrl-C already, the list stays empty: the outer block has it, and its end is when
    it comes (an inner block ending first would cut the outer one short).
    """
    if threading.current_thread() is not threading.main_thread():
        yield []
        return
    previous = signal.getsignal(signal.SIGINT)
    if isinstance(previous, _Held):
        yield []
        return
    held = _Held()
    signal.signal(signal.SIGINT, held)
    try:
        yield held.received
    finally:
        signal.signal(signal.SIGINT, previous)


class _Held:
    """The SIGINT handler of a block that holds a Ctrl-C: it notes each one."""

    def __init__(self) -> None:
        self.received: list[bool] = []

    def __call__(self, signum: int, frame: object) -> None:
        self.received.append(True)


@contextmanager
def sigint_held() -> Iterator[None]:
    """Run the block to its end with a Ctrl-C held, then raise it (KeyboardInterrupt) if one
    came: for work a Ctrl-C must not cut in the middle of, whose caller still stops."""
    with sigint_deferred() as received:
        yield
    if received:
        raise KeyboardInterrupt


def hold_ctrl_c_while_importing(names: Iterable[str]) -> None:
    """Import the modules `names` (not yet imported) with a Ctrl-C held until each is made,
    wherever it is first imported, then raised (the import fails, the command stops): a
    Ctrl-C inside DuckDB's C extension as it registers its types ends the process with
    "Critical nanobind error" and SIGABRT instead of `Aborted!`.
    For the `tokenlake` command's own process, whose imports are lazy (a command imports the
    engines it uses)."""
    finder = _HeldImports(frozenset(names))
    if not any(isinstance(each, _HeldImports) for each in sys.meta_path):
        sys.meta_path.insert(0, finder)


class _HeldImports:
    """A finder of `sys.meta_path` (as `importlib.abc.MetaPathFinder` describes one): finds
    the modules it names as the finders after it do, and loads them with a Ctrl-C held
    (`sigint_held`)."""

    def __init__(self, names: frozenset[str]) -> None:
        self.names = names

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = cast("Loader", _HeldLoader(spec.loader))
                return spec
        return None


class _HeldLoader:
    """A loader (as `importlib.abc.Loader` describes one) whose module is made and run with a
    Ctrl-C held."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def __getattr__(self, name: str) -> object:  # the rest as the loader has it
        return getattr(self.loader, name)

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        with sigint_held():
            made: ModuleType | None = self.loader.create_module(spec)
            return made

    def exec_module(self, module: ModuleType) -> None:
        with sigint_held():
            self.loader.exec_module(module)
