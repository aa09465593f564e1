"""Extract a dump directory into the lake: plan the steps, commit each outcome, publish.

Memory is bounded by one step per worker: a step's files are loaded, turned into two tables,
written, and dropped before the next step is read. Running the steps (workers, signals,
dead-worker retry) is pipeline/tokenlake/orchestrate/scheduler.py's; this module decides what to run and commits
what comes back.

Commit protocol (see pipeline/tokenlake/store/manifest.py): a step's two Parquet files are written under fresh
names, then the run manifest is replaced to list them; the catalog is rebuilt from the
manifests; files no manifest lists (superseded, or left by a crash or by this extraction when
it is interrupted or fails) are deleted last, also when a Ctrl-C or SIGTERM stops it.
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
import math
import numbers
import time
from collections.abc import Callable, Container, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from tokenlake import schema
from tokenlake.errors import DamagedManifestError, LakeError, PipelineError, UsageError, shown
from tokenlake.layout import check_run_name, manifest_name
from tokenlake.load import lake_files
from tokenlake.orchestrate import MAX_SECONDS, MAX_WORKERS, maintain
from tokenlake.orchestrate.progress import ProgressCallback, Reporter, as_reporter
from tokenlake.orchestrate.scheduler import Todo, run_steps
from tokenlake.orchestrate.step import StepOutcome, StepStatus, incomplete_text, not_yet_text
from tokenlake.processes import crash_point
from tokenlake.read import completeness, dump, formats
from tokenlake.read.remote import remote_dump
from tokenlake.serve import catalog, rollups
from tokenlake.steps import StepSelection, as_selection
from tokenlake.store import manifest, require_lake
from tokenlake.store.base import Store
from tokenlake.tags import checked_tags
from tokenlake.threads import sigint_deferred, sigint_held
from tokenlake.transform.tables import StepResult

log = logging.getLogger(__name__)


@dataclass
class ExtractSummary:
    """What an extraction did; the CLI prints it."""

    run: str
    lake: Path | str  # the lake's location, as the CLI's summary line names it
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
        workers: Processes extracting steps in parallel; None: the core count, or this
            process alone when the steps fit one job (`scheduler.chosen_workers`).
        replace: Allow replacing a run of the same name extracted from another directory.
        tags: User tags set on the run (`tokenlake.tags.user_tags`); its other tags are kept.
        executor: `local` (`workers` processes) or `ray` (one Ray task per step, see
            pipeline/tokenlake/orchestrate/ray_executor.py; `workers` is then unused).
        ray_address: With `ray`: the cluster to connect to.
        follow: Keep watching a live run, extracting each step once complete (follow.py).
        poll_seconds: With `follow`: seconds between looks at the dump.
        settle_seconds: Seconds without change after which an incomplete step
            (`read.completeness`) lands marked incomplete instead of waiting; with `follow`
            also after which a step whose rank set is not known yet (the first step, eval
            files) counts as complete.
        dump_format: The dump's format (`miles`, `slime-v1`, `slime-v2`, `nemo-rl`);
            default: detected from its layout (pipeline/tokenlake/read/formats.py).
        with_experts: Also write the routing-replay arrays to the `experts` table; steps
            extracted before without it are extracted again (without it, a step keeps the
            `experts` file it has until its sources change).
    """

    run_name: str | None = None
    steps: Container[int] | None = None
    strict: bool = False
    workers: int | None = 1
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
        """These options, `steps` read as `tokenlake.steps.as_selection` reads them (the
        Python API's `"0-9,12"`, `5`, `range(3)`, ids), or a UsageError naming the option
        that is not valid or the two that cannot go together."""
        if self.steps is not None and not isinstance(self.steps, StepSelection):
            return dataclasses.replace(self, steps=as_selection(self.steps)).check()
        if self.tags is not None:
            checked = checked_tags(self.tags)
            if checked != self.tags:  # numbers and booleans as their JSON text
                return dataclasses.replace(self, tags=checked).check()
        if self.workers is not None:
            _check_number("workers", self.workers, 1, MAX_WORKERS, whole=True)
        _check_number("poll_seconds", self.poll_seconds, 0, MAX_SECONDS, low_open=True)
        _check_number("settle_seconds", self.settle_seconds, 0, MAX_SECONDS)
        formats.parse_format(self.dump_format)
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


