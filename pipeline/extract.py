"""Extract a dump directory into the lake: discover → load → resolve → flatten → write → catalog.

Memory is bounded by one step per worker: a step's files are loaded, turned into two tables,
written, and dropped before the next step is read.

Commit protocol (see pipeline/manifest.py): a step's two Parquet files are written under fresh
names, then the run manifest is replaced to list them; the catalog is rebuilt from the
manifests; files no manifest lists (superseded or left by a crash) are deleted last.
"""

from __future__ import annotations

import logging
import re
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Container, Iterator
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from pipeline import catalog, dump, lake_files, manifest, schema
from pipeline.errors import LakeError, PipelineError, UsageError
from pipeline.progress import ProgressCallback, Reporter, as_reporter
from pipeline.step import (
    StepOutcome,
    StepResult,
    discard_files,
    extract_step,
    fingerprint,
    worker_died_text,
)

log = logging.getLogger(__name__)

_FORBIDDEN_IN_RUN_NAME = re.compile(r"[/\\=%\x00-\x1f]")

NEW, UPDATED, UNCHANGED, REMOVED, SKIPPED = "new", "updated", "unchanged", "removed", "skipped"


@dataclass
class ExtractSummary:
    """What an extraction did; the CLI prints it."""

    run: str
    lake: Path
    steps: list[StepResult] = field(default_factory=list)  # written by this extraction
    counts: dict[str, int] = field(
        default_factory=lambda: dict.fromkeys((NEW, UPDATED, UNCHANGED, REMOVED, SKIPPED), 0)
    )
    failed: list[tuple[str, str]] = field(default_factory=list)  # (step label, error message)
    ignored_files: list[tuple[Path, str]] = field(default_factory=list)  # (path, why)
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.steps)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.steps)

    @property
    def nonfinite_values(self) -> int:
        return sum(s.nonfinite_values for s in self.steps)


def check_run_name(name: str) -> str:
    """A run name must be usable as a Hive partition value; quotes and unicode are fine.

    Examples:
        >>> check_run_name("qwen 'grpo' ü")
        "qwen 'grpo' ü"
    """
    if not name or name.startswith(".") or _FORBIDDEN_IN_RUN_NAME.search(name):
        raise UsageError(
            f"Run name `{name}` cannot be a partition directory: it must be non-empty, not start"
            " with `.`, and contain no `/`, `\\`, `=`, `%` or control characters."
            " Choose another with --run-name."
        )
    return name


