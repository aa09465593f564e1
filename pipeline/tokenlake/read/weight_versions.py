"""`Sample.weight_versions` in both of its shapes (dump-format.md 2.3 and 9b).

- Legacy: a list of strings, one per engine call that reported a version.
- Spans (miles #1891/#1892): one entry per engine call, each a list of spans
  `{"version": str, "abs_start": int, "abs_end": int}`: half-open positions in `Sample.tokens`
  (prompt included), increasing and non-overlapping across the whole sample. A call the engine
  did not stamp is `[]` and still counts as a call.

Both give the sample's versions in call order (the summary columns) and, where the dump says
it, the version that produced each response token. Positions no span covers have none; a
legacy list gives a version per token only when its calls can be placed on the response
(`legacy_calls`), never a guess.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from tokenlake.errors import SampleValueError, shown
from tokenlake.read.jsontext import clean_text
from tokenlake.read.values import INT64_MAX, INT64_MIN, is_int
from tokenlake.steptypes import NO_WEIGHT_VERSIONS, Span, WeightVersions

FIELD = "weight_versions"
_DIGITS = re.compile(r"[0-9]+")
_SPAN_KEYS = ("version", "abs_start", "abs_end")


# What a response token's version may take on average (`token_version` repeats each version on
# every token it covers): real versions are counters and hashes of a few dozen characters.
MAX_VERSION_BYTES_PER_TOKEN = 256


def parse(value: Any) -> WeightVersions:
    """Check `weight_versions` (missing or None: no versions) in whichever shape it has.

    Raises:
        SampleValueError: a value is of the wrong type, or spans are not increasing.
    """
    if value is None:
        return NO_WEIGHT_VERSIONS
    if not isinstance(value, list | tuple):
        raise SampleValueError(FIELD, f"is {shown(value)}, not a list")
    if not value:
        return NO_WEIGHT_VERSIONS
    if isinstance(value[0], list | tuple):
        return _parse_spans(value)
    versions = tuple(_version(version, f"entry {entry}") for entry, version in enumerate(value))
    return WeightVersions(versions, len(versions), None)


def _parse_spans(calls: list[Any] | tuple[Any, ...]) -> WeightVersions:
    spans: list[Span] = []
    previous_end = 0
    for call, entry in enumerate(calls):
        if not isinstance(entry, list | tuple):
            problem = f"entry {call} is {shown(entry)}, not a list of spans like entry 0"
            raise SampleValueError(FIELD, problem)
        for number, raw in enumerate(entry):
            where = f"entry {call} span {number}"
            span = _span(raw, where)
            if not previous_end <= span.start < span.end:
                problem = (
                    f"{where} covers [{span.start}, {span.end}); spans must be non-empty,"
                    f" increasing and not overlap (the previous one ends at {previous_end})"
                )
                raise SampleValueError(FIELD, problem)
            previous_end = span.end
            spans.append(span)
    return WeightVersions(tuple(s.version for s in spans), len(calls), tuple(spans))


def _span(raw: Any, where: str) -> Span:
    if not isinstance(raw, dict):
        keys = ", ".join(_SPAN_KEYS)
        raise SampleValueError(FIELD, f"{where} is {shown(raw)}, not a dict of {keys}")
    missing = [f"`{key}`" for key in _SPAN_KEYS if key not in raw]  # other keys: ignored
    if missing:
        raise SampleValueError(FIELD, f"{where} lacks {', '.join(missing)}")
    bounds = []
    for key in ("abs_start", "abs_end"):
        number = raw[key]
        if not is_int(number) or not 0 <= number <= INT64_MAX:
            problem = f"{where} `{key}` is {shown(number)}, not a position (an integer from 0)"
            raise SampleValueError(FIELD, problem)
        bounds.append(int(number))
    return Span(_version(raw["version"], f"{where} `version`"), bounds[0], bounds[1])


def _version(version: Any, where: str) -> str:
    """An engine-reported version: a string, or an integer written as its digits."""
    if is_int(version) and INT64_MIN <= version <= INT64_MAX:
        version = str(int(version))
    if not isinstance(version, str):
        raise SampleValueError(FIELD, f"{where} is {shown(version)}, not a string")
    # An all-digit version is a number (`weight_version_min`, staleness), so it must fit int64.
    if _DIGITS.fullmatch(version) and (len(version) > 19 or int(version) > INT64_MAX):
        problem = f"{where} is {shown(version)}, a number outside the int64 range"
        raise SampleValueError(FIELD, problem)
    return clean_text(version)


@dataclass(frozen=True)
class TokenVersions:
    """The version of each response token, as codes into `names` (-1: no version known)."""

    names: tuple[str, ...]
    codes: np.ndarray  # int32 [R]


def per_token(
    weights: WeightVersions, total_length: int, response_length: int, mask: np.ndarray | None
) -> TokenVersions | None:
    """The version that produced each of the R response tokens, or None when unknown for all.

    Spans: a position inside a span has its version, one outside every span none. Spans that
    end beyond `Sample.tokens` do not fit this token grid (media expansion shifts positions and
    spans are not remapped), so nothing is placed. Legacy lists: see `legacy_calls`.
    """
    placed: TokenVersions | None
    if weights.spans is not None:
        if any(span.end > total_length for span in weights.spans):
            return None
        placed = _from_spans(weights.spans, total_length - response_length, response_length)
    else:
        placed = legacy_calls(weights.versions, response_length, mask)
    if placed is not None:
        _check_repeated_bytes(placed)
    return placed


def _check_repeated_bytes(placed: TokenVersions) -> None:
    """Refuse versions whose strings, repeated on every token they cover (`token_version`),
    would take more than MAX_VERSION_BYTES_PER_TOKEN a token: a 1 MiB version on a 40 000
    token response is 40 GiB of one string (SampleValueError)."""
    lengths = np.array([len(name.encode("utf-8", "surrogatepass")) for name in placed.names])
    counts = np.bincount(placed.codes[placed.codes >= 0], minlength=len(lengths))
    repeated = int(np.dot(lengths, counts))
    tokens = len(placed.codes)
    if repeated > MAX_VERSION_BYTES_PER_TOKEN * tokens:
        problem = (
            f"would repeat {repeated:,} bytes of version strings on its {tokens:,} response"
            f" tokens; `token_version` holds at most {MAX_VERSION_BYTES_PER_TOKEN} bytes a token"
        )
        raise SampleValueError(FIELD, problem)


def _from_spans(spans: tuple[Span, ...], prompt_length: int, response_length: int) -> TokenVersions:
    names = tuple(dict.fromkeys(span.version for span in spans))
    code_of = {name: code for code, name in enumerate(names)}
    codes = np.full(response_length, -1, dtype=np.int32)
    for span in spans:
        start = max(span.start - prompt_length, 0)
        end = max(span.end - prompt_length, 0)
        codes[start:end] = code_of[span.version]
    return TokenVersions(names, codes)


def legacy_calls(
    versions: tuple[str, ...], response_length: int, mask: np.ndarray | None
) -> TokenVersions | None:
    """A legacy list's versions placed on the response, when its calls can be placed.

    One version and no loss mask: the one call generated the whole response. Otherwise each
    loss-covered run of the generator's mask (`loss_mask > 0`) is one engine call, and the
    versions are placed on the runs only when there are exactly as many runs as versions;
    positions between runs (tool output) have none. Anything else is None (unknown), since a
    call that reported no version is left out of the list and could be any of them.
    """
    if not versions:
        return None
    names = tuple(dict.fromkeys(versions))
    code_of = {name: code for code, name in enumerate(names)}
    if mask is None:
        if len(versions) != 1:
            return None
        return TokenVersions(names, np.zeros(response_length, dtype=np.int32))
    if mask.ndim != 1 or len(mask) != response_length:
        return None
    covered = np.asarray(mask) > 0
    starts = covered & ~np.concatenate(([False], covered[:-1]))
    if int(starts.sum()) != len(versions):
        return None
    run = np.cumsum(starts) - 1  # the run each covered position is in
    lookup = np.array([code_of[v] for v in versions], dtype=np.int32)
    codes = np.where(covered, lookup[np.maximum(run, 0)], -1).astype(np.int32)
    return TokenVersions(names, codes)


def numeric(version: str) -> int | None:
    """The number an all-digit version stands for (parse checked it fits int64), else None."""
    return int(version) if _DIGITS.fullmatch(version) else None
