"""The generator's newer (and older) dump shapes (dump-format.md 9 and 9b), one sample at a
time: what the writers put into the files and what the ground truth says a reader gets.

- Weight-version spans (#1891/#1892): one entry per engine call, each a list of
  `{"version", "abs_start", "abs_end"}` spans over `Sample.tokens`. Agentic samples make one
  call per generated run of their mask (multi-turn) or two calls split at R // 2, and so does
  `Sample.index % 8 == 3`, whose first call is not stamped (`[[], [span]]`); `Sample.index %
  4 == 2` has its weights updated mid-call (two spans); `Sample.index % 8 == 5` is one call the
  engine did not stamp (`[[]]`). Versions are the step and the step + 1, as the legacy lists.
- Speculative-decoding counters under #2598's names, EAGLE-like: per call of n tokens
  verify = ceil(n / 3), correct = n - verify, proposed = 4 * verify, completion = n.
- Sampling supports (#2595): position j of a response keeps 1 + token_id % 4 ids (the sampled
  one first, then its neighbours in the vocabulary), on training samples only.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from tokenlake.generator.synth_spec import VOCAB_SIZE, DumpSpec, StepBatch


def _calls(step: StepBatch, i: int) -> list[tuple[int, int]]:
    """Response ranges [start, end) of the engine calls of sample `i`."""
    r = int(step.rlen[i])
    if r < 2 or not (step.agentic[i] or int(step.index[i]) % 8 == 3):
        return [(0, r)]
    if step.multi[i]:  # the generated runs of the generator's mask
        generated = step.resp(step.gen_mask, i) > 0
        starts = np.flatnonzero(generated & ~np.concatenate(([False], generated[:-1])))
        ends = np.flatnonzero(generated & ~np.concatenate((generated[1:], [False]))) + 1
        return [(int(a), int(b)) for a, b in zip(starts, ends, strict=True)]
    return [(0, r // 2), (r // 2, r)]


def weight_versions(spec: DumpSpec, step: StepBatch, i: int) -> list[Any]:
    """`Sample.weight_versions` of sample `i` in the spec's shape."""
    rid = step.rid
    calls = _calls(step, i)
    if not spec.weight_spans:
        return [str(rid), str(rid + 1)] if step.agentic[i] else [str(rid + 1)]
    index, p = int(step.index[i]), int(step.plen[i])
    if index % 8 == 5 or int(step.rlen[i]) == 0:
        return [[] for _ in calls]
    out: list[Any] = []
    for number, (a, b) in enumerate(calls):
        if number == 0 and len(calls) > 1 and index % 8 == 3:
            out.append([])  # the first call not stamped, the second is
            continue
        version = rid + number if len(calls) > 1 else rid + 1
        if len(calls) == 1 and index % 4 == 2 and b - a >= 2:
            middle = (a + b) // 2
            out.append([_span(rid, p + a, p + middle), _span(rid + 1, p + middle, p + b)])
        else:
            out.append([_span(version, p + a, p + b)])
    return out


def _span(version: int, start: int, end: int) -> dict[str, Any]:
    return {"version": str(version), "abs_start": start, "abs_end": end}


def token_versions(spec: DumpSpec, step: StepBatch, i: int) -> list[str | None]:
    """The version a correct reader gives each response token (columns.md `token_version`)."""
    r, p = int(step.rlen[i]), int(step.plen[i])
    versions: list[str | None] = [None] * r
    value = weight_versions(spec, step, i)
    if spec.weight_spans:
        for call in value:
            for span in call:
                for j in range(span["abs_start"] - p, span["abs_end"] - p):
                    versions[j] = span["version"]
        return versions
    calls = _calls(step, i)
    if len(value) == 1 and not step.multi[i]:  # one version, no mask: the whole response
        return [value[0]] * r
    if step.multi[i] and len(calls) == len(value):  # one version per generated run
        for (a, b), version in zip(calls, value, strict=True):
            versions[a:b] = [version] * (b - a)
    return versions


def spec_info(spec: DumpSpec, step: StepBatch, i: int) -> dict[str, int]:
    """`Sample.spec_info`: zero counters (speculative decoding off), or #2598's names."""
    if not spec.spec_renamed:
        return dict.fromkeys(
            ("spec_accept_token_num", "spec_draft_token_num", "spec_verify_ct", "completion_token_num"),
            0,
        )  # fmt: skip
    counters = dict.fromkeys(
        ("spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct", "completion_tokens"),
        0,
    )  # fmt: skip
    for a, b in _calls(step, i):
        n = b - a
        if n == 0:
            continue  # a call that verified nothing adds nothing
        verify = -(-n // 3)
        counters["spec_num_correct_drafts"] += n - verify
        counters["spec_num_proposed_drafts"] += 4 * verify
        counters["spec_verify_ct"] += verify
        counters["completion_tokens"] += n
    return counters


def spec_accept_rate(spec: DumpSpec, step: StepBatch, i: int) -> float | None:
    """What a reader gives as `spec_accept_rate` (correct / proposed, None without drafts)."""
    info = spec_info(spec, step, i)
    correct = info.get("spec_num_correct_drafts", info.get("spec_accept_token_num", 0))
    proposed = info.get("spec_num_proposed_drafts", info.get("spec_draft_token_num", 0))
    return correct / proposed if proposed else None


def support_sizes(step: StepBatch, i: int) -> np.ndarray:
    """How many ids the sampler kept at each response position of sample `i`."""
    return (1 + step.tok(i)[int(step.plen[i]) :] % 4).astype(np.int64)


def sampling_mask(step: StepBatch, i: int) -> tuple[list[int], list[int]]:
    """(`rollout_sampling_mask_ids`, `rollout_sampling_mask_offsets`) of sample `i`."""
    sizes = support_sizes(step, i)
    response = step.tok(i)[int(step.plen[i]) :]
    ids = [
        int((token + k) % VOCAB_SIZE)
        for token, size in zip(response, sizes, strict=True)
        for k in range(size)
    ]
    offsets = np.concatenate(([0], np.cumsum(sizes))).astype(np.int64).tolist()
    return ids, offsets
