"""A lake and a dump never share a folder: `extract` refuses, with one line, a lake inside the
dump it reads, the dump's own folder, a lake holding the dump, and a lake in (or being) any
other dump of any format, symbolic links resolved; and writes nothing anywhere.
(Object-store locations: tests/read/test_remote_dump.py and tests/store/test_lake_references.py.)
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.fixture_paths import NEMO_RL_REAL, PRIME_RL_REAL, REAL_DUMPS
from tokenlake import Lake
from tokenlake.cli import main
from tokenlake.errors import LakeError

NEVER = "a lake and a dump never share a folder: choose a --lake outside every dump"
MILES_MARK = "miles, slime: it holds `rollout_data/`"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.fixture
def dumps(tmp_path: Path) -> Path:
    """Copies of two miles dumps, a NeMo-RL log folder and a prime-rl run, side by side."""
    shutil.copytree(REAL_DUMPS / "basic", tmp_path / "basic")
    shutil.copytree(REAL_DUMPS / "cp2", tmp_path / "cp2")
    shutil.copytree(NEMO_RL_REAL / "grpo_multiturn", tmp_path / "nemo")
    shutil.copytree(PRIME_RL_REAL / "single_rank", tmp_path / "prime")
    (tmp_path / "link").symlink_to(tmp_path / "cp2")
    return tmp_path


def refused(dump: Path, lake: Path) -> str:
    result = CliRunner().invoke(main, ["extract", str(dump), "--lake", str(lake), "--silent"])
    assert (result.exit_code, result.stdout) == (1, ""), result.output
    return result.stderr


@pytest.mark.parametrize(
    ("dump", "lake", "problem"),
    [
        ("basic", "cp2", f"Lake `{{t}}/cp2`: is a dump ({MILES_MARK})"),
        (
            "basic",
            "cp2/lake",
            f"Lake `{{t}}/cp2/lake`: is inside `{{t}}/cp2`, a dump ({MILES_MARK})",
        ),
        (
            "basic",
            "link/lake",
            f"Lake `{{t}}/cp2/lake`: is inside `{{t}}/cp2`, a dump ({MILES_MARK})",
        ),
        ("basic", "basic", "Lake `{t}/basic`: is the dump `{t}/basic` itself"),
        ("basic", "basic/x/lake", "Lake `{t}/basic/x/lake`: is inside the dump `{t}/basic`"),
        ("basic", ".", "Lake `{t}`: holds the dump `{t}/basic`"),
        ("nemo", "nemo/lake", "Lake `{t}/nemo/lake`: is inside the dump `{t}/nemo`"),
        (
            "basic",
            "nemo/lake",
            "Lake `{t}/nemo/lake`: is inside `{t}/nemo`, a dump (NeMo-RL: it holds"
            " `train_data_step1.jsonl`)",
        ),
        # a prime-rl run was written into: its folder was no dump to this check
        ("basic", "prime", "Lake `{t}/prime`: is a dump (prime-rl: it holds `token_exports/`)"),
        (
            "basic",
            "prime/lake",
            "Lake `{t}/prime/lake`: is inside `{t}/prime`, a dump (prime-rl: it holds"
            " `token_exports/`)",
        ),
    ],
)
def test_a_lake_overlapping_a_dump_is_refused_and_nothing_is_written(
    dumps: Path, dump: str, lake: str, problem: str
) -> None:
    before = snapshot(dumps)
    line = problem.format(t=dumps)
    assert refused(dumps / dump, dumps / lake) == f"Error: {line}; {NEVER}\n"
    assert snapshot(dumps) == before
    assert not any((dumps / name / "lake").exists() for name in ("cp2", "nemo", "prime"))


def test_the_python_api_refuses_the_same(dumps: Path) -> None:
    with pytest.raises(LakeError) as caught:
        Lake(dumps / "cp2").extract(dumps / "basic")
    assert str(caught.value) == f"Lake `{dumps}/cp2`: is a dump ({MILES_MARK}); {NEVER}"


def test_a_lake_beside_the_dumps_is_written(dumps: Path) -> None:
    result = CliRunner().invoke(
        main, ["extract", str(dumps / "basic"), "--lake", str(dumps / "lake"), "--silent"]
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Run `basic`: 3 new, 0 updated")
