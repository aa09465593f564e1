"""Check the rollout-sample values that the join and the flattener read (dump-format.md 2.3).

Every value comes from a file anyone could have written. A value of a type the spec allows is
read as it is; one out of its type or range is a `SampleValueError` naming the field, which
`located` turns into the step's one-line error naming file and sample. Nothing is coerced:
token 6.7 is not read as 6, the string "6" is not parsed, `response_length` 10.9 is not 10.

Per-token lists are checked as whole arrays (dtype, then min and max); only when that fails is
the list walked to name the first bad entry. The checked arrays are returned (`CheckedSample`)
and the flattener reads those: each list is converted to numpy once. The sample dicts are never
changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from tokenlake import schema
from tokenlake.errors import DumpFormatError, SampleValueError, shown
from tokenlake.read import sampling_support, weight_versions
from tokenlake.read.values import INT64_MAX, INT64_MIN, first_bool, flat_array, is_int
from tokenlake.steptypes import CheckedSample, ListArray

# The per-token lists `check_sample` reads as arrays: the unpickler may give them as
# `ListArray` (`dump.load_rollout`), which is read exactly as the list it was.
ARRAY_FIELDS = frozenset(
    {"tokens", "loss_mask", schema.ROLLOUT_LOG_PROBS_FIELD, *schema.ROLLOUT_TOKEN_FIELDS}
)


def sample_label(position: int, sample: dict[str, Any]) -> str:
    """How errors name a sample: its batch position and `Sample.index`."""
    return f"batch position {position}, sample_index {sample.get('index')}"


def check_samples(path: Path, samples: list[dict[str, Any]]) -> list[CheckedSample]:
    """Check every sample before the step is joined and flattened; raise for the first bad one."""
    checked = []
    for position, sample in enumerate(samples):
        try:
            checked.append(check_sample(sample))
        except SampleValueError as exc:
            exc.position = position
            raise located(exc, path, samples) from None
    return checked


def located(exc: SampleValueError, path: Path, samples: list[dict[str, Any]]) -> DumpFormatError:
    """The error naming the file and the sample (by batch position, and `Sample.index` unless
    the index itself is the bad value).

    Examples:
        >>> exc = SampleValueError("index", "is 'zero', not an integer")
        >>> exc.position = 1
        >>> str(located(exc, Path("d/rollout_data/3.pt"), [{}, {"index": "zero"}]))
        "`d/rollout_data/3.pt` (batch position 1): `index` is 'zero', not an integer"
    """
    position = exc.position if exc.position is not None else 0
    sample = samples[position]
    label = f"batch position {position}" if exc.field == "index" else sample_label(position, sample)
    return DumpFormatError(path, str(exc), sample=label)


def check_sample(sample: dict[str, Any]) -> CheckedSample:
    """The checks that must pass before any other code reads the sample; `index` first, as
    every later message names the sample by it."""
    optional_int64(sample.get("index"), "index")
    tokens = token_ids(sample)
    length = response_length(sample, len(tokens))
    mask, log_probs = (
        None if sample.get(key) is None else _numeric_list(sample[key], key, what)
        for key, what in (("loss_mask", "integers"), ("rollout_log_probs", "numbers"))
    )
    weights = weight_versions.parse(sample.get("weight_versions"))
    supports = sampling_support.support_sizes(sample, length)
    per_token = {
        key: _numeric_list(sample[key], key, "numbers")
        for key in schema.ROLLOUT_TOKEN_FIELDS
        if sample.get(key) is not None
    }
    return CheckedSample(tokens, length, mask, log_probs, weights, supports, per_token)


def optional_int64(value: Any, field: str) -> int | None:
    """An integer that fits the int64 column, or None.

    Examples:
        >>> optional_int64(0.5, "index")
        Traceback (most recent call last):
        ...
        tokenlake.errors.SampleValueError: `index` is 0.5, not an integer
    """
    if value is None:
        return None
    if not is_int(value):
        raise SampleValueError(field, f"is {shown(value)}, not an integer")
    number = int(value)
    if not INT64_MIN <= number <= INT64_MAX:
        raise SampleValueError(field, f"is {shown(number)}, outside the int64 range")
    return number


def token_ids(sample: dict[str, Any]) -> np.ndarray:
    """`Sample.tokens` as int64 ids (0 or more), checked as one array; missing or None: empty."""
    values = sample.get("tokens")
    if values is None:
        return np.zeros(0, dtype=np.int64)
    array = _numeric_list(values, "tokens", "integers")
    if array.size and (array.min() < 0 or array.max() > INT64_MAX):
        _raise_first_bad(_as_list(values), "tokens", _token_problem)
    return array.astype(np.int64, copy=False)


def response_length(sample: dict[str, Any], total: int) -> int:
    """R: an integer from 0 to the number of tokens; missing or None reads as 0."""
    value = sample.get("response_length")
    if value is None:
        return 0
    if not is_int(value):
        raise SampleValueError("response_length", f"is {shown(value)}, not an integer")
    length = int(value)
    if length < 0:
        raise SampleValueError("response_length", f"is {shown(length)}; it cannot be negative")
    if length > total:
        raise SampleValueError("response_length", f"{shown(length)} exceeds the {total} `tokens`")
    return length


# What each per-token list holds: the numpy dtype kinds of a good array, and the entry check.
_ENTRY_KINDS = {"integers": "biu", "numbers": "iuf"}


def _numeric_list(values: Any, field: str, what: str) -> np.ndarray:
    """A flat list of `what` ("integers" or "numbers") as one array. Masks and log-probs may
    also be a 1-D array already (the flattener reads either); `tokens` must be a list."""
    kinds = "iu" if field == "tokens" else _ENTRY_KINDS[what]
    if type(values) is ListArray:  # a list, decoded as np.array would convert it
        if values.dtype.kind in kinds:
            return values.view(np.ndarray)
        values = values.tolist()  # the list's own entries name the first bad one
    if isinstance(values, np.ndarray) and field != "tokens":
        if values.ndim == 1 and values.dtype.kind in kinds:
            return values
    if not isinstance(values, list | tuple):
        raise SampleValueError(field, f"is {shown(values)}, not a list of {what}")
    if not values:
        return np.zeros(0, dtype=np.int64)
    array = flat_array(values)
    if array is None or array.dtype.kind not in kinds or _hides_a_bool(values, array, kinds):
        problem = _token_problem if field == "tokens" else _ENTRY_PROBLEMS[what]
        _raise_first_bad(values, field, problem)
        # Each entry is right, but numpy promoted the mix (int64 with uint64 gives float64).
        return np.array(values, dtype=np.float64 if what == "numbers" else np.int64)
    return array


def _hides_a_bool(values: list[Any] | tuple[Any, ...], array: np.ndarray, kinds: str) -> bool:
    """A bool numpy turned into 1 or 0 in a list of numbers or token ids (masks may hold
    bools: there `True` is 1)."""
    return "b" not in kinds and first_bool(values, array) is not None


def _as_list(values: Any) -> Any:
    """A decoded list as the list it was (errors show its entries as Python numbers)."""
    return values.tolist() if type(values) is ListArray else values


def _token_problem(value: Any) -> str | None:
    if not is_int(value):
        return f"is {shown(value)}, not an integer"
    if value < 0:
        return f"is {shown(value)}; token ids cannot be negative"
    if value > INT64_MAX:
        return f"is {shown(value)}, outside the int64 range"
    return None


def _integer_problem(value: Any) -> str | None:
    """Masks: integers or bools (the reference treats `value > 0` as on)."""
    if isinstance(value, bool | np.bool_):
        return None
    if not is_int(value):
        return f"is {shown(value)}, not an integer"
    if not INT64_MIN <= value <= INT64_MAX:
        return f"is {shown(value)}, outside the int64 range"
    return None


def _number_problem(value: Any) -> str | None:
    if isinstance(value, bool | np.bool_) or not isinstance(
        value, int | float | np.integer | np.floating
    ):
        return f"is {shown(value)}, not a number"
    if isinstance(value, int) and abs(value).bit_length() > 1000:  # float() would overflow
        return f"is {shown(value)}, beyond the float64 range"
    return None


_ENTRY_PROBLEMS = {"integers": _integer_problem, "numbers": _number_problem}


def _raise_first_bad(values: Any, field: str, problem: Callable[[Any], str | None]) -> None:
    """Walk the list (only once the array check failed) and raise for its first bad entry."""
    for entry, value in enumerate(values):
        text = problem(value)
        if text is not None:
            raise SampleValueError(field, f"entry {entry} {text}")
