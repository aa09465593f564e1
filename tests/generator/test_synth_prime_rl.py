"""The generator's prime-rl layout (presets `prime-rl`, `bench-prime-rl`) against the real
exports prime-rl's own trainer wrote (tests/fixtures/prime-rl-real): the same files, keys in
the same order, the same JSON types per key, the same placeholders and derived fields; and its
metrics.jsonl line agrees with the lake as prime-rl's does."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import store_of
from tests.fixture_paths import PRIME_RL_REAL
from tokenlake.generator.synth import PRESETS, write_dump
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

REAL = PRIME_RL_REAL / "packed_2ranks"


def _kind(value: Any) -> str:
    """A JSON value's type; a list by the set of its items' types."""
    if isinstance(value, list):
        return "list[" + "|".join(sorted({_kind(v) for v in value})) + "]"
    return type(value).__name__


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("prime") / "run"
    write_dump(out, replace(PRESETS["prime-rl"], dp=2, cp=2))
    return out


def test_the_files_are_laid_out_as_prime_rl_writes_them(generated: Path) -> None:
    def layout(root: Path) -> set[str]:
        return {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}

    real = layout(REAL) - {p for p in layout(REAL) if p.startswith("expected/")}
    assert real == {
        "metrics.jsonl",
        *(f"token_exports/step_{s}/{n}" for s in (1, 2) for n in ("STABLE", "rank_0.jsonl")),
        *(f"token_exports/step_{s}/rank_1.jsonl" for s in (1, 2)),
    }
    # cp 2: one writer per CP group, world ranks 0 and 2; three training steps
    assert layout(generated) == {
        "metrics.jsonl",
        *(f"token_exports/step_{s}/{n}" for s in (1, 2, 3) for n in ("STABLE", "rank_0.jsonl")),
        *(f"token_exports/step_{s}/rank_2.jsonl" for s in (1, 2, 3)),
    }
    assert (generated / "token_exports" / "step_1" / "STABLE").read_bytes() == b""


def test_each_line_has_the_real_keys_types_and_separators(generated: Path) -> None:
    real = (REAL / "token_exports" / "step_1" / "rank_0.jsonl").read_text().splitlines()[0]
    ours = (generated / "token_exports" / "step_1" / "rank_0.jsonl").read_text().splitlines()[0]
    assert ", " not in real and ", " not in ours and ": " not in ours  # separators=(",", ":")
    real_record, record = json.loads(real), json.loads(ours)
    assert list(record) == list(real_record)
    assert {k: _kind(v) for k, v in record.items()} == {k: _kind(v) for k, v in real_record.items()}
    assert _kind(record["rl_weights"]) == "list[NoneType]"  # no weight streams, as the real


def test_placeholders_and_derived_fields_follow_prime_rls_rules(generated: Path) -> None:
    """As in the real exports: 0.0 engine log-prob and advantage off the loss mask; the ratio
    fields computed from the two log-probs on every position; DPPO masks only on loss tokens;
    a sample's prompt is all before its first loss token; position ids 0 … n−1."""
    for path, kind in ((REAL, "real"), (generated, "generated")):
        for file in sorted((path / "token_exports").rglob("rank_*.jsonl")):
            for record in _lines(file):
                loss = np.array(record["loss_mask"])
                trainer = np.array(record["trainer_logprobs"], dtype=np.float32)
                inference = np.array(record["inference_logprobs"], dtype=np.float32)
                assert record["position_ids"] == list(range(len(loss))), kind
                assert loss.any(), kind  # a line without a loss token is never written
                assert not np.array(record["inference_logprobs"])[~loss].any(), kind
                assert not np.array(record["advantages"])[~loss].any(), kind
                log_ratio = np.array(record["log_importance_ratio"], dtype=np.float32)
                assert np.array_equal(log_ratio, trainer - inference), kind
                k3 = np.array(record["mismatch_kl"], dtype=np.float32)
                assert np.allclose(k3, np.exp(log_ratio) - log_ratio - 1, atol=1e-6), kind
                assert not np.array(record["is_masked"])[~loss].any(), kind


