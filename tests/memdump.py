"""A one-step dump held in memory: `pt.load` is replaced by a lookup, so the whole step path
(`dump.load_*` checks, join, CP resolution, flattening, trajectory) runs without torch.

    dump = MemDump(tmp_path, monkeypatch)
    dump.rollout([{"index": 0, "tokens": [1, 2, 3], "response_length": 2}])
    dump.train(0, {"sample_indices": [0], ...}, cp_rank=0, cp_size=1)
    tokens, samples = dump.tables()      # or dump.error(): the step's one-line failure
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

from tests.conftest import store_of
from tokenlake.orchestrate import step
from tokenlake.read import dump as dump_module
from tokenlake.read import pt
from tokenlake.transform import tables


class MemDump:
    def __init__(self, root: Path, monkeypatch: pytest.MonkeyPatch, rid: int = 0) -> None:
        self.root, self.rid = root, rid
        self.contents: dict[Path, Any] = {}
        self.ranks: list[tuple[int, Path]] = []
        self.evaluation = False
        for name in (dump_module.ROLLOUT_DIR, dump_module.TRAIN_DIR, "trajectory"):
            (root / name).mkdir(parents=True, exist_ok=True)
        monkeypatch.setattr(pt, "load", lambda path, arrays_under=None: self.contents[Path(path)])

    def _put(self, path: Path, data: Any) -> Path:
        path.write_bytes(b"")  # fingerprinting stats the file; its content comes from memory
        self.contents[path] = data
        return path

    def rollout(self, samples: list[dict[str, Any]], evaluation: bool = False) -> Path:
        self.evaluation = evaluation
        name = f"eval_{self.rid}.pt" if evaluation else f"{self.rid}.pt"
        data = {"rollout_id": self.rid, "metadata": {}, "samples": samples}
        return self._put(self.root / dump_module.ROLLOUT_DIR / name, data)

    def train(self, rank: int, columns: dict[str, Any], **top: Any) -> Path:
        path = self.root / dump_module.TRAIN_DIR / f"{self.rid}_{rank}.pt"
        self.ranks.append((rank, path))
        return self._put(
            path, {"rollout_id": self.rid, "rank": rank, "rollout_data": columns, **top}
        )

    def trajectory(self, content: bytes) -> Path:
        label = f"eval_{self.rid}" if self.evaluation else str(self.rid)
        path = self.root / "trajectory" / f"{label}.jsonl"
        path.write_bytes(content)
        return path

    def files(self) -> dump_module.StepFiles:
        name = f"eval_{self.rid}.pt" if self.evaluation else f"{self.rid}.pt"
        return dump_module.StepFiles(
            self.rid,
            self.evaluation,
            self.root / dump_module.ROLLOUT_DIR / name,
            tuple(sorted(self.ranks)),
        )

    def tables(self) -> tuple[pa.Table, pa.Table]:
        tokens, samples, _ = tables.build_step_tables(self.files())
        return tokens, samples

    def error(self) -> str | None:
        outcome = step.extract_step(self.files(), store_of(self.root / "lake"), "r", "new")
        return outcome.error


def column(table: pa.Table, name: str) -> list[Any]:
    return table.column(name).to_pylist()


def sample(index: int, tokens: list[int], response_length: int, **extra: Any) -> dict[str, Any]:
    """A minimal rollout sample dict."""
    return {
        "index": index,
        "group_index": 0,
        "tokens": tokens,
        "response_length": response_length,
        "status": "completed",
        "reward": 1.0,
        **extra,
    }


def train_rows(
    indices: list[int],
    tokens: list[list[int]],
    response_lengths: list[int],
    **fields: list[Any],
) -> dict[str, Any]:
    """Train columns for rows (masks all ones unless given), float32 arrays for `fields`."""
    masks = fields.pop("loss_masks", None) or [np.ones(r, np.int32) for r in response_lengths]
    return {
        "sample_indices": indices,
        "tokens": [np.asarray(t, np.int64) for t in tokens],
        "response_lengths": response_lengths,
        "total_lengths": [len(t) for t in tokens],
        "rewards": [0.5] * len(indices),
        "loss_masks": masks,
        **{k: [np.asarray(v, np.float32) for v in vs] for k, vs in fields.items()},
    }
