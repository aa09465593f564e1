"""The dump generator against the real miles fixtures, and its own ground truth."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

from tests.fixture_paths import REAL_DUMPS
from tokenlake.errors import UsageError
from tokenlake.generator import synth, synth_truth
from tokenlake.generator.synth import PRESETS, DumpSpec, write_dump
from tokenlake.read import cp_layout

FIXTURES = REAL_DUMPS

# Specs mirroring the real fixtures (layout, not values).
MIRRORS = {
    "basic": DumpSpec(dp=2, tp=2),
    "cp2": DumpSpec(dp=2, cp=2, tp=2, response_length=(1, 48), removed_positions=(5,)),
    "pp2": DumpSpec(dp=2, pp=2),
}


def _load(path: Path) -> Any:
    import torch

    return torch.load(path, weights_only=False, map_location="cpu")


def _describe(value: Any) -> str:
    """Python type of a value; tensors with their dtype; lists by the types of their items."""
    import torch

    if isinstance(value, torch.Tensor):
        return f"Tensor[{value.dtype}]"
    if isinstance(value, list):
        return "list[" + "|".join(sorted({_describe(v) for v in value})) + "]"
    return type(value).__name__


def _rollout_structure(path: Path) -> dict[str, Any]:
    content = _load(path)
    samples = content["samples"]
    keys = {tuple(s) for s in samples}
    types = {k: sorted({_describe(s[k]) for s in samples}) for k in samples[0]}
    return {"top": list(content), "sample_keys": keys, "types": types, "meta": content["metadata"]}


def _train_structure(path: Path) -> dict[str, Any]:
    content = _load(path)
    data = content["rollout_data"]
    header = {k: content[k] for k in ("cp_rank", "cp_size", "qkv_format") if k in content}
    return {
        "top": list(content),
        "columns": list(data),
        "types": {k: _describe(v) for k, v in data.items()},
        "header": header,
    }


def _dump_structure(root: Path) -> dict[str, Any]:
    rollouts = {p.name: _rollout_structure(p) for p in sorted((root / "rollout_data").iterdir())}
    trains = {p.name: _train_structure(p) for p in sorted((root / "train_data").iterdir())}
    parquet = {
        p.name: pq.read_schema(p).remove_metadata()
        for p in sorted((root / "dashboard_columns").iterdir())
    }
    trajectory = {
        p.name: [_json_keys(json.loads(line)) for line in p.read_text().splitlines()]
        for p in sorted((root / "trajectory").iterdir())
    }
    return {"rollout": rollouts, "train": trains, "parquet": parquet, "trajectory": trajectory}


def _json_keys(record: dict[str, Any]) -> tuple[Any, ...]:
    return (*record, tuple(tuple(m) for m in record["messages"]))


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(MIRRORS))
def test_generated_dump_has_the_real_structure(case: str, tmp_path: Path) -> None:
    real = _dump_structure(FIXTURES / case)
    write_dump(tmp_path, MIRRORS[case])
    ours = _dump_structure(tmp_path)
    assert ours["rollout"] == real["rollout"]
    assert ours["train"] == real["train"]  # same files, keys, key order, types, cp headers
    assert ours["trajectory"] == real["trajectory"]
    assert ours["parquet"].keys() == real["parquet"].keys()
    assert real["parquet"]  # each real dump has dashboard columns: the loop compares something
    for name, schema in real["parquet"].items():
        assert ours["parquet"][name].equals(schema), name


@pytest.mark.slow
def test_pp_stage_zero_lacks_trainer_fields(tmp_path: Path) -> None:
    write_dump(tmp_path, MIRRORS["pp2"])
    stage0 = _load(tmp_path / "train_data" / "0_1.pt")["rollout_data"]
    stage1 = _load(tmp_path / "train_data" / "0_3.pt")["rollout_data"]
    assert set(stage1) - set(stage0) == set(synth.TRAINER_FIELDS)
    assert stage0["sample_indices"] == stage1["sample_indices"] == [1, 3, 5, 7]  # strided


@pytest.mark.slow
def test_rewards_follow_grpo_normalisation_of_the_fixture() -> None:
    paths = sorted((FIXTURES / "basic" / "train_data").glob("*.pt"))
    assert len(paths) == 8, paths  # 2 steps x 4 ranks: a check over no file proves nothing
    for path in paths:
        data = _load(path)["rollout_data"]
        step = _load(path)["rollout_id"]
        normalised = synth.grpo_normalise(np.array(data["raw_reward"]), 2)
        expected = [float(normalised[i - step * 8]) for i in data["sample_indices"]]
        assert data["rewards"] == expected, path.name


def _cp_slices(root: Path, spec: DumpSpec, rid: int) -> dict[int, dict[int, dict[str, Any]]]:
    """sample index -> cp rank -> field -> stored slice, from the last stage's TP-0 files."""
    out: dict[int, dict[int, dict[str, Any]]] = {}
    for dp in range(spec.dp):
        for cp in range(spec.cp):
            rank = synth.global_rank(spec, dp=dp, cp=cp, pp=spec.pp - 1, tp=0)
            path = root / "train_data" / f"{rid}_{rank}.pt"
            if not path.exists():
                continue
            data = _load(path)["rollout_data"]
            for r, index in enumerate(data["sample_indices"]):
                fields = {
                    f: data[f][r].numpy() for f in (*synth.TRAINER_FIELDS, "rollout_log_probs")
                }
                fields["max_seq_lens"] = data.get("max_seq_lens", [None] * (r + 1))[r]
                out.setdefault(index, {})[cp] = fields
    return out


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["cp-thd", "cp-bshd"])
def test_cp_slices_reassemble_to_the_truth(preset: str, tmp_path: Path) -> None:
    spec = PRESETS[preset]
    truth = write_dump(tmp_path, spec, keep_truth=True)
    assert truth is not None
    checked = 0
    for rid in range(spec.steps):
        slices = _cp_slices(tmp_path, spec, rid)
        for (step, evaluation, _), sample in truth.samples.items():
            if step != rid or evaluation:
                continue
            by_rank = slices[sample.sample_index]
            padded = by_rank[0]["max_seq_lens"]
            if preset == "cp-bshd":
                assert padded % 8 == 0 and padded >= len(sample.token_ids)
            total, r = len(sample.token_ids), sample.response_length
            for name in synth.TRAINER_FIELDS:
                parts = [by_rank[s][name] for s in range(spec.cp)]
                assert np.array_equal(
                    cp_layout.assemble(parts, total, r, padded), getattr(sample, name)
                )
            parts = [by_rank[s]["rollout_log_probs"] for s in range(spec.cp)]
            assembled = cp_layout.assemble(parts, total, r, padded)
            assert np.array_equal(assembled, sample.train_rollout_log_probs)
            checked += 1
    assert checked == spec.steps * spec.samples_per_step


