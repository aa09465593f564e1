"""Extract a dump directory into the lake: plan the steps, commit each outcome, publish.

Memory is bounded by one step per worker: a step's files are loaded, turned into two tables,
written, and dropped before the next step is read. Running the steps (workers, signals,
dead-worker retry) is pipeline/tokenlake/orchestrate/scheduler.py's; this module decides what to run and commits
what comes back.

Commit protocol (see pipeline/tokenlake/store/manifest.py): a step's two Parquet files are written under fresh
names, then the run manifest is replaced to list them; the catalog is rebuilt from the
manifests; files no manifest lists (superseded or left by a crash) are deleted last.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import time
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tokenlake import schema
from tokenlake.errors import DamagedManifestError, LakeError, PipelineError, UsageError
from tokenlake.layout import Location, check_run_name, manifest_name
from tokenlake.load import lake_files
from tokenlake.orchestrate import maintain
from tokenlake.orchestrate.progress import ProgressCallback, Reporter, as_reporter
from tokenlake.orchestrate.scheduler import Todo, run_steps, sigint_deferred, sigint_held
from tokenlake.orchestrate.step import StepOutcome, StepStatus
from tokenlake.processes import crash_point
from tokenlake.read import dump, remote_dump
from tokenlake.serve import catalog
from tokenlake.store import manifest, store_at
from tokenlake.store.base import Store
from tokenlake.transform.tables import StepResult

log = logging.getLogger(__name__)


@dataclass
class ExtractSummary:
    """What an extraction did; the CLI prints it."""

    run: str
    lake: Location | Store
    steps: list[StepResult] = field(default_factory=list)  # written by this extraction
    counts: dict[StepStatus, int] = field(default_factory=lambda: dict.fromkeys(StepStatus, 0))
    failed: list[tuple[str, str]] = field(default_factory=list)  # (step label, error message)
    ignored_files: list[tuple[Path | str, str]] = field(default_factory=list)  # (path, why)
    warnings: list[str] = field(default_factory=list)  # sidecar problems, one line each
    seconds: float = 0.0
    # The format the dump was read in (pipeline/tokenlake/read/formats.py).
    dump_format: str = "miles"

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.steps)

    @property
    def samples(self) -> int:
        return sum(s.samples for s in self.steps)

    @property
    def nonfinite_values(self) -> int:
        return sum(s.nonfinite_values for s in self.steps)


class ExtractInterrupted(KeyboardInterrupt):
    """Ctrl-C stopped an extraction; `summary` holds the steps committed before it."""

    def __init__(self, summary: ExtractSummary) -> None:
        super().__init__(f"extraction of run `{summary.run}` interrupted")
        self.summary = summary


def _import_engines() -> None:
    """Import DuckDB (the catalog's engine) with a Ctrl-C held until it is done: one that lands
    inside the import of its C extension leaves the module half made, and the process then
    dies by SIGINT or SIGABRT at exit instead of stopping cleanly."""
    with sigint_held():
        importlib.import_module("duckdb")


@dataclass(frozen=True)
class ExtractOptions:
    """How to extract a dump: the options of `tokenlake extract`, for the CLI and Python alike.

    Attributes:
        run_name: The run's name in the lake; default: the dump directory's base name.
        steps: Step ids to extract (train and eval files of those steps); default: all.
            Tested with `in` only, so a lazy range selection (`tokenlake.steps.parse_steps`)
            costs nothing; selecting no step of the dump is an error.
        strict: Raise on the first bad step instead of recording it and going on.
        workers: Processes extracting steps in parallel.
        replace: Allow replacing a run of the same name extracted from another directory.
        tags: User tags set on the run (`tokenlake.tags.user_tags`); its other tags are kept.
        executor: `local` (`workers` processes) or `ray` (one Ray task per step, see
            pipeline/tokenlake/orchestrate/ray_executor.py; `workers` is then unused).
        ray_address: With `ray`: the cluster to connect to.
        follow: Keep watching a live run, extracting each step once complete (follow.py).
        poll_seconds: With `follow`: seconds between looks at the dump.
        settle_seconds: With `follow`: seconds without change after which a step whose rank
            set is not known yet (the first step, eval files) counts as complete.
        dump_format: The dump's format (`miles`, `slime-v1`, `slime-v2`, `nemo-rl`);
            default: detected from its layout (pipeline/tokenlake/read/formats.py).
        with_experts: Also write the routing-replay arrays to the `experts` table; steps
            extracted before without it are extracted again (without it, a step keeps the
            `experts` file it has until its sources change).
    """

    run_name: str | None = None
    steps: Container[int] | None = None
    strict: bool = False
    workers: int = 1
    replace: bool = False
    tags: Mapping[str, str] | None = None
    executor: str = "local"
    ray_address: str | None = None
    follow: bool = False
    poll_seconds: float = 5.0
    settle_seconds: float = 30.0
    dump_format: str | None = None
    with_experts: bool = False

    def check(self) -> ExtractOptions:
        """These options, or a UsageError naming the two that cannot go together."""
        if self.executor not in ("local", "ray"):
            raise UsageError(f"Unknown executor `{self.executor}`; choose `local` or `ray`.")
        if self.ray_address is not None and self.executor != "ray":
            raise UsageError("--ray-address needs --executor ray.")
        if self.follow:
            if self.executor == "ray" or self.with_experts:
                option = "--executor ray" if self.executor == "ray" else "--with-experts"
                raise UsageError(f"{option} cannot be combined with --follow yet.")
            if self.steps is not None or self.strict:  # not silently ignored
                option = "--steps" if self.steps is not None else "--strict"
                raise UsageError(
                    f"{option} cannot be combined with --follow, which extracts every"
                    " complete step and retries a bad one when it changes."
                )
        return self


def extract_run(
    dump_dir: Path | str,
    lake: Location | Store,
    options: ExtractOptions | None = None,
    *,
    progress: ProgressCallback | Reporter | None = None,
    ready: Callable[[dump.StepFiles], bool] | None = None,
) -> ExtractSummary:
    """Extract a dump directory into `lake` and rebuild the catalog.

    Re-extracting a run re-reads only steps whose source files changed, removes steps whose
    files disappeared, and touches no other run. With `options.steps`, only those steps are
    considered and the run's other steps are kept as they are.

    Args:
        dump_dir: The `--dump-details` directory, or the URL of a dump on an object store
            (`s3://bucket/dump`, staged locally: pipeline/tokenlake/read/remote_dump.py). Only read.
        lake: The lake's store, or its location (a directory or an object-store URL, created
            if missing).
        options: How (`ExtractOptions`; its `follow` fields are follow.py's).
        progress: Called after each step is written, or a `Reporter`.
        ready: Only steps for which it returns true are considered (live runs, see follow.py);
            the run's other steps are kept as they are, except that steps whose rollout file
            is gone are removed.

    Returns:
        What was written, what was skipped and why.
    """
    options = options or ExtractOptions()
    started = time.perf_counter()
    if options.executor == "ray":
        from tokenlake.orchestrate.ray_executor import require_ray

        require_ray()
    _import_engines()
    listing = remote_dump.discover(dump_dir, options.dump_format)
    remote_dump.check_apart(listing, str(lake))
    run = check_run_name(options.run_name if options.run_name is not None else listing.root.name)
    chosen = dump.select_steps(listing, options.steps)
    if options.with_experts:
        chosen = tuple(dataclasses.replace(s, with_experts=True) for s in chosen)
    store = prepare_lake(lake, listing.root)
    summary = ExtractSummary(
        run=run,
        lake=store.location,
        ignored_files=list(listing.ignored),
        dump_format=listing.format,
    )
    reporter = as_reporter(progress)
    with store.lock():
        store.check_links(run)  # nothing is written or swept through a planted link
        catalog.refuse_if_held(store)
        _check_other_manifests(store, run)
        record = _current_manifest(store, run, listing.source, options.replace)
        retagged = {**record.tags, **(options.tags or {})}
        tags_changed, record.tags = retagged != record.tags, retagged
        selected = [s for s in chosen if ready is None or ready(s)]
        todo = _plan(store, record, selected, summary)
        if options.steps is None:  # `ready` only defers present steps; a vanished one is gone
            _drop_vanished_steps(record, {s.label for s in listing.steps}, summary)
        reporter.planned(len(todo))
        interrupted = False
        batch: list[StepOutcome] = []
        try:
            try:
                for outcome in _outcomes(todo, store, run, options, reporter):
                    if _finished(outcome, summary, options.strict, reporter):
                        batch.append(outcome)  # first: a Ctrl-C in the progress display
                        reporter.done(outcome.result)  # type: ignore[arg-type]
                    if commit_due(len(batch), len(record.steps)):
                        _commit(store, record, batch, summary)
            except KeyboardInterrupt:
                interrupted = True
                reporter.stopping([])
        finally:  # also on Ctrl-C or an error: commit the finished steps, publish them
            with sigint_deferred() as deferred:  # a Ctrl-C now must not cut publishing short
                try:
                    if batch:
                        _commit(store, record, batch, summary)
                finally:
                    _publish_if_needed(store, record, summary, tags_changed)
            interrupted = interrupted or bool(deferred)
        if interrupted:  # Ctrl-C still propagates, with what was committed so far
            summary.seconds = time.perf_counter() - started
            raise ExtractInterrupted(summary)
        _sweep(store, run)
    summary.seconds = time.perf_counter() - started
    return summary


def drop_run(lake: Location | Store, run: str) -> None:
    """Remove a run from the lake; other runs are untouched.

    Each step leaves a consistent lake, so a kill at any point is repaired by dropping again:
    the manifest is first replaced by an empty one (the commit point: from then on no reader
    gets a row of the run, see `catalog.connect`), then the catalog is rebuilt, then the
    run's files are deleted, and the manifest last (so the run is still there to drop).
    """
    store = dump.require_lake(store_at(lake))
    manifest_name(run)  # a bad run name is refused before anything is listed
    listed = store.manifest_runs()  # a damaged manifest too (a FIFO, a link): it is dropped
    if run not in listed:
        runs = ", ".join(f"`{name}`" for name in listed) or "none"
        raise LakeError(store.location, f"has no run `{run}` (runs: {runs})")
    with store.lock():
        store.check_links(run)  # refused before anything is deleted
        store.delete_stale_temporaries()  # of a command killed earlier
        emptied = manifest.RunManifest(run=run, source_dir="")  # lists no file
        manifest.save_manifest(store.location, emptied)
        crash_point("drop:emptied")
        catalog.build_catalog(store.location)
        crash_point("drop:catalog")
        store.delete_unlisted(emptied)
        crash_point("drop:files")
        store.delete([manifest_name(run)])


def _sweep(store: Store, run: str) -> None:
    """Delete leftovers of an interrupted extraction (temporary or never-committed files).

    Judged against the manifest on disk, which the catalog (not stale) agrees with: the
    in-memory record may differ when nothing was published.
    """
    committed = manifest.load_manifest(store, run)
    if committed is not None:
        store.delete_unlisted(committed)
    store.delete_stale_temporaries()


def _changed(summary: ExtractSummary) -> bool:
    return any(summary.counts[k] for k in (StepStatus.NEW, StepStatus.UPDATED, StepStatus.REMOVED))


def catalog_is_stale(store: Store) -> bool:
    """Whether the catalog must be rebuilt: it lists other files than the manifests, or it
    is broken.

    A command killed after changing a manifest but before rebuilding the catalog (a step
    committed, a run dropped or tagged) leaves the catalog behind its manifests; a catalog
    left without its views (a full disk) or that cannot be opened is repaired too: the next
    extraction rebuilds it even if every step is unchanged by then. So is one with another
    program's write-ahead log beside it.
    """
    if catalog.has_foreign_log(store):  # first: no reader's warning about it then
        return True
    try:
        return catalog.catalog_problem(store) is not None
    except DamagedManifestError:  # the run's own manifest: publishing replaces it
        return True


def _lake_failure(path: str, problem: str) -> LakeError:
    return LakeError(
        path,
        f"{problem}. Steps committed before this are kept; free space or fix permissions,"
        " then extract again",
    )


def _publish_if_needed(
    store: Store,
    record: manifest.RunManifest,
    summary: ExtractSummary,
    tags_changed: bool = False,
) -> None:
    """Publish when something changed; a run that has never had a step committed is not
    published at all (no empty run when its first step fails or is not complete yet)."""
    known = bool(record.steps) or store.exists(manifest_name(record.run))
    if not known:
        return
    vocab_changed, warning = lake_files.refresh_vocab(store, record)
    if warning is not None:  # a broken tokenizer never blocks the run: texts stay NULL
        summary.ignored_files.append(warning)
    metrics_changed, warnings = lake_files.refresh_metrics(store, record)
    summary.warnings.extend(warnings)
    # Steps kept as they were but written by an older tokenlake get its rollups now.
    rollups_changed = maintain.refresh_rollups(store, record, warnings=summary.warnings) > 0
    # A new or changed meta.json (or a runs row of schema version 1) rewrites the runs row.
    meta_changed = lake_files.meta_source(record) != record.meta_source
    if (
        vocab_changed
        or metrics_changed
        or meta_changed
        or tags_changed
        or rollups_changed
        or _changed(summary)
        or catalog_is_stale(store)
    ):
        summary.warnings.extend(_publish(store, record, summary.dump_format) or ())


def _publish(store: Store, record: manifest.RunManifest, dump_format: str) -> list[str]:
    """Record the run row, rebuild the catalog, then delete files no manifest lists.

    Returns the warnings (a malformed meta.json, a broken user view), one line each."""
    warnings = lake_files.write_run_row(store, record, dump_format=dump_format)
    manifest.save_manifest(store, record)
    catalog.build_catalog(store, warnings)
    store.delete_unlisted(record)
    return warnings


def prepare_lake(lake: Location | Store, dump_root: Path) -> Store:
    """The lake's store, its directory created; refuses one that would write into the dump
    or into folders that are not a lake's (never write there)."""
    store = store_at(lake)
    store.check_writable_for(dump_root)
    store.create()
    return store


def _check_other_manifests(store: Store, run: str) -> None:
    """Fail before any work if another run's manifest is damaged: the catalog needs them all."""
    for name in store.manifest_runs():
        if name != run:
            manifest.load_listed(store, name)


def _current_manifest(
    store: Store, run: str, source: Path | str, replace: bool = False
) -> manifest.RunManifest:
    try:
        record = manifest.load_manifest(store, run)
    except DamagedManifestError as exc:  # extracting the run again is the repair
        log.warning("%s; extracting the run anew", exc)
        record = None
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
    store: Store,
    record: manifest.RunManifest,
    selected: list[dump.StepFiles],
    summary: ExtractSummary,
) -> list[Todo]:
    """The steps to (re)extract, each with whether it is new or updated."""
    todo: list[Todo] = []
    for files in selected:
        previous = record.steps.get(files.label)
        if previous is None:
            todo.append((files, StepStatus.NEW))
        elif (
            previous.sources != dump.fingerprint(files)
            or previous.schema_version != schema.SCHEMA_VERSION  # written by another tokenlake
            or (files.with_experts and schema.EXPERTS not in previous.files)
            or not all(store.exists(name) for name in previous.files.values())
        ):
            todo.append((files, StepStatus.UPDATED))
        else:
            summary.counts[StepStatus.UNCHANGED] += 1
    return todo


