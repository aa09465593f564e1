"""The catalog opens in the DuckDB clients README promises, and its shell line works as written.

README promises every DuckDB client from the version pyproject.toml pins as the lowest; that
exact release is installed into its own virtual environment (once per session), opens a
catalog built by the current DuckDB read-only, and reads every view in full.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixture_paths import REAL_DUMPS
from tokenlake import schema
from tokenlake.serve.sql_views import iter_view_files

pytestmark = pytest.mark.slow  # installs an old DuckDB and extracts a real fixture dump

REPO = Path(__file__).resolve().parents[2]
# Each view is read in full into a temporary table: a bare SELECT would leave the binder's
# work half done for unused columns, and fetching to Python needs pytz for timestamps.
READ_EVERY_VIEW = """
import sys, duckdb
con = duckdb.connect(sys.argv[1], read_only=True)
failed = []
for name in sys.argv[2:]:
    try:
        con.execute(f'CREATE TEMP TABLE copied AS SELECT * FROM "{name}"')
        con.execute('DROP TABLE copied')
    except duckdb.Error as exc:
        failed.append(f"{name}: {str(exc).splitlines()[0]}")
print(f"DuckDB {duckdb.__version__}: {len(sys.argv) - 2 - len(failed)} views read", *failed, sep="\\n")
"""


def oldest_duckdb() -> str:
    """The lowest DuckDB that pyproject.toml allows (`duckdb>=X`)."""
    pins = re.findall(r'^\s*"duckdb([<>=~!][^"]*)",', (REPO / "pyproject.toml").read_text(), re.M)
    assert len(pins) == 1 and re.fullmatch(r">=\d+\.\d+", pins[0]), pins
    return f"{pins[0][2:]}.0"


@pytest.fixture(scope="session")
def old_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    venv = tmp_path_factory.mktemp("duckdb-oldest")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", f"duckdb=={oldest_duckdb()}"]
    done = subprocess.run(install, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return python


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("compat") / "lake"
    extract = [sys.executable, "-m", "tokenlake", "extract", str(REAL_DUMPS / "basic")]
    subprocess.run([*extract, "--lake", str(lake), "--silent"], check=True, timeout=300)
    return lake


def test_readme_promises_the_pinned_oldest_duckdb() -> None:
    version = oldest_duckdb().removesuffix(".0")
    assert f"any DuckDB client from {version} on" in (REPO / "README.md").read_text()


def test_the_oldest_promised_duckdb_reads_every_view(old_python: Path, lake: Path) -> None:
    views = [*schema.TABLES, *(path.stem for path in iter_view_files())]
    assert len(views) > len(schema.TABLES)
    args = [str(old_python), "-c", READ_EVERY_VIEW, str(lake / "tokenlake.duckdb"), *views]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"DuckDB {oldest_duckdb()}: {len(views)} views read\n"


def test_the_readme_shell_line_opens_the_catalog_read_only(lake: Path) -> None:
    shell = Path(sys.executable).parent / "duckdb"  # the duckdb-cli extra: `make setup` has it
    assert shell.is_file(), f"{shell} is missing: `make setup` installs it (extra duckdb-cli)"
    sql = ".mode csv\nSELECT run, rollout_id, n_samples FROM step_stats ORDER BY ALL;\n"
    done = subprocess.run(
        [str(shell), "-readonly", "lake/tokenlake.duckdb"], cwd=lake.parent, input=sql,
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == "run,rollout_id,n_samples\nbasic,0,8\nbasic,1,8\n"
