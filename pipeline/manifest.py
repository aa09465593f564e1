"""Per-run manifests: which Parquet files make up the lake, and what they were made from.

`LAKE/_manifest/<run>.json` is the commit point of an extraction. A step's new files are
written under fresh names first; only when the manifest (replaced atomically) lists them do
they become part of the lake. The catalog is built from the manifests, so a crash at any moment
leaves the lake as the last manifest describes it; files no manifest lists are leftovers that
the next extraction deletes. (The leading underscore hides the folder from Hive readers.)
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pipeline import schema
from pipeline.errors import LakeError

MANIFEST_DIR = "_manifest"
MANIFEST_VERSION = 1


@dataclass(frozen=True)
class SourceFile:
    """Identity of a dump file at extraction time (name relative to the dump root)."""

    name: str
    size: int
    mtime_ns: int

    @classmethod
    def of(cls, path: Path, root: Path) -> SourceFile:
        stat = path.stat()
        return cls(str(path.relative_to(root)), stat.st_size, stat.st_mtime_ns)


@dataclass
class StepRecord:
    """One extracted rollout file (a train step or an eval file) of a run."""

    rollout_id: int
    evaluation: bool
    sources: list[SourceFile]
    files: dict[str, str]  # table -> path relative to the lake
    samples: int
    tokens: int
    train_files: int
    checksum: str  # blake2b of the token ids and loss masks, in row order

    @property
    def key(self) -> str:
        return f"eval_{self.rollout_id}" if self.evaluation else str(self.rollout_id)


@dataclass
class RunManifest:
    """Everything the lake holds for one run."""

    run: str
    source_dir: str
    steps: dict[str, StepRecord] = field(default_factory=dict)
    runs_file: str | None = None
    vocab_file: str | None = None
    vocab_source: SourceFile | None = None  # the tokenizer file it was built from
    version: int = MANIFEST_VERSION

    def files(self, table: str) -> list[str]:
        """Relative paths of one table's files, in step order."""
        if table == schema.RUNS:
            return [self.runs_file] if self.runs_file else []
        if table == schema.VOCAB:
            return [self.vocab_file] if self.vocab_file else []
        ordered = sorted(self.steps.values(), key=lambda s: (s.rollout_id, s.evaluation))
        return [s.files[table] for s in ordered if table in s.files]


def manifest_path(lake: Path, run: str) -> Path:
    return lake / MANIFEST_DIR / f"{run}.json"


def load_manifest(lake: Path, run: str) -> RunManifest | None:
    """The run's manifest, or None if the run was never extracted into this lake."""
    path = manifest_path(lake, run)
    if not path.is_file():
        return None
    return _from_json(path, json.loads(path.read_text(encoding="utf-8")))


def load_all(lake: Path) -> list[RunManifest]:
    """Every run's manifest, by run name."""
    directory = lake / MANIFEST_DIR
    if not directory.is_dir():
        return []
    return [
        _from_json(p, json.loads(p.read_text(encoding="utf-8")))
        for p in sorted(directory.glob("*.json"))
        if not p.name.startswith(".")
    ]


def save_manifest(lake: Path, manifest: RunManifest) -> None:
    """Replace the run's manifest atomically (temporary file, fsync, rename)."""
    path = manifest_path(lake, manifest.run)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(asdict(manifest), handle, ensure_ascii=False, indent=1)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise LakeError(path, f"manifest cannot be written ({exc.strerror or exc})") from exc
    finally:
        tmp.unlink(missing_ok=True)


def _from_json(path: Path, data: dict[str, Any]) -> RunManifest:
    if data.get("version") != MANIFEST_VERSION:
        raise LakeError(path, f"manifest version {data.get('version')!r} is not {MANIFEST_VERSION}")
    steps = {}
    for key, step in data["steps"].items():
        sources = [SourceFile(**s) for s in step.pop("sources")]
        steps[key] = StepRecord(sources=sources, **step)
    return RunManifest(
        run=data["run"],
        source_dir=data["source_dir"],
        steps=steps,
        runs_file=data.get("runs_file"),
        vocab_file=data.get("vocab_file"),
        vocab_source=SourceFile(**data["vocab_source"]) if data.get("vocab_source") else None,
        version=data["version"],
    )