def _drop_vanished_steps(
    record: manifest.RunManifest, present: set[str], summary: ExtractSummary
) -> None:
    for key in [k for k in record.steps if k not in present]:
        del record.steps[key]
        summary.counts[StepStatus.REMOVED] += 1


def _outcomes(
    todo: list[tuple[dump.StepFiles, StepStatus]],
    store: Store,
    run: str,
    options: ExtractOptions,
    reporter: Reporter,
) -> Iterator[StepOutcome]:
    """Local workers (pipeline/tokenlake/orchestrate/scheduler.py), or one Ray task per step.
    Workers get the lake's location (plain data; each resolves its own store). Returned, not
    bound to a name: the loop holds the only reference, so an exception that leaves it closes
    the scheduler at once."""
    location = store.location
    if options.executor == "ray":
        from tokenlake.orchestrate.ray_executor import run_steps_on_ray

        return run_steps_on_ray(todo, location, run, address=options.ray_address)
    return run_steps(todo, location, run, options.workers, reporter.stopping)


# Finished steps are committed in batches: the manifest is rewritten whole at each commit, so
# one write per step would make a run's commits quadratic in its steps. A batch is committed
# once it holds 1/COMMIT_FRACTION as many steps as the manifest lists (the first steps one by
# one): each write is then at most 1/COMMIT_FRACTION larger than the one before, and all the
# writes of a run add up to at most COMMIT_FRACTION + 1 times its final manifest.
COMMIT_FRACTION = 8


