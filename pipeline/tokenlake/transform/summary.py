"""Per-sample scalar columns of the `samples` table (dump-format.md 6.2), from one sample dict
and its resolved train row. Pure Python over one sample; no tokens are touched here.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenlake import schema
from tokenlake.errors import SampleValueError, shown
from tokenlake.read import sampling_support, validate, weight_versions
from tokenlake.read.jsontext import clean_text, to_json
from tokenlake.read.values import INT64_MAX, INT64_MIN
from tokenlake.steptypes import TrainRow

# Speculative-decoding counters (accepted, drafted): each as its names, newest first (#2598
# renamed them; a dump has one of the two).
_SPEC_COUNTERS = (
    ("spec_num_correct_drafts", "spec_accept_token_num"),
    ("spec_num_proposed_drafts", "spec_draft_token_num"),
)


def sample_summary(
    rollout_id: int,
    evaluation: bool,
    position: int,
    sample: dict[str, Any],
    train: TrainRow | None,
    step_train_files: int = 0,
) -> dict[str, Any]:
    """One `samples` row (column names from `tokenlake.schema.SAMPLES_SCHEMA`).

    Raises:
        SampleValueError: a value is out of its type or range; `position` is set on it.
    """
    try:
        row = _rollout_side(rollout_id, sample)
    except SampleValueError as exc:
        exc.position = position
        raise
    status = row[schema.STATUS]
    return {
        schema.EVALUATION: evaluation,
        schema.BATCH_POSITION: position,
        **row,
        schema.STEP_TRAIN_FILES: step_train_files,
        **_train_side(train, status),
    }


def _rollout_side(rollout_id: int, sample: dict[str, Any]) -> dict[str, Any]:
    tokens = sample.get("tokens")
    tokens = [] if tokens is None else tokens  # checked by `validate.check_sample` already
    response_length = validate.response_length(sample, len(tokens))
    prompt_length = len(tokens) - response_length
    weights = weight_versions.parse(sample.get("weight_versions"))
    versions = list(weights.versions)
    version_min = weights.numeric_min
    reward = sample.get("reward")
    return {
        schema.SAMPLE_INDEX: validate.optional_int64(sample.get("index"), "index"),
        schema.GROUP_INDEX: validate.optional_int64(sample.get("group_index"), "group_index"),
        schema.ROLLOUT_EXECUTION_ID: validate.optional_int64(
            sample.get("rollout_id"), "rollout_id"
        ),
        schema.STATUS: _optional_text(sample.get("status"), "status"),
        schema.REMOVE_SAMPLE: _flag(sample.get("remove_sample"), "remove_sample"),
        schema.RESPONSE_LENGTH: response_length,
        schema.TOTAL_LENGTH: len(tokens),
        schema.PROMPT_LENGTH: prompt_length,
        schema.REWARD: reference_reward(reward),
        schema.REWARD_JSON: None
        if reward is None or _is_number(reward)
        else to_json(reward, "reward"),
        schema.WEIGHT_VERSIONS: versions,
        schema.WEIGHT_VERSION: versions[-1] if versions else None,
        schema.WEIGHT_VERSION_MIN: version_min,
        schema.MIXED_VERSION: len(set(versions)) > 1 if versions else None,
        schema.STALENESS: rollout_id - version_min if version_min is not None else None,
        **_start_version(rollout_id, sample.get("start_weight_version")),
        schema.TURNS: weights.calls,
        schema.TOOL_CALLS: _tool_calls(sample.get("prompt")),
        schema.NON_GENERATION_TIME: _optional_float(
            sample.get("non_generation_time", 0.0), "non_generation_time"
        ),
        schema.SPEC_ACCEPT_RATE: _ratio(sample.get("spec_info"), "spec_info", *_SPEC_COUNTERS),
        schema.PREFIX_CACHE_HIT_RATE: _ratio(
            sample.get("prefix_cache_info"),
            "prefix_cache_info",
            "cached_tokens",
            "total_prompt_tokens",
        ),
        schema.LABEL: _text_or_json(sample.get("label"), "label"),
        schema.PROMPT_TEXT: _text_or_json(sample.get("prompt"), "prompt"),
        schema.RESPONSE_TEXT: _text_or_json(sample.get("response"), "response"),
        schema.PROMPT_TOKEN_IDS: list(tokens[:prompt_length]),
        schema.METADATA_JSON: to_json(_or_empty(sample.get("metadata")), "metadata"),
        # checked with the sample (`validate.check_sample`): both keys or neither
        schema.BOUNDED_SAMPLING: sampling_support.bounded(sample),
        schema.ENV_NAME: _optional_text(sample.get("env_name"), "env_name"),
    }


def _train_side(train: TrainRow | None, status: str | None) -> dict[str, Any]:
    status_truncated = status == "truncated"
    if train is None:
        return {
            schema.HAS_TRAIN_ROW: False,
            schema.RAW_REWARD: None,
            schema.NORMALIZED_REWARD: None,
            schema.TRUNCATED: status_truncated,
            schema.DUMPED_RANK: None,
            schema.ALIGNMENT_FAILED: False,
            schema.TRAIN_TOTAL_LENGTH: None,
            schema.TRAIN_RESPONSE_LENGTH: None,
        }
    return {
        schema.HAS_TRAIN_ROW: True,
        schema.RAW_REWARD: train.raw_reward,
        schema.NORMALIZED_REWARD: train.normalized_reward,
        schema.TRUNCATED: status_truncated if train.truncated is None else train.truncated,
        schema.DUMPED_RANK: train.dumped_rank,
        schema.ALIGNMENT_FAILED: train.alignment_failed,
        schema.TRAIN_TOTAL_LENGTH: train.total_length,
        schema.TRAIN_RESPONSE_LENGTH: train.response_length,
    }


def reference_reward(reward: Any) -> float | None:
    """float(reward) when the reference accepts it: Python int/float (bool, numpy.float64).

    Examples:
        >>> reference_reward(True), reference_reward(2), reference_reward({"acc": 1.0})
        (1.0, 2.0, None)
    """
    if not _is_number(reward):
        return None
    try:
        return float(reward)
    except OverflowError:  # an int beyond float64, such as 10**400
        raise SampleValueError("reward", f"is {shown(reward)}, beyond the float64 range") from None


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float)


def _start_version(rollout_id: int, value: Any) -> dict[str, int | None]:
    """`start_weight_version` (the version when the trajectory was submitted: an int or None)
    and its lag `start_staleness` (NULL when that does not fit int64: no real version)."""
    start = validate.optional_int64(value, "start_weight_version")
    lag = None if start is None else rollout_id - start
    if lag is not None and not INT64_MIN <= lag <= INT64_MAX:
        lag = None
    return {schema.START_WEIGHT_VERSION: start, schema.START_STALENESS: lag}


def _tool_calls(prompt: Any) -> int | None:
    if not isinstance(prompt, list):
        return None
    return sum(
        1
        for message in prompt
        if isinstance(message, dict) and _is_text(message.get("role"), "tool")
    )


def _is_text(value: Any, text: str) -> bool:
    """`value == text` for strings only: `==` on an array would compare element-wise."""
    return isinstance(value, str) and value == text


def _ratio(
    info: Any, field: str, numerator: str | tuple[str, ...], denominator: str | tuple[str, ...]
) -> float | None:
    """A counter ratio from a dict (the reader turns spec_info's older object into one); a counter
    given as several names is read under the first name the dict has."""
    if info is None:
        return None
    if not isinstance(info, dict):
        raise SampleValueError(field, f"is {shown(info)}, not a dict of counters")
    num = _counter(info, field, numerator)
    den = _counter(info, field, denominator)
    return num / den if den and num is not None else None


def _counter(info: dict[Any, Any], field: str, names: str | tuple[str, ...]) -> int | None:
    """The counter under the first of its names the dict has; None when it has none (or
    only None): a missing numerator is unknown, not a 0 of a 0.0 rate."""
    names = (names,) if isinstance(names, str) else names
    name = next((n for n in names if info.get(n) is not None), None)
    return None if name is None else _count(info.get(name), f"{field}.{name}")


def _count(value: Any, field: str) -> int:
    """A counter: an integer from 0 (missing or None: 0)."""
    number = validate.optional_int64(value, field) or 0
    if number < 0:
        raise SampleValueError(field, f"is {number}; a count cannot be negative")
    return number


def _flag(value: Any, field: str) -> bool:
    """A bool (Python or numpy); missing or None is False."""
    if value is None:
        return False
    if not isinstance(value, bool | np.bool_):
        raise SampleValueError(field, f"is {shown(value)}, not a bool")
    return bool(value)


def _optional_text(value: Any, field: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise SampleValueError(field, f"is {shown(value)}, not a string")
    return clean_text(value)


def _optional_float(value: Any, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool | np.bool_) or not isinstance(value, int | float | np.number):
        raise SampleValueError(field, f"is {shown(value)}, not a number")
    try:
        return float(value)
    except (OverflowError, TypeError):  # an int beyond float64; a complex number
        raise SampleValueError(field, f"is {shown(value)}, not a float64 number") from None


def _text_or_json(value: Any, field: str) -> str | None:
    """Text as it is; anything else (a chat prompt, a dict label) as JSON."""
    if value is None:
        return None
    if isinstance(value, str):
        return clean_text(value)
    return to_json(value, field)


def _or_empty(value: Any) -> Any:
    return {} if value is None else value