def extract_run(
    dump_dir: Path,
    lake: Path,
    run_name: str | None = None,
    *,
    steps: Container[int] | None = None,
    strict: bool = False,
    workers: int = 1,
    progress: ProgressCallback | Reporter | None = None,
    ready: Callable[[dump.StepFiles], bool] | None = None,
    replace: bool = False,
) -> ExtractSummary:
    """Extract a miles dump directory into `lake` and rebuild the catalog.

    Re-extracting a run re-reads only steps whose source files changed, removes steps whose
    files disappeared, and touches no other run. With `steps`, only those steps are considered
    and the run's other steps are kept as they are.

    Args:
        dump_dir: The `--dump-details` directory (only read, never written).
        lake: The lake root; created if missing.
        run_name: The run's name in the lake; default: the dump directory's base name.
        steps: Step ids to extract (train and eval files of those steps); default: all.
            Tested with `in` only, so a lazy range selection costs nothing; selecting no
            step of the dump is an error.
        strict: Raise on the first bad step instead of recording it and going on.
        workers: Processes extracting steps in parallel.
        progress: Called after each step is written, or a `Reporter`.
        ready: Only steps for which it returns true are considered (live runs, see follow.py);
            the run's other steps are kept as they are, except that steps whose rollout file
            is gone are removed.
        replace: Allow replacing a run of the same name extracted from another directory.

    Returns:
        What was written, what was skipped and why.
    """
    started = time.perf_counter()
    listing = dump.discover(dump_dir)
    run = check_run_name(run_name if run_name is not None else listing.root.name)
    chosen = dump.select_steps(listing, steps)
    lake = prepare_lake(lake, listing.root)
    summary = ExtractSummary(run=run, lake=lake, ignored_files=list(listing.ignored))
    reporter = as_reporter(progress)
    with lake_files.lake_lock(lake):
        record = _current_manifest(lake, run, listing.root, replace)
        selected = [s for s in chosen if ready is None or ready(s)]
        todo = _plan(lake, record, selected, summary)
        if steps is None:  # `ready` only defers present steps; a vanished one is gone
            _drop_vanished_steps(record, {s.label for s in listing.steps}, summary)
        reporter.planned(len(todo))
        interrupted: KeyboardInterrupt | None = None
        try:
            try:
                for outcome in _run_steps(todo, lake, run, workers, reporter.stopping):
                    _commit(lake, record, outcome, summary, strict, reporter)
            except KeyboardInterrupt as exc:
                interrupted = exc
                reporter.stopping([])
        finally:  # also on Ctrl-C or an error: publish the steps committed so far
            with _sigint_deferred() as deferred:  # a Ctrl-C now must not cut publishing short
                _publish_if_needed(lake, record, summary)
            if deferred:
                interrupted = interrupted or KeyboardInterrupt()
        if interrupted is not None:
            # Ctrl-C still propagates; it carries what was committed so the caller can say so.
            summary.seconds = time.perf_counter() - started
            interrupted.summary = summary  # type: ignore[attr-defined]
            raise interrupted
        _sweep(lake, run)
    summary.seconds = time.perf_counter() - started
    return summary


def drop_run(lake: Path, run: str) -> None:
    """Remove a run from the lake: its manifest first (the commit point), then the catalog,
    then its files. Other runs are untouched."""
    lake = lake.resolve()
    path = manifest.manifest_path(lake, run)
    if not path.is_file():
        runs = ", ".join(f"`{r.run}`" for r in manifest.load_all(lake)) or "none"
        raise LakeError(lake, f"has no run `{run}` (runs: {runs})")
    with lake_files.lake_lock(lake):
        path.unlink()
        catalog.build_catalog(lake)
        lake_files.delete_unlisted(lake, manifest.RunManifest(run=run, source_dir=""))


def _sweep(lake: Path, run: str) -> None:
    """Delete leftovers of an interrupted extraction (temporary or never-committed files).

    Judged against the manifest on disk, which the catalog (not stale) agrees with: the
    in-memory record may differ when nothing was published.
    """
    committed = manifest.load_manifest(lake, run)
    if committed is not None:
        lake_files.delete_unlisted(lake, committed)
    lake_files.delete_stale_temporaries(lake)


def _changed(summary: ExtractSummary) -> bool:
    return any(summary.counts[k] for k in (NEW, UPDATED, REMOVED))


def catalog_is_stale(lake: Path) -> bool:
    """Whether some manifest is newer than the catalog (or there is no catalog).

    An extraction killed after committing steps but before rebuilding the catalog leaves the
    catalog behind its manifests; the next extraction must rebuild it even if every step is
    unchanged by then.
    """
    target = lake / schema.CATALOG_FILE
    if not target.is_file():
        return True
    built = target.stat().st_mtime_ns
    manifests = (lake / manifest.MANIFEST_DIR).glob("*.json")
    return any(p.stat().st_mtime_ns >= built for p in manifests if not p.name.startswith("."))


def _lake_failure(path: str, problem: str) -> LakeError:
    return LakeError(
        path,
        f"{problem}. Steps committed before this are kept; free space or fix permissions,"
        " then extract again",
    )


def _publish_if_needed(lake: Path, record: manifest.RunManifest, summary: ExtractSummary) -> None:
    """Publish when something changed; a run that has never had a step committed is not
    published at all (no empty run when its first step fails or is not complete yet)."""
    known = bool(record.steps) or manifest.load_manifest(lake, record.run) is not None
    vocab_changed = known and lake_files.refresh_vocab(lake, record)
    if known and (vocab_changed or _changed(summary) or catalog_is_stale(lake)):
        _publish(lake, record)


