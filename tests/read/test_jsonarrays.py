"""A JSON line read with its lists of numbers decoded whole-array (`jsonarrays.object_line`)
is exactly what `json` gives (`bounded.json_object_line`), value or error: each decoded list
is the array `np.asarray` makes of `json`'s list, everything else the same Python objects.
On every line of the NeMo-RL and prime-rl fixtures and generated layouts, on random lines
and on mutated ones; and the two step readers read the same steps either way."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.fixture_paths import NEMO_RL_REAL, PRIME_RL_REAL
from tests.read.test_ptread import _age
from tokenlake import bounded
from tokenlake.errors import DumpFormatError
from tokenlake.generator import synth
from tokenlake.read import jsonarrays, nemo_rl, prime_rl
from tokenlake.steptypes import ListArray

PATH = Path("rank_0.jsonl")
PRIME = prime_rl._WANTED
NEMO = nemo_rl._WANTED
UNREAD = prime_rl._UNREAD
FORMATS = {
    "prime-rl": (PRIME, prime_rl.MAX_DEPTH, UNREAD),
    "nemo-rl": (NEMO, nemo_rl.MAX_DEPTH, ()),
}


def _outcome(read: Any) -> tuple[str, Any]:
    try:
        return ("value", read())
    except DumpFormatError as exc:
        return ("error", str(exc))


def _exact_at(exact: Any, where: tuple[Any, ...]) -> Any:
    for step in where:
        exact = exact[step]
    return exact


def _as_exact(fast: Any, exact: Any, where: tuple[Any, ...], found: list[tuple[Any, ...]]) -> Any:
    """`fast` with each ListArray checked against `exact`'s list there (the dtype and bits
    `np.asarray` gives it) and swapped for that list; `found` gets where each one was."""
    if type(fast) is ListArray:
        want = np.asarray(_exact_at(exact, where))
        assert fast.dtype == want.dtype and fast.shape == want.shape, where
        assert fast.tobytes() == want.tobytes(), where
        found.append(where)
        return _exact_at(exact, where)
    if isinstance(fast, dict):
        return {k: _as_exact(v, exact, (*where, k), found) for k, v in fast.items()}
    if isinstance(fast, list):
        return [_as_exact(v, exact, (*where, i), found) for i, v in enumerate(fast)]
    return fast


def assert_fast_is_exact(
    raw: bytes, wanted: jsonarrays.Wanted, max_depth: int = 8, unread: tuple[str, ...] = ()
) -> int:
    """The fast read of `raw` equals the exact one, but for the keys in `unread`, which it
    leaves out; returns how many lists it decoded."""
    exact = _outcome(lambda: bounded.json_object_line(PATH, raw, "line 1", max_depth))
    fast = _outcome(lambda: jsonarrays.object_line(PATH, raw, "line 1", max_depth, wanted, unread))
    if exact[0] == "value":
        exact = ("value", {k: v for k, v in exact[1].items() if k not in unread})
    if exact[0] == "error":
        assert fast == exact
        return 0
    assert fast[0] == "value", fast
    found: list[tuple[Any, ...]] = []
    # repr tells 1 from 1.0 and True, -0.0 from 0.0, and shows NaN
    assert repr(_as_exact(fast[1], exact[1], (), found)) == repr(exact[1])
    assert all(where in wanted for where in found), found
    return len(found)


def _lines(paths: list[Path]) -> list[bytes]:
    lines = [line for path in paths for line in path.read_bytes().splitlines() if line.strip()]
    assert lines
    return lines


def test_every_fixture_line_reads_the_same() -> None:
    decoded = 0
    for name, root in (("prime-rl", PRIME_RL_REAL), ("nemo-rl", NEMO_RL_REAL)):
        wanted, depth, unread = FORMATS[name]
        for line in _lines(sorted(root.glob("**/*.jsonl"))):
            decoded += assert_fast_is_exact(line, wanted, depth, unread)
    assert decoded > 100


LAYOUTS = {
    name: dataclasses.replace(spec, steps=1, prompts_per_step=2) if "bench" in name else spec
    for name, spec in synth.PRESETS.items()
    if spec.framework in FORMATS
}


_LAYOUT_NAMES = [
    pytest.param(name, marks=pytest.mark.slow) if "bench" in name else name
    for name in sorted(LAYOUTS)
]


@pytest.mark.parametrize("name", _LAYOUT_NAMES)
def test_every_line_of_every_generated_layout_reads_the_same(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every list of every line decoded, however short (the small presets' lines are)."""
    monkeypatch.setattr(jsonarrays, "MIN_LINE_BYTES", 0)
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)
    spec = LAYOUTS[name]
    synth.write_dump(tmp_path, spec)
    wanted, depth, unread = FORMATS[spec.framework]
    lines = _lines(
        sorted(tmp_path.glob("**/*_data_step*.jsonl" if "nemo" in name else "**/rank_*.jsonl"))
    )
    assert sum(assert_fast_is_exact(line, wanted, depth, unread) for line in lines) > 0


