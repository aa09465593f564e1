"""Tinker-style batches (miles #2273 / #2365, dump-format.md 9b): losses from client-supplied
per-token channels instead of rewards.

For a batch whose rollout dump says `metadata["batch_kind"] == "tinker"`, the train
conversion fills the per-token channels a sample lacks with 0.0 (`[0.0] * R`) so that one
batch can mix samples with and without them: a sample without engine log-probs gets
0.0-filled `rollout_log_probs` (which would read as a huge drift), one without `loss_weights`
or `advantages` zero weights or advantages. Such a batch carries no rewards either: the
train side writes 0.0 for every sample's `rewards` and `raw_reward`. Those values are the
writer's filler, so they are NULL in the lake.
"""

from __future__ import annotations

from typing import Any

TINKER = "tinker"
# Train field -> the rollout-sample key whose absence makes the train values filler.
_FILLED = {
    "rollout_log_probs": "rollout_log_probs",
    "loss_weights": "loss_weights",
    "advantages": "advantages",
}


def is_tinker(metadata: Any) -> bool:
    """Whether the rollout dump's top-level `metadata` marks a Tinker batch."""
    kind = metadata.get("batch_kind") if isinstance(metadata, dict) else None
    return isinstance(kind, str) and kind == TINKER


def placeholder_fields(tinker: bool, sample: dict[str, Any]) -> frozenset[str]:
    """The train fields whose values for this sample are the writer's 0.0 filler."""
    if not tinker:
        return frozenset()
    return frozenset(field for field, key in _FILLED.items() if sample.get(key) is None)
