"""One lake, one run of each framework: the same tables and views for all, side by side.

The generator writes one batch spec in each framework's layout (`DumpSpec.framework`); the
five runs must give the same drift, step for step (NeMo-RL and prime-rl number their steps
from 1). The real dumps of the four frameworks then share one lake, and the drift views and the
report list every run.
"""

from __future__ import annotations

import math
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, PRIME_RL_REAL, REAL_DUMPS, SLIME_REAL
from tokenlake.generator.synth import PRESETS, write_dump
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

pytestmark = pytest.mark.slow  # generates and extracts five dumps

FRAMEWORKS = ("miles", "slime-v1", "slime-v2", "nemo-rl", "prime-rl")
SPEC = replace(PRESETS["slime-v2"], cp=2, dp=2, record_cp=True)
DRIFT_SQL = """
SELECT run, rollout_id, tokens, samples, mean_lp_diff, mean_abs_lp_diff_smtm, k3_kl,
       mult_prob_error, is_ratio_mean
FROM drift_steps ORDER BY run, rollout_id
"""


def rows(lake: Path, sql: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(sql).fetchall()


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("frameworks")
    lake = root / "lake"
    for name in FRAMEWORKS:
        spec = replace(SPEC, framework=name, record_cp=name != "slime-v1")
        write_dump(root / name, spec)
        summary = extract_run(root / name, store_of(lake), ExtractOptions(workers=1))
        steps = 3 if name == "prime-rl" else 4  # prime-rl exports no evaluation
        assert (summary.failed, summary.dump_format, summary.counts["new"]) == ([], name, steps)
    return lake


def test_runs_record_each_framework(generated: Path) -> None:
    assert rows(
        generated, "SELECT run, framework, dump_format, format_version FROM runs ORDER BY run"
    ) == [
        ("miles", "miles", "miles", None),
        ("nemo-rl", "nemo-rl", "nemo-rl", None),
        ("prime-rl", "prime-rl", "prime-rl", None),
        ("slime-v1", "slime", "slime-v1", 1),
        ("slime-v2", "slime", "slime-v2", 2),
    ]


def test_the_same_batches_give_the_same_drift_in_every_framework(generated: Path) -> None:
    by_run: dict[str, list[tuple]] = {}
    for row in rows(generated, DRIFT_SQL):
        by_run.setdefault(row[0], []).append(row[1:])
    miles = by_run["miles"]
    assert [r[0] for r in miles] == [0, 1, 2] and all(r[1] > 100 for r in miles)
    expected = {
        "slime-v1": miles,
        "slime-v2": miles,
        "nemo-rl": [(rid + 1, *rest) for rid, *rest in miles],  # NeMo-RL's steps start at 1
        "prime-rl": [(rid + 1, *rest) for rid, *rest in miles],  # so do prime-rl's
    }
    for run, want in expected.items():
        got = by_run[run]
        assert [r[:3] for r in got] == [r[:3] for r in want], run
        for step, reference in zip(got, want, strict=True):
            for value, other in zip(step[3:], reference[3:], strict=True):
                assert math.isclose(value, other, rel_tol=1e-12), run


def test_what_a_framework_does_not_log_is_null_not_a_number(generated: Path) -> None:
    got = rows(
        generated,
        "SELECT run, count(weight_version), count(group_index), count(dumped_rank),"
        " count(raw_reward) FROM samples WHERE NOT evaluation GROUP BY run ORDER BY run",
    )
    assert got == [
        ("miles", 24, 24, 24, 24),
        ("nemo-rl", 0, 0, 0, 0),
        ("prime-rl", 0, 0, 21, 0),  # its rank; the 3 samples without a loss token not exported
        ("slime-v1", 24, 24, 24, 24),
        ("slime-v2", 24, 24, 24, 24),
    ]


@pytest.fixture(scope="module")
def real(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("real") / "lake"
    for dump in (
        REAL_DUMPS / "basic",
        SLIME_REAL / "v1_tp2",
        SLIME_REAL / "v2_dp2_cp2",
        NEMO_RL_REAL / "grpo_multiturn",
        PRIME_RL_REAL / "packed_2ranks",
    ):
        assert extract_run(dump, store_of(lake), ExtractOptions(workers=1)).failed == []
    return lake


def test_the_drift_views_hold_every_real_run_side_by_side(real: Path) -> None:
    got = rows(
        real,
        "SELECT r.framework, d.run, count(*), sum(d.tokens), bool_and(d.mean_abs_lp_diff_tm > 0)"
        " FROM drift_steps AS d JOIN runs AS r USING (run) GROUP BY ALL ORDER BY d.run",
    )
    assert got == [
        ("miles", "basic", 2, 164, True),
        ("nemo-rl", "grpo_multiturn", 3, 1307, True),
        ("prime-rl", "packed_2ranks", 2, 181, True),
        ("slime", "v1_tp2", 3, 776, True),
        ("slime", "v2_dp2_cp2", 3, 771, True),
    ]


def test_the_report_shows_every_framework(real: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", "report", str(real), "-o", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    page = out.read_text()
    for run in ("basic", "grpo_multiturn", "packed_2ranks", "v1_tp2", "v2_dp2_cp2"):
        assert run in page
