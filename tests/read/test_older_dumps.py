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

from tests.conftest import store_of
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
    """`miles.utils.types` with the nested `Sample.SpecInfo` dataclass of 2025-11 and the
    multi-LoRA dataclasses of 2026-07-21."""
    module = types.ModuleType("miles.utils.types")

    @dataclass(frozen=True)
    class AdapterRef:
        name: str
        slot: int

    @dataclass(frozen=True)
    class RewardSpec:
        rm_type: str | None = None
        custom_rm_path: str | None = None

    for cls in (AdapterRef, RewardSpec):
        cls.__module__, cls.__qualname__ = module.__name__, cls.__name__
        setattr(module, cls.__name__, cls)

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


def _era_2025_11_14(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    """2025-11-14: `rollout_routed_experts` (numpy int32 [T-1, layers, top-k]); 2026-01-02:
    status `failed` (batch position 4)."""
    import numpy as np

    total = len(sample["tokens"])
    sample["rollout_routed_experts"] = np.arange((total - 1) * 4, dtype=np.int32).reshape(-1, 2, 2)
    if position == 4:
        sample["status"] = "failed"


def _era_2026_06(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    """2026-06: rollout-side `teacher_log_probs`, `opd_reverse_kl` (response-aligned lists)
    and `rollout_indexer_topk` (numpy int32)."""
    import numpy as np

    r = sample["response_length"]
    sample["teacher_log_probs"] = [-0.5] * r
    sample["opd_reverse_kl"] = [0.125] * r
    sample["rollout_indexer_topk"] = np.zeros((len(sample["tokens"]) - 1, 1, 2), dtype=np.int32)


def _era_2026_07_21(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    """2026-07-21: `adapter` (`AdapterRef`) and `reward_spec` (`RewardSpec`) objects."""
    module = sys.modules["miles.utils.types"]
    sample["adapter"] = module.AdapterRef(name="math", slot=position % 2)  # type: ignore[attr-defined]
    sample["reward_spec"] = module.RewardSpec(rm_type="deepscaler")  # type: ignore[attr-defined]


def _drop_weight_versions(columns: dict[str, Any]) -> None:
    """Before 2026-04-08 the train dump has no `weight_versions` column."""
    del columns["weight_versions"]


def _mooncake(columns: dict[str, Any]) -> None:
    """2026-07-28: the optional mooncake store gives numpy-typed per-row columns."""
    import numpy as np

    for key in ("sample_indices", "response_lengths", "total_lengths", "truncated"):
        columns[key] = np.array(columns[key], dtype=np.int64)
    columns["rewards"] = np.array(columns["rewards"], dtype=np.float32)


def _schedule(columns: dict[str, Any]) -> None:
    """2026-08-04: `rollout_ids`, `rollout_mask_sums` and the rollout-side DP schedule."""
    rows = len(columns["sample_indices"])
    columns["rollout_ids"] = list(columns["sample_indices"])
    columns["rollout_mask_sums"] = [int(m.sum()) for m in columns["loss_masks"]]
    columns["num_microbatches"] = [2]
    columns["micro_batch_indices"] = [list(range(rows // 2)), list(range(rows // 2, rows))]
    columns["num_rollouts"] = [rows]


def _rollout_id(rollout: dict[str, Any], position: int, sample: dict[str, Any]) -> None:
    sample["rollout_id"] = None  # Sample.rollout_id, unset (falls back to Sample.index)


@dataclass(frozen=True)
class Era:
    name: str
    rewrite_sample: Callable[[dict[str, Any], int, dict[str, Any]], None]
    rewrite_train: Callable[[dict[str, Any]], None] | None
    # per batch position of step 0: spec_accept_rate, prefix_cache_hit_rate, non_generation_time
    expected: list[tuple[Any, Any, Any]]
    changed_token_columns: tuple[str, ...] = ()  # checked by the era's own test


PLAIN = [(None, None, 0.0)] * 8
ERAS = [
    Era("2025-10-08", _era_2025_10, _drop_weight_versions, PLAIN),
    Era(
        "2025-11",
        _era_2025_11,
        _drop_weight_versions,
        [(None, None, 0.0)] + [(0.75, None, 0.0)] * 7,
    ),
    Era("2025-11-14", _era_2025_11_14, _drop_weight_versions, PLAIN),
    Era(
        "2025-12",
        _era_2025_12,
        _drop_weight_versions,
        [(None, None, 0.0)] + [(0.75, None, 0.0)] * 7,
    ),
    Era("2026-04", _era_2026_04, None, PLAIN),
    Era("2026-06", _era_2026_06, None, PLAIN, ("teacher_log_prob", "opd_reverse_kl")),
    Era("2026-07-21", _era_2026_07_21, None, PLAIN),
    Era("2026-07-28", lambda *_: None, _mooncake, PLAIN),
    Era("2026-08-04", _rollout_id, _schedule, PLAIN),
]


def _rewrite(dump: Path, era: Era) -> None:
    import torch

    for path in sorted((dump / "rollout_data").glob("*.pt")):
        rollout = torch.load(path, weights_only=True)
        for position, sample in enumerate(rollout["samples"]):
            era.rewrite_sample(rollout, position, sample)
        torch.save(rollout, path)
    if era.rewrite_train is not None:
        for path in sorted((dump / "train_data").glob("*.pt")):
            train = torch.load(path, weights_only=True)
            era.rewrite_train(train["rollout_data"])
            torch.save(train, path)


def _summary(lake: Path, run: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(
            "SELECT spec_accept_rate, prefix_cache_hit_rate, non_generation_time FROM samples"
            " WHERE run = ? AND rollout_id = 0 AND NOT evaluation ORDER BY batch_position",
            [run],
        ).fetchall()


def _tokens(lake: Path, run: str, without: tuple[str, ...] = ()) -> list[tuple]:
    import duckdb

    excluded = ", ".join(("run", *without))
    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(
            f"SELECT * EXCLUDE ({excluded}) FROM tokens WHERE run = ? ORDER BY ALL", [run]
        ).fetchall()


def _query(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


def _messages(lake: Path, run: str) -> int:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        (count,) = con.execute(
            "SELECT count(messages_json) FROM samples WHERE run = ?", [run]
        ).fetchone()
    return count


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    root = tmp_path_factory.mktemp("older")
    lake = root / "lake"
    assert (
        extract_run(
            SOURCE, store_of(lake), ExtractOptions(run_name="as-written", strict=True)
        ).failed
        == []
    )
    with pytest.MonkeyPatch.context() as patch:
        for name in ("miles", "miles.utils"):
            patch.setitem(sys.modules, name, types.ModuleType(name))
        patch.setitem(sys.modules, "miles.utils.types", _fake_miles_types())
        for era in ERAS:
            dump = root / era.name
            shutil.copytree(SOURCE, dump)
            _rewrite(dump, era)
    for era in ERAS:  # read without the fake module: the stand-ins of tokenlake's allow-list
        summary = extract_run(
            root / era.name, store_of(lake), ExtractOptions(run_name=era.name, strict=True)
        )
        assert (summary.failed, summary.counts["new"]) == ([], 3)
    return lake


@pytest.mark.parametrize("era", ERAS, ids=[e.name for e in ERAS])
def test_an_older_era_extracts_with_its_own_summary_values(lake: Path, era: Era) -> None:
    assert _summary(lake, era.name) == era.expected
    changed = era.changed_token_columns
    assert _tokens(lake, era.name, changed) == _tokens(lake, "as-written", changed)
    assert _messages(lake, era.name) == 9  # metadata["messages"] inside the .pt


def test_the_dump_as_written_reads_its_zero_counters_as_null(lake: Path) -> None:
    assert _summary(lake, "as-written") == [(None, None, 0.0)] * 8


def test_status_failed_and_numpy_replay_arrays_are_read(lake: Path) -> None:
    got = _query(
        lake,
        "SELECT batch_position, status FROM samples WHERE run = '2025-11-14' AND rollout_id = 0"
        " AND NOT evaluation AND batch_position IN (3, 4) ORDER BY 1",
    )
    assert got == [(3, "completed"), (4, "failed")]


def test_rollout_side_teacher_fields_fill_the_tokens(lake: Path) -> None:
    got = _query(
        lake,
        "SELECT evaluation, count(*), count(teacher_log_prob), min(teacher_log_prob),"
        " max(teacher_log_prob), min(opd_reverse_kl), max(opd_reverse_kl) FROM tokens"
        " WHERE run = '2026-06' AND (loss_mask > 0 OR loss_mask IS NULL) GROUP BY ALL ORDER BY ALL",
    )
    assert got == [
        (False, 88, 88, -0.5, -0.5, 0.125, 0.125),
        (True, 25, 25, -0.5, -0.5, 0.125, 0.125),
    ]
    assert _query(lake, "SELECT count(teacher_log_prob) FROM tokens WHERE run = '2026-04'") == [
        (0,)
    ]