@pytest.mark.parametrize("name", _LAYOUT_NAMES)
def test_the_readers_read_every_generated_step_the_same(
    tmp_path: Path, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = LAYOUTS[name]
    synth.write_dump(tmp_path, spec)
    for path in tmp_path.glob("**/*.jsonl"):
        _age(path)
    reader = nemo_rl if spec.framework == "nemo-rl" else prime_rl
    steps = reader.discover(tmp_path).steps
    assert steps
    fast = [_plain(reader.read_step(step)) for step in steps]
    monkeypatch.setattr(jsonarrays, "MIN_LINE_BYTES", 1 << 40)  # every line the exact way
    assert [_plain(reader.read_step(step)) for step in steps] == fast


def _plain(value: Any) -> Any:
    """A step read as comparable data: arrays by dtype, shape and bits."""
    if isinstance(value, np.ndarray):
        return ("array", value.dtype.str, value.shape, value.tobytes())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, _plain(vars(value)))
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return repr(value)


# Entries as their JSON text: numbers `json` reads as ints or floats (or refuses), words.
_NUMBER_TEXTS = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.integers(-5, 5).map(str),
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.floats(width=32, allow_nan=False, allow_infinity=False).map(repr),
    st.sampled_from(
        [
            "-0",
            "-0.0",
            "0e0",
            "1E5",
            "1e+5",
            "1e-05",
            "1e400",
            "-1e400",
            "1e-400",
            "5e-324",
            "123456789012345678",
            "1234567890123456789",
            "-9223372036854775808",
            "0.1",
            "2.4703282292062328e-324",
            "1.7976931348623159e308",
            "4.35e-07",
        ]
    ),
)
_EXPONENT_FLOATS = st.one_of(st.floats(1e-300, 1e-5), st.floats(1e16, 1e300)).flatmap(
    lambda x: st.sampled_from([repr(x), repr(-x)])
)
_ODD_TEXTS = st.sampled_from(
    ["NaN", "Infinity", "-Infinity", "01", "1.", ".5", "+1", "1e", "--1", "1.5.5", "1e5.5",
     "true", "false", "null", '"1"', "[]", "{}", "tru", "nul", "0x1", "1_0", " 1", "1 "]
)  # fmt: skip


def _one_odd(entries: st.SearchStrategy[str], odd: list[str]) -> st.SearchStrategy[list[str]]:
    """Lists of `entries` with one of them swapped for one of `odd`."""
    return st.tuples(
        st.lists(entries, min_size=60, max_size=120), st.integers(0, 59), st.sampled_from(odd)
    ).map(lambda case: [*case[0][: case[1]], case[2], *case[0][case[1] + 1 :]])


