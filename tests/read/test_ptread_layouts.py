"""The fast reader returns exactly what torch.load returns for every generated layout."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from tests.read.test_ptread import _age, assert_same, load_torch_reference
from tokenlake.generator import synth
from tokenlake.read import pt

# Small copies of every preset; the bench ones shrunk to one step of two prompts.
LAYOUTS = {
    name: (
        replace(spec, steps=1, prompts_per_step=2, eval_steps=(0,))
        if name.startswith("bench")
        else spec
    )
    for name, spec in synth.PRESETS.items()
    # NeMo-RL and prime-rl write no `.pt` file at all (tests/read/test_nemo_rl.py and
    # test_prime_rl.py read theirs)
    if spec.framework not in ("nemo-rl", "prime-rl")
}


def written_layout(root: Path, name: str, pattern: str) -> list[Path]:
    """The files of layout `name` written under `root` that match `pattern`, backdated as a
    finished run's (the reader memory-maps them and never calls them still being written)."""
    synth.write_dump(root, LAYOUTS[name])
    files = sorted(root.glob(pattern))
    assert files
    return [_age(path) for path in files]


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(LAYOUTS))
def test_every_file_of_every_layout_equals_torch(tmp_path: Path, name: str) -> None:
    for path in written_layout(tmp_path, name, "**/*.pt"):
        assert_same(pt.load(path), load_torch_reference(path), str(path.relative_to(tmp_path)))
