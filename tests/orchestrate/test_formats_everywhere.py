"""Every dump format works the way miles' does: worker processes, incremental re-extraction,
live following and dumps on an object store give the same lake as one plain extraction.
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, PRIME_RL_REAL, SLIME_REAL
from tests.s3server import fresh_s3, new_bucket, rows
from tokenlake.orchestrate.extract import ExtractOptions, ExtractSummary, extract_run
from tokenlake.orchestrate.follow import FollowState, follow_round
from tokenlake.read import prime_rl
from tokenlake.read.remote import remote_dump

pytestmark = pytest.mark.slow  # real extractions, worker processes, a server

DUMPS = {
    "slime-v1": SLIME_REAL / "v1_tp2",
    "slime-v2": SLIME_REAL / "v2_dp2_cp2",
    "nemo-rl": NEMO_RL_REAL / "grpo_multiturn",
    "prime-rl": PRIME_RL_REAL / "packed_2ranks",
}
STEPS = {"slime-v1": 4, "slime-v2": 4, "nemo-rl": 4, "prime-rl": 2}
TABLES_SQL = ("SELECT * FROM tokens", "SELECT * FROM samples")


def _copy(name: str, tmp_path: Path) -> Path:
    dump = tmp_path / "dump"
    shutil.copytree(DUMPS[name], dump, ignore=shutil.ignore_patterns("expected"))
    return dump


def _counts(summary: object) -> dict[str, int]:
    return {str(k): v for k, v in summary.counts.items() if v}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", DUMPS)
def test_workers_and_incremental_reextraction(name: str, tmp_path: Path) -> None:
    dump = _copy(name, tmp_path)
    one, two, steps = tmp_path / "one", tmp_path / "two", STEPS[name]
    assert _counts(extract_run(dump, store_of(one), ExtractOptions(workers=1))) == {"new": steps}
    assert _counts(extract_run(dump, store_of(two), ExtractOptions(workers=2))) == {"new": steps}
    for sql in TABLES_SQL:
        assert rows(one, sql) == rows(two, sql) != []
    assert _counts(extract_run(dump, store_of(two), ExtractOptions(workers=2))) == {
        "unchanged": steps
    }
    # one step's train file changes: that step alone is read again
    changed = {
        "slime-v1": dump / "train_data" / "1_3.pt",
        "slime-v2": dump / "train_data" / "1.pt",
        "nemo-rl": dump / "train_data_step1.jsonl",
        "prime-rl": dump / "token_exports" / "step_1" / "rank_1.jsonl",
    }[name]
    stamp = changed.stat().st_mtime_ns + 10**9
    os.utime(changed, ns=(stamp, stamp))
    summary = extract_run(dump, store_of(two), ExtractOptions(workers=2))
    assert _counts(summary) == {"updated": 1, "unchanged": steps - 1}
    assert [s.rollout_id for s in summary.steps] == [1]
    for sql in TABLES_SQL:
        assert rows(one, sql) == rows(two, sql)


def test_following_a_nemo_rl_log_directory_as_its_files_appear(tmp_path: Path) -> None:
    source, live, lake = DUMPS["nemo-rl"], tmp_path / "logs", tmp_path / "lake"
    live.mkdir()
    state, options = FollowState(), ExtractOptions(settle_seconds=30.0)
    for name in ("train_data_step1.jsonl", "train_data_step2.jsonl"):
        shutil.copy(source / name, live / name)

    def round_at(seconds: float) -> ExtractSummary:
        return follow_round(
            live, store_of(lake), "live", state, options, None, clock=lambda: seconds
        )

    first = round_at(2e9)
    assert [s.rollout_id for s in first.steps] == [1, 2]
    shutil.copy(source / "train_data_step3.jsonl", live / "train_data_step3.jsonl")
    # a file written this instant has not settled: not extracted yet
    now = (live / "train_data_step3.jsonl").stat().st_mtime
    assert round_at(now).steps == []
    later = round_at(now + 31)
    assert [s.rollout_id for s in later.steps] == [3]
    assert _counts(later) == {"new": 1, "unchanged": 2}


def test_following_a_prime_rl_run_takes_a_step_when_its_stable_appears(tmp_path: Path) -> None:
    """A step folder is extracted once prime-rl touched its `STABLE`, never before, however
    long its rank files have been there."""
    run, lake = _copy("prime-rl", tmp_path), tmp_path / "lake"
    marker = run / "token_exports" / "step_2" / "STABLE"
    marker.unlink()
    state, options = FollowState(), ExtractOptions(settle_seconds=30.0)
    first = follow_round(run, store_of(lake), "live", state, options, None, clock=lambda: 2e9)
    assert [s.rollout_id for s in first.steps] == [1]
    again = follow_round(run, store_of(lake), "live", state, options, None, clock=lambda: 2e9 + 60)
    assert (again.steps, again.failed, _counts(again)) == ([], [], {"unchanged": 1})
    marker.touch()
    later = follow_round(run, store_of(lake), "live", state, options, None, clock=lambda: 2e9 + 120)
    assert [s.rollout_id for s in later.steps] == [2]
    assert _counts(later) == {"new": 1, "unchanged": 1}
    assert rows(lake, "SELECT count(*) FROM samples") == [("16",)]


def test_following_a_prime_rl_run_takes_a_step_in_the_round_after_its_stable(
    tmp_path: Path,
) -> None:
    """`STABLE` says the step is complete: the next round takes it, without waiting
    `settle_seconds` for its files to age (it waited 30 s after `STABLE` by default, as a
    miles step without the rank set known)."""
    run, lake = _copy("prime-rl", tmp_path), tmp_path / "lake"
    marker = run / "token_exports" / "step_2" / "STABLE"
    marker.unlink()
    for path in run.rglob("*"):  # every file written just now, as in a live run
        path.touch()
    state, options = FollowState(), ExtractOptions(settle_seconds=30.0)
    now = time.time()
    first = follow_round(run, store_of(lake), "live", state, options, None, clock=lambda: now)
    assert [s.rollout_id for s in first.steps] == [1]
    marker.touch()
    now = marker.stat().st_mtime + 1
    later = follow_round(run, store_of(lake), "live", state, options, None, clock=lambda: now)
    assert [s.rollout_id for s in later.steps] == [2]
    assert _counts(later) == {"new": 1, "unchanged": 1}


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with fresh_s3() as env:
        yield env


def _upload(bucket: str, prefix: str, source: Path) -> str:
    import boto3

    client = boto3.client("s3")
    for path in sorted(source.rglob("*")):
        if path.is_file() and "expected" not in path.relative_to(source).parts:
            client.upload_file(str(path), bucket, f"{prefix}/{path.relative_to(source)}")
    return f"s3://{bucket}/{prefix}"


@pytest.mark.parametrize("name", DUMPS)
def test_a_dump_on_an_object_store_gives_the_local_lake(
    name: str, s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(remote_dump.CACHE_VARIABLE, str(tmp_path / "cache"))
    url = _upload(new_bucket(), name, DUMPS[name])
    far = extract_run(url, store_of(tmp_path / "far"), ExtractOptions(workers=1))
    assert (far.dump_format, _counts(far)) == (name, {"new": STEPS[name]})
    near = extract_run(
        DUMPS[name], store_of(tmp_path / "near"), ExtractOptions(workers=1, run_name=name)
    )
    for sql in (*TABLES_SQL, "SELECT * EXCLUDE (run) FROM metrics"):
        assert rows(tmp_path / "far", sql) == rows(tmp_path / "near", sql)
    assert rows(tmp_path / "far", "SELECT dump_format FROM runs") == [(repr(name),)]
    assert near.failed == []
    # the stage holds placeholders only: nothing downloaded stays behind
    staged = [p for p in remote_dump.stage_root(url).rglob("*") if p.is_file()]
    read_per_step = [
        p for p in staged if p.suffix in (".pt", ".jsonl") and p.name != prime_rl.METRICS_FILE
    ]
    assert read_per_step and all(p.stat().st_blocks == 0 for p in read_per_step)
    assert _counts(extract_run(url, store_of(tmp_path / "far"), ExtractOptions(workers=1))) == {
        "unchanged": STEPS[name]
    }


def test_following_looks_inside_a_rollout_file_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Telling slime's format 1 from miles loads a rollout file: once a round has landed a
    step, later rounds reuse the format instead of loading it again."""
    from tokenlake.orchestrate.follow import follow_run
    from tokenlake.read import formats

    looks = []
    real = formats._has_miles_metadata
    monkeypatch.setattr(
        formats, "_has_miles_metadata", lambda *args: looks.append(1) or real(*args)
    )
    rounds = []
    follow_run(
        _copy("slime-v1", tmp_path),
        store_of(tmp_path / "lake"),
        ExtractOptions(follow=True, run_name="live", poll_seconds=0, settle_seconds=0),
        on_round=rounds.append,
        should_stop=lambda: len(rounds) == 3,
        clock=lambda: 2e9,
    )
    assert [_counts(r) for r in rounds] == [{"new": 4}, {"unchanged": 4}, {"unchanged": 4}]
    assert [r.dump_format for r in rounds] == ["slime-v1"] * 3
    assert looks == [1]
