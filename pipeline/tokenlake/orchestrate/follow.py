"""Follow a live run: extract each step once it is complete, until stopped.

miles writes every file in place, with no completion marker (dump-format.md 7), so a step counts
as complete when:
- its train files cover the ranks that the run's newest extracted step had, or none of its files
  changed for `settle_seconds` (rank numbers may be sparse, and a run resumed across an upgrade
  of miles, or onto another layout, changes its rank set: a rank the step never gets is not
  waited for beyond the settle time, and the next steps are expected to have the new set);
- an evaluation file (never has train files) or a step without train files has not changed for
  `settle_seconds` (such a step is extracted rollout-side only and extracted again when its
  train files appear).
prime-rl marks a complete step itself (`STABLE`, without which its reader lists no step):
such a step is complete as soon as it is listed.
A file that fails to load is skipped for now and retried when it changes; each round re-lists
the directory, and a step whose files changed since its extraction is extracted again.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from tokenlake.orchestrate.extract import (
    ExtractInterrupted,
    ExtractOptions,
    ExtractSummary,
    check_run_name,
    extract_run,
)
from tokenlake.orchestrate.progress import ProgressCallback
from tokenlake.orchestrate.scheduler import ctrl_c_remembered
from tokenlake.read import completeness, dump
from tokenlake.read.remote import remote_dump
from tokenlake.store import manifest
from tokenlake.store.base import Store

log = logging.getLogger(__name__)


@dataclass
class FollowState:
    """What earlier rounds learnt: the rank set of complete steps, and failures not to retry."""

    expected_ranks: frozenset[int] | None = None
    failed: dict[str, tuple[tuple[str, int, int], ...]] = field(default_factory=dict)


def follow_run(
    dump_dir: Path | str,
    store: Store,
    options: ExtractOptions | None = None,
    *,
    progress: ProgressCallback | None = None,
    on_round: Callable[[ExtractSummary], None] | None = None,
    should_stop: Callable[[], bool] = lambda: False,
    clock: Callable[[], float] = time.time,
) -> FollowState:
    """Extract complete steps every `options.poll_seconds` until `should_stop()` or Ctrl-C.

    With `options.replace`, a run of the same name extracted from another directory is
    replaced (by the first round that extracts a step); without it that is an error. `clock`
    is the time, in seconds since the epoch like a file's mtime, that `settle_seconds` is
    counted against: a test moves it forward instead of waiting.

    Returns:
        The final state (rank set learnt, failures pending a change).
    """
    options = options or ExtractOptions(follow=True)
    run_name = options.run_name
    run = check_run_name(run_name if run_name is not None else remote_dump.dump_name(dump_dir))
    state = FollowState(expected_ranks=_known_ranks(store, run))
    stopped = False
    try:
        with ctrl_c_remembered() as ctrl_c:
            while not (should_stop() or ctrl_c):
                summary = follow_round(dump_dir, store, run, state, options, progress, clock)
                if options.dump_format is None and summary.steps:
                    # Detected once a step landed: later rounds skip the look inside a
                    # rollout file that tells miles from slime (a download, for a dump on a
                    # store).
                    options = replace(options, dump_format=summary.dump_format)
                if on_round is not None:
                    on_round(summary)
                if should_stop() or ctrl_c:
                    break
                time.sleep(options.poll_seconds)
        stopped = bool(ctrl_c)  # a Ctrl-C whose KeyboardInterrupt a library swallowed
    except KeyboardInterrupt as exc:
        if isinstance(exc, ExtractInterrupted) and on_round is not None:  # a round cut short
            on_round(exc.summary)
        stopped = True
    if stopped:
        log.info("stopped by the user; the lake holds every step committed so far")
    return state


def follow_round(
    dump_dir: Path | str,
    store: Store,
    run: str,
    state: FollowState,
    options: ExtractOptions,
    progress: ProgressCallback | None,
    clock: Callable[[], float] = time.time,
) -> ExtractSummary:
    """One pass: extract what is complete at `clock()`, remember what failed."""
    now = clock()
    # Stamps taken before reading: a file completed while it was read must count as changed
    # (a stamp taken after the failure would match the finished file and never retry it).
    attempted: dict[str, tuple[tuple[str, int, int], ...]] = {}

    def ready(files: dump.StepFiles) -> bool:
        stamp = attempted[files.label] = _stamp(files)
        if state.failed.get(files.label) == stamp:
            return False  # failed before and unchanged since: wait for the file to change
        return is_complete(files, state.expected_ranks, now, options.settle_seconds)

    once = replace(options, run_name=run, steps=None, strict=False, follow=False)
    summary = extract_run(dump_dir, store, once, progress=progress, ready=ready, clock=lambda: now)
    for label, message in summary.failed:
        state.failed[label] = attempted[label]
        # info: `on_round` shows the failure to the user (the CLI prints "Not yet: ...")
        log.info("step %s not extracted yet: %s", label, message)
    if summary.steps:  # the rank set learnt from every step the manifest now records
        state.expected_ranks = _known_ranks(store, run) or state.expected_ranks
    return summary


def is_complete(
    files: dump.StepFiles, expected_ranks: frozenset[int] | None, now: float, settle: float
) -> bool:
    """Whether a step's files are all there and (where that is all we can tell) settled; a
    step its framework marked complete (prime-rl's `STABLE`) is."""
    if files.format in completeness.MARKED_FORMATS:
        return True
    ranks = files.ranks
    if not files.evaluation and ranks and expected_ranks is not None and expected_ranks <= ranks:
        return True
    try:
        newest = max(p.stat().st_mtime for p in files.paths)
    except FileNotFoundError:
        return False
    return now - newest >= settle


def _stamp(files: dump.StepFiles) -> tuple[tuple[str, int, int], ...]:
    stamp = []
    for path in files.paths:
        try:
            stat = path.stat()
        except FileNotFoundError:
            continue
        stamp.append((path.name, stat.st_size, stat.st_mtime_ns))
    return tuple(stamp)


def _known_ranks(store: Store, run: str) -> frozenset[int] | None:
    """The rank set of the newest already-extracted step with train files (a run's rank set
    can change between steps, so an older, larger one is no promise for the next)."""
    record = manifest.load_manifest(store, run)
    if record is None:
        return None
    newest: tuple[int, frozenset[int]] | None = None
    for step in record.steps.values():
        ranks = frozenset(
            rank for rank in (dump.rank_of(s.name) for s in step.sources) if rank is not None
        )
        if ranks and (newest is None or step.rollout_id > newest[0]):
            newest = (step.rollout_id, ranks)
    return None if newest is None else newest[1]