def _check_number(
    name: str,
    value: object,
    low: float,
    high: float,
    *,
    whole: bool = False,
    low_open: bool = False,
) -> None:
    """An option's number (the Python API passes it as it comes; the CLI's callbacks check
    its text): finite, within [low, high] (above `low` with `low_open`), whole if `whole`.

    Examples:
        >>> _check_number("workers", "2", 1, 256, whole=True)
        Traceback (most recent call last):
        ...
        tokenlake.errors.UsageError: workers is '2'; give a whole number at least 1 and at most 256.
    """
    kind_of = numbers.Integral if whole else numbers.Real  # numpy's numbers too
    good = isinstance(value, kind_of) and not isinstance(value, bool)
    if good:
        try:
            number = float(value)  # type: ignore[arg-type]  # a Real
        except OverflowError:  # an int beyond float64
            number = math.inf
        below = number <= low if low_open else number < low
        good = math.isfinite(number) and not below and number <= high
    if not good:
        kind = "whole number" if whole else "number"
        bound = f"more than {low:g}" if low_open else f"at least {low:g}"
        raise UsageError(f"{name} is {shown(value)}; give a {kind} {bound} and at most {high:g}.")


def extract_run(
    dump_dir: Path | str,
    store: Store,
    options: ExtractOptions | None = None,
    *,
    progress: ProgressCallback | Reporter | None = None,
    ready: Callable[[dump.StepFiles], bool] | None = None,
    clock: Callable[[], float] = time.time,
) -> ExtractSummary:
    """Extract a dump directory into `lake` and rebuild the catalog.

    Re-extracting a run re-reads only steps whose source files changed, removes steps whose
    files disappeared, and touches no other run. With `options.steps`, only those steps are
    considered and the run's other steps are kept as they are.

    Args:
        dump_dir: The `--dump-details` directory, or the URL of a dump on an object store
            (`s3://bucket/dump`, staged locally: pipeline/tokenlake/read/remote/remote_dump.py). Only read.
        store: The lake's store (a directory or an object-store prefix, created if missing).
        options: How (`ExtractOptions`; its `follow` fields are follow.py's).
        progress: Called after each step is written, or a `Reporter`.
        ready: Only steps for which it returns true are considered (live runs, see follow.py);
            the run's other steps are kept as they are, except that steps whose rollout file
            is gone are removed.
        clock: The time (seconds since the epoch, like a file's mtime) an incomplete step's
            files are judged settled against (`read.completeness`; follow.py passes its own).

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
    run = check_run_name(options.run_name if options.run_name is not None else listing.root.name)
    chosen = dump.select_steps(listing, options.steps)
    if options.with_experts:
        chosen = tuple(dataclasses.replace(s, with_experts=True) for s in chosen)
    store = prepare_lake(store, listing)
    # Made while the lake is planned and the steps read: the rollups computed here, or the
    # refresh at publish, take it.
    rollups.prepare_step_connection()
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
        judge = Completeness(summary, options.settle_seconds, clock())
        todo = judge.todo(_plan(store, record, selected, summary), listing.steps)
        if options.steps is None:  # `ready` only defers present steps; a vanished one is gone
            _drop_vanished_steps(record, {s.label for s in listing.steps}, summary)
        reporter.planned(len(todo))
        # Steps to write: the catalog they end with is begun now, on the core they leave free.
        ahead = catalog.CatalogAhead(store) if todo else None
        interrupted = False
        batch: list[StepOutcome] = []
        try:
            try:
                crash_point("extract:planned")
                for outcome in _outcomes(todo, store, run, options, reporter):
                    outcome = judge.batch(record, outcome, store)
                    if _finished(outcome, summary, options.strict, reporter):
                        batch.append(outcome)  # first: a Ctrl-C in the progress display
                        reporter.done(outcome.result)  # type: ignore[arg-type]
                    if commit_due(len(batch), len(record.steps)):
                        _commit(store, record, batch, summary)
                if batch:  # before judging batch sizes: every finished step is in `record`
                    _commit(store, record, batch, summary)
                judge.short_batches_before(record)
            except KeyboardInterrupt:
                interrupted = True
                reporter.stopping([])
        finally:  # also on Ctrl-C or an error: commit the finished steps, publish what is
            # committed, then delete every file no manifest lists (written for steps not
            # committed)
            with sigint_deferred() as deferred:  # a Ctrl-C now must not cut these short
                try:
                    if batch:
                        _commit(store, record, batch, summary)
                finally:
                    try:
                        changed = tags_changed or judge.marked
                        _publish_if_needed(store, record, summary, changed, ahead)
                    finally:
                        if ahead is not None:
                            ahead.discard()
                    crash_point("extract:published")
                    sweep_leftovers(store)
            interrupted = interrupted or bool(deferred)
        if interrupted:  # Ctrl-C still propagates, with what was committed so far
            summary.seconds = time.perf_counter() - started
            raise ExtractInterrupted(summary)
    summary.seconds = time.perf_counter() - started
    return summary


@dataclass
class Completeness:
    """Applies each format's completeness rule (`read.completeness`) to an extraction: an
    incomplete step whose files still change is not extracted (skipped as not yet complete);
    a settled one is extracted, marked incomplete, with one warning line."""

    summary: ExtractSummary
    settle: float
    now: float
    marked: bool = False  # a step committed earlier was marked incomplete

    def todo(self, planned: list[Todo], listed: tuple[dump.StepFiles, ...]) -> list[Todo]:
        """The planned steps to extract, the settled incomplete ones marked; not-yet ones
        skipped (a step extracted before keeps what the lake has for it)."""
        reference = completeness.reference_ranks(listed)
        judged = []
        for files, status in planned:
            missing = completeness.step_missing(
                files, reference.get(files.label), self.now, self.settle
            )
            if missing is None:
                if completeness.unjudged(files, reference.get(files.label), self.now, self.settle):
                    files = dataclasses.replace(files, unsettled=self.settle)
                judged.append((files, status))
            elif missing.fresh:
                self._not_yet(files.label, missing.what)
            else:
                judged.append((dataclasses.replace(files, incomplete=missing.what), status))
        return judged

    def batch(
        self, record: manifest.RunManifest, outcome: StepOutcome, store: Store
    ) -> StepOutcome:
        """NeMo-RL: a training step whose sample count is below the run's batch size is not
        yet complete while its file still changes (its files are deleted), else marked."""
        step = outcome.record
        if step is None or step.evaluation or self.summary.dump_format != completeness.NEMO_RL:
            return outcome
        short = completeness.short_batch(step.samples, _batch_sizes(record, outcome.label))
        if short is None:
            return outcome
        newest = max((source.mtime_ns for source in step.sources), default=0) / 1e9
        if self.now - newest < self.settle:
            store.delete(step.files.values())
            return dataclasses.replace(
                outcome, record=None, result=None, error=not_yet_text(short, self.settle)
            )
        return _marked(outcome, short)

    def short_batches_before(self, record: manifest.RunManifest) -> None:
        """NeMo-RL steps committed before a larger one came in (earlier, or in this
        extraction, whose steps finish in any order): their sample count is now known to be
        short. Marked, with a warning; `marked` says the manifest changed."""
        if self.summary.dump_format != completeness.NEMO_RL:
            return
        for label, step in sorted(record.steps.items()):
            if step.evaluation or step.incomplete is not None:
                continue
            short = completeness.short_batch(step.samples, _batch_sizes(record, label))
            if short is not None:
                record.steps[label] = dataclasses.replace(step, incomplete=short)
                self.summary.warnings.append(incomplete_text(label, short))
                self.marked = True

    def _not_yet(self, label: str, missing: str) -> None:
        self.summary.failed.append((label, not_yet_text(missing, self.settle)))
        self.summary.counts[StepStatus.SKIPPED] += 1


def _batch_sizes(record: manifest.RunManifest, label: str) -> list[int]:
    """The sample counts of the run's other complete training steps."""
    return [
        step.samples
        for key, step in record.steps.items()
        if key != label and not step.evaluation and step.incomplete is None
    ]