def commit_due(finished: int, listed: int) -> bool:
    """Whether `finished` steps not yet committed, beside `listed` steps in the manifest,
    are committed now.

    Examples:
        >>> [commit_due(1, listed) for listed in (0, 15, 16)]
        [True, True, False]
        >>> commit_due(2, 16), commit_due(0, 0)
        (True, False)
    """
    return finished > 0 and finished >= max(1, listed // COMMIT_FRACTION)


def _finished(
    outcome: StepOutcome,
    summary: ExtractSummary,
    strict: bool,
    reporter: Reporter,
) -> bool:
    """Whether a step's files were written, to be committed; a failed step is recorded."""
    if outcome.lake_error is not None:  # the lake, not the input, is at fault: stop here
        raise _lake_failure(*outcome.lake_error)
    if outcome.error is not None:
        if strict:
            raise PipelineError(f"Step {outcome.label}: {outcome.error}")
        summary.failed.append((outcome.label, outcome.error))
        summary.counts[StepStatus.SKIPPED] += 1
        reporter.skipped(outcome.label)
        # info, not error: the caller reports `summary.failed` (the CLI would print it twice)
        log.info("step %s skipped: %s", outcome.label, outcome.error)
        return False
    assert outcome.record is not None and outcome.result is not None
    return True


def _commit(
    store: Store,
    record: manifest.RunManifest,
    batch: list[StepOutcome],
    summary: ExtractSummary,
) -> None:
    """Make finished steps' files part of the lake by listing them in the manifest (one
    write); `batch` is emptied."""
    previous = {o.label: record.steps.get(o.label) for o in batch}
    for outcome in batch:
        assert outcome.record is not None
        record.steps[outcome.label] = outcome.record
    try:
        manifest.save_manifest(store, record)
    except LakeError as exc:  # not committed: their files must not linger, the record stays
        for outcome in batch:
            assert outcome.record is not None
            store.delete(outcome.record.files.values())
            before = previous[outcome.label]
            if before is None:
                del record.steps[outcome.label]
            else:
                record.steps[outcome.label] = before
        batch.clear()
        raise _lake_failure(exc.path, exc.problem) from exc
    for outcome in batch:
        assert outcome.result is not None
        summary.steps.append(outcome.result)
        summary.warnings.extend(outcome.result.warnings)
        summary.counts[outcome.status] += 1
    batch.clear()