_ENTRIES = st.one_of(
    st.lists(_NUMBER_TEXTS, min_size=40, max_size=120),
    st.lists(st.one_of(_EXPONENT_FLOATS, st.floats(-1e6, 1e6).map(repr)), min_size=40),
    st.lists(st.sampled_from(["true", "false"]), min_size=60, max_size=120),
    st.lists(st.sampled_from(["null"]), min_size=60, max_size=120),
    st.lists(st.sampled_from(["true", "false", "null"]), min_size=60, max_size=120),
    st.lists(st.one_of(_NUMBER_TEXTS, _ODD_TEXTS), min_size=40, max_size=120),
    # what `json` writes for ints or for floats, with one entry it refuses (or reads otherwise)
    _one_odd(st.integers(-1000, 1000).map(str), ["01", "-01", "00", "-", "--1", "1-2", "-0"]),
    _one_odd(st.floats(-1e6, 1e6).map(repr), ["01.5", "1.", ".5", "-.5", "00.0", "1..2", "-0"]),
    # floats `repr` writes with an exponent, and entries `_plain_commas` must leave to the regexes
    _one_odd(
        _EXPONENT_FLOATS,
        [
            "1.5e5",
            "1.5E-05",
            "1.5e-",
            "1.5e+-5",
            "1.5ee-5",
            "1.e-5",
            "1.5e-5e-5",
            "1.5-5",
            "1.5+5",
            "+1.5",
            "1.5e-5.5",
            "01.5e-5",
            "1.5e--5",
            "1e-05",
            "e-5",
            "1.5e-05-",
            "-0",
        ],
    ),  # fmt: skip
    _one_odd(st.sampled_from(["true", "false"]), ["truefalse", "tru", "", "null", "True", "0"]),
    _one_odd(st.just("null"), ["nullnull", "nul", "", "true", "None", "0"]),
)


@st.composite
def _lines_of_lists(draw: st.DrawFn) -> tuple[bytes, jsonarrays.Wanted]:
    """A line of prime-rl's shape (lists at top-level keys) or NeMo-RL's (each in a list),
    with random entries and separators, and sometimes a repeated key."""
    nested = draw(st.booleans())
    keys = draw(st.lists(st.sampled_from(["token_ids", "loss_mask", "advantages", "other",
                                          "mismatch_kl"]), min_size=1, max_size=5))  # fmt: skip
    members = []
    for key in keys:
        separator = draw(st.sampled_from([",", ", ", ",  ", " ,"]))
        text = "[" + separator.join(draw(_ENTRIES)) + "]"
        members.append(f'"{key}": ' + (f"[{text}]" if nested else text))
    members.append('"pad": "' + "x" * 4096 + '"')
    line = ("{" + ", ".join(members) + "}").encode()
    keys3 = ("token_ids", "loss_mask", "advantages")
    wanted = tuple((key, 0) for key in keys3) if nested else tuple((key,) for key in keys3)
    return line, wanted


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_lines_of_lists())
def test_random_lines_read_the_same(case: tuple[bytes, jsonarrays.Wanted]) -> None:
    line, wanted = case
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)
        assert_fast_is_exact(line, wanted, unread=("mismatch_kl",))


def _real_line() -> bytes:
    lines = _lines(sorted(PRIME_RL_REAL.glob("**/rank_*.jsonl")))
    return max(lines, key=len)


