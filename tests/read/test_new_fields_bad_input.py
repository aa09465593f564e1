"""A bad value in one of the newer sample fields (dump-format.md 9b) skips its step with one
line naming file, step, sample and field; the other steps land."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.test_bad_input import REPLACE, age, extract, lake_steps
from tests.fixture_paths import NEXT_DUMPS

pytestmark = pytest.mark.slow

SAMPLE = "batch position 2, sample_index 10"  # step 1 of spec_rename
CASES = [
    ({"start_weight_version": "3"}, "`start_weight_version` is '3', not an integer"),
    ({"teacher_log_probs": ["-0.5"]}, "`teacher_log_probs` entry 0 is '-0.5', not a number"),
    ({"loss_weights": "heavy"}, "`loss_weights` is 'heavy', not a list of numbers"),
    (
        {"rollout_sampling_mask_ids": [1, 2], "rollout_sampling_mask_offsets": [0, 2, 2]},
        "`rollout_sampling_mask_offsets` are not strictly increasing (an empty support)",
    ),
    (
        {"weight_versions": [[{"version": "1", "abs_start": 3}]]},
        "`weight_versions` entry 0 span 0 lacks `abs_end`",
    ),
]


@pytest.mark.parametrize(("change", "problem"), CASES, ids=[next(iter(c)) for c, _ in CASES])
def test_one_line_and_the_other_step_lands(tmp_path: Path, change: dict[str, Any], problem: str):
    import torch

    dump = tmp_path / "spec_rename"
    shutil.copytree(NEXT_DUMPS / "spec_rename", dump)
    path = dump / "rollout_data" / "1.pt"
    data = torch.load(path, weights_only=True)
    data["samples"][2].update(change)
    torch.save(data, path)
    for file in dump.rglob("*"):
        age(file)
    lake = tmp_path / "lake"
    code, _, err = extract(dump, lake)
    assert code == 1
    assert err == [f"Skipped step 1: `{path.resolve()}` ({SAMPLE}): {problem}. {REPLACE}"]
    assert lake_steps(lake, "spec_rename") == [(0, False, 8)]
