"""Ground truth of a generated dump: every sample's full-length values before CP slicing and
file dropping, and whether a reader must flag `alignment_failed`. The layout tests compare the
extracted lake with it; it is computed from the same arrays `tokenlake.generator.synth` writes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from tokenlake.generator import synth_shapes
from tokenlake.generator.synth_spec import (
    TRAINER_FIELDS,
    DumpSpec,
    StepBatch,
    dropped_cp_rank,
    eval_count,
    padded_lengths,
    train_rollout_log_probs,
    trainer_fields,
)
from tokenlake.read.cp_layout import rank_width, slice_for_rank


@dataclass
class SampleTruth:
    """Full-length ground truth of one sample, before any CP slicing or file dropping.

    Per-token arrays are response-aligned (length R). Trainer arrays are float32, or None where
    the layout has no such field (no train row, field switched off, step without it).
    """

    rollout_id: int
    evaluation: bool
    batch_position: int
    sample_index: int | None  # None: the layout has none (prime-rl)
    group_index: int | None
    status: str | None
    remove_sample: bool
    token_ids: np.ndarray  # int64, T = P + R
    prompt_length: int
    response_length: int
    loss_mask: np.ndarray | None  # train-side mask (int32), None without a train row
    rollout_loss_mask: np.ndarray | None  # rollout dump's own `loss_mask`, None when None
    rollout_log_probs: np.ndarray  # float64, as the rollout dump stores them
    train_rollout_log_probs: np.ndarray | None  # train-side copy (its dtype's values, float32)
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
    # False: the dump holds no tokens for the sample (NeMo-RL's validation lines), so the
    # lake's `response_length` and `prompt_length` are NULL
    lengths_known: bool = True
    # The newer shapes (tokenlake.generator.synth_shapes): what a reader gives each response
    # token as its weight version and support size (None: NULL), and the sample's
    # spec_accept_rate; whether its conversation is inside the `.pt` (pre_dashboard).
    token_versions: tuple[str | None, ...] = ()
    support_sizes: np.ndarray | None = None
    spec_accept_rate: float | None = None
    messages_in_pt: bool = False


@dataclass
class Truth:
    """Ground truth of a generated dump, keyed by (rollout_id, evaluation, batch_position)."""

    spec: DumpSpec
    samples: dict[tuple[int, bool, int], SampleTruth]


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


def alignment_fails(spec: DumpSpec, step: StepBatch, i: int, probe: np.ndarray) -> bool:
    """Whether a reader must flag `alignment_failed` for train row of batch position `i`."""
    if spec.cp == 1:
        return False
    dp = i % spec.dp
    present = [s for s in range(spec.cp) if not dropped_cp_rank(spec, step.rid, dp, s)]
    if spec.record_cp:
        return len(present) != spec.cp
    rows = np.arange(dp, step.n, spec.dp)
    pads = padded_lengths(spec, step, rows)
    padded = None if pads is None else pads[i]
    total, full = int(step.t_off[i + 1] - step.t_off[i]), step.resp(probe, i)
    slices = [slice_for_rank(full, total, s, spec.cp, padded) for s in present]
    return not legacy_layout_ok(slices, total, int(step.rlen[i]))


def _sample_truth(
    spec: DumpSpec, step: StepBatch, i: int, evaluation: bool, has_train: bool, probe: np.ndarray
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
        alignment_fails=has_train and alignment_fails(spec, step, i, probe),
        lengths_known=True,
        token_versions=tuple(synth_shapes.token_versions(spec, step, i)),
        support_sizes=(
            synth_shapes.support_sizes(step, i) if spec.sampling_support and not evaluation else None
        ),
        spec_accept_rate=synth_shapes.spec_accept_rate(spec, step, i),
        messages_in_pt=spec.pre_dashboard and i < 2,
    )  # fmt: skip


def step_truth(
    spec: DumpSpec, step: StepBatch, evaluation: bool, has_train: bool
) -> dict[tuple[int, bool, int], SampleTruth]:
    probe = train_rollout_log_probs(spec, step)
    count = eval_count(step) if evaluation else step.n
    samples = [
        in_framework(spec, _sample_truth(spec, step, i, evaluation, has_train, probe))
        for i in range(count)
    ]
    if spec.framework == "prime-rl":
        samples = in_prime_rl(spec, samples) if not evaluation else []
    return {(t.rollout_id, t.evaluation, t.batch_position): t for t in samples}


def in_prime_rl(spec: DumpSpec, samples: list[SampleTruth]) -> list[SampleTruth]:
    """A step's truth as the lake holds it from prime-rl's token exports: its steps counted
    from 1; only samples with a loss token, ordered by rank (DP shard, sample i on i % dp) then
    line; each prompt ends at the first loss token; nothing but the tokens, the two log-probs,
    entropy and advantage exported (no index, group, status, reward or eval)."""
    ordered = [samples[i] for dp in range(spec.dp) for i in range(dp, len(samples), spec.dp)]
    kept: list[SampleTruth] = []
    for truth in ordered:
        assert truth.loss_mask is not None  # every training sample of a prime-rl step
        sampled = np.flatnonzero(truth.loss_mask)
        if not sampled.size:
            continue  # a line without a loss token is never written
        cut = int(sampled[0])

        def rest(values: np.ndarray | None, cut: int = cut) -> np.ndarray | None:
            return None if values is None else values[cut:]

        kept.append(
            replace(
                truth,
                rollout_id=truth.rollout_id + 1,
                batch_position=len(kept),
                sample_index=None,
                group_index=None,
                status=None,
                remove_sample=False,
                prompt_length=truth.prompt_length + cut,
                response_length=truth.response_length - cut,
                loss_mask=rest(truth.loss_mask),
                rollout_loss_mask=None,
                rollout_log_probs=truth.rollout_log_probs[cut:],
                train_rollout_log_probs=rest(truth.train_rollout_log_probs),
                log_probs=rest(truth.log_probs),
                entropy=rest(truth.entropy),
                advantages=rest(truth.advantages),
                ref_log_probs=None,
                ref_entropy=None,
                returns=None,
                raw_reward=None,
                normalized_reward=None,
            )  # fmt: skip
        )
    return kept


# A NeMo-RL train line of before 2026-02-21 as the lake holds it: no tokens, so no train row
_NO_TRAIN_ROW: dict[str, Any] = dict(
    loss_mask=None, train_rollout_log_probs=None, log_probs=None,
    ref_log_probs=None, entropy=None, ref_entropy=None, advantages=None, returns=None,
    raw_reward=None, normalized_reward=None, has_train_row=False, remove_sample=False,
)  # fmt: skip


def in_framework(spec: DumpSpec, truth: SampleTruth) -> SampleTruth:
    """A sample's truth as the lake holds it when the spec is written in another framework's
    layout (docs/frameworks.md): slime's format 2 leaves `ref_entropy` CP-local (NULL);
    NeMo-RL counts training steps from 1, logs a line's number as its index, no status and
    none of the fields below, and validation lines (and train lines of before 2026-02-21)
    without tokens."""
    if spec.framework == "slime-v2" and spec.cp > 1:
        return replace(truth, ref_entropy=None)
    if spec.framework != "nemo-rl":
        return truth
    line = replace(truth, sample_index=truth.batch_position, status=None, alignment_fails=False)
    if truth.evaluation or spec.nemo_rl_before_2026_02:
        nothing = np.zeros(0)
        return replace(
            line, token_ids=nothing.astype(np.int64), prompt_length=0, response_length=0,
            rollout_log_probs=nothing, rollout_loss_mask=None, lengths_known=False,
            **({} if truth.evaluation else {**_NO_TRAIN_ROW, "rollout_id": truth.rollout_id + 1}),
        )  # fmt: skip
    return replace(
        line, rollout_id=truth.rollout_id + 1, ref_log_probs=None, entropy=None,
        ref_entropy=None, returns=None, raw_reward=None, normalized_reward=None,
    )  # fmt: skip