@pytest.mark.slow
def test_legacy_preset_has_no_cp_keys(tmp_path: Path) -> None:
    write_dump(tmp_path, PRESETS["cp-legacy"])
    files = sorted((tmp_path / "train_data").glob("*.pt"))
    assert len(files) == 2 * 2 * 2  # steps x DP x CP
    for path in files:
        assert list(_load(path)) == ["rollout_id", "rank", "rollout_data"]


@pytest.mark.slow
def test_missing_cp_rank_really_lacks_those_files(tmp_path: Path) -> None:
    spec = PRESETS["cp-missing-rank"]
    truth = write_dump(tmp_path, spec, keep_truth=True)
    names = {p.name for p in (tmp_path / "train_data").glob("*.pt")}
    # DP 2 x CP 2 x TP 2: shard 0, CP rank 1 = ranks 2 and 3, step 0 only.
    assert {f"0_{r}.pt" for r in range(8)} - names == {"0_2.pt", "0_3.pt"}
    assert {f"1_{r}.pt" for r in range(8)} <= names
    assert truth is not None
    failing = sorted(k[2] for k, s in truth.samples.items() if s.alignment_fails)
    assert failing == [0, 2, 4, 6]  # step 0's shard-0 positions (strided DP split)


@pytest.mark.slow
def test_same_seed_same_bytes_other_seed_other_values(tmp_path: Path) -> None:
    spec = PRESETS["example"]
    for name in ("a", "b"):
        write_dump(tmp_path / name, spec)
    write_dump(tmp_path / "c", replace(spec, seed=1))

    def content(name: str, rel: str) -> bytes:
        return pickle.dumps(_load(tmp_path / name / rel))

    for rel in ("rollout_data/1.pt", "rollout_data/eval_0.pt"):
        assert content("a", rel) == content("b", rel)
        assert content("a", rel) != content("c", rel)
    train_a = _load(tmp_path / "a" / "train_data" / "1_2.pt")["rollout_data"]["log_probs"]
    train_b = _load(tmp_path / "b" / "train_data" / "1_2.pt")["rollout_data"]["log_probs"]
    assert len(train_a) > 0  # all() over no sample would hold
    assert all(np.array_equal(x.numpy(), y.numpy()) for x, y in zip(train_a, train_b, strict=True))


