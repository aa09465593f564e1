"""Deterministic generator of miles `--dump-details` directories (dump-format.md sections 1-5).

Keys, key order, Python types and tensor dtypes copy the real dumps under
``shared/fixtures/miles-real/dumps``; only the values are synthetic. Layout choices, all within
what miles writes:

- DP sharding is the legacy **strided** split: shard d holds batch positions d, d+D, ... (4.2).
- Rank = tp + TP*(cp + CP*(dp + DP*pp)) (Megatron order, TP innermost, PP outermost; 4.3).
- Only the last PP stage carries the trainer outputs; TP peers are exact copies.
- CP slices come from `pipeline.cp_layout.slice_for_rank`; under bshd the padded length M
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
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.cp_layout import rank_width, slice_for_rank
from pipeline.errors import PipelineError, UsageError

logger = logging.getLogger(__name__)

VOCAB_SIZE = 32000
BSHD_PAD = 8  # bshd padded length: shard max T rounded up to this multiple
DUMP_SUBDIRS = ("rollout_data", "train_data", "dashboard_columns", "trajectory")
# Trainer outputs in the order the real train dumps list them (last PP stage only).
TRAINER_FIELDS = ("log_probs", "ref_log_probs", "advantages", "returns", "entropy", "ref_entropy")
ENTROPY_FIELDS = ("entropy", "ref_entropy")
DASHBOARD_ROW_GROUP = 8  # rows per row group, as miles writes dashboard_columns (2.6)
AGENTIC_PROMPT = (
    {"role": "user", "content": "What is 1+1?"},
    {"role": "assistant", "content": "let me check"},
    {"role": "tool", "content": "2"},
)


@dataclass(frozen=True)
class DumpSpec:
    """What to generate; every field maps to one layout feature of real miles dumps."""

    steps: int = 2
    prompts_per_step: int = 4
    samples_per_prompt: int = 2
    prompt_length: tuple[int, int] = (4, 12)  # inclusive range, drawn per prompt
    response_length: tuple[int, int] = (1, 24)  # inclusive range, drawn per sample
    dp: int = 2
    tp: int = 1
    pp: int = 1
    cp: int = 1
    qkv_format: str = "thd"  # "thd" | "bshd" (bshd adds max_seq_lens)
    record_cp: bool = True  # False = legacy dump (no cp_rank/cp_size/qkv_format keys)
    missing_cp_rank: bool = False  # drop the files of one CP rank of one DP shard (step 0)
    removed_positions: tuple[int, ...] = ()  # batch positions with remove_sample=True
    multi_turn: bool = False  # observation runs inside and at the end of agentic responses
    eval_steps: tuple[int, ...] = (0,)
    entropy: bool = True
    log_probs: bool = True  # False = no `log_probs` in any file of the run
    log_probs_missing_steps: tuple[int, ...] = ()  # steps whose files lack `log_probs`
    dashboard_columns: bool = True
    nonfinite: bool = False  # a few NaN/+inf/-inf in trainer log-probs / entropy
    rollout_only_steps: tuple[int, ...] = ()  # steps with a rollout file and no train files
    empty_response: bool = False  # one sample per step with R = 0
    # Per-token noise on advantages (std). Plain GRPO broadcasts the normalised reward, so 0.0
    # is the realistic value (spec 3.5); small presets keep noise so every position differs.
    advantage_noise: float = 0.01
    seed: int = 0

    @property
    def samples_per_step(self) -> int:
        """Number of samples in one step's batch."""
        return self.prompts_per_step * self.samples_per_prompt


