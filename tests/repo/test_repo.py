"""No dump, lake or other big binary is ever committed, except the listed real fixtures."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path

from tests.fixture_paths import MILES_NEXT, MILES_REAL, NEMO_RL_REAL, SLIME_REAL

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN_SUFFIXES = (".pt", ".parquet", ".duckdb", ".pkl")
MAX_BYTES = 512 * 1024
FIXTURE_LISTS = (
    MILES_REAL / "SHA256SUMS",
    MILES_NEXT / "SHA256SUMS",
    SLIME_REAL / "MANIFEST.sha256",
    NEMO_RL_REAL / "MANIFEST.sha256",
)


def _tracked() -> list[Path]:
    listed = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.split("\n")
    return [ROOT / name for name in listed if name]


def _listed_fixtures() -> dict[Path, str]:
    """The real fixtures allowed past the guard, with the hash each must keep."""
    listed = {}
    for fixture_list in FIXTURE_LISTS:
        for line in fixture_list.read_text().splitlines():
            digest, name = line.split(maxsplit=1)
            listed[(fixture_list.parent / name).resolve()] = digest
    return listed


def test_no_data_files_or_big_files_are_tracked():
    tracked = _tracked()
    assert tracked, "not a git checkout?"
    allowed = _listed_fixtures()
    others = [p for p in tracked if p.resolve() not in allowed]
    assert [p.name for p in others if p.suffix in FORBIDDEN_SUFFIXES] == []
    assert [p.name for p in others if p.is_file() and p.stat().st_size > MAX_BYTES] == []


def test_the_allowed_fixtures_are_exactly_the_listed_real_dumps():
    allowed = _listed_fixtures()
    assert len(allowed) == 124 + 111 + 40 + 10  # miles-real, miles-next, slime, NeMo-RL
    for path, digest in allowed.items():
        assert hashlib.sha256(path.read_bytes()).hexdigest() == digest, path
    assert max(path.stat().st_size for path in allowed) < MAX_BYTES


def test_nothing_refers_to_a_path_outside_the_repository():
    """A clone from anywhere has no `../shared` and no `/work`: docs and code must not need them."""
    offenders = []
    for path in _tracked():
        if path.suffix not in {".py", ".md", ".sql", ".toml", ".cfg", ""} or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for needle in ("../shared", "/work/"):
            if needle in text and path != Path(__file__).resolve():
                offenders.append(f"{path.relative_to(ROOT)}: {needle}")
    assert offenders == []
