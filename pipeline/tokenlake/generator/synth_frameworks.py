"""The generator's other frameworks: slime (train dump format 1 or 2) and NeMo-RL logs.

The same `StepBatch` as a miles dump (`tokenlake.generator.synth_spec.build_step`), written in the
other layouts as each framework's own code writes them (docs/frameworks.md): so a spec
generated in two formats gives the same token values in the lake, and the drift views can be
checked against each other.

- slime: rollout files without miles' top-level `metadata`, slime's sample keys (`session_id`,
  `rollout_top_p_token_ids`/`_offsets`: with `sampling_support` the supports miles writes as
  `rollout_sampling_mask_*`, train side too), no `dashboard_columns/` or `trajectory/`.
  Format 1: miles' per-rank train files without `weight_versions` or CP keys (legacy CP).
  Format 2: one `train_data/{rid}.pt` per step, `{format_version: 2, rollout_id, rank,
  samples, dp_shards, raw_reward}`, every column at full length except `ref_entropy`, which
  slime leaves CP-local (CP rank 0's chunks).
- NeMo-RL: `train_data_step{rid + 1}.jsonl` (NeMo-RL counts steps from 1) and, for an eval
  step, `val_data_step{rid}.jsonl`; one line per sample, each value wrapped in a one-entry
  list, sequences right-padded with 0 to the step's longest. `log_probs=False` writes
  `prev_logprobs` as 0.0 everywhere, as `loss_fn.force_on_policy_ratio` does.
  `nemo_rl_before_2026_02` writes the train lines NeMo-RL logged before 2026-02-21: without
  `token_ids`, `token_loss_mask`, `sample_loss_mask` and `advantages`.
- prime-rl: `token_exports/step_{rid + 1}/rank_{R}.jsonl` (prime-rl counts steps from 1), one
  line per sample with a loss token, as `TokenExporter` writes them (the keys in its order,
  `separators=(",", ":")`, non-finite values as `null`, the 0.0 placeholders of
  `inference_logprobs` and `advantages` off the sampled tokens, the ratio fields and DPPO masks
  computed in float32 as `compute_importance_ratio_and_mismatch_kl` does, no weight streams),
  sample i on DP rank i % dp (rank `dp * cp`: one writer per CP group), then `STABLE`; no
  evaluation export; and `metrics.jsonl` with each step's `mismatch_kl/all/mean`. With
  `prime_rl_june_2026` the lines are those of 2026-06-11 .. 2026-06-26: `export_step` (the
  step) and `run_id` (null) after their keys, `training_mode` `rl` after `env_name`, the
  sample's reward on every token as `rewards` after `advantages`, and no weight streams;
  `prime_rl_may_2026` those lines without `export_step` and `run_id`, and no `STABLE`.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

import numpy as np

from tokenlake.generator import synth_shapes
from tokenlake.generator.synth_spec import (
    DumpSpec,
    StepBatch,
    eval_count,
    global_rank,
    train_rollout_log_probs,
    trainer_fields,
)
from tokenlake.read.cp_layout import slice_for_rank

FRAMEWORKS = ("miles", "slime-v1", "slime-v2", "nemo-rl", "prime-rl")
# miles' sample keys that slime's `Sample` does not have
_MILES_ONLY = ("rollout_indexer_topk", "opd_reverse_kl", "adapter", "reward_spec", "routing_key")
# The train line's keys NeMo-RL added on 2026-02-21 (f11f99c79)
_NEMO_RL_SINCE_2026_02 = ("token_ids", "token_loss_mask", "sample_loss_mask", "advantages")
MILES_SUPPORT_IDS = "rollout_sampling_mask_ids"
MILES_SUPPORT_OFFSETS = "rollout_sampling_mask_offsets"
SLIME_SUPPORT_NAMES = {
    MILES_SUPPORT_IDS: "rollout_top_p_token_ids",
    MILES_SUPPORT_OFFSETS: "rollout_top_p_token_offsets",
}
PROMPT_LOG_PROB = -2.0  # NeMo-RL's trainer log-prob of a prompt token: any value, never read
PRIME_RL_VOCAB = 512  # prime-rl's first token of a micro-batch: log(1/vocab), entropy log(vocab)
PRIME_RL_DPPO = (0.2, 0.2)  # DefaultLossConfig's dppo_mask_low, dppo_mask_high
PRIME_RL_START = 1_786_000_000.0  # metrics.jsonl's `time` of step 1


def slime_rollout(payload: dict[str, Any], spec: DumpSpec) -> dict[str, Any]:
    """A miles rollout payload as slime writes it: no top-level `metadata`, slime's keys."""
    samples = []
    for sample in payload["samples"]:
        kept = {k: v for k, v in sample.items() if k not in _MILES_ONLY}
        session = uuid.UUID(int=spec.seed << 64 | payload["rollout_id"] << 32 | sample["index"])
        kept.update(  # slime's names for the sampler's supports (#2102), miles' are #2595's
            rollout_top_p_token_ids=kept.pop(MILES_SUPPORT_IDS, None),
            rollout_top_p_token_offsets=kept.pop(MILES_SUPPORT_OFFSETS, None),
            session_id=str(session),
        )
        samples.append(kept)
    return {"rollout_id": payload["rollout_id"], "samples": samples}


