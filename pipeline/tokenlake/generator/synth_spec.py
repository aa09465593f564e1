"""What the generator makes: the `DumpSpec`, its presets, one step's batch as flat arrays
(`StepBatch`, built from a seeded generator), and the layout rules (ranks, CP files dropped,
which stage holds which fields) that the file writers and the ground truth share.
See `tokenlake.generator.synth` for the layout choices.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

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
    miles_dashboard: bool = False  # dashboard/meta.json + metrics.jsonl (synth_dashboard)
    nonfinite: bool = False  # a few NaN/+inf/-inf in trainer log-probs / entropy
    rollout_only_steps: tuple[int, ...] = ()  # steps with a rollout file and no train files
    empty_response: bool = False  # one sample per step with R = 0
    # Per-token noise on advantages (std). Plain GRPO broadcasts the normalised reward, so 0.0
    # is the realistic value (spec 3.5); small presets keep noise so every position differs.
    advantage_noise: float = 0.01
    # dtype of the train-side `rollout_log_probs` copy: "float32", or "bfloat16"/"float16" as
    # under --true-on-policy-mode with bf16/fp16 (spec 3.3, 8.12); the rollout dump keeps float64
    train_rlp_dtype: str = "float32"
    # The layout written (tokenlake.generator.synth_frameworks): miles, slime-v1, slime-v2, nemo-rl,
    # prime-rl
    framework: str = "miles"
    # Newer and older shapes (dump-format.md 9, 9b; tokenlake.generator.synth_shapes):
    weight_spans: bool = False  # weight_versions as per-call lists of spans (#1891/#1892)
    spec_renamed: bool = False  # speculative-decoding counters under #2598's names, non-zero
    sampling_support: bool = False  # rollout_sampling_mask_ids / _offsets (#2595)
    sparse_ranks: bool = False  # train files only from TP rank 0 of the last PP stage (#3141)
    # Writers of 2026-07-22: conversation in metadata["messages"], no trajectory/, no
    # dashboard_columns/, no Sample.rollout_id, no rollout_ids / rollout_mask_sums columns
    pre_dashboard: bool = False
    # prime-rl's token export lines of 2026-06-11 .. 2026-06-26 (docs/frameworks.md): with
    # `export_step`, `run_id`, `training_mode` and per-token `rewards`, no weight streams
    prime_rl_june_2026: bool = False
    # ... and of 2026-05-21 .. 2026-06-10: June's lines without `export_step` and `run_id`, and
    # no `STABLE` in any step folder
    prime_rl_may_2026: bool = False
    # bshd: each sample padded to its own length, not the shard's longest (miles #2698, open
    # on 2026-08-21): each train row's `max_seq_lens` is its own
    bshd_per_sample_pad: bool = False
    # NeMo-RL's train lines of before 2026-02-21 (docs/frameworks.md): `content`, `rewards`,
    # `input_lengths` and the two log-prob arrays only, no tokens
    nemo_rl_before_2026_02: bool = False
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
_SLIME = replace(
    _SMALL, steps=3, multi_turn=True, response_length=(4, 40), removed_positions=(5,),
    dashboard_columns=False,
)  # fmt: skip
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
    "cp-bshd-per-sample": replace(
        _SMALL, cp=2, qkv_format="bshd", response_length=(1, 48), bshd_per_sample_pad=True
    ),
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
    "true-on-policy-bf16": replace(_SMALL, train_rlp_dtype="bfloat16", tp=2),
    "true-on-policy-fp16": replace(_SMALL, train_rlp_dtype="float16", cp=2),
    "weight-spans": replace(_SMALL, weight_spans=True, multi_turn=True, record_cp=False),
    "spec-rename": replace(_SMALL, spec_renamed=True, eval_steps=()),
    "sampling-support": replace(_SMALL, sampling_support=True, multi_turn=True),
    "sparse-ranks": replace(_SMALL, sparse_ranks=True, pp=2, tp=4, eval_steps=()),
    "sparse-ranks-cp": replace(_SMALL, sparse_ranks=True, pp=2, tp=2, cp=2),
    "pre-dashboard": replace(
        _SMALL, pre_dashboard=True, record_cp=False, dashboard_columns=False, removed_positions=(5,)
    ),
    "bench": _BENCH,
    "bench-cp": replace(_BENCH, cp=2),
    # The other frameworks (docs/frameworks.md): their own layouts of the same batches.
    "slime-v1": replace(_SLIME, framework="slime-v1", tp=2, record_cp=False),
    "slime-v2": replace(_SLIME, framework="slime-v2", cp=2),
    "slime-v2-top-p": replace(_SLIME, framework="slime-v2", sampling_support=True),
    "nemo-rl": replace(_SLIME, framework="nemo-rl"),
    "nemo-rl-2026-01": replace(_SLIME, framework="nemo-rl", nemo_rl_before_2026_02=True),
    "bench-slime-v2": replace(_BENCH, framework="slime-v2", dashboard_columns=False, cp=2),
    "bench-nemo-rl": replace(_BENCH, framework="nemo-rl", dashboard_columns=False),
    "prime-rl": replace(_SLIME, framework="prime-rl"),
    "prime-rl-2026-06": replace(_SLIME, framework="prime-rl", prime_rl_june_2026=True),
    "prime-rl-2026-05": replace(_SLIME, framework="prime-rl", prime_rl_may_2026=True),
    "bench-prime-rl": replace(_BENCH, framework="prime-rl", dashboard_columns=False),
}


@dataclass
class StepBatch:
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


def _inject_nonfinite(step: StepBatch) -> None:
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


def build_step(spec: DumpSpec, rid: int) -> StepBatch:
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
    step = StepBatch(
        rid, index, group_local, plen, rlen, t_off, r_off,
        np.concatenate(pieces).astype(np.int64), truncated, removed, agentic, multi, reward,
        norm, gen_mask, np.where(removed[row_of], 0, gen_mask).astype(np.int32), rlp,
        _trainer_values(rng, rlp, obs, norm[row_of].astype(np.float32), spec.advantage_noise),
    )  # fmt: skip
    if spec.nonfinite:
        _inject_nonfinite(step)
    return step


# ---------------------------------------------------------------------------------------------
# Layout rules shared by the writers and the ground truth
# ---------------------------------------------------------------------------------------------
def eval_count(step: StepBatch) -> int:
    """Eval dumps hold the first half of the step's samples (at least one)."""
    return max(1, step.n // 2)


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


def train_rollout_log_probs(spec: DumpSpec, step: StepBatch) -> np.ndarray:
    """The train-side `rollout_log_probs` copy (float32 holding the values of its dtype):
    float64 -> float32 -> bfloat16/float16, each rounding to nearest even, as torch does.

    Examples:
        >>> spec = DumpSpec(train_rlp_dtype="bfloat16")
        >>> step = build_step(replace(spec, steps=1), 0)
        >>> bits = train_rollout_log_probs(spec, step).view(np.uint32)
        >>> bool((bits & 0xFFFF == 0).all())
        True
    """
    values = step.rlp.astype(np.float32)
    if spec.train_rlp_dtype == "float16":
        return values.astype(np.float16).astype(np.float32)
    if spec.train_rlp_dtype == "bfloat16":
        bits = values.view(np.uint32).astype(np.uint64)
        rounded = (bits + np.uint64(0x7FFF) + ((bits >> np.uint64(16)) & np.uint64(1))) & np.uint64(
            0xFFFF0000
        )
        return rounded.astype(np.uint32).view(np.float32)
    return values


def trainer_fields(spec: DumpSpec, rid: int) -> tuple[str, ...]:
    """Trainer outputs the last PP stage's files of step `rid` carry, in dump order."""
    skip: set[str] = set()
    if not spec.entropy:
        skip.update(ENTROPY_FIELDS)
    if not spec.log_probs or rid in spec.log_probs_missing_steps:
        skip.add("log_probs")
    return tuple(f for f in TRAINER_FIELDS if f not in skip)


def padded_lengths(spec: DumpSpec, step: StepBatch, rows: np.ndarray) -> dict[int, int] | None:
    """bshd M of each row (batch position -> M): the shard's maximum T rounded up to a
    multiple of `BSHD_PAD`, or with `bshd_per_sample_pad` the row's own T so rounded (miles
    #2698); None under thd."""
    if spec.qkv_format != "bshd":
        return None
    lengths = np.diff(step.t_off)[rows]
    if spec.bshd_per_sample_pad:
        return {
            int(i): -(-int(t) // BSHD_PAD) * BSHD_PAD for i, t in zip(rows, lengths, strict=True)
        }
    padded = -(-int(lengths.max()) // BSHD_PAD) * BSHD_PAD
    return dict.fromkeys((int(i) for i in rows), padded)
