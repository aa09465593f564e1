"""Run step extractions: in this process, or on a pool of worker processes.

The scheduler owns parallelism and signals, nothing else: it takes the steps to extract and
yields each step's `StepOutcome` as it finishes. Committing and publishing the outcomes is the
caller's (pipeline/tokenlake/orchestrate/extract.py). Another executor (e.g. a cluster) only has to provide a
function of the same shape as `run_steps`.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from typing import Any

from tokenlake.orchestrate.step import StepOutcome, StepStatus, extract_steps, worker_died_text
from tokenlake.read import dump
from tokenlake.store.base import Store
from tokenlake.threads import WAKE_SECONDS, sigint_held

# A step to extract and its status (new or updated) as planned by extract.py.
Todo = tuple[dump.StepFiles, StepStatus]

# Consecutive small steps are extracted as one job (`step.extract_steps`), whose rollups are
# computed together: most of a small step's cost is the rollups' queries, whatever its size.
# A job holds at most BATCH_STEPS steps whose dump files add up to at most BATCH_BYTES, so a
# worker's memory stays bounded as by one step of that size; a larger step is a job alone.
BATCH_BYTES = 4 << 20
BATCH_STEPS = 16


def run_steps(
    todo: Sequence[Todo],
    store: Store,
    run: str,
    workers: int | None,
    stopping: Callable[[list[str]], None] = lambda labels: None,
) -> Iterator[StepOutcome]:
    """Extract the steps, in parallel when asked; yields outcomes as steps finish.

    Consecutive small steps make one job (`step_batches`), the others a job each. With N
    workers, N - 1 are processes and one is a thread of this process: nothing to start or
    import for it, and it works while the processes start. The main thread only hands out
    jobs, one at a time to whoever is free, so a slow step never holds back the queue behind
    it. Closing the generator early (Ctrl-C, --strict) starts no further step,
    calls `stopping` with the labels of the steps still running, and waits for them.
    `workers=None` is `chosen_workers`' choice.
    """
    workers = chosen_workers(todo) if workers is None else workers
    batches = step_batches(todo, workers)
    if workers <= 1 or len(batches) <= 1:
        for batch in batches:
            yield from extract_steps(batch, store, run)
        return
    yield from _run_in_pool(batches, store, run, workers, stopping)


def chosen_workers(todo: Sequence[Todo]) -> int:
    """One (this process alone) when the steps fit one job's budget (BATCH_STEPS steps whose
    dump files add up to at most BATCH_BYTES), else the core count. A spawned worker imports
    tokenlake, numpy and pyarrow again before its first step (~0.4 s of CPU), more than the
    whole of such a dump's steps take in this process."""
    known = [size for files, _ in todo if (size := _dump_bytes(files)) is not None]
    if len(known) == len(todo) <= BATCH_STEPS and sum(known) <= BATCH_BYTES:
        return 1
    return os.cpu_count() or 1


