"""Finished steps are committed in batches, so a run's manifest writes grow like its steps'
logarithm and the bytes they write like its final manifest, not quadratically.

Counted, never timed: how many times the manifest is written, and how many steps each lists.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from tests.conftest import store_of
from tokenlake.generator import synth
from tokenlake.generator.synth_spec import DumpSpec
from tokenlake.orchestrate import extract
from tokenlake.orchestrate.extract import ExtractOptions, commit_due, extract_run
from tokenlake.store import manifest


def _writes(steps: int) -> list[int]:
    """The steps each manifest write lists when `steps` steps finish one after the other."""
    listed, finished, writes = 0, 0, []
    for _ in range(steps):
        finished += 1
        if commit_due(finished, listed):
            listed, finished = listed + finished, 0
            writes.append(listed)
    if finished:
        writes.append(listed + finished)
    return writes


def test_writes_of_a_long_run_add_up_to_nine_final_manifests() -> None:
    writes = _writes(3000)
    assert len(writes) == 62
    assert writes[:17] == [*range(1, 17), 18]
    assert writes[-1] == 3000
    assert sum(writes) == 27_207  # 9.07 times the final manifest's 3,000 steps
    assert all(b - a <= max(1, a // extract.COMMIT_FRACTION) for a, b in itertools.pairwise(writes))


@pytest.mark.slow
def test_an_extraction_writes_the_manifest_once_per_batch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = tmp_path / "dump"
    spec = DumpSpec(steps=20, prompts_per_step=1, samples_per_prompt=1, dp=1, eval_steps=())
    synth.write_dump(dump, spec)
    listed: list[int] = []
    save = manifest.save_manifest

    def counting_save(lake: object, record: manifest.RunManifest) -> None:
        listed.append(len(record.steps))
        save(lake, record)  # type: ignore[arg-type]

    monkeypatch.setattr(manifest, "save_manifest", counting_save)
    summary = extract_run(dump, store_of(tmp_path / "lake"), ExtractOptions(workers=1))
    assert len(summary.steps) == 20
    # 16 steps one by one, then two batches of 2, then the publish (the run's row)
    assert listed == [*range(1, 17), 18, 20, 20]
    committed = manifest.load_manifest(store_of(tmp_path / "lake"), dump.name)
    assert committed is not None and len(committed.steps) == 20