def _publish(lake: Path, record: manifest.RunManifest) -> None:
    """Record the run row, rebuild the catalog, then delete files no manifest lists."""
    lake_files.write_run_row(lake, record)
    manifest.save_manifest(lake, record)
    catalog.build_catalog(lake)
    lake_files.delete_unlisted(lake, record)


def prepare_lake(lake: Path, dump_root: Path) -> Path:
    """Create the lake directory; refuse a lake inside the dump (never write there)."""
    lake = lake.resolve()
    if lake == dump_root or dump_root in lake.parents:
        raise LakeError(lake, "is inside the dump directory; tokenlake never writes there")
    if lake.exists() and not lake.is_dir():
        raise LakeError(lake, "is a file, not a directory; choose another --lake")
    try:
        lake.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise LakeError(lake, f"cannot be created ({exc.strerror or exc})") from exc
    return lake


def _current_manifest(
    lake: Path, run: str, source: Path, replace: bool = False
) -> manifest.RunManifest:
    record = manifest.load_manifest(lake, run)
    if record is not None and record.source_dir != str(source) and not replace:
        raise UsageError(
            f"Run `{run}` in the lake was extracted from `{record.source_dir}`, not from"
            f" `{source}`; give --replace to replace it, or another --run-name."
        )
    if record is None or record.source_dir != str(source):
        # A new run, or the name now points at another dump: nothing of the old one is reused
        # (its files are deleted at the end, once the new manifest no longer lists them).
        return manifest.RunManifest(run=run, source_dir=str(source))
    return record


def _plan(
    lake: Path,
    record: manifest.RunManifest,
    selected: list[dump.StepFiles],
    summary: ExtractSummary,
) -> list[tuple[dump.StepFiles, str]]:
    """The steps to (re)extract, each with whether it is new or updated."""
    todo = []
    for files in selected:
        previous = record.steps.get(files.label)
        if previous is None:
            todo.append((files, NEW))
        elif previous.sources != fingerprint(files, Path(record.source_dir)) or not all(
            (lake / name).is_file() for name in previous.files.values()
        ):
            todo.append((files, UPDATED))
        else:
            summary.counts[UNCHANGED] += 1
    return todo


def _drop_vanished_steps(
    record: manifest.RunManifest, present: set[str], summary: ExtractSummary
) -> None:
    for key in [k for k in record.steps if k not in present]:
        del record.steps[key]
        summary.counts[REMOVED] += 1