MUTATIONS = {
    "bom": lambda line: b"\xef\xbb\xbf" + line,
    "leading space": lambda line: b" " + line,
    "utf-16": lambda line: line.decode().encode("utf-16"),
    "not utf-8 in a string": lambda line: line.replace(
        b'"env_name": "', b'"env_name": "\xff', 1
    ).replace(b'"env_name":"', b'"env_name":"\xff', 1),
    "lone surrogate": lambda line: line.replace(
        b'"schema_version"', b'"\\udc80": 1, "schema_version"', 1
    ),
    "duplicate key": lambda line: line[:-1] + b', "token_ids": [' + b",".join([b"7"] * 200) + b"]}",
    "own NaN": lambda line: line[:-1] + b', "nan": NaN}',
    "NaN in a list": lambda line: line.replace(b"[", b"[NaN, ", 2),
    "Infinity in a list": lambda line: line.replace(b"0.0,", b"Infinity,", 1),
    "1e400": lambda line: line.replace(b"0.0,", b"1e400,", 3),
    "huge integer": lambda line: line.replace(b"[", b"[" + b"9" * 30 + b",", 2),
    "integer among floats": lambda line: line.replace(b"0.0,", b"3,", 5),
    "minus zero": lambda line: line.replace(b"0.0,", b"-0,", 5),
    "bool among ints": lambda line: line.replace(b"[", b"[true,", 3),
    "null among floats": lambda line: line.replace(b"0.0,", b"null,", 4),
    "truncated": lambda line: line[: len(line) // 2],
    "deep": lambda line: line[:-1] + b', "deep": ' + b"[" * 20 + b"]" * 20 + b"}",
    "wide": lambda line: line[:-1] + b', "wide": [' + b",".join([b"{}"] * 3000) + b"]}",
    "an array": lambda line: b"[" + line + b"]",
    "trailing comma in a list": lambda line: line.replace(b"]", b",]", 1),
    "leading zero": lambda line: line.replace(b",1", b",01", 1),
    "escaped bracket": lambda line: line[:-1] + b', "s": "\\"[1,2]"}',
    "leading zero in a ratio list": lambda line: line.replace(
        b'"mismatch_kl": [', b'"mismatch_kl": [01, ', 1
    ).replace(b'"mismatch_kl":[', b'"mismatch_kl":[01,', 1),
    "bool in a ratio list": lambda line: line.replace(
        b'"prob_delta": [', b'"prob_delta": [true, ', 1
    ).replace(b'"prob_delta":[', b'"prob_delta":[true,', 1),
    "pipe in a list": lambda line: line.replace(b"0.0,", b"0.0,|", 1),
    "pipes in a string": lambda line: line.replace(
        b'"env_name": "', b'"env_name": "|[|]|', 1
    ).replace(b'"env_name":"', b'"env_name":"|[|]|', 1),
    "a ratio list twice": lambda line: line[:-1] + b', "importance_ratio": 5}',
    "tab separator": lambda line: line.replace(b",", b",\t", 40),
}


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_mutated_lines_read_the_same(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)  # the fixture's lists are short
    line = _real_line()
    assert len(line) >= jsonarrays.MIN_LINE_BYTES
    for spaced in (line, line.replace(b",", b", ")):
        assert_fast_is_exact(MUTATIONS[name](spaced), PRIME, prime_rl.MAX_DEPTH, UNREAD)


def test_random_byte_flips_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)  # the fixture's lists are short
    line, rng = _real_line(), random.Random(34)
    for _ in range(300):
        mutated = bytearray(line)
        for _ in range(rng.randint(1, 3)):
            mutated[rng.randrange(len(mutated))] = rng.choice(b'0123456789-+.eE,[]{}" tfnul\xff')
        assert_fast_is_exact(bytes(mutated), PRIME, prime_rl.MAX_DEPTH, UNREAD)


def test_a_real_line_decodes_its_lists_as_arrays(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)  # the fixture's `token_ids` is short
    record = jsonarrays.object_line(PATH, _real_line(), "line 1", prime_rl.MAX_DEPTH, PRIME)
    kinds = {key: (type(record[key]).__name__, getattr(record[key], "dtype", None)) for key in
             ("token_ids", "loss_mask", "trainer_logprobs", "rl_weights", "mismatch_kl")}  # fmt: skip
    assert kinds == {
        "token_ids": ("ListArray", np.dtype("int64")),
        "loss_mask": ("ListArray", np.dtype("bool")),
        "trainer_logprobs": ("ListArray", np.dtype("float64")),
        "rl_weights": ("list", None),
        "mismatch_kl": ("list", None),
    }
    assert json.loads(_real_line())["mismatch_kl"] == record["mismatch_kl"]


def test_the_lists_prime_rl_never_reads_are_left_out_and_never_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)  # the fixture's lists are short
    line, parsed = _real_line(), []
    cast = jsonarrays._cast
    monkeypatch.setattr(jsonarrays, "_cast", lambda *how: parsed.append(how[0]) or cast(*how))
    record = jsonarrays.object_line(PATH, line, "line 1", prime_rl.MAX_DEPTH, PRIME, UNREAD)
    exact = json.loads(line)
    assert sorted(set(exact) - set(record)) == sorted(UNREAD)
    assert all(isinstance(exact[key], list) and len(exact[key]) > 1 for key in UNREAD)
    unread_texts = {json.dumps(exact[key], separators=(",", ":"))[1:-1] for key in UNREAD}
    assert parsed and not unread_texts & {text.replace(b" ", b"").decode() for text in parsed}


