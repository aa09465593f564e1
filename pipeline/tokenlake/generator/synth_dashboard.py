"""Write the miles dashboard telemetry of a synthetic dump: `dashboard/meta.json`, `metrics.jsonl`.

The format copies what miles' dashboard collector writes (`miles/dashboard/store.py`):
`meta.json` is ``json.dumps({"run_name", "start_ts", "args", "schema_version": 1}, indent=1)``
with `args` the curated snapshot of `miles/dashboard/args.py`; `metrics.jsonl` holds one
compact JSON payload per line, ``{"ts", "step_key", "step", "metrics"}``, in logging order.
Per step the generator logs what miles logs to W&B (values synthetic, deterministic):

- `rollout/step` payload: `rollout/raw_reward` (the mean of the step's generated rewards, so
  it equals `step_stats.reward_mean`), `rollout/response_len/mean`, `rollout/step`;
- `perf` payload against `rollout/step`: `perf/rollout_time`, `perf/step_time`;
- `train/step` payload (steps with train files): `train/loss`, `train/grad_norm`,
  `train/lr-pg_0`, `train/step`. miles counts `train/step` in optimizer steps
  (rollout_id * num_steps_per_rollout + step_id); the generator makes one optimizer step
  per rollout, so here it equals the rollout id;
- `eval/step` payload at eval steps: `eval/gsm8k`, `eval/step`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from tokenlake.generator.synth_spec import DumpSpec, build_step

START_TS = 1767225600.0  # 2026-01-01T00:00:00Z: fixed, so the same spec writes the same bytes
STEP_SECONDS = 60.0


def run_args(spec: DumpSpec) -> dict[str, Any]:
    """The `args` snapshot of meta.json for `spec` (a subset of miles' `_SNAPSHOT_KEYS`)."""
    return {
        "wandb_group": f"synth-{spec.seed}",
        "wandb_project": "tokenlake-synth",
        "wandb_run_id": f"synth{spec.seed:04d}",
        "colocate": True,
        "actor_num_nodes": 1,
        "actor_num_gpus_per_node": spec.dp * spec.tp * spec.pp * spec.cp,
        "rollout_batch_size": spec.prompts_per_step,
        "n_samples_per_prompt": spec.samples_per_prompt,
        "rollout_max_response_len": spec.response_length[1],
        "hf_checkpoint": "/models/synth-0.5b",
        "sglang_mem_fraction_static": 0.7,
    }


def meta_record(spec: DumpSpec) -> dict[str, Any]:
    """The meta.json object, keys in miles' `Meta` field order."""
    return {
        "run_name": f"synth-{spec.seed}",
        "start_ts": START_TS,
        "args": run_args(spec),
        "schema_version": 1,
    }


def _payload(ts: float, step_key: str, step: int, metrics: dict[str, Any]) -> dict[str, Any]:
    return {"ts": ts, "step_key": step_key, "step": step, "metrics": metrics}


def step_payloads(spec: DumpSpec, rid: int, rng: random.Random) -> list[dict[str, Any]]:
    """The tracking payloads one step logs, in logging order."""
    base = START_TS + STEP_SECONDS * (rid + 1)
    out = []
    if rid < spec.steps:
        step = build_step(spec, rid)
        rollout = {
            "rollout/raw_reward": float(step.reward.mean()),
            "rollout/response_len/mean": float(step.rlen.mean()),
            "rollout/step": rid,
        }
        out.append(_payload(base, "rollout/step", rid, rollout))
        perf = {"perf/rollout_time": round(rng.uniform(5, 9), 3), "perf/step_time": 30.5}
        out.append(_payload(base + 0.25, "rollout/step", rid, perf))
        if rid not in spec.rollout_only_steps:
            train = {
                "train/loss": round(rng.uniform(-0.1, 0.1), 6),
                "train/grad_norm": round(rng.uniform(0.1, 2.0), 6),
                "train/lr-pg_0": 1e-6,
                "train/step": rid,
            }
            out.append(_payload(base + 30.0, "train/step", rid, train))
    if rid in spec.eval_steps:
        evaluation = {"eval/gsm8k": round(rng.uniform(0, 1), 4), "eval/step": rid}
        out.append(_payload(base + 45.0, "eval/step", rid, evaluation))
    return out


def write_miles_dashboard(out: Path, spec: DumpSpec) -> list[dict[str, Any]]:
    """Write `out/dashboard/meta.json` and `metrics.jsonl` for `spec`; return the payloads.

    Both files are rewritten whole (never appended to), so writing a dump again with
    `force=True` gives the same bytes. Other files under `dashboard/` are left alone.
    """
    folder = Path(out) / "dashboard"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "meta.json").write_text(json.dumps(meta_record(spec), indent=1))
    rng = random.Random(spec.seed)
    payloads = [
        p
        for rid in sorted(set(range(spec.steps)) | set(spec.eval_steps))
        for p in step_payloads(spec, rid, rng)
    ]
    lines = "".join(json.dumps(p, separators=(",", ":")) + "\n" for p in payloads)
    (folder / "metrics.jsonl").write_text(lines)
    return payloads
