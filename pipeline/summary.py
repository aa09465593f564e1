"""Per-sample scalar columns of the `samples` table (dump-format.md 6.2), from one sample dict
and its resolved train row. Pure Python over one sample; no tokens are touched here.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pipeline.resolve import TrainRow

_DIGITS = re.compile(r"[0-9]+")


def sample_summary(
    rollout_id: int,
    evaluation: bool,
    position: int,
    sample: dict[str, Any],
    train: TrainRow | None,
    step_train_files: int = 0,
) -> dict[str, Any]:
    """One `samples` row (column names from `pipeline.schema.SAMPLES_SCHEMA`)."""
    tokens = list(sample.get("tokens") or [])
    response_length = int(sample.get("response_length") or 0)
    prompt_length = len(tokens) - response_length
    versions = [str(v) for v in sample.get("weight_versions") or []]
    version_min = _min_numeric_version(versions)
    status = _status(sample.get("status"))
    return {
        "evaluation": evaluation,
        "batch_position": position,
        "sample_index": _int_or_none(sample.get("index")),
        "group_index": _int_or_none(sample.get("group_index")),
        "rollout_execution_id": _int_or_none(sample.get("rollout_id")),
        "status": status,
        "remove_sample": bool(sample.get("remove_sample", False)),
        "response_length": response_length,
        "total_length": len(tokens),
        "prompt_length": prompt_length,
        "reward": reference_reward(sample.get("reward")),
        "reward_json": _reward_json(sample.get("reward")),
        "weight_versions": versions,
        "weight_version": versions[-1] if versions else None,
        "weight_version_min": version_min,
        "mixed_version": len(set(versions)) > 1 if versions else None,
        "staleness": rollout_id - version_min if version_min is not None else None,
        "turns": len(versions) if versions else None,
        "tool_calls": _tool_calls(sample.get("prompt")),
        "non_generation_time": _float_or_none(sample.get("non_generation_time", 0.0)),
        "spec_accept_rate": _ratio(
            sample.get("spec_info"), "spec_accept_token_num", "spec_draft_token_num"
        ),
        "prefix_cache_hit_rate": _ratio(
            sample.get("prefix_cache_info"), "cached_tokens", "total_prompt_tokens"
        ),
        "label": _text_or_none(sample.get("label")),
        "prompt_text": _prompt_text(sample.get("prompt")),
        "response_text": _text_or_none(sample.get("response")),
        "prompt_token_ids": [int(t) for t in tokens[:prompt_length]],
        "metadata_json": to_json(sample.get("metadata") or {}),
        "step_train_files": step_train_files,
        **_train_side(train, status),
    }


def _train_side(train: TrainRow | None, status: str | None) -> dict[str, Any]:
    status_truncated = status == "truncated"
    if train is None:
        return {
            "has_train_row": False,
            "raw_reward": None,
            "normalized_reward": None,
            "truncated": status_truncated,
            "dumped_rank": None,
            "alignment_failed": False,
            "train_total_length": None,
            "train_response_length": None,
        }
    return {
        "has_train_row": True,
        "raw_reward": train.raw_reward,
        "normalized_reward": train.normalized_reward,
        "truncated": status_truncated if train.truncated is None else train.truncated,
        "dumped_rank": train.dumped_rank,
        "alignment_failed": train.alignment_failed,
        "train_total_length": train.total_length,
        "train_response_length": train.response_length,
    }


def reference_reward(reward: Any) -> float | None:
    """float(reward) when the reference accepts it: Python int/float (bool, numpy.float64).

    Examples:
        >>> reference_reward(True), reference_reward(2), reference_reward({"acc": 1.0})
        (1.0, 2.0, None)
    """
    if isinstance(reward, int | float):
        return float(reward)
    return None


def _reward_json(reward: Any) -> str | None:
    if reward is None or isinstance(reward, int | float):
        return None
    return to_json(reward)


def _min_numeric_version(versions: list[str]) -> int | None:
    numeric = [int(v) for v in versions if _DIGITS.fullmatch(v)]
    return min(numeric) if numeric else None


def _tool_calls(prompt: Any) -> int | None:
    if not isinstance(prompt, list):
        return None
    return sum(
        1 for message in prompt if isinstance(message, dict) and message.get("role") == "tool"
    )


def _ratio(info: Any, numerator: str, denominator: str) -> float | None:
    """A counter ratio from a dict or an old-style object (spec_info before 2025-12)."""
    if info is None:
        return None
    get = (
        info.get
        if isinstance(info, dict)
        else lambda key, default=None: getattr(info, key, default)
    )
    den = get(denominator, 0) or 0
    if not den:
        return None
    return float(get(numerator, 0) or 0) / float(den)


def _status(status: Any) -> str | None:
    if status is None:
        return None
    return str(getattr(status, "value", status))


def _prompt_text(prompt: Any) -> str | None:
    if prompt is None or isinstance(prompt, str):
        return prompt
    return to_json(prompt)


def _text_or_none(value: Any) -> str | None:
    if value is None or isinstance(value, str):
        return value
    return to_json(value)


def _int_or_none(value: Any) -> int | None:
    return None if value is None else int(value)


def _float_or_none(value: Any) -> float | None:
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


def to_json(value: Any) -> str:
    """JSON text of a dump value; numpy scalars and arrays and unknown objects stay readable.

    Examples:
        >>> to_json({"a": [1, 2.5], "b": "é"})
        '{"a": [1, 2.5], "b": "é"}'
    """
    return json.dumps(value, ensure_ascii=False, default=_json_default, allow_nan=True)


def _json_default(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if hasattr(value, "__dict__"):
        return {"__class__": type(value).__name__, **vars(value)}
    return repr(value)
