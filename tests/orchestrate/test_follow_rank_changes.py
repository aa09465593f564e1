"""`--follow` on a run whose rank set changes between steps never waits for a rank that will
not come (dump-format.md 9b, #3141: one train file per DP/CP shard, sparse rank numbers).

The live dump is the real `basic` dump (DP 2 x TP 2: ranks 0-3, ranks 0 and 1 one DP shard,
2 and 3 the other) whose step 1 is written as miles writes after #3141 (ranks 0 and 2 only),
plus a step 2 like it. Rounds are run one by one; `math.inf` as the settle time means "the
files have not settled", 0.0 "they have".
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEXT_DUMPS, REAL_DUMPS
from tests.follower import counts
from tests.orchestrate.test_follow import step_train_files
from tokenlake.orchestrate.extract import ExtractOptions
from tokenlake.orchestrate.follow import FollowState, follow_round, is_complete
from tokenlake.orchestrate.verify import verify_lake
from tokenlake.read import dump

pytestmark = pytest.mark.slow  # extracts real dump files


def _copy_step(live: Path, source: int, target: int, ranks: tuple[int, ...]) -> None:
    """Step `source`'s rollout file and the given ranks' train files as step `target`."""
    import torch

    rollout = torch.load(live / "rollout_data" / f"{source}.pt", weights_only=True)
    rollout["rollout_id"] = target
    torch.save(rollout, live / "rollout_data" / f"{target}.pt")
    for rank in ranks:
        train = torch.load(REAL_DUMPS / "basic" / "train_data" / f"{source}_{rank}.pt")
        train["rollout_id"] = target
        torch.save(train, live / "train_data" / f"{target}_{rank}.pt")


def test_a_step_with_fewer_ranks_than_the_last_is_extracted_once_settled(tmp_path: Path):
    live, lake = tmp_path / "live", tmp_path / "lake"
    shutil.copytree(REAL_DUMPS / "basic", live)
    parked = tmp_path / "parked"
    parked.mkdir()
    for path in sorted((live / "train_data").glob("1_*.pt")):
        shutil.move(path, parked / path.name)
    state = FollowState()
    assert counts(
        follow_round(live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None)
    ) == (3, 0, 0, 0, 0)
    assert state.expected_ranks == frozenset({0, 1, 2, 3})

    for rank in (0, 2):  # one file per DP shard from now on
        shutil.move(parked / f"1_{rank}.pt", live / "train_data" / f"1_{rank}.pt")
    # Not settled: ranks 1 and 3 could still come (and eval_0 is not settled either, so not
    # counted).
    assert counts(
        follow_round(
            live, store_of(lake), "live", state, ExtractOptions(settle_seconds=math.inf), None
        )
    ) == (0, 0, 1, 0, 0)
    assert step_train_files(lake)[2] == (1, False, 0, False)
    # Settled: extracted with the two shards, which hold every sample; the new set is learnt.
    assert counts(
        follow_round(live, store_of(lake), "live", state, ExtractOptions(settle_seconds=0.0), None)
    ) == (0, 1, 2, 0, 0)
    assert step_train_files(lake)[2] == (1, False, 2, True)
    assert state.expected_ranks == frozenset({0, 2})

    # The next step with the new rank set is complete at once, settled or not.
    _copy_step(live, 1, 2, (0, 2))
    assert counts(
        follow_round(
            live, store_of(lake), "live", state, ExtractOptions(settle_seconds=math.inf), None
        )
    ) == (1, 0, 2, 0, 0)
    assert step_train_files(lake)[3] == (2, False, 2, True)
    assert verify_lake(store_of(lake)) == (4, [])


def test_sparse_ranks_without_rank_zero_complete_a_step():
    """The #3141 fixture's ranks 8 and 12: once learnt, a step holding them is complete."""
    (step_0, step_1) = dump.discover(NEXT_DUMPS / "sparse_ranks").steps
    assert step_0.ranks == step_1.ranks == frozenset({8, 12})
    assert not is_complete(step_1, None, now=0.0, settle=math.inf)
    assert is_complete(step_1, frozenset({8, 12}), now=0.0, settle=math.inf)
    assert not is_complete(step_1, frozenset({8, 9, 12}), now=0.0, settle=math.inf)
    assert is_complete(step_1, frozenset({8, 9, 12}), now=math.inf, settle=30.0)