def _marked(outcome: StepOutcome, missing: str) -> StepOutcome:
    assert outcome.record is not None and outcome.result is not None
    warnings = (*outcome.result.warnings, incomplete_text(outcome.label, missing))
    return dataclasses.replace(
        outcome,
        record=dataclasses.replace(outcome.record, incomplete=missing),
        result=dataclasses.replace(outcome.result, warnings=warnings),
    )


def drop_run(store: Store, run: str) -> None:
    """Remove a run from the lake; other runs are untouched.

    Each step leaves a consistent lake, so a kill at any point is repaired by dropping again:
    the manifest is first replaced by an empty one (the commit point: from then on no reader
    gets a row of the run, see `catalog.connect`), then the catalog is rebuilt, then the
    run's files are deleted, and the manifest last (so the run is still there to drop). A
    Ctrl-C after the commit point is raised once the run is gone.
    """
    store = require_lake(store)
    manifest_name(run)  # a bad run name is refused before anything is listed
    listed = store.manifest_runs()  # a damaged manifest too (a FIFO, a link): it is dropped
    if run not in listed:
        runs = ", ".join(f"`{name}`" for name in listed) or "none"
        raise LakeError(store.location, f"has no run `{run}` (runs: {runs})")
    with store.lock():
        store.check_links(run)  # refused before anything is deleted
        store.delete_stale_temporaries()  # of a command killed earlier
        emptied = manifest.RunManifest(run=run, source_dir="")  # lists no file
        with sigint_held():  # from the commit point, a Ctrl-C waits until the run is gone
            manifest.save_manifest(store, emptied)
            crash_point("drop:emptied")
            catalog.build_catalog(store)
            crash_point("drop:catalog")
            store.delete_unlisted(emptied)
            crash_point("drop:files")
            store.delete([manifest_name(run)])


