"""Dumps on an object store: `tokenlake extract s3://bucket/dump` through a sparse local stage.

A real fixture dump is uploaded to moto's S3 server on 127.0.0.1; extracting it must give what
extracting the local copy gives, record the URL as the run's source, read only what each step
needs, and leave no downloaded byte behind (every `.pt` in the stage stays sparse).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from click.testing import CliRunner

import tokenlake
from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, REAL_DUMPS
from tests.follower import Follower
from tests.s3server import cli, list_keys, moto_server, new_bucket, rows, text_rows
from tokenlake.cli import main
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.orchestrate.step import StepStatus, extract_step
from tokenlake.orchestrate.verify import verify_lake
from tokenlake.read import dump
from tokenlake.read.remote import remote_dump, remote_stage
from tokenlake.serve import catalog
from tokenlake.store import manifest

pytestmark = pytest.mark.slow  # a server, and real extractions

BASIC = REAL_DUMPS / "basic"
RESTORED = r"Run `basic`: 0 new, (1 updated, 2|0 updated, 3) unchanged, 0 removed, 0 skipped steps"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    import s3fs

    # fsspec caches filesystems by their arguments, not by the environment: an instance made
    # for another module's server would still point at that server's port
    s3fs.S3FileSystem.clear_instance_cache()
    with moto_server() as env:
        yield env
    s3fs.S3FileSystem.clear_instance_cache()


@pytest.fixture
def bucket(s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv(remote_dump.CACHE_VARIABLE, str(tmp_path / "cache"))
    return new_bucket()


def upload(bucket: str, prefix: str, source: Path = BASIC, names: list[str] | None = None) -> str:
    """Put a local dump's files (or some of them) under `s3://bucket/prefix`; returns the URL."""
    import boto3

    client = boto3.client("s3")
    if names is None:
        names = sorted(p.relative_to(source).as_posix() for p in source.rglob("*") if p.is_file())
    for name in names:  # in this order
        client.upload_file(str(source / name), bucket, f"{prefix}/{name}")
    return f"s3://{bucket}/{prefix}"


def step_0_as_step_1(tmp_path: Path) -> Path:
    """A dump folder whose `rollout_data/1.pt` holds the basic dump's step 0: other bytes, of
    the same size, which extraction refuses by their `rollout_id`."""
    folder = tmp_path / "rewrite"
    (folder / "rollout_data").mkdir(parents=True)
    shutil.copyfile(BASIC / "rollout_data" / "0.pt", folder / "rollout_data" / "1.pt")
    return folder


def rewritten_step_1(url: str, lake: Path) -> str:
    """What extraction says once it reads `step_0_as_step_1`'s file: the change was seen."""
    return (
        f"Skipped step 1: `{url}/rollout_data/1.pt`: holds `rollout_id` 0, but its name says 1."
        " Replace or remove the file, then extract again.\n"
        "Run `basic`: 0 new, 0 updated, 2 unchanged, 0 removed, 1 skipped steps; wrote 0 samples"
        f" and 0 tokens in T s -> {lake}\n"
    )


def same_tables(found: Path | str, expected: Path | str) -> None:
    far, near = catalog.connect(store_of(found)), catalog.connect(store_of(expected))
    try:
        for table in ("tokens", "samples", "vocab"):
            sql = f"SELECT * FROM {table}"
            assert text_rows(far, sql) == text_rows(near, sql), table
    finally:
        far.close()
        near.close()


def staged_pt_files(url: str) -> list[os.stat_result]:
    """Every `.pt` of the dump's stage; none may hold a downloaded byte after extraction."""
    root = remote_dump.stage_root(url)
    return [p.stat() for p in sorted(root.rglob("*.pt"))]