def write_slime_v2_train(out: Path, spec: DumpSpec, step: StepBatch) -> None:
    """`train_data/{rid}.pt` of slime's train dump format 2 (DP strided as miles' rows)."""
    import torch

    rlp32 = train_rollout_log_probs(spec, step)
    fields = trainer_fields(spec, step.rid)
    samples = [_v2_sample(spec, step, i, rlp32, fields) for i in range(step.n)]
    payload = {
        "format_version": 2,
        "rollout_id": step.rid,
        "rank": 0,
        "samples": samples,
        "dp_shards": [_v2_shard(spec, step, dp) for dp in range(spec.dp)],
        "raw_reward": step.reward.tolist(),
    }
    torch.save(payload, out / "train_data" / f"{step.rid}.pt")


def _v2_sample(
    spec: DumpSpec, step: StepBatch, i: int, rlp32: np.ndarray, fields: tuple[str, ...]
) -> dict[str, Any]:
    import torch

    mask = step.resp(step.train_mask, i)
    total = int(step.t_off[i + 1] - step.t_off[i])
    sample: dict[str, Any] = {
        "data_parallel_rank": i % spec.dp,
        "sample_index": int(step.index[i]),
        "rollout_position": i,
        "tokens": torch.from_numpy(step.tok(i).copy()),
        "response_lengths": int(step.rlen[i]),
        "rewards": float(step.norm[i]),
        "truncated": int(step.truncated[i]),
        "loss_masks": torch.from_numpy(mask.astype(np.int32)),
        "rollout_ids": i,
        "rollout_mask_sums": torch.tensor(float(mask.sum()), dtype=torch.float32),
        "source_names": "unknown",
        "total_lengths": total,
        "local_raw_reward": float(step.reward[i]),
        "rollout_log_probs": torch.from_numpy(step.resp(rlp32, i).copy()),
    }
    if spec.sampling_support:  # int32 tensors, as slime's rollout data holds them
        ids, offsets = synth_shapes.sampling_mask(step, i)
        sample["rollout_top_p_token_ids"] = torch.tensor(ids, dtype=torch.int32)
        sample["rollout_top_p_token_offsets"] = torch.tensor(offsets, dtype=torch.int32)
    for name in fields:
        full = step.resp(step.trainer[name], i).copy()
        if name == "ref_entropy" and spec.cp > 1:  # not gathered over CP ranks by slime
            full = slice_for_rank(full, total, 0, spec.cp, None)
        sample[name] = torch.from_numpy(full)
    return sample


def _v2_shard(spec: DumpSpec, step: StepBatch, dp: int) -> dict[str, Any]:
    rows = list(range(dp, step.n, spec.dp))
    return {
        "rank": global_rank(spec, dp=dp, cp=0, pp=0, tp=0),
        "data_parallel_rank": dp,
        "sample_indices": [int(step.index[i]) for i in rows],
        "partition": rows,
        "global_batch_sizes": [step.n],
        "num_microbatches": [1],
        "micro_batch_indices": [list(range(len(rows)))],
    }


def nemo_rl_name(rid: int, evaluation: bool) -> str:
    """The log file of a generated step: NeMo-RL counts training steps from 1."""
    return f"val_data_step{rid}.jsonl" if evaluation else f"train_data_step{rid + 1}.jsonl"


