"""What a dump format's reader gives the later stages for one step (one shape for every format).

The miles reader (pipeline/tokenlake/transform/step.py) and each other format's reader
(`slime_v2`, `nemo_rl`) return a `StepRead`; flattening and the `samples` summary read only
this, so a format lacking a value gives None there and the lake holds NULL.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tokenlake.read.resolve import TrainRow
from tokenlake.read.validate import CheckedSample


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