_SMALL = DumpSpec()
_BENCH = DumpSpec(
    steps=4,
    prompts_per_step=64,
    samples_per_prompt=8,
    prompt_length=(64, 1024),
    response_length=(256, 8192),
    dp=4,
    tp=2,
    multi_turn=True,
    removed_positions=(7,),
    advantage_noise=0.0,  # GRPO: advantages = the normalised reward at every position
)
PRESETS: dict[str, DumpSpec] = {
    "example": DumpSpec(
        steps=3,
        prompts_per_step=8,
        samples_per_prompt=4,
        response_length=(1, 64),
        tp=2,
        multi_turn=True,
        removed_positions=(5,),
    ),
    "tp": replace(_SMALL, tp=4),
    "pp": replace(_SMALL, pp=2),
    "cp-thd": replace(_SMALL, cp=2, tp=2, response_length=(1, 48), removed_positions=(5,)),
    "cp-bshd": replace(_SMALL, cp=2, qkv_format="bshd", response_length=(1, 48)),
    "cp-legacy": replace(_SMALL, cp=2, record_cp=False, response_length=(1, 48)),
    "cp-missing-rank": replace(_SMALL, cp=2, tp=2, missing_cp_rank=True),
    "cp-legacy-missing-rank": replace(
        _SMALL, cp=2, record_cp=False, missing_cp_rank=True, response_length=(1, 48)
    ),
    "removed": replace(_SMALL, steps=3, removed_positions=(0, 3)),
    "multi-turn": replace(_SMALL, multi_turn=True, response_length=(4, 40), tp=2),
    "no-entropy": replace(_SMALL, entropy=False),
    "no-log-probs": replace(_SMALL, log_probs=False),
    "log-probs-missing-step": replace(_SMALL, log_probs_missing_steps=(1,)),
    "no-dashboard-columns": replace(_SMALL, dashboard_columns=False),
    "nonfinite": replace(_SMALL, nonfinite=True),
    "rollout-only": replace(_SMALL, steps=3, rollout_only_steps=(1,)),
    "empty-response": replace(_SMALL, empty_response=True, cp=2),
    "bench": _BENCH,
    "bench-cp": replace(_BENCH, cp=2),
}


@dataclass
class SampleTruth:
    """Full-length ground truth of one sample, before any CP slicing or file dropping.

    Per-token arrays are response-aligned (length R). Trainer arrays are float32, or None where
    the layout has no such field (no train row, field switched off, step without it).
    """

    rollout_id: int
    evaluation: bool
    batch_position: int
    sample_index: int
    group_index: int
    status: str
    remove_sample: bool
    token_ids: np.ndarray  # int64, T = P + R
    prompt_length: int
    response_length: int
    loss_mask: np.ndarray | None  # train-side mask (int32), None without a train row
    rollout_loss_mask: np.ndarray | None  # rollout dump's own `loss_mask`, None when None
    rollout_log_probs: np.ndarray  # float64, as the rollout dump stores them
    train_rollout_log_probs: np.ndarray | None  # float32 train-side copy
    log_probs: np.ndarray | None
    ref_log_probs: np.ndarray | None
    entropy: np.ndarray | None
    ref_entropy: np.ndarray | None
    advantages: np.ndarray | None
    returns: np.ndarray | None
    reward: float  # Sample.reward
    raw_reward: float | None  # train-side raw_reward[batch position]
    normalized_reward: float | None  # train-side `rewards` value
    has_train_row: bool
    alignment_fails: bool  # the reader must flag alignment_failed (CP layout unreadable)


@dataclass
class Truth:
    """Ground truth of a generated dump, keyed by (rollout_id, evaluation, batch_position)."""

    spec: DumpSpec
    samples: dict[tuple[int, bool, int], SampleTruth]


@dataclass
class _Step:
    """One step's batch, as flat arrays (tokens by `t_off`, response arrays by `r_off`)."""

    rid: int
    index: np.ndarray
    group: np.ndarray
    plen: np.ndarray
    rlen: np.ndarray
    t_off: np.ndarray
    r_off: np.ndarray
    tokens: np.ndarray
    truncated: np.ndarray
    removed: np.ndarray
    agentic: np.ndarray
    multi: np.ndarray
    reward: np.ndarray
    norm: np.ndarray
    gen_mask: np.ndarray
    train_mask: np.ndarray
    rlp: np.ndarray
    trainer: dict[str, np.ndarray]

    @property
    def n(self) -> int:
        return len(self.index)

    def tok(self, i: int) -> np.ndarray:
        return self.tokens[self.t_off[i] : self.t_off[i + 1]]

    def resp(self, flat: np.ndarray, i: int) -> np.ndarray:
        return flat[self.r_off[i] : self.r_off[i + 1]]


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------
def grpo_normalise(raw: np.ndarray, group_size: int) -> np.ndarray:
    """GRPO reward normalisation of consecutive groups (dump-format.md 3.5), float32.

    Examples:
        >>> grpo_normalise(np.array([0.0, 1.0, 1.0, 1.0]), 2).tolist()
        [-0.7071057558059692, 0.7071057558059692, 0.0, 0.0]
    """
    x = raw.astype(np.float32).reshape(-1, group_size)
    centred = x - x.mean(axis=1, keepdims=True, dtype=np.float32)
    if group_size > 1:
        std = x.std(axis=1, ddof=1, keepdims=True, dtype=np.float32)
        safe = np.where(std > 0, std + np.float32(1e-6), np.float32(1.0))
        centred = np.where(std > 0, centred / safe, centred)
    return centred.astype(np.float32).reshape(-1)


