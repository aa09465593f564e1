"""A selection of steps (`0-9,12`), as every command and the Python API take it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from tokenlake.errors import UsageError

INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class StepSelection:
    """A `--steps` selection: inclusive ranges, tested lazily (`0-10000000000` costs nothing).

    Examples:
        >>> selection = parse_steps("0-2,7")
        >>> [s for s in range(10) if s in selection]
        [0, 1, 2, 7]
    """

    text: str
    ranges: tuple[tuple[int, int], ...]

    def __str__(self) -> str:
        return self.text

    def __contains__(self, step: object) -> bool:
        return isinstance(step, int) and any(lo <= step <= hi for lo, hi in self.ranges)


def parse_steps(text: str | None) -> StepSelection | None:
    """Parse `0-9,12` into a lazy step selection; malformed or reversed ranges are errors."""
    if text is None:
        return None
    ranges = []
    for part in text.split(","):
        low, sep, high = part.strip().partition("-")
        if not _digits(low) or (sep and not _digits(high)):
            raise UsageError(f"--steps `{text}` is not a list of steps or ranges like `0-9,12`.")
        lo, hi = int(low), int(high) if sep else int(low)
        if max(lo, hi) > INT64_MAX:
            raise UsageError(f"--steps `{text}`: a step id is at most {INT64_MAX}.")
        if lo > hi:
            raise UsageError(
                f"--steps `{text}`: range `{part.strip()}` is reversed; write `{hi}-{lo}`."
            )
        ranges.append((lo, hi))
    return StepSelection(text, tuple(ranges))


def _digits(text: str) -> bool:
    """ASCII digits only: `isdigit` alone passes `²` (which `int` refuses) and `١` (read as 1).

    Examples:
        >>> _digits("12"), _digits("²"), _digits("١"), _digits("")
        (True, False, False, False)
    """
    return text.isascii() and text.isdigit()


def as_selection(steps: object) -> StepSelection | None:
    """What the Python API takes as steps, as the CLI reads `--steps`: None (every step), a
    string like `0-9,12`, one step id, a range, or step ids; anything else is a UsageError.

    Examples:
        >>> str(as_selection([3, 1, 2, 7])), str(as_selection(range(0, 4))), str(as_selection(5))
        ('1-3,7', '0-3', '5')
        >>> as_selection(["1"])
        Traceback (most recent call last):
        ...
        tokenlake.errors.UsageError: steps: `'1'` is not a step id; give ints, a range, or a string like `0-9,12`.
    """
    if steps is None or isinstance(steps, StepSelection):
        return steps
    if isinstance(steps, str):
        return parse_steps(steps)
    if isinstance(steps, range) and steps.step == 1:
        if not steps:
            raise UsageError(f"steps: `{steps}` is empty; it selects no step.")
        low, high = steps[0], steps[-1]
        if low < 0 or high > INT64_MAX:
            raise UsageError(_NOT_A_STEP.format(shown=low if low < 0 else high))
        return StepSelection(str(low) if low == high else f"{low}-{high}", ((low, high),))
    values = [steps] if isinstance(steps, int) else steps
    if not isinstance(values, Iterable):
        raise UsageError(_NOT_A_STEP.format(shown=repr(steps)[:80]))
    ids = []
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= INT64_MAX:
            raise UsageError(_NOT_A_STEP.format(shown=repr(value)[:80]))
        ids.append(value)
    return _of_ids(ids)  # no id: the empty selection, nothing


_NOT_A_STEP = "steps: `{shown}` is not a step id; give ints, a range, or a string like `0-9,12`."


def _of_ids(ids: Iterable[int]) -> StepSelection:
    """The selection of exactly these step ids (a range: its two ends), as ranges."""
    ordered = sorted(set(ids))
    ranges: list[tuple[int, int]] = []
    for step in ordered:
        if ranges and step == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], step)
        else:
            ranges.append((step, step))
    text = ",".join(str(lo) if lo == hi else f"{lo}-{hi}" for lo, hi in ranges)
    return StepSelection(text, tuple(ranges))


def describe_ids(ids: Sequence[int]) -> str:
    """`0-2, 5`: step ids as ranges, for a message.

    Examples:
        >>> describe_ids([5, 0, 1, 2])
        '0-2, 5'
    """
    return _of_ids(ids).text.replace(",", ", ") if ids else "none"