def write_nemo_rl_step(out: Path, spec: DumpSpec, step: StepBatch, evaluation: bool) -> None:
    """One logged batch: the train lines of a step, or the validation lines of an eval."""
    count = eval_count(step) if evaluation else step.n
    width = int(np.diff(step.t_off).max()) if step.n else 0
    lines = [
        _val_line(step, i) if evaluation else _train_line(spec, step, i, width)
        for i in range(count)
    ]
    if spec.nemo_rl_before_2026_02 and not evaluation:
        lines = [
            {k: v for k, v in line.items() if k not in _NEMO_RL_SINCE_2026_02} for line in lines
        ]
    text = "".join(json.dumps({**line, "idx": i}) + "\n" for i, line in enumerate(lines))
    (out / nemo_rl_name(step.rid, evaluation)).write_text(text)


def _train_line(spec: DumpSpec, step: StepBatch, i: int, width: int) -> dict[str, Any]:
    prompt, length = int(step.plen[i]), int(step.t_off[i + 1] - step.t_off[i])
    pad = width - length
    gen = step.resp(step.gen_mask, i).astype(np.int64)
    rlp = step.resp(train_rollout_log_probs(spec, step), i)
    norm = float(step.norm[i])
    if spec.log_probs and step.rid not in spec.log_probs_missing_steps:
        trainer = (
            [0.0]
            + [PROMPT_LOG_PROB] * (prompt - 1)
            + _floats(step.resp(step.trainer["log_probs"], i))
        )
    else:  # never computed: logged as 0.0 everywhere
        trainer = [0.0] * length
    return {
        "content": [[f"Question {int(step.group[i])}: 1+1?", "x" * int(step.rlen[i])]],
        "rewards": [float(step.reward[i])],
        "input_lengths": [length],
        "token_ids": [step.tok(i).tolist() + [0] * pad],
        "token_loss_mask": [[0] * prompt + gen.tolist() + [0] * pad],
        "sample_loss_mask": [0.0 if step.removed[i] else 1.0],
        "advantages": [
            [norm] * prompt + _floats(step.resp(step.trainer["advantages"], i)) + [norm] * pad
        ],
        "generation_logprobs": [[0.0] * prompt + _floats(np.where(gen, rlp, 0.0)) + [0.0] * pad],
        "prev_logprobs": [trainer + [0.0] * pad],
    }


def _val_line(step: StepBatch, i: int) -> dict[str, Any]:
    messages = [
        {"role": "user", "content": f"Question {int(step.group[i])}: 1+1?"},
        {"role": "assistant", "content": "x" * int(step.rlen[i])},
        {"role": "environment", "content": "Environment: correct"},
    ]
    return {"content": [messages], "rewards": [float(step.reward[i])]}


def _floats(values: np.ndarray) -> list[float]:
    """float32 values as JSON numbers that read back as the same float32."""
    return np.asarray(values, dtype=np.float32).astype(np.float64).tolist()


def write_prime_rl_step(out: Path, spec: DumpSpec, step: StepBatch, evaluation: bool) -> None:
    """One trainer step's token exports (prime-rl exports no evaluation): each DP rank's
    lines, then `STABLE`; and the step's line of `metrics.jsonl`."""
    if evaluation:
        return
    folder = out / "token_exports" / f"step_{step.rid + 1}"
    folder.mkdir(parents=True, exist_ok=True)
    k3_sum, k3_count = np.float32(0.0), 0
    for dp in range(spec.dp):
        lines: list[str] = []
        for i in range(dp, step.n, spec.dp):
            record, k3 = _prime_rl_line(spec, step, i, dp * spec.cp, len(lines))
            if record is not None:
                lines.append(json.dumps(record, separators=(",", ":"), allow_nan=False) + "\n")
                k3_sum, k3_count = k3_sum + k3.sum(dtype=np.float32), k3_count + len(k3)
        if lines:
            (folder / f"rank_{dp * spec.cp}.jsonl").write_text("".join(lines))
    if not spec.prime_rl_may_2026:  # that writer marked no step complete
        (folder / "STABLE").touch()
    metrics = {"step": step.rid + 1, "time": PRIME_RL_START + step.rid}
    if k3_count:
        metrics["mismatch_kl/all/mean"] = float(k3_sum / np.float32(k3_count))
    with open(out / "metrics.jsonl", "a") as handle:
        handle.write(json.dumps(metrics) + "\n")