def test_extract_an_s3_dump_as_its_local_copy(bucket: str, tmp_path: Path) -> None:
    url, lake = upload(bucket, "runs/basic"), tmp_path / "lake"
    code, out = cli("extract", url, "--lake", str(lake), "--silent")
    assert (code, out) == (
        0,
        "Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
        f" samples and 206 tokens in T s -> {lake}\n",
    )
    local = tmp_path / "local"
    extract_run(BASIC, store_of(local), ExtractOptions(run_name="basic"))
    same_tables(lake, local)
    assert rows(lake, "SELECT source_dir FROM runs") == [(repr(url),)]
    stats = staged_pt_files(url)
    assert len(stats) == 11 and all(s.st_blocks == 0 and s.st_size > 0 for s in stats)

    code, out = cli("extract", url, "--lake", str(lake), "--silent")
    assert out.startswith("Run `basic`: 0 new, 0 updated, 3 unchanged, 0 removed, 0 skipped")
    # Rewritten twice, perhaps within the second LastModified shows: other bytes, then its own.
    upload(bucket, "runs/basic", source=step_0_as_step_1(tmp_path), names=["rollout_data/1.pt"])
    assert cli("extract", url, "--lake", str(lake), "--silent") == (1, rewritten_step_1(url, lake))
    upload(bucket, "runs/basic", names=["rollout_data/1.pt"])
    code, out = cli("extract", url, "--lake", str(lake), "--silent")
    # Its own bytes again: updated under a later LastModified second, unchanged (the stamp it
    # was extracted with) within the first one; the next test fixes the second.
    assert code == 0 and re.match(RESTORED, out), out
    same_tables(lake, local)

    assert cli("verify", str(lake)) == (0, "3 steps checked, 0 problems\n")
    import boto3

    boto3.client("s3").delete_object(Bucket=bucket, Key="runs/basic/rollout_data/1.pt")
    assert cli("verify", str(lake)) == (
        1,
        f"run `basic` step 1: source `{url}/rollout_data/1.pt` no longer exists\n"
        "3 steps checked, 1 problem\n",
    )
    for key in list_keys(bucket, "runs/basic/"):  # the whole dump is gone
        boto3.client("s3").delete_object(Bucket=bucket, Key=key)
    assert cli("verify", str(lake)) == (
        1,
        f"run `basic`: sources not checked: `{url}` holds no objects (is the prefix right?)\n"
        "3 steps checked, 1 problem\n",
    )


