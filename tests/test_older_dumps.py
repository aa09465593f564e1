"""Every row of the spec's format history (dump-format.md 9, 2.3, 8.14) back to 2025-10-08.

The real `legacy_pre_dashboard` dump (miles' writers of 2026-07-22) is rewritten in the shape
of each older era exactly as the spec describes it: keys removed or renamed, `spec_info` as a
pickled `miles.utils.types.Sample.SpecInfo` object, the `weight_versions` train column gone.
Each copy must extract every step, with the same token values as the unchanged dump and the
era's summary values: NULL where the era's dump has no counters; `non_generation_time` 0.0 when
absent, the default miles' own loader fills in (as its reference summary shows).
"""

from __future__ import annotations

import shutil
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixture_paths import NEXT_DUMPS

pytestmark = pytest.mark.slow

SOURCE = NEXT_DUMPS / "legacy_pre_dashboard"
# Sample keys that came later than 2025-10-08 (section 2.3 and 9), removed for that era.
LATER_KEYS = (
    "remove_sample", "spec_info", "prefix_cache_info", "non_generation_time", "rollout_id",
    "routing_key", "multimodal_inputs", "multimodal_train_inputs", "rollout_indexer_topk",
    "teacher_log_probs", "opd_reverse_kl", "generate_function_path", "adapter", "reward_spec",
    "rollout_routed_experts",
)  # fmt: skip


def _fake_miles_types() -> types.ModuleType:
    """`miles.utils.types` with the nested `Sample.SpecInfo` dataclass of 2025-11."""
    module = types.ModuleType("miles.utils.types")

    class Sample:
        @dataclass
        class SpecInfo:
            spec_accept_token_num: int = 0
            spec_draft_token_num: int = 0
            spec_verify_ct: int = 0
            completion_token_num: int = 0

    Sample.__module__ = Sample.SpecInfo.__module__ = module.__name__
    Sample.__qualname__, Sample.SpecInfo.__qualname__ = "Sample", "Sample.SpecInfo"
    module.Sample = Sample  # type: ignore[attr-defined]
    return module


def _era_2025_10(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    """2025-10-08: rollout dump = `rollout_id` + `samples`; samples without the later keys."""
    rollout.pop("metadata", None)
    for key in LATER_KEYS:
        sample.pop(key, None)


def _era_2025_11(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    """2025-11-01 .. 2025-12-01: `spec_info` pickled as the live dataclass instance."""
    rollout.pop("metadata", None)
    spec_info = sys.modules["miles.utils.types"].Sample.SpecInfo  # type: ignore[attr-defined]
    sample["spec_info"] = spec_info(3 * position, 4 * position, position, 5)
    for key in ("prefix_cache_info", "non_generation_time", "remove_sample", "routing_key"):
        sample.pop(key, None)


def _era_2025_12(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    """2025-12-01 .. 2026-01-05: `spec_info` a dict with the derived rates and no
    `completion_token_num`; no `prefix_cache_info`, no `non_generation_time`."""
    rollout.pop("metadata", None)
    accepted, drafted = 3 * position, 4 * position
    sample["spec_info"] = {
        "spec_accept_token_num": accepted,
        "spec_draft_token_num": drafted,
        "spec_verify_ct": position,
        "spec_accept_rate": 0.75 if drafted else 0.0,
        "spec_accept_length": 2.5,
    }
    sample.pop("prefix_cache_info")
    sample.pop("non_generation_time")
    sample.pop("routing_key")


def _era_2026_04(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    """2026-04-06 .. 2026-07-10: `session_id` instead of `routing_key`; no top-level
    `metadata`."""
    rollout.pop("metadata", None)
    sample.pop("routing_key")
    sample["session_id"] = f"session-{position}"


@dataclass(frozen=True)
class Era:
    name: str
    rewrite_sample: Callable[[dict[str, Any], int, dict[str, Any]], None]
    weight_versions_column: bool  # the train column exists since 2026-04-08
    # per batch position of step 0: spec_accept_rate, prefix_cache_hit_rate, non_generation_time
    expected: list[tuple[Any, Any, Any]]


ERAS = [
    Era("2025-10-08", _era_2025_10, False, [(None, None, 0.0)] * 8),
    Era("2025-11", _era_2025_11, False, [(None, None, 0.0)] + [(0.75, None, 0.0)] * 7),
    Era("2025-12", _era_2025_12, False, [(None, None, 0.0)] + [(0.75, None, 0.0)] * 7),
    Era("2026-04", _era_2026_04, True, [(None, None, 0.0)] * 8),
]


def _rewrite(dump: Path, era: Era) -> None:
    import torch

    for path in sorted((dump / "rollout_data").glob("*.pt")):
        rollout = torch.load(path, weights_only=True)
        for position, sample in enumerate(rollout["samples"]):
            era.rewrite_sample(rollout, position, sample)
        torch.save(rollout, path)
    if not era.weight_versions_column:
        for path in sorted((dump / "train_data").glob("*.pt")):
            train = torch.load(path, weights_only=True)
            del train["rollout_data"]["weight_versions"]
            torch.save(train, path)


def _summary(lake: Path, run: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(
            "SELECT spec_accept_rate, prefix_cache_hit_rate, non_generation_time FROM samples"
            " WHERE run = ? AND rollout_id = 0 AND NOT evaluation ORDER BY batch_position",
            [run],
        ).fetchall()


def _tokens(lake: Path, run: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(
            "SELECT * EXCLUDE (run) FROM tokens WHERE run = ? ORDER BY ALL", [run]
        ).fetchall()


def _messages(lake: Path, run: str) -> int:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        (count,) = con.execute(
            "SELECT count(messages_json) FROM samples WHERE run = ?", [run]
        ).fetchone()
    return count


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenlake.load.extract import extract_run

    root = tmp_path_factory.mktemp("older")
    lake = root / "lake"
    assert extract_run(SOURCE, lake, run_name="as-written", strict=True).failed == []
    with pytest.MonkeyPatch.context() as patch:
        for name in ("miles", "miles.utils"):
            patch.setitem(sys.modules, name, types.ModuleType(name))
        patch.setitem(sys.modules, "miles.utils.types", _fake_miles_types())
        for era in ERAS:
            dump = root / era.name
            shutil.copytree(SOURCE, dump)
            _rewrite(dump, era)
    for era in ERAS:  # read without the fake module: the stand-ins of tokenlake's allow-list
        summary = extract_run(root / era.name, lake, run_name=era.name, strict=True)
        assert (summary.failed, summary.counts["new"]) == ([], 3)
    return lake


@pytest.mark.parametrize("era", ERAS, ids=[e.name for e in ERAS])
def test_an_older_era_extracts_with_its_own_summary_values(lake: Path, era: Era) -> None:
    assert _summary(lake, era.name) == era.expected
    assert _tokens(lake, era.name) == _tokens(lake, "as-written")
    assert _messages(lake, era.name) == 9  # metadata["messages"] inside the .pt


def test_the_dump_as_written_reads_its_zero_counters_as_null(lake: Path) -> None:
    assert _summary(lake, "as-written") == [(None, None, 0.0)] * 8
