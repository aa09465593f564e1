"""Deterministic generator of miles `--dump-details` directories (dump-format.md sections 1-5),
and of the same batches in slime's and NeMo-RL's layouts (`DumpSpec.framework`, written by
`tokenlake.generator.synth_frameworks`).

Keys, key order, Python types and tensor dtypes copy the real dumps under
``tests/fixtures/miles-real/dumps``; only the values are synthetic. Layout choices, all within
what miles writes:

- DP sharding is the legacy **strided** split: shard d holds batch positions d, d+D, ... (4.2).
- Rank = tp + TP*(cp + CP*(dp + DP*pp)) (Megatron order, TP innermost, PP outermost; 4.3).
- Only the last PP stage carries the trainer outputs; TP peers are exact copies.
- CP slices come from `tokenlake.read.cp_layout.slice_for_rank`; under bshd the padded length M
  (`max_seq_lens`) is the shard's maximum T rounded up to a multiple of `BSHD_PAD` = 8.
- `missing_cp_rank` drops every file of CP rank CP-1 of DP shard 0 at step 0.
- Eval dumps hold the first half of their step's samples, `Sample.index` restarted at 0 (one
  eval dataset), `remove_sample` false, metadata ``{}``.
- `Sample.index` = step * samples_per_step + batch position; `group_index` = batch position //
  samples_per_prompt (restarting every step, as in the fixtures).
- Multi-turn: agentic-shaped samples (`Sample.index % 3 == 0`) with R >= 4 get one observation
  run inside the response and one at its end (mask 0, rollout log-prob exactly 0.0).
- Batch position 2 and about 10% of the others are `truncated` (R = the range maximum); with
  `empty_response` the last batch position has R = 0. The first two samples of every training
  step carry a conversation (``trajectory/``).

Every step draws from ``numpy.random.default_rng([seed, step])``, so a step's values do not
depend on which other steps are generated. Memory is bounded by one step (plus the `Truth`
when asked for).
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from tokenlake import extras
from tokenlake.errors import PipelineError, UsageError
from tokenlake.generator import synth_dashboard, synth_frameworks, synth_shapes
from tokenlake.generator.synth_spec import (
    AGENTIC_PROMPT,
    DASHBOARD_ROW_GROUP,
    DUMP_SUBDIRS,
    PRESETS,
    TRAINER_FIELDS,
    DumpSpec,
    StepBatch,
    build_step,
    dropped_cp_rank,
    eval_count,
    global_rank,
    grpo_normalise,
    padded_lengths,
    train_rollout_log_probs,
    trainer_fields,
)
from tokenlake.generator.synth_truth import Truth, step_truth
from tokenlake.read import nemo_rl, prime_rl
from tokenlake.read.cp_layout import slice_for_rank

logger = logging.getLogger(__name__)

__all__ = [
    "DumpSpec",
    "PRESETS",
    "StepBatch",
    "TRAINER_FIELDS",
    "Truth",
    "dropped_cp_rank",
    "global_rank",
    "grpo_normalise",
    "main",
    "trainer_fields",
    "write_dump",
]


# ---------------------------------------------------------------------------------------------
# Rollout side: rollout_data/{stem}.pt, dashboard_columns/, trajectory/
# ---------------------------------------------------------------------------------------------
def _sample_dict(
    spec: DumpSpec, step: StepBatch, i: int, lists: dict[str, list[Any]], evaluation: bool
) -> dict:
    """One `Sample.to_dict()` with every key of the real dumps, in their order."""
    t0, t1, r0, r1 = step.t_off[i], step.t_off[i + 1], step.r_off[i], step.r_off[i + 1]
    agentic, plen = bool(step.agentic[i]), int(step.plen[i])
    group = int(step.group[i])
    sample_index = i if evaluation else int(step.index[i])
    sample = {
        "group_index": group,
        "index": i if evaluation else int(step.index[i]),
        "rollout_id": None,
        "prompt": [dict(m) for m in AGENTIC_PROMPT] if agentic else f"Question {group}: 1+1?",
        "tokens": lists["tokens"][t0:t1],
        "multimodal_inputs": None,
        "multimodal_train_inputs": None,
        "response": "x" * int(step.rlen[i]),
        "response_length": int(step.rlen[i]),
        "label": None,
        "reward": float(step.reward[i]),
        "loss_mask": lists["mask"][r0:r1] if step.multi[i] else None,
        "weight_versions": synth_shapes.weight_versions(spec, step, i),
        "rollout_log_probs": lists["rlp"][r0:r1],
        "rollout_routed_experts": None,
        "rollout_indexer_topk": None,
        "remove_sample": bool(step.removed[i]) and not evaluation,
        "teacher_log_probs": None,
        "opd_reverse_kl": None,
        "status": "truncated" if step.truncated[i] else "completed",
        "metadata": {"messages": _messages(sample_index)} if spec.pre_dashboard and i < 2 else {},
        "generate_function_path": None,
        "train_metadata": None,
        "adapter": None,
        "reward_spec": None,
        "routing_key": None,
        "non_generation_time": 1.5 if step.multi[i] else 0.0,
        "spec_info": synth_shapes.spec_info(spec, step, i),
        "prefix_cache_info": {"cached_tokens": plen // 2 if agentic else 0, "total_prompt_tokens": plen},
    }  # fmt: skip
    if spec.pre_dashboard:
        del sample["rollout_id"]  # Sample.rollout_id came on 2026-08-04
    if spec.sampling_support:  # after rollout_log_probs; None on eval (never sent there)
        ids, offsets = synth_shapes.sampling_mask(step, i) if not evaluation else (None, None)
        keys = list(sample)
        at = keys.index("rollout_log_probs") + 1
        supports = {"rollout_sampling_mask_ids": ids, "rollout_sampling_mask_offsets": offsets}
        sample = {k: sample[k] for k in keys[:at]} | supports | {k: sample[k] for k in keys[at:]}
    return sample


def _rollout_payload(
    spec: DumpSpec, step: StepBatch, count: int, evaluation: bool
) -> dict[str, Any]:
    """The rollout `.pt` content for the first `count` samples."""
    t_end, r_end = int(step.t_off[count]), int(step.r_off[count])
    lists = {
        "tokens": step.tokens[:t_end].tolist(),
        "rlp": step.rlp[:r_end].tolist(),
        "mask": step.gen_mask[:r_end].tolist() if step.multi.any() else [],
    }
    samples = [_sample_dict(spec, step, i, lists, evaluation) for i in range(count)]
    return {"rollout_id": step.rid, "metadata": {}, "samples": samples}


def _large_list(offsets: np.ndarray, values: np.ndarray, mask: np.ndarray | None = None) -> Any:
    null = None if mask is None else pa.array(mask)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values), mask=null)


def _dashboard_table(step: StepBatch, count: int, evaluation: bool) -> pa.Table:
    """dashboard_columns rows (2.6) for the first `count` samples, built column-wise."""
    t_off, r_off = step.t_off[: count + 1], step.r_off[: count + 1]
    rlen, multi = step.rlen[:count], step.multi[:count]
    has_mask = np.repeat(multi, rlen)
    mask_off = np.concatenate([[0], np.cumsum(rlen * multi)])
    r_end = int(r_off[-1])
    index = np.arange(count) if evaluation else step.index[:count]
    columns = {
        "sample_index": pa.array(index.astype(np.int32)),
        "response_length": pa.array(rlen.astype(np.int32)),
        "total_length": pa.array(np.diff(t_off).astype(np.int32)),
        "tokens": _large_list(t_off, step.tokens[: t_off[-1]].astype(np.int32)),
        "loss_mask": _large_list(
            mask_off, step.gen_mask[:r_end][has_mask[:r_end]].astype(np.int8), ~multi
        ),
        "rollout_log_probs": _large_list(r_off, step.rlp[:r_end].astype(np.float32)),
    }
    return pa.table(columns)


def _write_dashboard(out: Path, stem: str, table: pa.Table) -> None:
    """Write via a temporary name and rename into place, as miles does (atomic)."""
    folder = out / "dashboard_columns"
    tmp = folder / f"rollout_{stem}.tmp"
    pq.write_table(table, tmp, row_group_size=DASHBOARD_ROW_GROUP, compression="zstd")
    tmp.replace(folder / f"rollout_{stem}.parquet")


def _messages(index: int, prompt: Any = None) -> list[dict[str, Any]]:
    """The conversation of a sample that records one (the fixtures' `_dummy_messages`)."""
    return [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": str(prompt)},
        {"role": "assistant", "content": "Let me look that up.",
         "reasoning_content": "The user asks a question; call the lookup tool first.",
         "tool_calls": [{"function": {"name": "lookup", "arguments": '{"query": "answer"}'}}]},
        {"role": "tool", "name": "lookup", "content": '{"result": 42}'},
        {"role": "assistant", "content": f"The answer for sample {index} is 42."},
    ]  # fmt: skip


def _write_trajectory(out: Path, payload: dict[str, Any]) -> None:
    """Conversations of the first two samples, one JSON object per line (2.7)."""
    lines = []
    for sample in payload["samples"][:2]:
        i = sample["index"]
        messages = _messages(i, sample["prompt"])
        keys = ("group_index", "status", "reward", "prompt")
        record = {"sample_index": i, **{k: sample[k] for k in keys}, "messages": messages}
        lines.append(json.dumps(record, separators=(",", ":")))
    (out / "trajectory" / f"{payload['rollout_id']}.jsonl").write_text("\n".join(lines) + "\n")


def _write_rollout(out: Path, spec: DumpSpec, step: StepBatch, evaluation: bool) -> None:
    """trajectory (train steps), dashboard parquet, then the `.pt`: miles' write order (1.1).
    NeMo-RL has no rollout file: its one log file per step is written here."""
    import torch

    if spec.framework == "nemo-rl":
        synth_frameworks.write_nemo_rl_step(out, spec, step, evaluation)
        return
    if spec.framework == "prime-rl":
        synth_frameworks.write_prime_rl_step(out, spec, step, evaluation)
        return

    count = eval_count(step) if evaluation else step.n
    stem = f"eval_{step.rid}" if evaluation else str(step.rid)
    payload = _rollout_payload(spec, step, count, evaluation)
    if spec.framework != "miles":  # slime: no metadata, no trajectory sidecar
        torch.save(
            synth_frameworks.slime_rollout(payload, spec), out / "rollout_data" / f"{stem}.pt"
        )
        return
    if not evaluation and not spec.pre_dashboard:  # before the dashboard: in the .pt
        _write_trajectory(out, payload)
    if spec.dashboard_columns:
        _write_dashboard(out, stem, _dashboard_table(step, count, evaluation))
    torch.save(payload, out / "rollout_data" / f"{stem}.pt")


# ---------------------------------------------------------------------------------------------
# Train side: train_data/{rid}_{rank}.pt
# ---------------------------------------------------------------------------------------------


def _shard_columns(
    spec: DumpSpec, step: StepBatch, rows: np.ndarray, padded: dict[int, int] | None
) -> dict[str, Any]:
    """Columns every rank of a DP shard holds in full, in the real dumps' key order."""
    import torch

    masks = [step.resp(step.train_mask, i) for i in rows]
    index = [int(step.index[i]) for i in rows]
    columns: dict[str, Any] = {
        "tokens": [torch.from_numpy(step.tok(i).copy()) for i in rows],
        "response_lengths": [int(step.rlen[i]) for i in rows],
        "rewards": [float(step.norm[i]) for i in rows],
        "truncated": [int(step.truncated[i]) for i in rows],
        "loss_masks": [torch.from_numpy(m.copy()) for m in masks],
        "sample_indices": index,
        "rollout_ids": list(index),  # no Sample.rollout_id: falls back to Sample.index
        "rollout_mask_sums": [int(m.sum()) for m in masks],
        "rollout_log_probs": None,  # CP-sliced, filled per rank (keeps the key order)
        "weight_versions": [synth_shapes.weight_versions(spec, step, i) for i in rows],
        "raw_reward": step.reward.tolist(),  # batch-global, rollout-dump order
        "total_lengths": [int(step.t_off[i + 1] - step.t_off[i]) for i in rows],
    }
    if spec.framework == "slime-v1":  # slime's format 1 never had the column
        del columns["weight_versions"]
    if padded is not None:
        columns["max_seq_lens"] = [padded[int(i)] for i in rows]
    if spec.pre_dashboard:  # both came on 2026-08-04
        del columns["rollout_ids"], columns["rollout_mask_sums"]
    if spec.sampling_support:  # plain lists per row, never CP-sliced, after rollout_log_probs
        supports = [synth_shapes.sampling_mask(step, i) for i in rows]
        order = list(columns)
        at = order.index("rollout_log_probs") + 1
        extra = {
            "rollout_sampling_mask_ids": [ids for ids, _ in supports],
            "rollout_sampling_mask_offsets": [offsets for _, offsets in supports],
        }
        if spec.framework == "slime-v1":  # slime's names (#2102)
            extra = {synth_frameworks.SLIME_SUPPORT_NAMES[k]: v for k, v in extra.items()}
        columns = {k: columns[k] for k in order[:at]} | extra | {k: columns[k] for k in order[at:]}
    return columns


def _sliced(
    spec: DumpSpec,
    step: StepBatch,
    flat: np.ndarray,
    rows: np.ndarray,
    cp: int,
    padded: dict[int, int] | None,
) -> list[Any]:
    """One tensor per row: the CP rank's zigzag slice of a response-aligned array."""
    import torch

    parts = []
    for i in rows:
        full = step.resp(flat, i)
        total = int(step.t_off[i + 1] - step.t_off[i])
        pad = None if padded is None else padded[int(i)]
        part = full.copy() if spec.cp == 1 else slice_for_rank(full, total, cp, spec.cp, pad)
        parts.append(torch.from_numpy(part))
    return parts


def _train_payload(spec: DumpSpec, rid: int, rank: int, cp: int, data: dict) -> dict[str, Any]:
    payload: dict[str, Any] = {"rollout_id": rid, "rank": rank, "rollout_data": data}
    if spec.record_cp:
        payload.update(cp_rank=cp, cp_size=spec.cp, qkv_format=spec.qkv_format)
    return payload


def _write_train(out: Path, spec: DumpSpec, step: StepBatch) -> None:
    """Every rank's file of one step (TP peers identical, trainer outputs on the last stage);
    slime's format 2 writes one file per step, NeMo-RL's log line holds the train side."""
    import torch

    if spec.framework == "slime-v2":
        synth_frameworks.write_slime_v2_train(out, spec, step)
        return
    if spec.framework in ("nemo-rl", "prime-rl"):
        return

    rlp32 = train_rollout_log_probs(spec, step)
    rlp_dtype = getattr(torch, spec.train_rlp_dtype)
    fields = trainer_fields(spec, step.rid)
    for dp in range(spec.dp):
        rows = np.arange(dp, step.n, spec.dp)
        padded = padded_lengths(spec, step, rows)
        common = _shard_columns(spec, step, rows, padded)
        for cp in range(spec.cp):
            if dropped_cp_rank(spec, step.rid, dp, cp):
                continue
            rlp = [t.to(rlp_dtype) for t in _sliced(spec, step, rlp32, rows, cp, padded)]
            data = {**common, "rollout_log_probs": rlp}
            outputs = {f: _sliced(spec, step, step.trainer[f], rows, cp, padded) for f in fields}
            for pp in range(spec.pp):
                columns = {**data, **outputs} if pp == spec.pp - 1 else data
                for tp in range(spec.tp):
                    if spec.sparse_ranks and (tp > 0 or pp < spec.pp - 1):
                        continue  # written only by TP rank 0 of the last PP stage
                    rank = global_rank(spec, dp=dp, cp=cp, pp=pp, tp=tp)
                    payload = _train_payload(spec, step.rid, rank, cp, columns)
                    torch.save(payload, out / "train_data" / f"{step.rid}_{rank}.pt")


# ---------------------------------------------------------------------------------------------
# Entry points
# ---------------------------------------------------------------------------------------------
def _validate(spec: DumpSpec) -> None:
    problems = []
    if min(spec.steps, spec.prompts_per_step, spec.samples_per_prompt) < 1:
        problems.append("`steps`, `prompts_per_step` and `samples_per_prompt` must be >= 1")
    if min(spec.dp, spec.tp, spec.pp, spec.cp) < 1:
        problems.append("`dp`, `tp`, `pp` and `cp` must be >= 1")
    if not 1 <= spec.prompt_length[0] <= spec.prompt_length[1]:
        problems.append(f"`prompt_length` {spec.prompt_length} must be 1 <= lo <= hi")
    if not 0 <= spec.response_length[0] <= spec.response_length[1]:
        problems.append(f"`response_length` {spec.response_length} must be 0 <= lo <= hi")
    if spec.qkv_format not in ("thd", "bshd"):
        problems.append(f"`qkv_format` is `{spec.qkv_format}`; expected `thd` or `bshd`")
    if any(not 0 <= p < spec.samples_per_step for p in spec.removed_positions):
        problems.append(f"`removed_positions` must lie in 0..{spec.samples_per_step - 1}")
    if spec.train_rlp_dtype not in ("float32", "bfloat16", "float16"):
        problems.append(
            f"`train_rlp_dtype` is `{spec.train_rlp_dtype}`; expected float32, bfloat16 or float16"
        )
    if spec.missing_cp_rank and spec.cp < 2:
        problems.append("`missing_cp_rank` needs `cp` >= 2")
    if spec.framework not in synth_frameworks.FRAMEWORKS:
        names = ", ".join(synth_frameworks.FRAMEWORKS)
        problems.append(f"`framework` is `{spec.framework}`; expected one of {names}")
    elif spec.framework != "miles" and spec.dashboard_columns:
        problems.append("`dashboard_columns` are miles' own: set it false for other frameworks")
    if problems:
        raise UsageError("Invalid dump spec: " + "; ".join(problems) + ".")


def _prepare(out: Path, spec: DumpSpec, force: bool) -> None:
    """Create `out`; with `force`, remove only the dump subdirectories this writer rewrites."""
    if out.exists() and not out.is_dir():
        raise UsageError(f"Output `{out}` exists and is not a directory.")
    if out.is_dir() and any(out.iterdir()):
        if not force:
            raise UsageError(
                f"Output directory `{out}` is not empty. Pass `--force` (force=True) to replace"
                " its rollout_data/, train_data/, dashboard_columns/ and trajectory/."
            )
        logs = [p.name for p in out.iterdir() if nemo_rl.is_log_name(p.name)]
        logs += [prime_rl.EXPORT_DIR, prime_rl.METRICS_FILE]
        for name in (*DUMP_SUBDIRS, *logs):
            target = out / name
            if target.is_symlink() or target.is_file():
                target.unlink()  # never follow a link out of `out`
            elif target.is_dir():
                shutil.rmtree(target)
    out.mkdir(parents=True, exist_ok=True)
    miles = ["rollout_data", "train_data"] + ([] if spec.pre_dashboard else ["trajectory"])
    wanted = {"miles": miles, "nemo-rl": [], "prime-rl": []}.get(
        spec.framework, ["rollout_data", "train_data"]
    )
    wanted += ["dashboard_columns"] if spec.dashboard_columns else []
    for name in wanted:
        (out / name).mkdir(parents=True, exist_ok=True)


def write_dump(
    out: Path, spec: DumpSpec, *, keep_truth: bool = False, force: bool = False
) -> Truth | None:
    """Write a miles dump for `spec` into `out`; return its ground truth if `keep_truth`.

    Raises:
        UsageError: `spec` is inconsistent, or `out` is not empty and `force` is false.
        MissingDependencyError: torch (the `synth` extra) is not installed.
    """
    extras.require_torch("Writing a synthetic dump")
    _validate(spec)
    out = Path(out)
    _prepare(out, spec, force)
    truth = Truth(spec=spec, samples={}) if keep_truth else None
    for rid in sorted(set(range(spec.steps)) | set(spec.eval_steps)):
        step = build_step(spec, rid)
        if rid < spec.steps:
            has_train = rid not in spec.rollout_only_steps
            _write_rollout(out, spec, step, evaluation=False)
            if has_train:
                _write_train(out, spec, step)
            if truth is not None:
                truth.samples.update(step_truth(spec, step, False, has_train))
        if rid in spec.eval_steps:
            _write_rollout(out, spec, step, evaluation=True)
            if truth is not None:
                truth.samples.update(step_truth(spec, step, True, False))
        logger.info("step %d: %d samples, %d response tokens", rid, step.n, int(step.r_off[-1]))
    if spec.miles_dashboard:
        synth_dashboard.write_miles_dashboard(out, spec)
    return truth


def main(argv: list[str] | None = None) -> int:
    """`python -m tokenlake.generator.synth OUT --preset NAME [--force] [--seed N]`."""
    parser = argparse.ArgumentParser(
        prog="python -m tokenlake.generator.synth", description="Write a synthetic miles dump."
    )
    parser.add_argument("out", type=Path, help="dump directory to write")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="example")
    parser.add_argument("--force", action="store_true", help="replace an existing dump")
    parser.add_argument("--seed", type=int, default=None, help="override the preset's seed")
    args = parser.parse_args(argv)
    spec = PRESETS[args.preset]
    if args.seed is not None:
        spec = replace(spec, seed=args.seed)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        write_dump(args.out, spec, force=args.force)
    except PipelineError as exc:
        sys.stderr.write(f"Error: {exc}\n")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
