"""The values one step passes from stage to stage, the same for every dump format.

A format's reader (`read/miles.py`, `read/slime_v2.py`, `read/nemo_rl.py`) returns a `StepRead`:
the step's samples, each one's checked arrays (`CheckedSample`, from `read/validate.py`) and
resolved train side (`TrainRow`, from `read/resolve.py`). Flattening and the `samples` summary
(`transform/`) read only these, so a format lacking a value gives None there and the lake holds
NULL. They live on the ground floor so that every stage may take them without importing the
stage that makes them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_DIGITS = re.compile(r"[0-9]+")


@dataclass(frozen=True)
class Span:
    """Tokens `start` .. `end - 1` of `Sample.tokens` were generated under weights `version`."""

    version: str
    start: int
    end: int


@dataclass(frozen=True)
class WeightVersions:
    """One sample's weight versions, checked (`read/weight_versions.py` parses them)."""

    versions: tuple[str, ...]  # every version in call order (spans flattened)
    calls: int | None  # engine calls: spans' entries; a legacy list's length; None if unknown
    spans: tuple[Span, ...] | None  # None for the legacy shape

    @property
    def numeric_min(self) -> int | None:
        """The least all-digit version (`weight_version_min`), None when there is none."""
        numeric = [int(v) for v in self.versions if _DIGITS.fullmatch(v)]
        return min(numeric) if numeric else None


NO_WEIGHT_VERSIONS = WeightVersions((), None, None)


class ListArray(np.ndarray):
    """A pickled or JSON list of numbers (or of bools) decoded straight into an array (int64
    for a list of integers, float64 for one of floats, bool for one of bools: what `np.array`
    makes of the list).

    Only where a reader asked for it (`tokenlake.read.pt.load`'s `arrays_under`,
    `tokenlake.read.jsonarrays.object_line`'s `wanted`); the type
    tells such a list from an array the pickle built itself, which the dump format may refuse
    where it expects a list (`Sample.tokens`).
    """


@dataclass(frozen=True)
class CheckedSample:
    """One sample's per-token lists, checked and converted (each exactly once)."""

    tokens: np.ndarray  # int64 [T], ids from 0
    response_length: int  # R, from 0 to T
    loss_mask: np.ndarray | None  # 1-D integers or bools; its length is not checked against R
    rollout_log_probs: np.ndarray | None  # 1-D numbers; its length is not checked against R
    weights: WeightVersions = NO_WEIGHT_VERSIONS  # `weight_versions`, either shape
    support_sizes: np.ndarray | None = None  # int32 [R] sampler support sizes; None: unbounded
    # `schema.ROLLOUT_TOKEN_FIELDS` the sample has (teacher log-probs, loss weights, ...):
    # 1-D numbers each; their lengths are not checked against R
    per_token: dict[str, np.ndarray] = field(default_factory=dict)

    @property
    def response_tokens(self) -> np.ndarray:
        """The last R token ids: the response."""
        return self.tokens[len(self.tokens) - self.response_length :]


@dataclass(frozen=True)
class TrainRow:
    """The resolved train side of one sample (a value: later stages read it, never change it)."""

    dumped_rank: int | None  # None: the format records no rank (NeMo-RL)
    response_length: int
    total_length: int
    loss_mask: np.ndarray  # int, length R (train side, authoritative)
    normalized_reward: float | None
    truncated: bool | None
    raw_reward: float | None
    fields: dict[str, np.ndarray | None]  # CP-sliced field -> full response array or None
    alignment_failed: bool
    # bool [R]: positions no CP rank stores (prompt length 0); unknown in every CP-sliced field
    holes: np.ndarray | None = None
    # field -> bool [R]: positions the format wrote as unknown (prime-rl's `null`): NULL in
    # that field's column, and in `lp_diff` where either log-prob is unknown
    nulls: dict[str, np.ndarray] = field(default_factory=dict)
    # int [R]: the response token ids the train row's values are of (miles' train `tokens`),
    # compared with the rollout sample's; None: the format records none, or they do not fit
    response_tokens: np.ndarray | None = None


@dataclass(frozen=True)
class StepRead:
    """One step's samples in batch order, checked, with their resolved train rows."""

    # Sample dicts with miles' keys (dump-format.md 2.3); `transform/summary.py` reads them.
    samples: list[dict[str, Any]]
    checked: list[CheckedSample]  # `validate.check_samples(samples)`
    train_rows: dict[int, TrainRow]  # batch position -> train row
    train_files: int  # train files the step had (0: rollout-only)
    # Each sample's conversation as JSON text; None: from the dump's trajectory file, if any.
    messages: list[str | None] | None = None
    # `samples` columns the format does not log for this step: NULL in every row, never the
    # 0 or [] the summary would derive from an absent value (NeMo-RL's token-less lines).
    unknown: tuple[str, ...] = ()
    # The rollout file's top-level `metadata` (miles: e.g. `batch_kind: tinker`), else None.
    batch_metadata: Any = None
