"""Whether a step's files are all there, from what the dump itself says: one rule per format.

miles, slime and NeMo-RL write no completion marker (dump-format.md 7), so a step is judged
by what its dump declares; prime-rl writes one, and its reader lists a step only once its
`STABLE` is there (read/prime_rl.py):

- miles and slime format 1 (`train_data/{rid}_{rank}.pt`): the ranks a step must have are
  those of the nearest other training step of the dump that has train files (the one before
  it, else the one after). A rank missing from that set is missing from the step, unless,
  once read, the step's train files hold every sample of its rollout, none refused by the
  CP/PP reassembly (a run resumed on another rank layout: `covers_every_sample`). A step no
  other training step tells the rank set of (a run's first) is not complete, while its files
  still change, until its train files hold every sample (`unjudged`): rank 0's file may be
  there long before the others'.
- slime format 2 (`train_data/{rid}.pt`): the one train file is written whole by one rank
  (a file cut short fails to load, `pt.load`); nothing more to count.
- NeMo-RL (`train_data_step{N}.jsonl`): a file cut at a line boundary loads; its sample count
  is then below the run's batch size, the largest count of its other training steps
  (`short_batch`, judged when the counts are known, at commit).
- prime-rl before 2026-06-11 wrote no `STABLE`: a step folder a later step folder shows
  finished (it has a file of each of its ranks: every rank moved on) is complete; the newest
  (`StepFiles.unmarked`) is judged by its files settling, then marked incomplete.
- Every format: a training step without any train file is a rollout-only step (`samples`
  says so: `train_files` 0), extracted again when its train files appear; `--follow` waits
  for it to settle first (pipeline/tokenlake/orchestrate/follow.py).

An incomplete step is *fresh* while any of its files changed less than `settle` seconds ago
(every file of the step, not only one that fails to load): it is not extracted yet. Settled,
it lands with one warning line naming what is missing, and is marked incomplete
(`StepRecord.incomplete`, the `incomplete_steps` audit).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenlake import schema
from tokenlake.read import dump
from tokenlake.steps import describe_ids

PER_RANK_FORMATS = ("miles", "slime-v1")
NEMO_RL = "nemo-rl"
# The formats whose reader lists a step only once the framework marked it complete (prime-rl's
# `STABLE`): `--follow` takes such a step at once, without waiting for its files to settle.
MARKED_FORMATS = ("prime-rl",)


@dataclass(frozen=True)
class Missing:
    """What a step lacks, and whether its files still change (then: not yet)."""

    what: str  # e.g. `ranks 1-3 of ranks 0-3 have no train file`
    fresh: bool
    seconds: float  # since its newest file changed


def step_missing(
    files: dump.StepFiles, expected_ranks: frozenset[int] | None, now: float, settle: float
) -> Missing | None:
    """What the step's files lack by its format's rule (None: complete, or nothing to count).

    `expected_ranks`: the ranks another step of the run has (`reference_ranks`), if known."""
    if files.unmarked is not None:  # prime-rl before its `STABLE`: judged by settling
        age = seconds_since_change(files, now)
        return Missing(files.unmarked, age < settle, age)
    if files.evaluation or files.format not in PER_RANK_FORMATS or not files.train_files:
        return None
    gone = missing_ranks(files.ranks, expected_ranks)
    if not gone:
        return None
    age = seconds_since_change(files, now)
    verb = "has" if len(gone) == 1 else "have"
    what = f"{_ranges(gone)} of {_ranges(gone | files.ranks)} {verb} no train file"
    return Missing(what, age < settle, age)


def unjudged(
    files: dump.StepFiles, expected_ranks: frozenset[int] | None, now: float, settle: float
) -> bool:
    """Whether a training step of a per-rank format has train files but no other step to
    tell its rank set, and its files changed less than `settle` seconds ago: it is complete
    only if they hold every sample (`covers_every_sample`, judged once it is read)."""
    return (
        not files.evaluation
        and files.format in PER_RANK_FORMATS
        and bool(files.train_files)
        and expected_ranks is None
        and seconds_since_change(files, now) < settle
    )


def uncovered(samples: Any) -> str:
    """What a step whose train files do not hold every sample lacks, as `not_yet_text`
    words it.

    Examples:
        >>> import pyarrow as pa
        >>> uncovered(pa.table({schema.HAS_TRAIN_ROW: [True, False, False]}))
        'its train files hold 1 of its 3 samples'
    """
    import pyarrow.compute as pc

    held = pc.sum(samples.column(schema.HAS_TRAIN_ROW).cast("int64")).as_py() or 0
    return f"its train files hold {held} of its {samples.num_rows} samples"


def missing_ranks(present: frozenset[int], expected: frozenset[int] | None) -> frozenset[int]:
    """The `expected` ranks that are not present (rank numbers may be sparse: miles writes
    one file per DP/CP shard since 2026-09, dump-format.md 9b, so no gap counts by itself).

    Examples:
        >>> sorted(missing_ranks(frozenset({0, 2}), frozenset({0, 1, 2, 3})))
        [1, 3]
        >>> sorted(missing_ranks(frozenset({8, 12}), None))
        []
    """
    return frozenset(expected or ()) - present


def reference_ranks(steps: Sequence[dump.StepFiles]) -> dict[str, frozenset[int]]:
    """Label -> the rank set of the nearest other training step with train files (the one
    before it, else the one after), for the per-rank formats."""
    trained = [s for s in steps if not s.evaluation and s.train_files]
    trained.sort(key=lambda s: s.rollout_id)
    reference: dict[str, frozenset[int]] = {}
    for files in steps:
        if files.evaluation or files.format not in PER_RANK_FORMATS:
            continue
        before = [s for s in trained if s.rollout_id < files.rollout_id]
        after = [s for s in trained if s.rollout_id > files.rollout_id]
        nearest = before[-1] if before else (after[0] if after else None)
        if nearest is not None:
            reference[files.label] = nearest.ranks
    return reference


def short_batch(samples: int, others: Sequence[int]) -> str | None:
    """NeMo-RL: what a training step lacks when its sample count is below the run's batch
    size (the largest count of its other training steps); None when it is not.

    Examples:
        >>> short_batch(5, [16, 16]), short_batch(16, [16]), short_batch(5, [])
        ("it has 5 samples; the run's other training steps have 16", None, None)
    """
    batch = max(others, default=0)
    if samples >= batch:
        return None
    return f"it has {samples} samples; the run's other training steps have {batch}"


def covers_every_sample(samples: Any) -> bool:
    """Whether a training step's `samples` table shows every sample with a train row and
    none refused by the CP/PP reassembly: its rank files are all there, whatever their set."""
    import pyarrow.compute as pc

    if samples.num_rows == 0:
        return False
    covered = pc.all(samples.column(schema.HAS_TRAIN_ROW)).as_py()
    refused = pc.any(samples.column(schema.ALIGNMENT_FAILED)).as_py()
    return bool(covered) and not refused


def seconds_since_change(files: dump.StepFiles, now: float) -> float:
    """Seconds since the newest of the step's files changed (0: one is gone, still moving)."""
    if files.remote is not None:
        newest = max(mtime for _, _, mtime in files.remote.objects) / 1e9
        return now - newest
    try:
        newest = max(path.stat().st_mtime for path in files.paths)
    except FileNotFoundError:
        return 0.0
    return now - newest


def _ranges(ranks: frozenset[int]) -> str:
    """`ranks 1-3, 5` or `rank 2`.

    Examples:
        >>> _ranges(frozenset({1, 2, 3, 5})), _ranges(frozenset({2}))
        ('ranks 1-3, 5', 'rank 2')
    """
    return f"{'ranks' if len(ranks) > 1 else 'rank'} {describe_ids(sorted(ranks))}"
