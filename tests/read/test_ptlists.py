"""The lists of numbers `ptread.load` decodes whole-array (`ptlists`, asked for with
`arrays_under`) are exactly the lists the unpickler makes, and everything else (values and
errors) is what the exact load gives: on every fixture file, on random pickles and on
mutated ones."""

from __future__ import annotations

import math
import pickle
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.forge import write_pt
from tests.read.test_ptread import REAL_FILES, assert_same
from tests.read.test_ptread_layouts import LAYOUTS, written_layout
from tokenlake.errors import PipelineError
from tokenlake.read import validate
from tokenlake.read.pt import ptcheck, ptlists, ptread, ptzip
from tokenlake.steptypes import ListArray

KEYS = ("samples", frozenset({"tokens", "loss_mask", "rollout_log_probs"}))


def _outcome(path: Path, arrays_under: Any) -> tuple[Any, ...]:
    try:
        return ("value", ptread.load(path, arrays_under))
    except PipelineError as exc:
        return ("error", type(exc).__name__, str(exc))


def _as_lists(value: Any, where: tuple[Any, ...], found: list[tuple[Any, ...]]) -> Any:
    """The value with each ListArray as its list; `found` gets where each one was."""
    if type(value) is ListArray:
        found.append(where)
        return value.tolist()
    if isinstance(value, dict):
        return type(value)((k, _as_lists(v, (*where, k), found)) for k, v in value.items())
    if isinstance(value, list | tuple):
        return type(value)(_as_lists(v, (*where, i), found) for i, v in enumerate(value))
    return value


def assert_fast_is_exact(path: Path) -> int:
    """The load with `arrays_under` equals the exact one; returns how many lists it decoded."""
    exact, fast = _outcome(path, None), _outcome(path, KEYS)
    if exact[0] == "error":
        assert fast == exact
        return 0
    assert fast[0] == "value", fast
    found: list[tuple[Any, ...]] = []
    assert_same(_as_lists(fast[1], (), found), exact[1])
    for where in found:
        assert len(where) == 3 and where[0] == "samples" and where[2] in KEYS[1], where
        got = fast[1]["samples"][where[1]][where[2]]
        want = np.array(exact[1]["samples"][where[1]][where[2]])
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        assert got.tobytes() == want.tobytes(), where  # NaN payloads and -0.0 too
    return len(found)


def _write(tmp_path: Path, value: Any, name: str = "x.pt") -> Path:
    return write_pt(tmp_path / name, pickle.dumps(value, protocol=2))


# --- the fixture files -------------------------------------------------------------------------


@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: "/".join(p.parts[-3:]))
def test_every_fixture_file_loads_the_same_with_its_lists_decoded(path: Path) -> None:
    assert_fast_is_exact(path)


@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_generated_rollout_file_loads_the_same_with_its_lists_decoded(
    tmp_path: Path, name: str
) -> None:
    rollouts = written_layout(tmp_path, name, "rollout_data/*.pt")
    decoded = sum(assert_fast_is_exact(path) for path in rollouts)
    if name == "example":  # its lists of at least ptlists.MIN_ITEMS numbers
        assert decoded == 48


# --- random and mutated pickles ----------------------------------------------------------------

_INT_RANGES = [(0, 255), (0, 65535), (-(2**31), 2**31 - 1), (0, 2**40)]
_SIZES = [0, 1, 2, 63, 64, 65, 999, 1000, 1001, 2000, 2001, 3500]


def _numbers(rng: random.Random, size: int) -> list[Any]:
    """A list of one kind of number, or (now and then) mixed or with a stray value."""
    kind = rng.randrange(6)
    if kind == 0:
        values: list[Any] = [rng.uniform(-30.0, 0.0) for _ in range(size)]
        specials = [math.nan, -math.nan, math.inf, -math.inf, -0.0, 5e-324, 1.7976931348623157e308]
        for _ in range(min(size, 5)):
            values[rng.randrange(size)] = rng.choice(specials)
        return values
    if kind == 5:  # one entry of another kind somewhere
        if not size:
            return []
        values = [rng.randrange(0, 65536) for _ in range(size)]
        values[rng.randrange(size)] = rng.choice([0.5, True, None, "7", 2**40, [1]])
        return values
    low, high = _INT_RANGES[kind - 1]
    return [rng.randint(low, high) for _ in range(size)]