def test_a_parse_refusing_a_checked_list_reads_the_line_the_exact_way(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """pyarrow refusing an entry JSON's grammar allows (none found): the line is `json`'s."""
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)
    monkeypatch.setattr(jsonarrays, "_cast", lambda *how: None)
    line = _real_line()
    assert jsonarrays.object_line(PATH, line, "line 1", prime_rl.MAX_DEPTH, PRIME) == json.loads(
        line
    )
    assert assert_fast_is_exact(line, PRIME, prime_rl.MAX_DEPTH, UNREAD) == 0  # json's lists


@pytest.mark.parametrize(
    ("text", "word", "repeats"),
    [
        ("true,true,true", "true", True),
        ("true, true, true", "true", True),
        ("true", "true", True),
        ("null, null", "null", True),
        ("true,true, true", "true", False),
        ("true,true,", "true", False),
        (",true,true", "true", False),
        ("truetrue,,true", "true", False),
        ("true,  true", "true", False),
        ("", "true", False),
    ],
)
def test_a_word_repeated_is_told_by_the_text_it_must_be(
    text: str, word: str, repeats: bool
) -> None:
    assert jsonarrays._repeats(text.encode(), word.encode()) is repeats


@pytest.mark.parametrize(
    "entries",
    [
        ["truefalse", ""],
        ["", "falsetrue"],
        ["nullnull", ""],
        ["true", "", "falsefalse"],
        ["", "truetrue"],
        ["nullnullnull", "", ""],
    ],
)
def test_two_words_in_one_entry_are_never_two_entries(
    entries: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many words as entries, but one entry empty and another two words: `json` refuses."""
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)
    word = "null" if "null" in entries[0] else "true"
    for separator in (",", ", "):
        text = separator.join([word] * 70 + entries)
        line = ('{"loss_mask": [' + text + '], "pad": "' + "x" * 5000 + '"}').encode()
        assert assert_fast_is_exact(line, PRIME) == 0


@given(st.lists(st.one_of(_EXPONENT_FLOATS, st.floats(-1e6, 1e6)), min_size=1, max_size=80))
def test_floats_as_json_writes_them_are_checked_without_a_regex(values: list[Any]) -> None:
    """Lists of floats with exponents (`1.5e-05`) take the cheap check (`_plain_commas`), not `_FRACTIONS`, as
    long as each entry has a fraction (`json.dumps` writes `1e-05` without one)."""
    texts = [v if isinstance(v, str) else repr(v) for v in values]
    for separator in (",", ", "):
        text = separator.join(texts).encode()
        assert (jsonarrays._plain_commas(text, True) is not None) == all(
            "." in entry for entry in texts
        )


@settings(max_examples=300, deadline=None)
@given(st.lists(_EXPONENT_FLOATS, min_size=3, max_size=20), st.data())
def test_the_cheap_check_accepts_only_what_the_grammar_does(
    entries: list[str], data: st.DataObject
) -> None:
    """Entries with a few bytes changed: whatever `_plain_commas` accepts, JSON's grammar does."""
    text = bytearray(",".join(entries).encode())
    for _ in range(data.draw(st.integers(1, 3))):
        where = data.draw(st.integers(0, len(text) - 1))
        text[where] = data.draw(st.sampled_from(b"0123456789-+.e, "))
    if jsonarrays._plain_commas(bytes(text), True) is not None:
        assert jsonarrays._FRACTIONS.fullmatch(bytes(text)), bytes(text)


@pytest.mark.parametrize(
    "text",
    ["1, 2 ,3", "1, 2, ", "1,  2, 3", " 1, 2, 3", "1, 2,3 ", "1 , 2, 3", "1.5, 2.5 ,3.5",
     "1.5e-05, 2.5 ,3.5", "1.5, 2.5, ", "1.5e-05,  2.5, 3.5"],
)  # fmt: skip
def test_a_space_anywhere_but_after_each_comma_is_left_to_json(
    text: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As many spaces as commas, but one misplaced: `json` reads it or refuses it, never the
    cheap check."""
    monkeypatch.setattr(jsonarrays, "MIN_LIST_BYTES", 0)
    assert jsonarrays._plain_commas(text.encode(), "." in text) is None
    line = ('{"advantages": [' + text + '], "pad": "' + "x" * 5000 + '"}').encode()
    assert_fast_is_exact(line, PRIME)