@pytest.mark.slow
def test_multi_turn_samples_have_observation_runs(tmp_path: Path) -> None:
    truth = write_dump(tmp_path, PRESETS["multi-turn"], keep_truth=True)
    rollout = _load(tmp_path / "rollout_data" / "0.pt")["samples"]
    assert truth is not None
    multi = 0
    for i, sample in enumerate(rollout):
        t = truth.samples[(0, False, i)]
        if sample["index"] % 3 != 0:
            assert sample["loss_mask"] is None
            continue
        multi += 1
        mask = np.array(sample["loss_mask"])
        assert np.array_equal(mask, t.loss_mask) and mask[-1] == 0 and mask[0] == 1
        runs = np.flatnonzero(np.diff(np.concatenate([[1], mask, [1]])) == -1)
        assert len(runs) == 2  # one observation run inside, one at the end
        assert all(
            v == 0.0 for v, m in zip(sample["rollout_log_probs"], mask, strict=True) if m == 0
        )
        assert all(
            v != 0.0 for v, m in zip(sample["rollout_log_probs"], mask, strict=True) if m == 1
        )
    assert multi == 3  # positions 0, 3, 6 of 8


@pytest.mark.slow
def test_variants_are_in_the_files(tmp_path: Path) -> None:
    variants = {
        "removed": replace(PRESETS["removed"], steps=1),
        "nonfinite": PRESETS["nonfinite"],
        "empty": PRESETS["empty-response"],
        "only": PRESETS["rollout-only"],
        "nolp": PRESETS["no-log-probs"],
    }
    for name, spec in variants.items():
        write_dump(tmp_path / name, spec)
    removed = _load(tmp_path / "removed" / "rollout_data" / "0.pt")["samples"]
    assert [s["remove_sample"] for s in removed] == [True, False, False, True] + [False] * 4
    shard0 = _load(tmp_path / "removed" / "train_data" / "0_0.pt")["rollout_data"]
    assert shard0["sample_indices"] == [0, 2, 4, 6] and shard0["rollout_mask_sums"][0] == 0
    lp = np.concatenate(
        [
            t.numpy()
            for t in _load(tmp_path / "nonfinite" / "train_data" / "0_0.pt")["rollout_data"][
                "log_probs"
            ]
        ]
    )
    assert np.isnan(lp).sum() == 1 and np.isneginf(lp).sum() == 1
    empty = _load(tmp_path / "empty" / "rollout_data" / "0.pt")["samples"][-1]
    assert (empty["response_length"], empty["rollout_log_probs"]) == (0, [])
    assert (
        sorted(
            p.name for p in (tmp_path / "only" / "train_data").iterdir() if p.name.startswith("1_")
        )
        == []
    )
    assert (tmp_path / "only" / "rollout_data" / "1.pt").exists()
    assert "log_probs" not in _load(tmp_path / "nolp" / "train_data" / "0_0.pt")["rollout_data"]