def test_metrics_line_is_the_lakes_mean_k3_as_prime_rls_is(generated: Path, tmp_path: Path) -> None:
    for path in (REAL, generated):
        first = _lines(path / "metrics.jsonl")[0]
        assert list(first)[:2] == ["step", "time"] and first["step"] == 1
    lake = tmp_path / "lake"
    summary = extract_run(generated, store_of(lake), ExtractOptions(workers=1))
    assert (summary.failed, summary.dump_format, summary.counts["new"]) == ([], "prime-rl", 3)
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        got = con.execute(
            "SELECT d.rollout_id, d.k3_kl, m.value FROM drift_steps AS d JOIN metrics AS m"
            " ON m.run = d.run AND m.step = d.rollout_id AND m.metric = 'mismatch_kl/all/mean'"
            " ORDER BY 1"
        ).fetchall()
    assert [r[0] for r in got] == [1, 2, 3]
    for _, k3, logged in got:
        assert math.isclose(k3, logged, rel_tol=0, abs_tol=2 * float(np.finfo(np.float32).eps))


def test_the_bench_preset_is_prime_rls_layout_at_the_bench_size() -> None:
    bench, small = PRESETS["bench-prime-rl"], PRESETS["prime-rl"]
    assert (bench.framework, small.framework) == ("prime-rl", "prime-rl")
    assert bench.samples_per_step == PRESETS["bench"].samples_per_step
    assert bench.dashboard_columns is False


JUNE_2026_KEYS = [  # prime-rl 941019f2e's record and `_export_columns`, in their order
    "schema_version", "step", "export_step", "rank", "micro_step", "micro_sequence_idx",
    "export_sequence_idx", "run_id", "env_name", "training_mode", "token_ids", "position_ids",
    "loss_mask", "advantages", "rewards", "inference_logprobs", "trainer_logprobs", "entropy",
    "mismatch_kl", "log_importance_ratio", "importance_ratio", "prob_delta", "is_masked",
    "is_masked_high", "is_masked_low",
]  # fmt: skip


def test_the_june_2026_preset_writes_that_writers_lines_and_lands_as_today(
    tmp_path: Path,
) -> None:
    """Preset `prime-rl-2026-06`: the lines of prime-rl 2026-06-11 .. 2026-06-26 (no weight
    streams; the sample's reward on every token): the same tokens as today's lines, and each
    sample's reward from them."""
    today, june = tmp_path / "today", tmp_path / "june"
    write_dump(today, PRESETS["prime-rl"])
    write_dump(june, PRESETS["prime-rl-2026-06"])
    lines = _lines(june / "token_exports" / "step_1" / "rank_0.jsonl")
    assert [list(record) for record in lines] == [JUNE_2026_KEYS] * len(lines)
    assert {(r["export_step"], r["run_id"], r["training_mode"]) for r in lines} == {(1, None, "rl")}
    rewards = [r["rewards"][0] for r in lines]
    assert all(r["rewards"] == [r["rewards"][0]] * len(r["token_ids"]) for r in lines)
    import duckdb

    got = {}
    for name, dump in (("today", today), ("june", june)):
        summary = extract_run(dump, store_of(tmp_path / f"lake-{name}"), ExtractOptions(workers=1))
        assert (summary.failed, summary.counts["new"]) == ([], 3)
        with duckdb.connect(str(tmp_path / f"lake-{name}" / "tokenlake.duckdb")) as con:
            got[name] = con.execute(
                "SELECT rollout_id, batch_position, position, token_id, train_log_prob,"
                " rollout_log_prob, lp_diff, advantage FROM tokens ORDER BY 1, 2, 3"
            ).fetchall()
            if name == "june":
                landed = con.execute(
                    "SELECT reward FROM samples WHERE rollout_id = 1 AND dumped_rank = 0"
                    " ORDER BY batch_position"
                ).fetchall()
    assert got["june"] == got["today"]
    assert landed == [(reward,) for reward in rewards]


def test_the_may_2026_preset_writes_no_stable_and_every_step_lands(tmp_path: Path) -> None:
    """Preset `prime-rl-2026-05`: the writer before `STABLE` (2026-05-21 .. 2026-06-10)."""
    may = tmp_path / "may"
    write_dump(may, PRESETS["prime-rl-2026-05"])
    assert not list(may.rglob("STABLE"))
    lines = _lines(may / "token_exports" / "step_1" / "rank_0.jsonl")
    keys = [k for k in JUNE_2026_KEYS if k not in ("export_step", "run_id")]
    assert [list(record) for record in lines] == [keys] * len(lines)
    options = ExtractOptions(workers=1, settle_seconds=0.0)
    summary = extract_run(may, store_of(tmp_path / "lake"), options)
    assert (summary.failed, summary.counts["new"]) == ([], 3)
    assert [w.split(":")[0] for w in summary.warnings] == ["Step 3 is incomplete"]