def sweep_leftovers(store: Store) -> int:
    """Delete what interrupted extractions left, of any run: files the naming scheme made that
    no manifest lists (written for a step never committed, or superseded), and temporaries
    whose writer is gone. Returns how many lake files were deleted.

    Judged against the manifests on disk, which the catalog (not stale) agrees with: the
    in-memory record may differ when nothing was published. Only under the lake's lock: no
    other writer has files in flight then. A damaged manifest sweeps nothing (what it lists
    is unknown); the extraction that repairs it sweeps.
    """
    try:
        doomed = manifest.leftovers(store)
    except DamagedManifestError as exc:
        log.info("not swept: %s", exc)
        doomed = []
    store.delete(doomed)
    store.delete_stale_temporaries()
    if doomed:
        log.info("deleted %d files that no manifest lists", len(doomed))
    return len(doomed)


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
    ahead: catalog.CatalogAhead | None = None,
) -> None:
    """Publish when something changed; a run that has never had a step committed is not
    published at all (no empty run when its first step fails or is not complete yet).
    `ahead`: the catalog begun for this extraction, if any."""
    known = bool(record.steps) or store.exists(manifest_name(record.run))
    if not known:
        return
    # Side files a stranger changed (or removed) are written again from the dump.
    side_changed = lake_files.forget_changed_side_files(store, record)
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
        side_changed
        or vocab_changed
        or metrics_changed
        or meta_changed
        or tags_changed
        or rollups_changed
        or _changed(summary)
        or catalog_is_stale(store)
    ):
        summary.warnings.extend(_publish(store, record, summary.dump_format, ahead) or ())


def _publish(
    store: Store,
    record: manifest.RunManifest,
    dump_format: str,
    ahead: catalog.CatalogAhead | None = None,
) -> list[str]:
    """Record the run row, rebuild the catalog (from `ahead` if given), then delete files no
    manifest lists.

    Returns the warnings (a malformed meta.json, a broken user view), one line each."""
    warnings = lake_files.write_run_row(store, record, dump_format=dump_format)
    manifest.save_manifest(store, record)
    catalog.build_catalog(store, warnings, ahead)
    store.delete_unlisted(record)
    return warnings


