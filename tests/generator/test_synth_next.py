"""The generator's presets for the newer (and one older) dump shapes (dump-format.md 9, 9b),
checked against the real dumps miles' own writers made of each (tests/fixtures/miles-next/)
and, through the extractor, against the generator's ground truth."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEXT_DUMPS
from tests.generator.test_synth import _describe, _load
from tokenlake import layout
from tokenlake.generator.synth import PRESETS, write_dump

pytestmark = pytest.mark.slow

# preset -> the real dump of the same shape
MIRRORS = {
    "weight-spans": "weight_spans",
    "spec-rename": "spec_rename",
    "sampling-support": "sampling_support",
    "sparse-ranks": "sparse_ranks",
    "pre-dashboard": "legacy_pre_dashboard",
}


def _structure(root: Path) -> dict[str, Any]:
    """Folders, file names, and per kind of file: top-level keys, sample keys / train columns
    in order, and the types each key holds across all files of that kind."""
    rollout_types: dict[str, set[str]] = {}
    train_types: dict[str, set[str]] = {}
    rollout_keys, train_keys = set(), set()
    for path in sorted((root / "rollout_data").iterdir()):
        content = _load(path)
        rollout_keys.add(("top", *content))
        for sample in content["samples"]:
            rollout_keys.add(tuple(sample))
            for key, value in sample.items():
                rollout_types.setdefault(key, set()).add(_describe(value))
    for path in sorted((root / "train_data").iterdir()):
        content = _load(path)
        train_keys.add(("top", *content))
        train_keys.add(tuple(content["rollout_data"]))
        for key, value in content["rollout_data"].items():
            # By row: which rows a file holds depends on the DP partition, not the format.
            rows = value if isinstance(value, list) and key != "raw_reward" else [value]
            train_types.setdefault(key, set()).update(_describe(row) for row in rows)
    return {
        "folders": sorted(p.name for p in root.iterdir() if p.name != "tokenizer"),
        "files": sorted(p.name for p in (root / "train_data").iterdir()),
        "rollout_files": sorted(p.name for p in (root / "rollout_data").iterdir()),
        "rollout_keys": rollout_keys,
        "rollout_types": rollout_types,
        "train_keys": train_keys,
        "train_types": train_types,
    }


@pytest.mark.parametrize("preset", sorted(MIRRORS))
def test_preset_has_the_structure_of_the_real_dump(preset: str, tmp_path: Path) -> None:
    real = _structure(NEXT_DUMPS / MIRRORS[preset])
    write_dump(tmp_path, PRESETS[preset])
    ours = _structure(tmp_path)
    for part in real:
        assert ours[part] == real[part], part


@pytest.fixture(scope="module")
def extracted(tmp_path_factory: pytest.TempPathFactory):
    import duckdb

    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    root = tmp_path_factory.mktemp("synth_next")
    lake = root / "lake"
    truths = {}
    for preset in (*MIRRORS, "sparse-ranks-cp", "slime-v2-top-p"):
        truths[preset] = write_dump(root / preset, PRESETS[preset], keep_truth=True)
        assert (
            extract_run(
                root / preset, store_of(lake), ExtractOptions(run_name=preset, strict=True)
            ).failed
            == []
        )
    con = duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True)
    yield con, truths
    con.close()


def _per_sample(con, run: str, expression: str) -> dict[tuple[int, bool, int], Any]:
    rows = con.execute(
        f"SELECT rollout_id, evaluation, batch_position, {expression} FROM tokens"
        " WHERE run = ? GROUP BY ALL ORDER BY ALL",
        [run],
    ).fetchall()
    return {(rid, ev, bp): value for rid, ev, bp, value in rows}


@pytest.mark.parametrize("preset", ["weight-spans", "pre-dashboard", "spec-rename"])
def test_token_versions_match_the_truth(extracted, preset: str) -> None:
    con, truths = extracted
    expected = {
        key: list(t.token_versions) for key, t in truths[preset].samples.items() if t.token_versions
    }
    assert len(expected) > 8
    assert any(v is None for vs in expected.values() for v in vs) or preset == "spec-rename"
    got = _per_sample(con, preset, "list(token_version ORDER BY position)")
    assert got == expected


@pytest.mark.parametrize("preset", ["sampling-support", "slime-v2-top-p"])
def test_support_sizes_match_the_truth(extracted, preset: str) -> None:
    """miles' `rollout_sampling_mask_*` and slime's `rollout_top_p_token_*` (#2102) alike."""
    con, truths = extracted
    truth = truths[preset].samples
    expected = {
        key: None if t.support_sizes is None else t.support_sizes.tolist()
        for key, t in truth.items()
        if t.response_length
    }
    got = _per_sample(con, preset, "list(support_size ORDER BY position)")
    assert {k: None if all(v is None for v in vs) else vs for k, vs in got.items()} == expected
    assert any(v is None for v in expected.values()) and any(expected.values())


def test_spec_accept_rate_and_conversations_match_the_truth(extracted) -> None:
    con, truths = extracted
    for preset, column in (("spec-rename", "spec_accept_rate"), ("pre-dashboard", "messages_json")):
        rows = con.execute(
            f"SELECT rollout_id, evaluation, batch_position, {column} FROM samples"
            " WHERE run = ? ORDER BY ALL",
            [preset],
        ).fetchall()
        truth = truths[preset].samples
        if column == "spec_accept_rate":
            expected = [(*k, t.spec_accept_rate) for k, t in sorted(truth.items())]
            assert any(rate for *_, rate in expected)
            assert [r[:3] for r in rows] == [e[:3] for e in expected]
            assert np.allclose([r[3] or 0 for r in rows], [e[3] or 0 for e in expected])
            assert [r[3] is None for r in rows] == [e[3] is None for e in expected]
        else:
            assert [(*r[:3], r[3] is not None) for r in rows] == [
                (*k, t.messages_in_pt) for k, t in sorted(truth.items())
            ]


@pytest.mark.parametrize("preset", ["sparse-ranks", "sparse-ranks-cp"])
def test_sparse_ranks_hold_every_sample(extracted, preset: str) -> None:
    con, truths = extracted
    got = con.execute(
        "SELECT bool_and(has_train_row), bool_or(alignment_failed), min(step_train_files),"
        " list(DISTINCT dumped_rank ORDER BY dumped_rank) FROM samples"
        " WHERE run = ? AND NOT evaluation",
        [preset],
    ).fetchone()
    assert got == (
        True,
        False,
        *{"sparse-ranks": (2, [8, 12]), "sparse-ranks-cp": (4, [8, 12])}[preset],
    )
