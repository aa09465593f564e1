"""A selection of steps (`0-9,12`), as every command and the Python API take it."""

from __future__ import annotations

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
        if not low.isdigit() or (sep and not high.isdigit()):
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