def _run_steps(
    todo: list[tuple[dump.StepFiles, str]],
    lake: Path,
    run: str,
    workers: int,
    stopping: Callable[[list[str]], None] = lambda labels: None,
) -> Iterator[StepOutcome]:
    """Extract the steps, in parallel when asked; yields outcomes as steps finish.

    With N workers, N - 1 are processes and one is a thread of this process: nothing to
    start or import for it, and it works while the processes start. The main thread only
    hands out steps, one at a time to whoever is free, so a slow step never holds back the
    queue behind it.
    """
    if workers <= 1 or len(todo) <= 1:
        for files, status in todo:
            yield extract_step(files, lake, run, status)
        return
    from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
    from concurrent.futures.process import BrokenProcessPool
    from multiprocessing import get_context

    pending = deque(todo)
    processes = min(workers, len(todo)) - 1
    # spawn, not fork: the parent may hold Arrow/DuckDB thread pools that fork would corrupt.
    # Workers start with SIGINT blocked (see `_sigint_blocked`; all start during the first
    # submits), so a Ctrl-C to the process group stops only the parent: running steps finish,
    # queued ones are not started, and no worker prints a KeyboardInterrupt traceback.
    local = ThreadPoolExecutor(1, thread_name_prefix="tokenlake-step")
    running: dict[Future[StepOutcome], ProcessPoolExecutor | ThreadPoolExecutor] = {}
    held: dict[Future[StepOutcome], tuple[dump.StepFiles, str]] = {}
    # A worker that dies (killed, segfault) breaks its whole pool: every step running there
    # is retried alone in a one-process pool, so only the step that kills its worker fails.
    alone: list[ProcessPoolExecutor] = []
    with _sigint_blocked():
        pool = ProcessPoolExecutor(processes, mp_context=get_context("spawn"))
    pools = [pool]  # the shared pool and those it replaced

    def hand_out(
        executor: ProcessPoolExecutor | ThreadPoolExecutor,
        step: tuple[dump.StepFiles, str] | None = None,
    ) -> None:
        files, status = step or pending.popleft()
        with _sigint_blocked():
            future = executor.submit(extract_step, files, lake, run, status)
        running[future], held[future] = executor, (files, status)

    try:
        for _ in range(min(processes, len(pending))):
            hand_out(pool)
        if pending:
            hand_out(local)
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in done:
                executor, (files, status) = running.pop(future), held.pop(future)
                broken = isinstance(future.exception(), BrokenProcessPool)
                if executor in alone:
                    executor.shutdown(wait=False)
                elif broken:
                    if executor is pool:
                        pool = ProcessPoolExecutor(processes, mp_context=get_context("spawn"))
                        pools.append(pool)
                    alone.append(ProcessPoolExecutor(1, mp_context=get_context("spawn")))
                    hand_out(alone[-1], (files, status))
                    continue
                if pending:
                    hand_out(local if executor is local else pool)
                if broken:
                    yield StepOutcome(files.label, status, error=worker_died_text(files))
                else:
                    yield future.result()
    finally:
        pending.clear()
        if running:  # stopped early (Ctrl-C, --strict): say what the shutdown waits for
            stopping([held[f][0].label for f in running])
        for each in (*pools, *alone, local):
            each.shutdown(wait=True, cancel_futures=True)


@contextmanager
def _sigint_deferred() -> Iterator[list[bool]]:
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
def _sigint_blocked() -> Iterator[None]:
    """Block SIGINT in this thread while worker processes start.

    Children inherit the signal mask through fork and exec, so they never see a Ctrl-C sent
    to the process group; here a Ctrl-C that arrives meanwhile stays pending and is raised as
    KeyboardInterrupt once unblocked (ignoring it instead would lose it).
    """
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _commit(
    lake: Path,
    record: manifest.RunManifest,
    outcome: StepOutcome,
    summary: ExtractSummary,
    strict: bool,
    reporter: Reporter,
) -> None:
    """Make one step's files part of the lake by listing them in the manifest."""
    if outcome.lake_error is not None:  # the lake, not the input, is at fault: stop here
        raise _lake_failure(*outcome.lake_error)
    if outcome.error is not None:
        if strict:
            raise PipelineError(f"Step {outcome.label}: {outcome.error}")
        summary.failed.append((outcome.label, outcome.error))
        summary.counts[SKIPPED] += 1
        reporter.skipped(outcome.label)
        # info, not error: the caller reports `summary.failed` (the CLI would print it twice)
        log.info("step %s skipped: %s", outcome.label, outcome.error)
        return
    assert outcome.record is not None and outcome.result is not None
    previous = record.steps.get(outcome.label)
    record.steps[outcome.label] = outcome.record
    try:
        manifest.save_manifest(lake, record)
    except LakeError as exc:  # not committed: its files must not linger, the record stays
        discard_files(lake / name for name in outcome.record.files.values())
        if previous is None:
            del record.steps[outcome.label]
        else:
            record.steps[outcome.label] = previous
        raise _lake_failure(exc.path, exc.problem) from exc
    summary.steps.append(outcome.result)
    summary.counts[outcome.status] += 1
    reporter.done(outcome.result)