def _prime_rl_line(
    spec: DumpSpec, step: StepBatch, i: int, rank: int, line: int
) -> tuple[dict[str, Any] | None, np.ndarray]:
    """One sample's line and its k3 values on the loss tokens (None: no loss token, which
    prime-rl never exports)."""
    prompt, length = int(step.plen[i]), int(step.t_off[i + 1] - step.t_off[i])
    loss = np.zeros(length, dtype=bool)
    loss[prompt:] = step.resp(step.train_mask, i) != 0
    if not loss.any():
        return None, np.zeros(0, dtype=np.float32)
    inference = np.zeros(length, dtype=np.float32)
    inference[prompt:] = np.where(
        loss[prompt:], step.resp(train_rollout_log_probs(spec, step), i), 0.0
    )
    trainer = np.full(length, PROMPT_LOG_PROB, dtype=np.float32)
    trainer[0] = -np.log(np.float32(PRIME_RL_VOCAB))
    trainer[prompt:] = step.resp(step.trainer["log_probs"], i)
    entropy = np.full(length, np.log(np.float32(PRIME_RL_VOCAB)), dtype=np.float32)
    if spec.entropy:
        entropy[prompt:] = step.resp(step.trainer["entropy"], i)
    advantages = np.zeros(length, dtype=np.float32)
    advantages[prompt:] = np.where(loss[prompt:], step.resp(step.trainer["advantages"], i), 0.0)
    with np.errstate(all="ignore"):  # a non-finite value is exported as null
        log_ratio = trainer - inference
        ratio = np.exp(log_ratio)
        k3 = ratio - log_ratio - np.float32(1.0)
        delta = np.exp(trainer) - np.exp(inference)
    low, high = PRIME_RL_DPPO
    invalid_high, invalid_low = delta > high, delta < -low
    positive, negative = advantages > 0, advantages < 0
    nothing = [None] * length
    record = {
        "schema_version": 1,
        "step": step.rid + 1,
        "rank": rank,
        "micro_step": 0,
        "micro_sequence_idx": line,
        "export_sequence_idx": line,
        "env_name": "synth",
        "token_ids": step.tok(i).tolist(),
        "position_ids": list(range(length)),
        "loss_mask": loss.tolist(),
        "advantages": _json_floats(advantages),
        "inference_logprobs": _json_floats(inference),
        "trainer_logprobs": _json_floats(trainer),
        "entropy": _json_floats(entropy),
        "mismatch_kl": _json_floats(k3),
        "log_importance_ratio": _json_floats(log_ratio),
        "importance_ratio": _json_floats(ratio),
        "prob_delta": _json_floats(delta),
        "is_masked": (loss & np.where(positive, invalid_high, invalid_low)).tolist(),
        "is_masked_high": (loss & positive & invalid_high).tolist(),
        "is_masked_low": (loss & negative & invalid_low).tolist(),
        "rl_weights": nothing,
        "ce_weights": nothing,
        "ref_kl_weights": nothing,
    }
    if spec.prime_rl_june_2026 or spec.prime_rl_may_2026:
        record = june_2026_line(record, float(step.reward[i]))
    if spec.prime_rl_may_2026:
        del record["export_step"], record["run_id"]
    return record, k3[loss & np.isfinite(k3)]


def june_2026_line(
    record: dict[str, Any], reward: float | None, mode: str = "rl"
) -> dict[str, Any]:
    """Today's token export line `record` as prime-rl wrote it from 2026-06-11 (941019f2e) to
    2026-06-26 (before 0be5ac452): its keys in that writer's order, the sample's `reward`
    (None: none) on every token, the line's `training_mode`."""
    older: dict[str, Any] = {}
    for key, value in record.items():
        if key in ("rl_weights", "ce_weights", "ref_kl_weights"):
            continue
        older[key] = value
        if key == "step":
            older["export_step"] = value
        elif key == "export_sequence_idx":
            older["run_id"] = None
        elif key == "env_name":
            older["training_mode"] = mode
        elif key == "advantages":
            older["rewards"] = [reward] * len(record["token_ids"])
    return older


def _json_floats(values: np.ndarray) -> list[float | None]:
    """float32 values as prime-rl writes them: numbers reading back as the same float32, and
    `null` for NaN and infinities."""
    return [v if np.isfinite(v) else None for v in _floats(values)]
