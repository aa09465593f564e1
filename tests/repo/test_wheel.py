"""The built wheel is the product: installed alone, it does what the checkout does.

The wheel is built once per session from a copy of the sources, then installed with its
dependencies at the locked versions into a fresh virtual environment that has no torch and
no checkout on its path. From a folder outside the checkout, that environment extracts a real
fixture dump, queries every view its own `tokenlake.sql` names, audits, verifies, writes the
report and uses the Python API; every output equals the checkout's on the same lake path.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixture_paths import REAL_DUMPS

pytestmark = pytest.mark.slow  # builds a wheel and installs its dependencies (a minute or two)

REPO = Path(__file__).resolve().parents[2]
LOCK = REPO / "pipeline" / "requirements-lock.txt"
# What the run time reads besides code: views, macros, audits, the report's assets.
RUNTIME_FILES = {
    "sql": ("tokenlake/sql", ["*.sql", "macros/*.sql", "audits/*.sql"]),
    "pipeline/tokenlake/serve/report_assets": ("tokenlake/serve/report_assets", ["*"]),
}
TIMES = re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d(:\d\d(\.\d+)?)?( UTC|\+00(:00)?)?")
# One row per view: its row count and its rows as text, sorted. `extracted_at` is when a run
# was extracted, so it differs between the two extractions and is left out.
VIEW_ROWS = (
    "SELECT {name!r} AS view, count(*) AS n_rows, coalesce(string_agg(t::VARCHAR, chr(10)"
    " ORDER BY t::VARCHAR), '') AS content"
    " FROM (SELECT COLUMNS(lambda c: c <> 'extracted_at') FROM {name}) AS t"
)
# DuckDB sums floats in whatever order its threads finish, so the last bits of an aggregate
# differ from one run to the next (in either environment): numbers are compared to 1e-9.
NUMBER = re.compile(r"-?\d+\.\d+(?:[eE][-+]?\d+)?")
NAMES = (
    "import importlib.resources as r, tokenlake.schema as s; print(*s.TABLES, *sorted(p.name[:-4]"
    " for p in r.files('tokenlake.sql').iterdir() if p.name.endswith('.sql')))"
)
API = (
    "import sys, tokenlake; lake = tokenlake.open_lake(sys.argv[1]); print(tokenlake.__file__);"
    " print(lake.sql('SELECT rollout_id, n_samples, reward_mean FROM step_stats ORDER BY 1').pl());"
    " print(lake.tokens(run='basic', columns=['rollout_id', 'lp_diff']).collect().describe())"
)


@pytest.fixture(scope="session")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the sources (a build writes `build/` and egg-info)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("pipeline", "sql"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (built,) = out.glob("tokenlake-*.whl")
    return built


@pytest.fixture(scope="session")
def installed(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The python of a fresh venv holding the wheel and its locked dependencies only."""
    venv = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"
    pip = [str(python), "-m", "pip", "install", "-q", "-c", str(LOCK), str(wheel)]
    done = subprocess.run(pip, capture_output=True, text=True, timeout=1200, env=clean_env())
    assert done.returncode == 0, done.stderr
    return python


def clean_env() -> dict[str, str]:
    """The environment without anything that would put the checkout or another venv in reach."""
    drop = {"PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME", "PYTHONSTARTUP"}
    return {k: v for k, v in os.environ.items() if k not in drop}


def in_wheel(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_carries_every_file_read_at_run_time(wheel: Path) -> None:
    names = in_wheel(wheel)
    for folder, (packaged, patterns) in RUNTIME_FILES.items():
        files = sorted(p for pattern in patterns for p in (REPO / folder).glob(pattern))
        assert files, folder  # a check over no file would pass whatever the wheel holds
        missing = [
            str(p.relative_to(REPO)) for p in files
            if f"{packaged}/{p.relative_to(REPO / folder)}" not in names
        ]  # fmt: skip
        assert missing == [], f"missing from {wheel.name}"
    modules = sorted((REPO / "pipeline" / "tokenlake").rglob("*.py"))
    assert (
        modules
        and [str(p) for p in modules if str(p.relative_to(REPO / "pipeline")) not in names] == []
    )
    assert not any(name.startswith("benchmarks/") for name in names)  # tools, not product


def run_all(python: Path, lake: Path, cwd: Path) -> dict[str, str]:
    """Every output a user sees from one environment, times blanked."""

    def run(*args: str) -> str:
        done = subprocess.run(
            [str(python), *args], cwd=cwd, env=clean_env(), capture_output=True, text=True,
            timeout=600,
        )  # fmt: skip
        # The real fixture's two sides log noise, so `audit` fails its drift alarms (exit 1).
        assert done.returncode == (1 if args[-2:-1] == ("audit",) else 0), (args, done.stderr)
        text = re.sub(r" in \d+\.\d+ s\b", " in T s", done.stdout + done.stderr)
        return TIMES.sub("TIME", text)

    tl: Callable[..., str] = lambda *args: run("-m", "tokenlake", *args)  # noqa: E731
    outputs = {"extract": tl("extract", str(REAL_DUMPS / "basic"), "--lake", str(lake), "--silent")}
    names = run("-c", NAMES).split()
    assert len(names) > 10 and "step_stats" in names, names
    every = " UNION ALL ".join(VIEW_ROWS.format(name=name) for name in names)
    outputs["views"] = " ".join(names)
    outputs["query"] = tl("query", str(lake), f"{every} ORDER BY view", "--format", "json")
    outputs["audit"] = tl("audit", str(lake))
    outputs["verify"] = tl("verify", str(lake))
    outputs["report"] = tl("report", str(lake), "-o", str(cwd / "report.html"))
    outputs["report.html"] = TIMES.sub("TIME", (cwd / "report.html").read_text(encoding="utf-8"))
    api = run("-c", API, str(lake)).splitlines()
    outputs["api"] = "\n".join(api[1:])
    outputs["imported from"] = api[0]
    return outputs


def test_the_installed_wheel_does_what_the_checkout_does(installed: Path, tmp_path: Path) -> None:
    no_torch = subprocess.run(
        [str(installed), "-c", "import torch"], capture_output=True, text=True
    )
    assert no_torch.returncode == 1 and "No module named 'torch'" in no_torch.stderr
    lake, cwd = tmp_path / "lake", tmp_path / "elsewhere"
    cwd.mkdir()
    checkout = run_all(Path(sys.executable), lake, cwd)
    shutil.rmtree(lake)
    wheel = run_all(installed, lake, cwd)
    assert checkout.pop("imported from") == str(REPO / "pipeline" / "tokenlake" / "__init__.py")
    site = installed.parent.parent / "lib"
    assert Path(wheel.pop("imported from")).is_relative_to(site)
    assert sorted(wheel) == sorted(checkout)
    for name, text in wheel.items():
        assert_same(text, checkout[name], name)
    assert wheel["extract"].startswith("Run `basic`: 3 new, 0 updated, 0 unchanged")
    assert len(wheel["query"].splitlines()) == len(wheel["views"].split())
    assert wheel["verify"].endswith("3 steps checked, 0 problems\n")
    audits = len(list((REPO / "sql" / "audits").glob("*.sql")))
    assert f" of {audits} audits failed" in wheel["audit"]


def assert_same(text: str, expected: str, what: str) -> None:
    """Equal text, and equal numbers up to the last bits of a float sum."""
    assert NUMBER.split(text) == NUMBER.split(expected), what
    numbers = [float(n) for n in NUMBER.findall(text)]
    wanted = [float(n) for n in NUMBER.findall(expected)]
    assert numbers == pytest.approx(wanted, rel=1e-9, abs=1e-12), what
