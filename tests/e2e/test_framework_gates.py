"""Each real run is judged by its own framework's drift gate, computed that framework's way.

slime's `train/train_rollout_logprob_abs_diff` (the per-sample means summed over the global
batch, removed samples counting 0), NeMo-RL's `train/token_mult_prob_error` and miles' log-prob
checker are compared with what each framework logged (the fixtures' framework_oracle.json), and
`tokenlake audit` passes the slime runs, which slime's 0.1 gate passes, and fails the NeMo-RL
run on the line that names NeMo-RL's own gate.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, REAL_DUMPS, SLIME_REAL
from tokenlake.cli import main
from tokenlake.orchestrate.extract import ExtractOptions, extract_run

pytestmark = pytest.mark.slow  # extracts four real dumps

ORACLE_TOL = 1e-5  # the frameworks' values are torch float32


def _lake(root: Path, *dumps: Path) -> Path:
    lake = root / "lake"
    for dump in dumps:
        assert extract_run(dump, store_of(lake), ExtractOptions(workers=1)).failed == []
    return lake


@pytest.fixture(scope="module")
def slime_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("slime")
    return _lake(root, SLIME_REAL / "v1_tp2", SLIME_REAL / "v2_dp2_cp2")


@pytest.fixture(scope="module")
def every_lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("every")
    dumps = (SLIME_REAL / "v1_tp2", NEMO_RL_REAL / "grpo_multiturn", REAL_DUMPS / "removed")
    return _lake(root, *dumps)


def _gates(lake: Path, run: str) -> list[tuple]:
    import duckdb

    with duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True) as con:
        return con.execute(
            "SELECT rollout_id, framework_gate, framework_gate_value, framework_gate_limit,"
            " framework_gate_passed, samples, train_samples, mean_abs_lp_diff_smtm"
            " FROM drift_steps WHERE run = ? ORDER BY rollout_id",
            [run],
        ).fetchall()


def _oracle(case: Path) -> list[dict]:
    return json.loads((case / "expected" / "framework_oracle.json").read_text())["steps"]


@pytest.mark.parametrize("case", ["v1_tp2", "v2_dp2_cp2"])
def test_slime_runs_get_the_value_slime_logs_and_gates(slime_lake: Path, case: str) -> None:
    got = _gates(slime_lake, case)
    logged = _oracle(SLIME_REAL / case)
    assert [row[0] for row in got] == [step["rollout_id"] for step in logged] == [0, 1, 2]
    for row, step in zip(got, logged, strict=True):
        assert row[1] == "train/train_rollout_logprob_abs_diff"
        assert (row[3], row[4], row[6]) == (0.1, True, step["global_batch_size"])
        assert math.isclose(
            row[2], step["train/train_rollout_logprob_abs_diff"], rel_tol=ORACLE_TOL
        )


def test_slime_v1_step_0_divides_by_the_global_batch_with_its_removed_sample(
    slime_lake: Path,
) -> None:
    step0 = _gates(slime_lake, "v1_tp2")[0]
    assert (step0[5], step0[6]) == (15, 16)
    assert (round(step0[7], 6), round(step0[2], 6)) == (0.038290, 0.035897)


def test_nemo_rl_run_gets_token_mult_prob_error(every_lake: Path) -> None:
    got = _gates(every_lake, "grpo_multiturn")
    logged = _oracle(NEMO_RL_REAL / "grpo_multiturn")
    assert [row[0] for row in got] == [step["step"] for step in logged] == [1, 2, 3]
    for row, step in zip(got, logged, strict=True):
        assert (row[1], row[3], row[4]) == ("train/token_mult_prob_error", 1.05, False)
        assert math.isclose(row[2], step["train/token_mult_prob_error"], rel_tol=ORACLE_TOL)


def test_miles_run_gets_the_log_prob_checker_value(every_lake: Path) -> None:
    """miles compares the step's sums of per-sample mean log-probs of each side over its
    samples: recomputed here from the reference reader's tokens (oracle/removed)."""
    import statistics

    per_sample: dict[int, list[float]] = {}
    sample_counts: dict[int, int] = {}
    for line in (REAL_DUMPS.parent / "oracle" / "removed" / "tokens.jsonl").open():
        row = json.loads(line)
        if row["evaluation"]:
            continue
        rid = row["rollout_id"]
        sample_counts[rid] = sample_counts.get(rid, 0) + 1
        mask = row["loss_mask"]
        deltas = [
            t - r
            for t, r, m in zip(row["train_log_probs"], row["rollout_log_probs"], mask, strict=True)
            if m
        ] if row.get("train_log_probs") and mask else []  # fmt: skip
        if deltas:
            per_sample.setdefault(rid, []).append(statistics.fmean(deltas))
    got = _gates(every_lake, "removed")
    assert [row[0] for row in got] == sorted(per_sample) == [0, 1, 2]
    for row in got:
        rid = row[0]
        want = abs(sum(per_sample[rid])) / sample_counts[rid]
        assert row[1] == "|rollout/log_probs - rollout/rollout_log_probs|"
        assert (row[3], row[4], row[6]) == (0.03, True, sample_counts[rid])
        assert math.isclose(row[2], want, rel_tol=1e-6)