def test_bench_preset_size_figures() -> None:
    bench, bench_cp = PRESETS["bench"], PRESETS["bench-cp"]
    assert bench.samples_per_step == 512
    assert bench.response_length == (256, 8192)
    assert (bench.dp, bench.tp, bench.cp, bench.pp) == (4, 2, 1, 1)
    assert bench_cp == replace(bench, cp=2)


@pytest.mark.slow
def test_scaled_bench_copy(tmp_path: Path) -> None:
    spec = replace(PRESETS["bench-cp"], steps=1, prompts_per_step=2, eval_steps=())
    truth = write_dump(tmp_path, spec, keep_truth=True)
    assert truth is not None and len(truth.samples) == 16
    lengths = [s.response_length for s in truth.samples.values()]
    assert min(lengths) >= 256 and max(lengths) == 8192  # position 2 is truncated at the max
    assert len(list((tmp_path / "train_data").iterdir())) == 4 * 2 * 2


def test_refuses_a_non_empty_directory_unless_forced(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("keep me")
    with pytest.raises(UsageError) as err:
        write_dump(tmp_path, DumpSpec(steps=1, eval_steps=()))
    assert str(err.value) == (
        f"Output directory `{tmp_path}` is not empty. Pass `--force` (force=True) to replace"
        " its rollout_data/, train_data/, dashboard_columns/ and trajectory/."
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


@pytest.mark.slow
def test_force_rewrites_only_the_dump_subdirectories(tmp_path: Path) -> None:
    write_dump(tmp_path, DumpSpec(steps=2, eval_steps=()))
    (tmp_path / "notes.txt").write_text("keep me")
    write_dump(tmp_path, DumpSpec(steps=1, eval_steps=(), dashboard_columns=False), force=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "notes.txt",
        "rollout_data",
        "train_data",
        "trajectory",
    ]
    assert sorted(p.name for p in (tmp_path / "rollout_data").iterdir()) == ["0.pt"]


def test_invalid_spec_is_refused_with_the_reason(tmp_path: Path) -> None:
    with pytest.raises(UsageError) as err:
        write_dump(tmp_path, DumpSpec(missing_cp_rank=True, removed_positions=(8,)))
    assert str(err.value) == (
        "Invalid dump spec: `removed_positions` must lie in 0..7; `missing_cp_rank` needs"
        " `cp` >= 2."
    )
    assert list(tmp_path.iterdir()) == []


def test_legacy_layout_inference() -> None:
    full = np.arange(1, 13, dtype=np.float32)
    parts = [cp_layout.slice_for_rank(full, 20, s, 2) for s in range(2)]
    assert synth_truth.legacy_layout_ok(parts, 20, 12)
    assert not synth_truth.legacy_layout_ok(parts[:1], 20, 12)  # a missing rank
    zeros = np.zeros(12, dtype=np.float32)  # two identical all-zero slices collapse into one
    assert not synth_truth.legacy_layout_ok([zeros[:4], zeros[:4]], 16, 8)


def test_rank_order_is_megatron() -> None:
    spec = DumpSpec(dp=2, cp=2, tp=2, pp=2)
    ranks = [
        synth.global_rank(spec, dp=d, cp=c, pp=p, tp=t)
        for p in range(2)
        for d in range(2)
        for c in range(2)
        for t in range(2)
    ]
    assert ranks == list(range(16))


@pytest.mark.slow
def test_module_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert synth.main([str(tmp_path), "--preset", "no-entropy"]) == 0
    assert sorted(p.name for p in (tmp_path / "rollout_data").iterdir()) == [
        "0.pt",
        "1.pt",
        "eval_0.pt",
    ]
    assert synth.main([str(tmp_path), "--preset", "no-entropy"]) == 1
    assert capsys.readouterr().err.startswith(f"Error: Output directory `{tmp_path}` is not empty.")
    assert synth.main([str(tmp_path), "--preset", "no-entropy", "--force", "--seed", "3"]) == 0