def step_batches(
    todo: Sequence[Todo], workers: int = 1, budget: int | None = None, most: int | None = None
) -> list[list[Todo]]:
    """The steps in order, cut into jobs: consecutive steps whose dump files add up to at most
    `budget` bytes, at most `most` of them (fewer when that leaves a worker idle); a step whose
    size is unknown, or larger than `budget`, alone (defaults: BATCH_BYTES, BATCH_STEPS).

    Examples:
        >>> from pathlib import Path
        >>> def step(i):
        ...     remote = dump.RemoteFiles("s3://b/d", ((f"rollout_data/{i}.pt", 1 << 20, 0),))
        ...     return dump.StepFiles(i, False, Path(f"d/rollout_data/{i}.pt"), remote=remote)
        >>> todo = [(step(i), StepStatus.NEW) for i in range(10)]
        >>> [len(b) for b in step_batches(todo)]
        [4, 4, 2]
        >>> [len(b) for b in step_batches(todo, workers=4)]
        [3, 3, 3, 1]
    """
    budget = BATCH_BYTES if budget is None else budget
    most = BATCH_STEPS if most is None else most
    most = max(1, min(most, -(-len(todo) // max(1, workers))))  # every worker a job
    batches: list[list[Todo]] = []
    batch: list[Todo] = []
    held = 0
    for files, status in todo:
        size = _dump_bytes(files)
        fits = size is not None and held + size <= budget
        if batch and (not fits or len(batch) >= most):
            batches.append(batch)
            batch, held = [], 0
        batch.append((files, status))
        held += size if size is not None else budget + 1
    if batch:
        batches.append(batch)
    return batches


def _dump_bytes(files: dump.StepFiles) -> int | None:
    """The bytes of a step's dump files as listed (None: one cannot be looked at)."""
    if files.remote is not None:
        return sum(size for _, size, _ in files.remote.objects)
    try:  # lstat: a link is the reader's to refuse, never followed here
        return sum(os.lstat(path).st_size for path in files.paths)
    except OSError:
        return None


def _run_in_pool(
    batches: list[list[Todo]],
    store: Store,
    run: str,
    workers: int,
    stopping: Callable[[list[str]], None],
) -> Iterator[StepOutcome]:
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool

    pending = deque(batches)
    processes = min(workers, len(batches)) - 1
    # Workers start with SIGINT blocked (see `sigint_blocked`; all start during the first
    # submits), so a Ctrl-C to the process group stops only the parent: running steps finish,
    # queued ones are not started, and no worker prints a KeyboardInterrupt traceback.
    local = ThreadPoolExecutor(1, thread_name_prefix="tokenlake-step")
    running: dict[Future[list[StepOutcome]], ProcessPoolExecutor | ThreadPoolExecutor] = {}
    held: dict[Future[list[StepOutcome]], list[Todo]] = {}
    # A worker that dies (killed, segfault) breaks its whole pool: the steps of a job of
    # several are queued again one a job, and a job of one step running there is retried
    # alone in a one-process pool, so only the step that kills its worker fails.
    alone: list[ProcessPoolExecutor] = []
    with sigint_blocked():
        pool = _worker_pool(processes)
    pools = [pool]  # the shared pool and those it replaced

    def hand_out(
        executor: ProcessPoolExecutor | ThreadPoolExecutor, batch: list[Todo] | None = None
    ) -> None:
        batch = batch or pending.popleft()
        with sigint_blocked():
            future = executor.submit(extract_steps, batch, store, run)
        running[future], held[future] = executor, batch

    try:
        for _ in range(min(processes, len(pending))):
            hand_out(pool)
        if pending:
            hand_out(local)
        while running:
            # In slices: see `threads.WAKE_SECONDS`.
            done, _ = wait(running, timeout=WAKE_SECONDS, return_when=FIRST_COMPLETED)
            for future in done:
                executor, batch = running.pop(future), held.pop(future)
                broken = isinstance(future.exception(), BrokenProcessPool)
                if executor in alone:
                    executor.shutdown(wait=False)
                elif broken:
                    if executor is pool:
                        pool = _worker_pool(processes)
                        pools.append(pool)
                    if len(batch) == 1:
                        alone.append(_worker_pool(1))
                        hand_out(alone[-1], batch)
                        continue
                    pending.extendleft([step] for step in reversed(batch))
                if pending:
                    hand_out(local if executor is local else pool)
                if not broken:
                    yield from future.result()
                elif executor in alone:
                    files, status = batch[0]
                    yield StepOutcome(files.label, status, error=worker_died_text(files))
    finally:
        pending.clear()
        if running:  # stopped early (Ctrl-C, --strict): say what the shutdown waits for
            stopping([files.label for f in running for files, _ in held[f]])
        # A Ctrl-C inside the shutdown would land in one of multiprocessing's finalizers,
        # which swallow it half-done and leave the pool's threads waiting forever.
        with sigint_held():
            for each in (*pools, *alone, local):
                each.shutdown(wait=True, cancel_futures=True)


def _worker_pool(processes: int) -> ProcessPoolExecutor:
    """Spawned worker processes (not forked: the parent may hold Arrow/DuckDB thread pools
    that fork would corrupt) that end when the parent does."""
    from multiprocessing import get_context

    return ProcessPoolExecutor(
        processes,
        mp_context=get_context("spawn"),
        initializer=_exit_with_parent,
        initargs=(os.getpid(),),
    )


def _exit_with_parent(parent: int, poll_seconds: float = 1.0) -> None:
    """In a worker: end the process once its parent (pid `parent`) is gone, a killed
    extraction. A worker holds both ends of its task pipe, so without this it would wait for
    work forever. The parent may have died while the worker was still starting, so it is
    named, not asked for."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_seconds)
        os._exit(1)

    threading.Thread(target=watch, name="tokenlake-parent-watch", daemon=True).start()


@contextmanager
def ctrl_c_remembered() -> Iterator[list[bool]]:
    """Note every Ctrl-C in the yielded list (non-empty once one came), and raise it as
    KeyboardInterrupt as before: a loop that checks the list stops at its next turn even when
    a library caught the KeyboardInterrupt (or took the signal, as DuckDB does) and went on.
    Only the main thread can set handlers; elsewhere the list stays empty."""
    seen: list[bool] = []
    if threading.current_thread() is not threading.main_thread():
        yield seen
        return
    previous = signal.getsignal(signal.SIGINT)

    def remember(signum: int, frame: Any) -> None:
        seen.append(True)
        if callable(previous):
            previous(signum, frame)
        elif previous != signal.SIG_IGN:
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, remember)
    try:
        yield seen
    finally:
        signal.signal(signal.SIGINT, previous)


@contextmanager
def sigterm_as_ctrl_c() -> Iterator[None]:
    """Within the block, a SIGTERM (`kill`, a job scheduler stopping the job) stops like a
    Ctrl-C: it raises SIGINT, so it is held, deferred or raised wherever a Ctrl-C would be,
    and the extraction publishes what it committed and deletes what it did not. Only the
    main thread can set handlers; elsewhere the block runs unchanged."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda *_: signal.raise_signal(signal.SIGINT))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextmanager
def sigint_blocked() -> Iterator[None]:
    """Block SIGINT and SIGTERM in this thread while worker processes start, and hold a Ctrl-C
    until then.

    Children inherit the signal mask through fork and exec, so they never see a Ctrl-C or a
    SIGTERM sent to the process group (they end with the parent, `_exit_with_parent`). Masking this thread alone does not stop Python from raising
    KeyboardInterrupt here: another thread (Arrow's, DuckDB's) may take the signal and
    Python then raises it in the main thread, which would cut a worker's start-up data short
    (the worker prints an EOFError traceback). So a Ctrl-C that comes meanwhile is held and
    raised once the workers are started.
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        with sigint_held():
            yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