def _lengths(spec: DumpSpec, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """Prompt lengths per prompt, response lengths and truncated flags per sample."""
    n = spec.samples_per_step
    plen_g = rng.integers(spec.prompt_length[0], spec.prompt_length[1] + 1, spec.prompts_per_step)
    rlen = rng.integers(spec.response_length[0], spec.response_length[1] + 1, n)
    truncated = rng.random(n) < 0.1
    truncated[2 % n] = n > 2
    rlen[truncated] = spec.response_length[1]
    if spec.empty_response:
        rlen[n - 1] = 0
        truncated[n - 1] = False
    return plen_g, rlen, truncated


def _observation_mask(rlen: np.ndarray, r_off: np.ndarray, multi: np.ndarray) -> np.ndarray:
    """Flat bool mask of observation tokens: one run inside, one at the end of the response."""
    obs = np.zeros(int(r_off[-1]), dtype=bool)
    for i in np.flatnonzero(multi):
        r, a = int(rlen[i]), int(r_off[i])
        k = max(1, r // 8)
        obs[a + r // 4 : a + r // 4 + k] = True  # inside; r//4 + 2k < r keeps a model gap
        obs[a + r - k : a + r] = True
    return obs


def _trainer_values(
    rng: np.random.Generator,
    rlp: np.ndarray,
    obs: np.ndarray,
    returns: np.ndarray,
    advantage_noise: float,
) -> dict[str, np.ndarray]:
    """Trainer outputs over the flat response: close to the rollout, real at observations."""
    total = len(rlp)
    lp = np.minimum(rlp + rng.normal(0.0, 0.05, total), 0.0).astype(np.float32)
    lp[obs] = -rng.exponential(4.0, int(obs.sum()))
    ref = np.minimum(lp + rng.normal(0.0, 0.1, total), 0.0).astype(np.float32)
    ent = rng.gamma(2.0, 0.6, total).astype(np.float32)
    ref_ent = (ent * rng.uniform(0.8, 1.2, total)).astype(np.float32)
    adv = (returns + advantage_noise * rng.normal(0.0, 1.0, total)).astype(np.float32)
    values = {"log_probs": lp, "ref_log_probs": ref, "advantages": adv, "returns": returns}
    return {**values, "entropy": ent, "ref_entropy": ref_ent}


def _inject_nonfinite(step: _Step) -> None:
    """NaN / +inf / -inf at trained positions of the first three plain samples."""
    ok = ~step.removed & ~step.multi & (step.rlen >= 2)
    lp, ent = step.trainer["log_probs"], step.trainer["entropy"]
    for k, i in enumerate(np.flatnonzero(ok)[:3]):
        a = int(step.r_off[i])
        if k == 0:
            lp[a] = np.nan
        elif k == 1:
            lp[a + 1], ent[a] = np.inf, np.nan
        else:
            lp[a], ent[a + 1] = -np.inf, np.inf


def _build_step(spec: DumpSpec, rid: int) -> _Step:
    """Draw one step's batch (all values, full length)."""
    rng = np.random.default_rng([spec.seed, rid])
    n, spp = spec.samples_per_step, spec.samples_per_prompt
    group_local = np.arange(n) // spp
    plen_g, rlen, truncated = _lengths(spec, rng)
    plen = plen_g[group_local]
    r_off = np.concatenate([[0], np.cumsum(rlen)]).astype(np.int64)
    t_off = np.concatenate([[0], np.cumsum(plen + rlen)]).astype(np.int64)
    prompts = [rng.integers(0, VOCAB_SIZE, int(p)) for p in plen_g]
    resp_tokens = rng.integers(0, VOCAB_SIZE, int(r_off[-1]))
    pieces = []
    for i in range(n):
        pieces += [prompts[group_local[i]], resp_tokens[r_off[i] : r_off[i + 1]]]
    index = rid * n + np.arange(n)
    agentic = index % 3 == 0
    multi = agentic & (rlen >= 4) & spec.multi_turn
    removed = np.zeros(n, dtype=bool)
    removed[list(spec.removed_positions)] = True
    obs = _observation_mask(rlen, r_off, multi)
    row_of = np.repeat(np.arange(n), rlen)
    gen_mask = (~obs).astype(np.int32)
    rlp = -rng.exponential(0.8, len(obs))
    rlp[obs] = 0.0  # the engine never generated observation tokens
    reward = (rng.random(n) < 0.5).astype(np.float64)
    norm = grpo_normalise(reward, spp)
    step = _Step(
        rid, index, group_local, plen, rlen, t_off, r_off,
        np.concatenate(pieces).astype(np.int64), truncated, removed, agentic, multi, reward,
        norm, gen_mask, np.where(removed[row_of], 0, gen_mask).astype(np.int32), rlp,
        _trainer_values(rng, rlp, obs, norm[row_of].astype(np.float32), spec.advantage_noise),
    )  # fmt: skip
    if spec.nonfinite:
        _inject_nonfinite(step)
    return step


# ---------------------------------------------------------------------------------------------
# Rollout side: rollout_data/{stem}.pt, dashboard_columns/, trajectory/
# ---------------------------------------------------------------------------------------------
def _sample_dict(step: _Step, i: int, lists: dict[str, list[Any]], evaluation: bool) -> dict:
    """One `Sample.to_dict()` with every key of the real dumps, in their order."""
    t0, t1, r0, r1 = step.t_off[i], step.t_off[i + 1], step.r_off[i], step.r_off[i + 1]
    agentic, plen = bool(step.agentic[i]), int(step.plen[i])
    group = int(step.group[i])
    return {
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
        "weight_versions": _versions(step, i),
        "rollout_log_probs": lists["rlp"][r0:r1],
        "rollout_routed_experts": None,
        "rollout_indexer_topk": None,
        "remove_sample": bool(step.removed[i]) and not evaluation,
        "teacher_log_probs": None,
        "opd_reverse_kl": None,
        "status": "truncated" if step.truncated[i] else "completed",
        "metadata": {},
        "generate_function_path": None,
        "train_metadata": None,
        "adapter": None,
        "reward_spec": None,
        "routing_key": None,
        "non_generation_time": 1.5 if step.multi[i] else 0.0,
        "spec_info": {
            "spec_accept_token_num": 0,
            "spec_draft_token_num": 0,
            "spec_verify_ct": 0,
            "completion_token_num": 0,
        },
        "prefix_cache_info": {"cached_tokens": plen // 2 if agentic else 0, "total_prompt_tokens": plen},
    }  # fmt: skip


def _rollout_payload(step: _Step, count: int, evaluation: bool) -> dict[str, Any]:
    """The rollout `.pt` content for the first `count` samples."""
    t_end, r_end = int(step.t_off[count]), int(step.r_off[count])
    lists = {
        "tokens": step.tokens[:t_end].tolist(),
        "rlp": step.rlp[:r_end].tolist(),
        "mask": step.gen_mask[:r_end].tolist() if step.multi.any() else [],
    }
    samples = [_sample_dict(step, i, lists, evaluation) for i in range(count)]
    return {"rollout_id": step.rid, "metadata": {}, "samples": samples}


def _large_list(offsets: np.ndarray, values: np.ndarray, mask: np.ndarray | None = None) -> Any:
    null = None if mask is None else pa.array(mask)
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values), mask=null)


def _dashboard_table(step: _Step, count: int, evaluation: bool) -> pa.Table:
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


def _write_trajectory(out: Path, payload: dict[str, Any]) -> None:
    """Conversations of the first two samples, one JSON object per line (2.7)."""
    lines = []
    for sample in payload["samples"][:2]:
        i = sample["index"]
        messages = [
            {"role": "system", "content": "You are a helpful assistant."},
            {"role": "user", "content": str(sample["prompt"])},
            {"role": "assistant", "content": "Let me look that up.",
             "reasoning_content": "The user asks a question; call the lookup tool first.",
             "tool_calls": [{"function": {"name": "lookup", "arguments": '{"query": "answer"}'}}]},
            {"role": "tool", "name": "lookup", "content": '{"result": 42}'},
            {"role": "assistant", "content": f"The answer for sample {i} is 42."},
        ]  # fmt: skip
        keys = ("group_index", "status", "reward", "prompt")
        record = {"sample_index": i, **{k: sample[k] for k in keys}, "messages": messages}
        lines.append(json.dumps(record, separators=(",", ":")))
    (out / "trajectory" / f"{payload['rollout_id']}.jsonl").write_text("\n".join(lines) + "\n")


def _eval_count(step: _Step) -> int:
    """Eval dumps hold the first half of the step's samples (at least one)."""
    return max(1, step.n // 2)


def _write_rollout(out: Path, spec: DumpSpec, step: _Step, evaluation: bool) -> None:
    """trajectory (train steps), dashboard parquet, then the `.pt`: miles' write order (1.1)."""
    import torch

    count = _eval_count(step) if evaluation else step.n
    stem = f"eval_{step.rid}" if evaluation else str(step.rid)
    payload = _rollout_payload(step, count, evaluation)
    if not evaluation:
        _write_trajectory(out, payload)
    if spec.dashboard_columns:
        _write_dashboard(out, stem, _dashboard_table(step, count, evaluation))
    torch.save(payload, out / "rollout_data" / f"{stem}.pt")


# ---------------------------------------------------------------------------------------------
# Train side: train_data/{rid}_{rank}.pt
# ---------------------------------------------------------------------------------------------
def global_rank(spec: DumpSpec, *, dp: int, cp: int, pp: int, tp: int) -> int:
    """Megatron rank order: TP innermost, then CP, then DP, PP outermost.

    Examples:
        >>> global_rank(DumpSpec(dp=2, cp=2, tp=2), dp=1, cp=1, pp=0, tp=0)
        6
    """
    return tp + spec.tp * (cp + spec.cp * (dp + spec.dp * pp))


def dropped_cp_rank(spec: DumpSpec, rid: int, dp: int, cp: int) -> bool:
    """True for the files `missing_cp_rank` leaves out: CP rank CP-1 of DP shard 0, step 0."""
    return spec.missing_cp_rank and rid == 0 and dp == 0 and cp == spec.cp - 1


def trainer_fields(spec: DumpSpec, rid: int) -> tuple[str, ...]:
    """Trainer outputs the last PP stage's files of step `rid` carry, in dump order."""
    skip: set[str] = set()
    if not spec.entropy:
        skip.update(ENTROPY_FIELDS)
    if not spec.log_probs or rid in spec.log_probs_missing_steps:
        skip.add("log_probs")
    return tuple(f for f in TRAINER_FIELDS if f not in skip)


def _versions(step: _Step, i: int) -> list[str]:
    """Agentic samples report two weight versions differing by 1, like the fixtures."""
    rid = step.rid
    return [str(rid), str(rid + 1)] if step.agentic[i] else [str(rid + 1)]


def _padded_length(step: _Step, rows: np.ndarray) -> int:
    """bshd M: the shard's maximum T rounded up to a multiple of `BSHD_PAD`."""
    longest = int(np.diff(step.t_off)[rows].max())
    return -(-longest // BSHD_PAD) * BSHD_PAD


def _shard_columns(step: _Step, rows: np.ndarray, padded: int | None) -> dict[str, Any]:
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
        "weight_versions": [_versions(step, i) for i in rows],
        "raw_reward": step.reward.tolist(),  # batch-global, rollout-dump order
        "total_lengths": [int(step.t_off[i + 1] - step.t_off[i]) for i in rows],
    }
    if padded is not None:
        columns["max_seq_lens"] = [padded] * len(rows)
    return columns


def _sliced(
    spec: DumpSpec, step: _Step, flat: np.ndarray, rows: np.ndarray, cp: int, padded: int | None
) -> list[Any]:
    """One tensor per row: the CP rank's zigzag slice of a response-aligned array."""
    import torch

    parts = []
    for i in rows:
        full = step.resp(flat, i)
        total = int(step.t_off[i + 1] - step.t_off[i])
        part = full.copy() if spec.cp == 1 else slice_for_rank(full, total, cp, spec.cp, padded)
        parts.append(torch.from_numpy(part))
    return parts


def _train_payload(spec: DumpSpec, rid: int, rank: int, cp: int, data: dict) -> dict[str, Any]:
    payload: dict[str, Any] = {"rollout_id": rid, "rank": rank, "rollout_data": data}
    if spec.record_cp:
        payload.update(cp_rank=cp, cp_size=spec.cp, qkv_format=spec.qkv_format)
    return payload


def _write_train(out: Path, spec: DumpSpec, step: _Step) -> None:
    """Every rank's file of one step (TP peers identical, trainer outputs on the last stage)."""
    import torch

    rlp32 = step.rlp.astype(np.float32)
    fields = trainer_fields(spec, step.rid)
    for dp in range(spec.dp):
        rows = np.arange(dp, step.n, spec.dp)
        padded = _padded_length(step, rows) if spec.qkv_format == "bshd" else None
        common = _shard_columns(step, rows, padded)
        for cp in range(spec.cp):
            if dropped_cp_rank(spec, step.rid, dp, cp):
                continue
            data = {**common, "rollout_log_probs": _sliced(spec, step, rlp32, rows, cp, padded)}
            outputs = {f: _sliced(spec, step, step.trainer[f], rows, cp, padded) for f in fields}
            for pp in range(spec.pp):
                columns = {**data, **outputs} if pp == spec.pp - 1 else data
                for tp in range(spec.tp):
                    rank = global_rank(spec, dp=dp, cp=cp, pp=pp, tp=tp)
                    payload = _train_payload(spec, step.rid, rank, cp, columns)
                    torch.save(payload, out / "train_data" / f"{step.rid}_{rank}.pt")


# ---------------------------------------------------------------------------------------------
# Ground truth
# ---------------------------------------------------------------------------------------------
def legacy_layout_ok(slices: list[np.ndarray], total_length: int, response_length: int) -> bool:
    """Whether the legacy CP inference (dump-format.md 4.6) accepts these probe slices.

    `slices` are the `rollout_log_probs` slices of the present CP ranks in ascending rank
    order. Identical slices fall into one inferred rank; widths are checked with the thd rule.

    Examples:
        >>> full = np.arange(12, dtype=np.float32)
        >>> legacy_layout_ok([slice_for_rank(full, 20, s, 2) for s in range(2)], 20, 12)
        True
        >>> legacy_layout_ok([slice_for_rank(full, 20, 1, 2)], 20, 12)
        False
    """
    distinct: list[np.ndarray] = []
    for part in slices:
        if not any(d.tobytes() == part.tobytes() and len(d) == len(part) for d in distinct):
            distinct.append(part)
    if len(distinct) == 1:
        return len(distinct[0]) == response_length
    k = len(distinct)
    widths = [rank_width(total_length, response_length, s, k) for s in range(k)]
    return [len(d) for d in distinct] == widths and sum(widths) == response_length


def _alignment_fails(spec: DumpSpec, step: _Step, i: int, probe: np.ndarray) -> bool:
    """Whether a reader must flag `alignment_failed` for train row of batch position `i`."""
    if spec.cp == 1:
        return False
    dp = i % spec.dp
    present = [s for s in range(spec.cp) if not dropped_cp_rank(spec, step.rid, dp, s)]
    if spec.record_cp:
        return len(present) != spec.cp
    rows = np.arange(dp, step.n, spec.dp)
    padded = _padded_length(step, rows) if spec.qkv_format == "bshd" else None
    total, full = int(step.t_off[i + 1] - step.t_off[i]), step.resp(probe, i)
    slices = [slice_for_rank(full, total, s, spec.cp, padded) for s in present]
    return not legacy_layout_ok(slices, total, int(step.rlen[i]))


def _sample_truth(
    spec: DumpSpec, step: _Step, i: int, evaluation: bool, has_train: bool, probe: np.ndarray
) -> SampleTruth:
    fields = trainer_fields(spec, step.rid) if has_train else ()
    trainer = {
        f: step.resp(step.trainer[f], i).copy() if f in fields else None for f in TRAINER_FIELDS
    }
    multi = bool(step.multi[i])
    return SampleTruth(
        rollout_id=step.rid, evaluation=evaluation, batch_position=i,
        sample_index=i if evaluation else int(step.index[i]),
        group_index=int(step.group[i]),
        status="truncated" if step.truncated[i] else "completed",
        remove_sample=bool(step.removed[i]) and not evaluation,
        token_ids=step.tok(i).copy(), prompt_length=int(step.plen[i]),
        response_length=int(step.rlen[i]),
        loss_mask=step.resp(step.train_mask, i).copy() if has_train else None,
        rollout_loss_mask=step.resp(step.gen_mask, i).copy() if multi else None,
        rollout_log_probs=step.resp(step.rlp, i).copy(),
        train_rollout_log_probs=step.resp(probe, i).copy() if has_train else None,
        **trainer, reward=float(step.reward[i]),
        raw_reward=float(step.reward[i]) if has_train else None,
        normalized_reward=float(step.norm[i]) if has_train else None,
        has_train_row=has_train,
        alignment_fails=has_train and _alignment_fails(spec, step, i, probe),
    )  # fmt: skip


def _step_truth(
    spec: DumpSpec, step: _Step, evaluation: bool, has_train: bool
) -> dict[tuple[int, bool, int], SampleTruth]:
    probe = step.rlp.astype(np.float32)
    count = _eval_count(step) if evaluation else step.n
    return {
        (step.rid, evaluation, i): _sample_truth(spec, step, i, evaluation, has_train, probe)
        for i in range(count)
    }


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
    if spec.missing_cp_rank and spec.cp < 2:
        problems.append("`missing_cp_rank` needs `cp` >= 2")
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
        for name in DUMP_SUBDIRS:
            target = out / name
            if target.is_symlink() or target.is_file():
                target.unlink()  # never follow a link out of `out`
            elif target.is_dir():
                shutil.rmtree(target)
    wanted = ["rollout_data", "train_data", "trajectory"]
    wanted += ["dashboard_columns"] if spec.dashboard_columns else []
    for name in wanted:
        (out / name).mkdir(parents=True, exist_ok=True)


def write_dump(
    out: Path, spec: DumpSpec, *, keep_truth: bool = False, force: bool = False
) -> Truth | None:
    """Write a miles dump for `spec` into `out`; return its ground truth if `keep_truth`.

    Raises:
        UsageError: `spec` is inconsistent, or `out` is not empty and `force` is false.
    """
    _validate(spec)
    out = Path(out)
    _prepare(out, spec, force)
    truth = Truth(spec=spec, samples={}) if keep_truth else None
    for rid in sorted(set(range(spec.steps)) | set(spec.eval_steps)):
        step = _build_step(spec, rid)
        if rid < spec.steps:
            has_train = rid not in spec.rollout_only_steps
            _write_rollout(out, spec, step, evaluation=False)
            if has_train:
                _write_train(out, spec, step)
            if truth is not None:
                truth.samples.update(_step_truth(spec, step, False, has_train))
        if rid in spec.eval_steps:
            _write_rollout(out, spec, step, evaluation=True)
            if truth is not None:
                truth.samples.update(_step_truth(spec, step, True, False))
        logger.info("step %d: %d samples, %d response tokens", rid, step.n, int(step.r_off[-1]))
    return truth


def main(argv: list[str] | None = None) -> int:
    """`python -m pipeline.synth OUT --preset NAME [--force] [--seed N]`."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.synth", description="Write a synthetic miles dump."
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