def _rollout(rng: random.Random) -> dict[str, Any]:
    samples = []
    for index in range(rng.randrange(1, 5)):
        sample: dict[str, Any] = {"index": index}
        for key in ("tokens", "loss_mask", "rollout_log_probs", "metadata_list"):
            if rng.random() < 0.9:
                sample[key] = _numbers(rng, rng.choice(_SIZES))
        samples.append(sample)
    return {"rollout_id": 0, "samples": samples, "metadata": {"tokens": _numbers(rng, 100)}}


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(0, 2**32 - 1))
def test_random_rollouts_load_the_same_with_their_lists_decoded(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    path = _write(tmp_path, _rollout(rng), f"{seed}.pt")
    assert_fast_is_exact(path)


def test_plain_lists_are_decoded_and_others_are_not(tmp_path: Path) -> None:
    ints, floats = list(range(-5, 2995)), [i / 7 for i in range(1001)]
    fragmented = [70_000, 5] * 500  # BININT, BININT2, BININT, ...
    sample = {"tokens": ints, "loss_mask": [1] * 64, "rollout_log_probs": floats}
    other = {"tokens": [1] * 63, "loss_mask": [*ints, 0.5], "rollout_log_probs": fragmented}
    value = {"samples": [sample, other], "m": list(ints)}  # a copy: a shared list stays a list
    path = _write(tmp_path, value)
    assert assert_fast_is_exact(path) == 3
    got = ptread.load(path, KEYS)
    assert [type(got["samples"][0][k]) for k in ("tokens", "loss_mask", "rollout_log_probs")] == [
        ListArray
    ] * 3
    assert type(got["samples"][1]["tokens"]) is list  # shorter than ptlists.MIN_ITEMS
    assert type(got["samples"][1]["loss_mask"]) is list  # not one kind of number
    assert type(got["samples"][1]["rollout_log_probs"]) is list  # runs too short to pay
    assert type(got["m"]) is list  # not under `samples`


@pytest.mark.parametrize("seed", range(300))
def test_mutated_pickles_load_or_fail_the_same_with_their_lists_decoded(
    tmp_path: Path, seed: int
) -> None:
    rng = random.Random(seed)
    data = bytearray(pickle.dumps(_rollout(random.Random(seed // 10)), protocol=2))
    for _ in range(rng.randrange(1, 4)):
        at = rng.randrange(2, len(data))
        # opcodes that could use a decoded list: APPEND(S), SETITEM(S), BUILD, DUP, POP, GET,
        # MARK, TUPLE, and the numbers themselves
        data[at] = rng.choice([*b"aesubt20h(\x85GKMJX", rng.randrange(256)])
    path = write_pt(tmp_path / "m.pt", bytes(data))
    assert_fast_is_exact(path)


# --- what the pickle may do to a list after it is built ------------------------------------------


def _list_then(ops: bytes) -> bytes:
    """{'samples': [{'tokens': [0..99]}]} with `ops` run right after the list is built."""
    items = b"(" + b"".join(b"K" + bytes([i]) for i in range(100)) + b"e"
    return (
        b"\x80\x02}q\x00X\x07\x00\x00\x00samplesq\x01]q\x02}q\x03X\x06\x00\x00\x00tokensq\x04"
        + b"]q\x05"
        + items
        + ops
        + b"s"  # SETITEM: sample['tokens'] = the top
        + b"as."  # APPEND the sample, SETITEM root['samples']
    )


@pytest.mark.parametrize(
    "ops",
    [
        pytest.param(b"", id="plain"),
        pytest.param(b"X\x01\x00\x00\x00za", id="append-text-to-it"),
        pytest.param(b"(K\x01G?\xf0\x00\x00\x00\x00\x00\x00e", id="appends-another-kind"),
        pytest.param(b"Nb", id="build-none"),
        pytest.param(b"}b", id="build-dict"),
        pytest.param(b"N}\x86b", id="build-slots"),
        pytest.param(b"}K\x01K\x02s0", id="setitem-onto-it"),
        pytest.param(b"2\x86", id="dup-into-a-tuple"),
        pytest.param(b"h\x05\x86", id="get-into-a-tuple"),
        pytest.param(b"N\x86}\x94h\x06N", id="as-a-dict-key-by-memo"),
        pytest.param(b"0K\x07", id="popped"),
    ],
)
def test_a_list_used_as_more_than_a_value_loads_as_the_unpickler_makes_it(
    tmp_path: Path, ops: bytes
) -> None:
    from tests.forge import write_pt as write

    assert_fast_is_exact(write(tmp_path / "x.pt", _list_then(ops)))


def test_the_plain_list_is_decoded(tmp_path: Path) -> None:
    path = write_pt(tmp_path / "x.pt", _list_then(b""))
    assert ptread.load(path, KEYS)["samples"][0]["tokens"].tolist() == list(range(100))


# --- the validator reads a decoded list as the list -------------------------------------------


@pytest.mark.parametrize(
    ("sample", "message"),
    [
        (
            {"tokens": [5] * 40 + [-3] + [7] * 40},
            "`tokens` entry 40 is -3; token ids cannot be negative",
        ),
        ({"tokens": [5.0] * 90}, "`tokens` entry 0 is 5.0, not an integer"),
        (
            {"tokens": [5] * 90, "loss_mask": [0.5] * 90},
            "`loss_mask` entry 0 is 0.5, not an integer",
        ),
    ],
)
def test_a_decoded_list_fails_validation_with_the_lists_message(
    tmp_path: Path, sample: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path, {"samples": [sample]})
    decoded = ptread.load(path, KEYS)["samples"][0]
    assert any(type(v) is ListArray for v in decoded.values())
    for candidate in (sample, decoded):
        with pytest.raises(Exception) as caught:
            validate.check_sample(candidate)
        assert str(caught.value) == message


def test_a_decoded_list_validates_to_the_lists_arrays(tmp_path: Path) -> None:
    sample = {
        "tokens": list(range(200)),
        "response_length": 150,
        "loss_mask": [1, 0] * 75,
        "rollout_log_probs": [-(i / 3) for i in range(150)],
    }
    decoded = ptread.load(_write(tmp_path, {"samples": [sample]}), KEYS)["samples"][0]
    want, got = validate.check_sample(sample), validate.check_sample(decoded)
    for field in ("tokens", "loss_mask", "rollout_log_probs"):
        a, b = getattr(got, field), getattr(want, field)
        assert type(a) is np.ndarray and (a.dtype, a.tobytes()) == (b.dtype, b.tobytes())


# --- the opcode check's verdicts, stepping over the lists or not ------------------------------


def _verdict(data: bytes, lists: ptlists.Finder | None) -> Any:
    try:
        return ptcheck.check_opcodes(data, lists)
    except ptzip.Corrupt as exc:
        return str(exc)


@pytest.mark.parametrize("seed", range(20))
def test_the_opcode_check_gives_the_same_verdicts_when_it_steps_over_the_lists(seed: int) -> None:
    rng = random.Random(seed)
    base = pickle.dumps(_rollout(random.Random(seed)), protocol=2)
    stepped = 0
    for _ in range(100):
        data = bytearray(base)
        for _ in range(rng.randrange(0, 4)):
            at = rng.randrange(2, len(data))
            data[at] = rng.choice([*b"aesubt20hqr(\x85\x95GKMJX]", rng.randrange(256)])
        finder = ptlists.Finder(bytes(data))
        assert _verdict(bytes(data), finder) == _verdict(bytes(data), None)
        stepped += len(finder.spans)
    assert stepped > 0
