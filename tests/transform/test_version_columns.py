"""`tokens.token_version` and `token_staleness`: each sample's version codes on the step's rows."""

from __future__ import annotations

import subprocess
import sys

import numpy as np

from tokenlake.read.weight_versions import TokenVersions
from tokenlake.transform import flatten
from tokenlake.transform.flatten import SampleTokens, version_columns


def _sample(length: int, names: tuple[str, ...] | None = None, codes=None) -> SampleTokens:
    versions = None
    if names is not None:
        versions = TokenVersions(names, np.array(codes, dtype=np.int32))
    return SampleTokens(np.arange(length), None, False, {}, versions=versions)


def _columns(parts: list[SampleTokens], rollout_id: int | None) -> tuple[list, list]:
    total = sum(len(p.token_ids) for p in parts)
    version, staleness = version_columns(parts, total, rollout_id)
    return version.to_pylist(), staleness.to_pylist()


def test_each_sample_keeps_its_own_codes_and_unknown_tokens_are_null() -> None:
    parts = [
        _sample(3, ("7", "9"), [0, -1, 1]),
        _sample(2),  # no versions at all
        _sample(4, ("9", "rc-1"), [-1, 0, 0, 1]),  # "9" again, as code 0 of this sample
        _sample(0, ("5",), []),  # an empty response
        _sample(1, ("5",), [0]),
    ]
    version, staleness = _columns(parts, 10)
    assert version == ["7", None, "9", None, None, None, "9", "9", "rc-1", "5"]
    # staleness: the step's rollout id less the version's number; none for a non-number
    assert staleness == [3, None, 1, None, None, None, 1, 1, None, 5]


def test_without_the_rollout_id_the_staleness_is_null() -> None:
    version, staleness = _columns([_sample(2, ("3",), [0, 0])], None)
    assert version == ["3", "3"]
    assert staleness == [None, None]


def test_a_step_without_versions_is_null_everywhere() -> None:
    assert _columns([_sample(2), _sample(1)], 4) == ([None, None, None], [None, None, None])
    assert _columns([], 4) == ([], [])


def test_a_large_step_gives_the_columns_a_small_one_gives(monkeypatch) -> None:
    parts = [
        _sample(3, ("7", "9"), [0, -1, 1]),
        _sample(2),
        _sample(4, ("9", "rc-1"), [-1, 0, 0, 1]),
    ]
    listed = version_columns(parts, 9, 10)
    monkeypatch.setattr(flatten, "_LISTED_ROWS", 0)  # every step "large": Arrow's take
    taken = version_columns(parts, 9, 10)
    assert [column.to_pylist() for column in listed] == [
        ["7", None, "9", None, None, None, "9", "9", "rc-1"],
        [3, None, 1, None, None, None, 1, 1, None],
    ]
    assert all(a.equals(b) and a.type == b.type for a, b in zip(listed, taken, strict=True))


def test_a_small_step_imports_no_pyarrow_compute() -> None:
    code = (
        "import sys, numpy as np\n"
        "from tokenlake.read.weight_versions import TokenVersions\n"
        "from tokenlake.transform.flatten import SampleTokens, version_columns\n"
        "v = TokenVersions(('3', 'x'), np.array([0, 1, -1], dtype=np.int32))\n"
        "part = SampleTokens(np.arange(3), None, False, {}, versions=v)\n"
        "print([c.to_pylist() for c in version_columns([part], 3, 5)])\n"
        "print('pyarrow.compute' in sys.modules)\n"
    )
    shown = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert shown == "[['3', 'x', None], [2, None, None]]\nFalse\n"