def test_audit_passes_the_slime_runs_slime_passes(slime_lake: Path) -> None:
    result = CliRunner().invoke(main, ["audit", str(slime_lake)])
    lines = result.output.splitlines()
    assert result.exit_code == 0, result.output
    assert [line for line in lines if "drift_alarms" in line or "framework_gates" in line] == [
        "PASS  drift_alarms [error]: Training steps of runs whose framework publishes no drift"
        " gate (framework_gates judges the others by their own) where one of tokenlake's"
        " cross-framework alarms fires: k3_kl above 0.01 (what Gaussian drift has at slime's 0.1"
        " gate), mean_abs_lp_diff_smtm above 0.1 (slime's gate, over covered samples),"
        " mult_prob_error above 1.05 (NeMo-RL's gate), ess_raw below 0.3 (tokenlake's own; no"
        " framework publishes one).",
        "PASS  framework_gates [error]: Training steps that fail their own framework's published"
        " CI gate, computed that framework's way: slime's train/train_rollout_logprob_abs_diff"
        " above 0.1 nats, NeMo-RL's train/token_mult_prob_error at or above 1.05, miles'"
        " |rollout/log_probs - rollout/rollout_log_probs| above 0.03 nats (the limits in"
        " drift_settings, each cited in docs/drift.md).",
    ]
    assert lines[-1] == "0 of 15 audits failed; 3 warnings, 2 info."


def test_audit_fails_the_nemo_rl_run_on_nemo_rls_gate_alone(every_lake: Path) -> None:
    """NeMo-RL's functional tests assert token_mult_prob_error < 1.05; this multi-turn run logs
    1.0586, 1.0535 and 1.0642, so it fails, on the line naming NeMo-RL's gate and source. The
    slime run and the miles run pass their own gates; nothing else fails."""
    result = CliRunner().invoke(main, ["audit", str(every_lake)])
    assert result.exit_code == 1, result.output
    lines = result.output.splitlines()
    start = lines.index(next(line for line in lines if line.startswith("FAIL  framework_gates")))
    assert lines[start].endswith(
        "(the limits in drift_settings, each cited in docs/drift.md). (3 rows)"
    )
    row = "      grpo_multiturn           {}  nemo-rl    train/token_mult_prob_error  {}  >=         1.05  NeMo-RL functional/grpo_megatron.sh:44"
    assert lines[start + 1 : start + 6] == [
        "      run             rollout_id  framework  gate                           value  rule  threshold  source",
        "      --------------  ----------  ---------  ---------------------------  -------  ----  ---------  --------------------------------------",
        row.format(1, "1.05864"),
        row.format(2, "1.05349"),
        row.format(3, "1.06421"),
    ]  # fmt: skip
    assert lines[start + 6].startswith("PASS  incomplete_steps [warning]")
    assert [line.split(":")[0] for line in lines if line.startswith("FAIL")] == [
        "FAIL  framework_gates [error]"
    ]
