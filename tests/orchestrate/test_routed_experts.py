"""Routing replay (`rollout_routed_experts`, `rollout_indexer_topk`: numpy [T-1, layers, k],
dump-format.md 2.3) lands in the `experts` table only with `--with-experts`."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.test_bad_input import REPLACE, age, extract, summary_line
from tests.fixture_paths import NEXT_DUMPS

pytestmark = pytest.mark.slow

LAYERS, TOP_K = 3, 2


def _routed(total: int, position: int):
    import numpy as np

    start = 1000 * position
    values = np.arange(start, start + (total - 1) * LAYERS * TOP_K, dtype=np.int32)
    return values.reshape(total - 1, LAYERS, TOP_K)


@pytest.fixture
def dump(tmp_path: Path) -> Path:
    """spec_rename with routed experts on every sample and the indexer's top-k on position 0."""
    import numpy as np
    import torch

    root = tmp_path / "replay"
    shutil.copytree(NEXT_DUMPS / "spec_rename", root)
    for path in sorted((root / "rollout_data").glob("*.pt")):
        data = torch.load(path, weights_only=True)
        for position, sample in enumerate(data["samples"]):
            sample["rollout_routed_experts"] = _routed(len(sample["tokens"]), position)
            if position == 0:
                sample["rollout_indexer_topk"] = np.full((2, 1, 4), 7, dtype=np.int64)
        torch.save(data, path)
    for path in root.rglob("*"):
        age(path)
    return root.resolve()


def _query(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def test_experts_only_on_request(dump: Path, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    code, out, err = extract(dump, lake)
    assert (code, err) == (0, [])
    assert _query(lake, "SELECT count(*) FROM experts") == [(0,)]
    assert not (lake / "experts").exists()

    code, out, err = extract(dump, lake, "--with-experts")  # steps without it: again
    assert (code, err) == (0, [])
    assert out == summary_line(
        "replay", lake, "0 new, 2 updated, 0 unchanged, 0 removed, 0 skipped", 16, 94
    )
    totals = _query(lake, "SELECT sum(total_length - 1) FROM samples")
    assert _query(lake, "SELECT count(*) FROM experts") == totals == [(sum_t := totals[0][0],)]
    assert sum_t > 0
    rows = _query(
        lake,
        "SELECT token_position, routed_experts, indexer_topk FROM experts"
        " WHERE rollout_id = 0 AND batch_position = 0 ORDER BY token_position LIMIT 3",
    )
    assert rows == [
        (0, [[0, 1], [2, 3], [4, 5]], [[7, 7, 7, 7]]),
        (1, [[6, 7], [8, 9], [10, 11]], [[7, 7, 7, 7]]),
        (2, [[12, 13], [14, 15], [16, 17]], None),
    ]
    second = _query(
        lake,
        "SELECT routed_experts[1][1] FROM experts WHERE rollout_id = 1 AND batch_position = 3"
        " AND token_position = 0",
    )
    assert second == [(3000,)]
    code, out, _ = extract(dump, lake, "--with-experts")
    assert "0 new, 0 updated, 2 unchanged" in out


def test_a_bad_replay_array_is_one_line(dump: Path, tmp_path: Path) -> None:
    import torch

    path = dump / "rollout_data" / "1.pt"
    data = torch.load(path, weights_only=False)  # the test's own file: numpy arrays inside
    data["samples"][2]["rollout_routed_experts"] = [[1, 2]]
    torch.save(data, path)
    age(path)
    code, _, err = extract(dump, tmp_path / "lake", "--with-experts")
    assert code == 1
    assert err == [
        f"Skipped step 1: `{path}` (batch position 2, sample_index 10): `rollout_routed_experts`"
        f" is a list of 1 entries, not a 3-D integer array. {REPLACE}"
    ]
    # Without the option the arrays are not read at all.
    assert extract(dump, tmp_path / "plain")[0] == 0


def test_a_zero_size_array_declaring_a_billion_positions_is_one_line(
    dump: Path, tmp_path: Path
) -> None:
    import numpy as np
    import torch

    from tests.limits import run_cli_limited

    path = dump / "rollout_data" / "1.pt"
    data = torch.load(path, weights_only=False)  # the test's own file: numpy arrays inside
    data["samples"][2]["rollout_routed_experts"] = np.empty((10**9, 0, 8), np.int32)  # 0 bytes
    torch.save(data, path)
    age(path)
    lake = tmp_path / "lake"
    args = ["extract", str(dump), "--lake", str(lake), "--workers", "1", "--silent"]
    done = run_cli_limited([*args, "--with-experts"], 1536 << 20, 120, "RLIMIT_DATA")
    assert (done.returncode, done.stderr.splitlines()) == (
        1,
        [
            f"Skipped step 1: `{path}` (batch position 2, sample_index 10):"
            " `rollout_routed_experts` is an array of shape (1000000000, 0, 8): 1,000,000,000"
            f" positions of 0 layers that hold no values. {REPLACE}"
        ],
    )
    assert _query(lake, "SELECT DISTINCT rollout_id FROM experts") == [(0,)]
