"""Conversations from `trajectory/{stem}.jsonl` (dump-format.md 2.7), matched to samples.

miles moves `metadata["messages"]` out of the rollout `.pt` into this sidecar, one line per
sample that recorded a conversation. Lines carry `sample_index` only, which can repeat (eval
datasets, agentic siblings), so the n-th line of an index goes to the n-th sample with it.
"""

from __future__ import annotations

import json
from collections import defaultdict, deque
from pathlib import Path
from typing import Any

from pipeline.errors import DumpFormatError

TRAJECTORY_DIR = "trajectory"


def trajectory_file(dump_root: Path, label: str) -> Path | None:
    """`trajectory/{label}.jsonl` if the step has one (`label` is `3` or `eval_3`)."""
    path = dump_root / TRAJECTORY_DIR / f"{label}.jsonl"
    return path if path.is_file() else None


def messages_by_position(path: Path | None, samples: list[dict[str, Any]]) -> list[str | None]:
    """Each sample's conversation as JSON text, or None (no line for it, or no file).

    Examples:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     p = Path(d) / "0.jsonl"
        ...     _ = p.write_text('{"sample_index": 5, "messages": [{"role": "user"}]}\\n')
        ...     messages_by_position(p, [{"index": 4}, {"index": 5}])
        [None, '[{"role": "user"}]']
    """
    if path is None:
        return [None] * len(samples)
    queued: dict[Any, deque[str]] = defaultdict(deque)
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            queued[record["sample_index"]].append(
                json.dumps(record["messages"], ensure_ascii=False)
            )
        except (ValueError, KeyError, TypeError) as exc:
            raise DumpFormatError(
                path, f"line {number} is not a trajectory record ({exc}); delete or fix it"
            ) from exc
    return [
        queued[s.get("index")].popleft() if queued.get(s.get("index")) else None for s in samples
    ]