def prepare_lake(store: Store, listing: dump.Dump) -> Store:
    """The lake's store, its directory created; refuses one that overlaps a dump or holds
    folders that are not a lake's (never write there)."""
    check_apart(listing, store)
    store.check_writable()
    store.create()
    return store


def check_apart(listing: dump.Dump, store: Store) -> None:
    """Refuse a lake that overlaps a dump, the one place this is decided: the lake inside the
    dump being read (`overlap`), the same folder, the dump inside the lake, or the lake (or a
    folder above it) being some other dump by its layout (`formats.dump_mark`)."""
    problem = overlap(listing.url or listing.root, store.location) or _dump_at_or_above(store)
    if problem is not None:
        raise LakeError(store.location, f"{problem}; {_NEVER}")


_NEVER = "a lake and a dump never share a folder: choose a --lake outside every dump"


def overlap(dump_location: Path | str, lake_location: Path | str) -> str | None:
    """How the lake's location overlaps the dump's (None: apart). Local paths are compared
    resolved (symbolic links followed); object-store URLs as (store, bucket, key segments).

    Examples:
        >>> overlap("s3://b/run", "s3a://b//run/lake/"), overlap("s3://b/run", "s3://b/runs")
        ('is inside the dump `s3://b/run`', None)
        >>> overlap("s3://b/lake/tokens/run", "s3://b/lake"), overlap("s3://b/x", "S3A://b/x/")
        ('holds the dump `s3://b/lake/tokens/run`', 'is the dump `s3://b/x` itself')
    """
    dump_at, lake_at = _place(dump_location), _place(lake_location)
    if dump_at[:2] != lake_at[:2]:
        return None
    dump_keys, lake_keys = dump_at[2], lake_at[2]
    if lake_keys == dump_keys:
        return f"is the dump `{dump_location}` itself"
    if lake_keys[: len(dump_keys)] == dump_keys:
        return f"is inside the dump `{dump_location}`"
    if dump_keys[: len(lake_keys)] == lake_keys:
        return f"holds the dump `{dump_location}`"
    return None


def _place(location: Path | str) -> tuple[str, str, tuple[str, ...]]:
    """(store, bucket, key segments) of an object-store URL; ("", "", path parts) of a local
    path, resolved."""
    if isinstance(location, str) and remote_dump.is_remote(location):
        return remote_dump.store_location(location)
    return "", "", Path(location).resolve().parts


def _dump_at_or_above(store: Store) -> str | None:
    """How the lake's folder, or a folder above it, is a dump by its layout (None: neither
    is): one listing of each, for an object store up to its bucket."""
    location = store.location
    if isinstance(location, Path):  # a directory: the store holds it resolved
        for folder in (location, *location.parents):
            mark = formats.local_dump_mark(folder)
            if mark is not None:
                return _dump_named(str(location), str(folder), mark)
        return None
    _, bucket, keys = remote_dump.store_location(location)
    scheme = location.split("://", 1)[0]
    for depth in range(len(keys), -1, -1):
        url = "/".join((f"{scheme}://{bucket}", *keys[:depth]))
        mark = remote_dump.remote_dump_mark(url)
        if mark is not None:
            return _dump_named(location, location if depth == len(keys) else url, mark)
    return None


def _dump_named(lake_location: str, folder: str, mark: str) -> str:
    return (
        f"is a dump ({mark})"
        if folder == lake_location
        else f"is inside `{folder}`, a dump ({mark})"
    )


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
    Workers get the store pickled (it travels as its location: `ObjectStore.__reduce__`).
    Returned, not bound to a name: the loop holds the only reference, so an exception that
    leaves it closes the scheduler at once."""
    if options.executor == "ray":
        from tokenlake.orchestrate.ray_executor import run_steps_on_ray

        return run_steps_on_ray(todo, store, run, address=options.ray_address)
    return run_steps(todo, store, run, options.workers, reporter.stopping)


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
    crash_point("extract:written")  # the steps' files are written, not yet committed
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
    crash_point("extract:committed")