def test_a_rewrite_within_the_listed_second_is_seen(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """S3 lists LastModified to the second: a store that lists every object at one second
    leaves the ETag alone to tell that an object's bytes changed."""
    second = 1_700_000_000 * 10**9
    monkeypatch.setattr(remote_stage, "_mtime_ns", lambda info: second)
    url, lake = upload(bucket, "runs/basic"), tmp_path / "lake"
    code, out = cli("extract", url, "--lake", str(lake), "--silent")
    assert out.startswith("Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped")
    upload(bucket, "runs/basic", source=step_0_as_step_1(tmp_path), names=["rollout_data/1.pt"])
    assert cli("extract", url, "--lake", str(lake), "--silent") == (1, rewritten_step_1(url, lake))
    stamps = {p.stat().st_mtime_ns // 10**9 for p in remote_dump.stage_root(url).rglob("*.pt")}
    assert stamps == {second // 10**9}
    upload(bucket, "runs/basic", names=["rollout_data/1.pt"])
    code, out = cli("extract", url, "--lake", str(lake), "--silent")
    assert out.startswith("Run `basic`: 0 new, 0 updated, 3 unchanged, 0 removed, 0 skipped")
    local = tmp_path / "local"
    extract_run(BASIC, store_of(local), ExtractOptions(run_name="basic"))
    same_tables(lake, local)


def test_two_workers_into_an_s3_lake_leave_every_staged_file_sparse(
    bucket: str, tmp_path: Path
) -> None:
    url, lake = upload(bucket, "basic"), f"s3://{bucket}/lake"
    code, out = cli("extract", url, "--lake", lake, "--workers", "2", "--silent")
    assert (code, out) == (
        0,
        "Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
        f" samples and 206 tokens in T s -> {lake}\n",
    )
    local = tmp_path / "local"
    extract_run(BASIC, store_of(local), ExtractOptions(run_name="basic"))
    same_tables(lake, local)
    assert all(s.st_blocks == 0 for s in staged_pt_files(url))
    # nothing but the stage is left in the cache: the private download folders are gone
    assert [p.name for p in remote_dump.stage_root(url).parent.iterdir()] == ["basic"]
    assert verify_lake(store_of(lake)) == (3, [])


def test_a_bad_object_skips_its_step_with_the_usual_line_naming_its_url(
    bucket: str, tmp_path: Path
) -> None:
    bad = Path(shutil.copytree(BASIC, tmp_path / "basic"))
    data = (bad / "train_data" / "1_2.pt").read_bytes()
    (bad / "train_data" / "1_2.pt").write_bytes(data[: len(data) // 2])
    url = upload(bucket, "basic", source=bad)
    remote = CliRunner().invoke(main, ["extract", url, "--lake", str(tmp_path / "l1"), "--silent"])
    local = CliRunner().invoke(
        main, ["extract", str(bad), "--lake", str(tmp_path / "l2"), "--silent"]
    )
    assert remote.exit_code == local.exit_code == 1
    skipped = [line for line in remote.output.splitlines() if line.startswith("Skipped")]
    expected = [line for line in local.output.splitlines() if line.startswith("Skipped")]
    assert skipped == [line.replace(str(bad), url) for line in expected]
    assert skipped[0].startswith(f"Skipped step 1: rank 2: Cannot read `{url}/train_data/1_2.pt`:")
    assert "2 new, 0 updated, 0 unchanged, 0 removed, 1 skipped" in remote.output


def test_an_object_that_changes_or_vanishes_after_listing_fails_its_step_only(
    bucket: str, tmp_path: Path
) -> None:
    import boto3

    url = upload(bucket, "basic")
    listing = remote_dump.discover(url)
    step_0, _, step_1 = listing.steps  # 0, eval 0, 1
    client = boto3.client("s3")
    client.put_object(Bucket=bucket, Key="basic/train_data/0_1.pt", Body=b"longer or shorter")
    client.delete_object(Bucket=bucket, Key="basic/rollout_data/1.pt")
    size = (BASIC / "train_data" / "0_1.pt").stat().st_size
    outcome = extract_step(step_0, store_of(tmp_path / "lake"), "basic", StepStatus.NEW)
    assert outcome.error == (
        f"rank 1: `{url}/train_data/0_1.pt` changed while it was read ({size:,} bytes listed,"
        " 17 downloaded); extract again."
    )
    outcome = extract_step(step_1, store_of(tmp_path / "lake"), "basic", StepStatus.NEW)
    assert outcome.error == (
        f"`{url}/rollout_data/1.pt` no longer exists. Extract again to pick up the current files."
    )
    assert all(s.st_blocks == 0 for s in staged_pt_files(url))


def test_a_step_extracts_where_no_stage_exists_as_a_ray_task_on_another_node(
    bucket: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = upload(bucket, "basic")
    step = remote_dump.discover(url).steps[0]
    expected = dump.fingerprint(step)  # what the driver plans with, from its stage
    shutil.rmtree(tmp_path / "cache")
    monkeypatch.setenv(remote_dump.CACHE_VARIABLE, str(tmp_path / "node-cache"))
    outcome = extract_step(step, store_of(tmp_path / "lake"), "basic", StepStatus.NEW)
    assert outcome.error is None and outcome.record is not None
    assert outcome.record.sources == expected
    assert (outcome.result.samples, outcome.result.tokens) == (8, 82)
    # the node's downloads are gone once the step is read
    assert [p for p in (tmp_path / "node-cache").rglob("*") if not p.is_dir()] == []


def test_python_api_extracts_an_s3_dump(bucket: str, tmp_path: Path) -> None:
    url = upload(bucket, "basic")
    lake = tokenlake.open_lake(tmp_path / "lake", create=True)
    assert lake.extract(url).counts[StepStatus.NEW] == 3
    assert manifest.load_manifest(store_of(tmp_path / "lake"), "basic").source_dir == url


def test_follow_an_s3_dump_as_its_objects_arrive(bucket: str, tmp_path: Path) -> None:
    first = ["tokenizer/tokenizer.json", "trajectory/0.jsonl", "rollout_data/0.pt"]
    first += [f"train_data/0_{r}.pt" for r in range(4)]
    # train files first: a rollout file alone would settle and be extracted rollout-side only
    rest = ["trajectory/1.jsonl", *(f"train_data/1_{r}.pt" for r in range(4))]
    rest += ["rollout_data/eval_0.pt", "rollout_data/1.pt"]
    url, lake = upload(bucket, "live", names=first), tmp_path / "lake"
    follower = Follower(url, lake, None, poll_seconds=0.05)
    follower.settle()
    assert follower.new_steps() == [1]  # step 0 first
    upload(bucket, "live", names=rest)
    follower.settle()  # eval 0 and step 1, whose ranks are complete
    follower.stop()
    assert follower.errors == []
    new = follower.new_steps()
    assert new[0] == 1 and sum(new) == 3  # step 0 first, then eval 0 and step 1
    assert verify_lake(store_of(lake)) == (3, [])
    local = tmp_path / "local"
    extract_run(BASIC, store_of(local), ExtractOptions(run_name="live"))
    same_tables(lake, local)


def test_stage_mirrors_the_prefix_sparse_and_drops_what_vanished(
    bucket: str, tmp_path: Path
) -> None:
    import boto3

    url = upload(bucket, "basic")
    root = remote_dump.stage(url)
    tokenizer = root / "tokenizer" / "tokenizer.json"
    assert tokenizer.read_bytes() == (BASIC / "tokenizer" / "tokenizer.json").read_bytes()
    assert not (root / "dashboard_columns").exists()  # not read by tokenlake: not staged
    placeholder = root / "rollout_data" / "0.pt"
    assert placeholder.stat().st_size == (BASIC / "rollout_data" / "0.pt").stat().st_size
    assert placeholder.stat().st_blocks == 0
    boto3.client("s3").delete_object(Bucket=bucket, Key="basic/rollout_data/0.pt")
    assert remote_dump.stage(url) == root and not placeholder.exists()
    assert replace(remote_dump.discover(url), steps=()).url == url


def test_dashboard_and_tokenizer_files_tokenlake_never_reads_are_not_downloaded(
    bucket: str, tmp_path: Path
) -> None:
    """The dashboard viewer's Parquet caches and telemetry streams (GBs in a long run) and a
    tokenizer folder's other files stay sparse placeholders (the folders, which tell the
    format, still exist); `meta.json`, the metrics streams and `tokenizer.json` are copied."""
    import boto3

    client = boto3.client("s3")
    url = upload(bucket, "basic")
    big = os.urandom(1 << 20)
    unread = (
        "dashboard/cache/summary_v4.parquet",
        "dashboard/gpu_util/20260101_00.jsonl",
        "dashboard/topology.jsonl",
        "tokenizer/model.safetensors",
    )
    for name in unread:
        client.put_object(Bucket=bucket, Key=f"basic/{name}", Body=big)
    read = {
        "dashboard/meta.json": b'{"run_name": "r"}',
        "dashboard/metrics.jsonl": b'{"ts": 1.0, "step": 0, "metrics": {"a": 1}}\n',
        "dashboard/metrics/20260101_00.jsonl": b'{"ts": 2.0, "step": 1, "metrics": {"a": 2}}\n',
    }
    for name, body in read.items():
        client.put_object(Bucket=bucket, Key=f"basic/{name}", Body=body)
    root = remote_dump.stage(url)
    for name in unread:
        staged = (root / name).stat()
        assert (staged.st_size, staged.st_blocks) == (len(big), 0), name
    for name, body in read.items():
        assert (root / name).read_bytes() == body, name
    assert (root / "tokenizer" / "tokenizer.json").read_bytes() == (
        BASIC / "tokenizer" / "tokenizer.json"
    ).read_bytes()


def test_what_is_not_extracted_is_named_by_its_url(bucket: str, tmp_path: Path) -> None:
    import boto3

    url = upload(bucket, "basic", names=["rollout_data/0.pt"])
    boto3.client("s3").put_object(Bucket=bucket, Key="basic/rollout_data/notes.txt", Body=b"x")
    code, out = cli("extract", url, "--lake", str(tmp_path / "lake"), "--silent")
    assert code == 0
    assert out.splitlines()[0] == (
        f"Ignored `{url}/rollout_data/notes.txt`: not a rollout or train dump file name"
    )
    empty = f"s3://{bucket}/nothing"
    assert cli("extract", empty, "--lake", str(tmp_path / "lake")) == (
        1,
        f"Error: `{empty}` holds no objects (is the prefix right?)\n",
    )
    assert cli("extract", url, "--lake", f"{url}/lake") == (
        1,
        f"Error: Lake `{url}/lake`: is inside the dump `{url}`; a lake and a dump never share"
        " a folder: choose a --lake outside every dump\n",
    )


def test_lines_about_dead_workers_and_ray_tasks_name_a_remote_dump_by_its_url() -> None:
    """Lines built outside the step (the scheduler's, the Ray executor's) name URLs too."""
    from tokenlake.orchestrate import ray_executor
    from tokenlake.orchestrate.step import worker_died_text
    from tokenlake.read.dump import RemoteFiles, StepFiles

    stage = Path("/cache/tokenlake/dumps/ab12/qwen")
    files = StepFiles(
        3,
        False,
        stage / "rollout_data" / "3.pt",
        root=stage,
        remote=RemoteFiles("s3://b/runs/qwen", (("rollout_data/3.pt", 10, 1),)),
    )
    url = "`s3://b/runs/qwen/rollout_data/3.pt`: "
    assert worker_died_text(files).startswith(url + "the worker process extracting this step")
    assert ray_executor.task_died_text(files, 2).startswith(url + "the Ray task extracting")
    failed = ray_executor.task_failed_text(files, ModuleNotFoundError("x"))
    assert failed.startswith(url + "the Ray task extracting this step failed with")


def test_a_lake_in_or_at_another_dump_on_the_object_store_is_refused(
    bucket: str, tmp_path: Path
) -> None:
    miles = upload(bucket, "runs/cp2", REAL_DUMPS / "cp2", ["rollout_data/0.pt"])
    nemo = upload(bucket, "logs/nemo", NEMO_RL_REAL / "grpo_multiturn", ["train_data_step1.jsonl"])
    never = "a lake and a dump never share a folder: choose a --lake outside every dump"
    before = list_keys(bucket)
    assert cli("extract", str(BASIC), "--lake", miles, "--silent") == (
        1,
        f"Error: Lake `{miles}`: is a dump (miles, slime: it holds `rollout_data/`); {never}\n",
    )
    assert cli("extract", str(BASIC), "--lake", f"{miles}/x/lake", "--silent") == (
        1,
        f"Error: Lake `{miles}/x/lake`: is inside `{miles}`, a dump (miles, slime: it holds"
        f" `rollout_data/`); {never}\n",
    )
    assert cli("extract", str(BASIC), "--lake", f"{nemo}/lake", "--silent") == (
        1,
        f"Error: Lake `{nemo}/lake`: is inside `{nemo}`, a dump (NeMo-RL: it holds"
        f" `train_data_step1.jsonl`); {never}\n",
    )
    assert list_keys(bucket) == before
