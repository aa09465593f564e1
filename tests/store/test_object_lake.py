"""A lake on an S3-protocol server (moto on 127.0.0.1): every command works as on a local lake.

extract, re-extract (incremental), follow, verify, drop, query, tag, the Python API, two
writers (conditional-PUT lock with a lease), a writer killed mid-run, and a store without
conditional writes. Results are compared with a local extraction of the same dump.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import tokenlake
from tests.conftest import store_of
from tests.fixture_paths import REAL_DUMPS
from tests.follower import Follower
from tests.s3server import cli, list_keys, moto_server, new_bucket, rows, text_rows
from tokenlake import layout, schema
from tokenlake.errors import LakeError
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.orchestrate.verify import verify_lake
from tokenlake.serve import catalog
from tokenlake.store import manifest, object_lock
from tokenlake.store.object import ObjectStore

pytestmark = pytest.mark.slow  # a server, and real extractions

ROOT = Path(__file__).resolve().parents[2]
BASIC = REAL_DUMPS / "basic"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with moto_server() as env:
        yield env


@pytest.fixture
def bucket(s3: dict[str, str]) -> str:
    return new_bucket()


def same_content(remote: str, local: Path) -> None:
    """Base tables equal row for row; aggregate views equal to the last bits DuckDB's
    parallel sums leave to chance (it adds in thread order, on either lake)."""
    far, near = catalog.connect(store_of(remote)), catalog.connect(store_of(local))
    try:
        for table in ("tokens", "samples", "vocab"):
            sql = f"SELECT * FROM {table}"
            assert text_rows(far, sql) == text_rows(near, sql), table
        for view in ("step_stats", "drift_steps"):
            found = far.execute(f"SELECT * FROM {view} ORDER BY ALL").fetchall()
            expected = near.execute(f"SELECT * FROM {view} ORDER BY ALL").fetchall()
            assert len(found) == len(expected)
            for got, want in zip(found, expected, strict=True):
                for x, y in zip(got, want, strict=True):
                    if isinstance(y, float):
                        assert x == pytest.approx(y, rel=1e-12, nan_ok=True), view
                    else:
                        assert x == y, view
    finally:
        far.close()
        near.close()


def listed_keys(bucket: str, prefix: str, lake: str) -> list[str]:
    """The keys the manifests list, plus the manifests and the catalog."""
    keys = [f"{prefix}/{layout.CATALOG_FILE}"]
    for record in manifest.load_all(store_of(lake)):
        keys.append(f"{prefix}/_manifest/{record.run}.json")
        keys += [f"{prefix}/{name}" for table in schema.LAKE_TABLES for name in record.files(table)]
    return sorted(keys)


def copy_dump(tmp_path: Path) -> Path:
    return Path(shutil.copytree(BASIC, tmp_path / "basic"))


def test_extract_reextract_verify_query_drop_as_on_a_local_lake(
    bucket: str, tmp_path: Path
) -> None:
    dump, url = copy_dump(tmp_path), f"s3://{bucket}/lake"
    code, out = cli("extract", str(dump), "--lake", url, "--silent")
    assert (code, out) == (
        0,
        f"Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
        f" samples and 206 tokens in T s -> {url}\n",
    )
    local = tmp_path / "local"
    extract_run(dump, store_of(local), ExtractOptions(run_name="basic"))
    same_content(url, local)
    assert list_keys(bucket) == listed_keys(bucket, "lake", url)  # no lock, nothing else

    # Incremental: one step's rollout file changed; only it is written again, the old
    # objects are swept.
    os.utime(dump / "rollout_data" / "1.pt", ns=(1, 1))
    code, out = cli("extract", str(dump), "--lake", url, "--silent")
    assert code == 0
    assert out.startswith("Run `basic`: 0 new, 1 updated, 2 unchanged, 0 removed, 0 skipped")
    assert list_keys(bucket) == listed_keys(bucket, "lake", url)
    extract_run(dump, store_of(local), ExtractOptions(run_name="basic"))
    same_content(url, local)

    assert cli("verify", url) == (0, "3 steps checked, 0 problems\n")
    code, out = cli("query", url, "SELECT rollout_id, n_samples FROM step_stats ORDER BY 1")
    assert (code, out) == (
        0,
        "rollout_id  n_samples\n----------  ---------\n         0          8\n"
        "         1          8\n(2 rows)\n",
    )
    code, out = cli("tag", url, "basic", "precision=bf16")
    assert code == 0
    assert rows(url, "SELECT tags_json FROM runs") == [('\'{"precision": "bf16"}\'',)]

    # A listed object deleted behind the lake's back is found by verify.
    import boto3

    step_1 = manifest.load_manifest(store_of(url), "basic").steps["1"].files[schema.TOKENS]
    boto3.client("s3").delete_object(Bucket=bucket, Key=f"lake/{step_1}")
    code, out = cli("verify", url)
    assert (code, out) == (
        1,
        f"run `basic` step 1: file `{step_1}` is missing\n3 steps checked, 1 problem\n",
    )

    assert cli("drop", url, "basic") == (0, f"Dropped run `basic` from {url}\n")
    assert list_keys(bucket) == [f"lake/{layout.CATALOG_FILE}"]


def test_python_api_reads_an_object_store_lake(bucket: str, tmp_path: Path) -> None:
    url = f"s3://{bucket}/lake"
    lake = tokenlake.open_lake(url, create=True)
    assert lake.extract(BASIC, run_name="basic").counts["new"] == 3
    local = tokenlake.open_lake(tmp_path / "local", create=True)
    local.extract(BASIC, run_name="basic")
    assert lake.root == url
    for frame in ("tokens", "samples", "runs"):
        remote_rows = getattr(lake, frame)().drop("extracted_at", strict=False)
        local_rows = getattr(local, frame)().drop("extracted_at", strict=False)
        if frame == "runs":
            remote_rows = remote_rows.drop("source_dir")
            local_rows = local_rows.drop("source_dir")
        assert remote_rows.collect().rows() == local_rows.collect().rows(), frame
    step_1 = lake.tokens(run="basic", steps=[1], columns=["lp_diff"]).collect()
    assert step_1.shape == (82, 3)
    assert lake.sql("SELECT count(*) FROM tokens").fetchall() == [(206,)]


def test_catalog_object_lists_exactly_the_manifest_objects(bucket: str) -> None:
    """The uploaded catalog opens in DuckDB; its views name the objects the manifests list
    (other clients read them through httpfs: docs/scale.md)."""
    import duckdb

    url = f"s3://{bucket}/lake"
    extract_run(BASIC, store_of(url), ExtractOptions(run_name="basic"))
    listed = {
        f"{url}/{name}"
        for record in manifest.load_all(store_of(url))
        for table in (schema.TOKENS, schema.SAMPLES)
        for name in record.files(table)
    }
    with tempfile.TemporaryDirectory() as folder:
        copy = Path(folder) / layout.CATALOG_FILE
        copy.write_bytes(ObjectStore(url).read_bytes(layout.CATALOG_FILE))
        with duckdb.connect(str(copy), read_only=True) as con:
            sql = con.execute(
                "SELECT string_agg(sql, ' ') FROM duckdb_views()"
                " WHERE view_name IN ('tokens', 'samples')"
            ).fetchall()[0][0]
    assert set(re.findall(r"'(s3://[^']+\.parquet)'", sql)) == listed


def test_building_a_catalog_asks_for_no_object_one_at_a_time(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DuckDB binds every view over the listed objects; the filesystem it reads through
    answers their sizes from one listing per table folder, not a HEAD per object and view."""
    url = f"s3://{bucket}/lake"
    extract_run(BASIC, store_of(url), ExtractOptions(run_name="basic"))
    heads: list[str] = []
    listings: list[str] = []
    given = ObjectStore.reading_filesystem

    def counted(store: ObjectStore):
        fs = given(store)
        call = fs._call_s3

        async def counting(method, *args, **kwargs):
            name = getattr(method, "__name__", str(method))
            (heads if name == "head_object" else listings).append(name)
            return await call(method, *args, **kwargs)

        fs._call_s3 = counting
        return fs

    monkeypatch.setattr(ObjectStore, "reading_filesystem", counted)
    con = catalog.connect(store_of(url))
    try:
        assert con.sql("SELECT count(*) FROM drift_steps").fetchall() == [(2,)]
        assert con.sql("SELECT count(*) FROM tokens").fetchall() == [(206,)]
    finally:
        con.close()
    assert heads == []
    assert "get_object" in listings  # the views did read through it


def test_follow_a_run_into_an_object_store_lake(bucket: str, tmp_path: Path) -> None:
    url, live = f"s3://{bucket}/lake", tmp_path / "live"
    for folder in ("rollout_data", "train_data", "trajectory"):
        (live / folder).mkdir(parents=True)
    first = ["trajectory/0.jsonl", "rollout_data/0.pt", *(f"train_data/0_{r}.pt" for r in range(4))]
    rest = ["rollout_data/eval_0.pt", "trajectory/1.jsonl", "rollout_data/1.pt"]
    rest += [f"train_data/1_{r}.pt" for r in range(4)]
    for name in first:
        shutil.copy(BASIC / name, live / name)
    follower = Follower(live, url, "live", poll_seconds=0.05)
    follower.settle()
    assert follower.new_steps() == [1]  # step 0 first
    for name in rest:
        shutil.copy(BASIC / name, live / name)
    follower.settle()  # eval 0 and step 1, whose ranks are complete
    follower.stop()
    assert follower.errors == []
    new = follower.new_steps()
    assert new[0] == 1 and sum(new) == 3  # step 0 first, then eval 0 and step 1
    assert verify_lake(store_of(url)) == (3, [])
    local = tmp_path / "local"
    extract_run(live, store_of(local), ExtractOptions(run_name="live"))
    same_content(url, local)


def forge_lock(bucket: str, host: str, pid: int, expires: float) -> None:
    import boto3

    body = {"holder": f"tokenlake on {host} (PID {pid})", "host": host, "pid": pid}
    body.update(token="forged", expires=expires)
    boto3.client("s3").put_object(
        Bucket=bucket, Key="lake/_manifest/.tokenlake.lock", Body=json.dumps(body).encode()
    )


def test_a_live_writer_on_another_host_holds_the_lake(bucket: str) -> None:
    url = f"s3://{bucket}/lake"
    expires = time.time() + 600
    forge_lock(bucket, "build-7", 4242, expires)
    code, out = cli("extract", str(BASIC), "--lake", url, "--silent")
    until = time.strftime("%H:%M:%S", time.gmtime(expires))
    assert (code, out) == (
        1,
        f"Error: Lake `{url}`: another tokenlake command (an extraction, a tag, a drop) is writing to it (tokenlake on"
        f" build-7 (PID 4242), lease until {until} UTC); wait for it to finish\n",
    )
    assert list_keys(bucket) == ["lake/_manifest/.tokenlake.lock"]  # nothing written

    forge_lock(bucket, "build-7", 4242, time.time() - 1)  # its lease ran out: taken over
    code, out = cli("extract", str(BASIC), "--lake", url, "--silent")
    assert code == 0 and out.startswith("Run `basic`: 3 new")
    assert "lake/_manifest/.tokenlake.lock" not in list_keys(bucket)  # released


def test_second_writer_is_refused_while_the_first_holds_the_lock(bucket: str) -> None:
    url = f"s3://{bucket}/lake"
    extract_run(BASIC, store_of(url), ExtractOptions(run_name="basic"))
    with ObjectStore(url).lock():
        code, out = cli("extract", str(BASIC), "--lake", url, "--run-name", "other", "--silent")
        assert code == 1
        assert out.startswith(
            f"Error: Lake `{url}`: another tokenlake command (an extraction, a tag, a drop) is writing to it (tokenlake on"
            f" {socket.gethostname()} (PID {os.getpid()}), lease until "
        )
        assert cli("drop", url, "basic")[0] == 1
    assert manifest.load_all(store_of(url))[0].run == "basic"


def test_a_writer_that_lost_its_lease_commits_nothing_more(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A lease the renewal thread never renews during the test: it renews here, in order.
    monkeypatch.setenv("TOKENLAKE_LOCK_LEASE_SECONDS", "86400")
    url = f"s3://{bucket}/lake"
    layout = ObjectStore(url)
    with layout.lock():
        held = object_lock._HELD[layout.location]
        assert held.renew() is True  # our own lock: renewed
        forge_lock(bucket, "build-7", 4242, time.time() + 600)  # another took it over
        assert held.renew() is False  # the renewal fails on the changed ETag
        with pytest.raises(LakeError) as info:
            layout.put_bytes("_manifest/x.json", b"{}", problem="manifest cannot be written")
    assert str(info.value).startswith(
        f"Lake `{url}`: this extraction lost its writer lock: its lease could not be renewed ("
    )
    assert str(info.value).endswith("; nothing more is committed. Extract again")
    assert list_keys(bucket) == ["lake/_manifest/.tokenlake.lock"]  # the other's lock stays


def test_a_renewal_keeps_its_own_etag_when_another_put_follows(
    bucket: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOKENLAKE_LOCK_LEASE_SECONDS", "86400")  # renewed here, in order
    layout = ObjectStore(f"s3://{bucket}/lake")
    with layout.lock():
        held = object_lock._HELD[layout.location]
        put = layout.fs.pipe_file

        def put_then_taken_over(*args, **kwargs):  # another writer's PUT lands right after
            answer = put(*args, **kwargs)
            forge_lock(bucket, "build-7", 4242, time.time() + 600)
            return answer

        monkeypatch.setattr(layout.fs, "pipe_file", put_then_taken_over)
        assert held.renew() is True  # our PUT matched our ETag
        monkeypatch.setattr(layout.fs, "pipe_file", put)
        assert held.renew() is False  # the lock is the other writer's now
        assert held.lost is not None and held.lost.startswith("its lease could not be renewed")
        held.lost = None  # let the block end without a commit check


def test_a_writer_killed_mid_run_leaves_a_consistent_lake_and_a_rerun_completes_it(
    bucket: str, tmp_path: Path
) -> None:
    url = f"s3://{bucket}/lake"
    dump = tmp_path / "dump"
    synth.write_dump(dump, synth.DumpSpec(steps=6, prompts_per_step=8, seed=5))
    # Two jobs (steps 0-2 and eval 0, steps 3-5), the second in a worker process that starts
    # meanwhile: committed one after the other, so the kill lands between the commits
    command = [sys.executable, "-m", "tokenlake", "extract", str(dump), "--lake", url]
    command += ["--workers", "2"]
    writer = subprocess.Popen([*command, "--silent"], cwd=ROOT, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and "lake/_manifest/dump.json" not in list_keys(bucket):
        time.sleep(0.05)
    writer.send_signal(signal.SIGKILL)
    writer.wait()
    record = manifest.load_manifest(store_of(url), "dump")
    assert record is not None and 1 <= len(record.steps) < 7  # killed after a commit
    checked, problems = verify_lake(store_of(url))
    assert checked == len(record.steps)
    left = "not listed in any manifest"  # files of steps in flight when it was killed
    assert [
        p.message for p in problems if "catalog" not in p.message and left not in p.message
    ] == []

    # Same host, holder gone: the next writer takes the lock over at once and completes.
    rerun = subprocess.run([*command, "--silent"], cwd=ROOT, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert "took over the stale writer lock" in rerun.stderr
    assert verify_lake(store_of(url)) == (7, [])
    assert list_keys(bucket) == listed_keys(bucket, "lake", url)  # leftovers swept
    local = tmp_path / "local"
    extract_run(dump, store_of(local), ExtractOptions(run_name="dump"))
    same_content(url, local)


def test_a_store_without_conditional_writes_is_refused_for_writing(tmp_path: Path) -> None:
    import fsspec
    from fsspec.implementations.memory import MemoryFileSystem

    class NoConditionalWrites(MemoryFileSystem):
        protocol = "nocond"

        def _open(self, path: str, mode: str = "rb", **kwargs: object) -> object:
            if "x" in mode:
                raise NotImplementedError("mode 'xb' is not supported")
            return super()._open(path, mode, **kwargs)

    fsspec.register_implementation("nocond", NoConditionalWrites, clobber=True)
    code, out = cli("extract", str(BASIC), "--lake", "nocond://lake", "--silent")
    assert (code, out) == (
        1,
        "Error: Lake `nocond://lake`: its store does not support conditional writes (mode 'xb'"
        " is not supported), so tokenlake cannot keep two writers apart; it writes only to"
        " stores that do (S3 and S3-compatible stores with If-None-Match)\n",
    )


def test_views_audit_and_report_read_an_object_store_lake(bucket: str, tmp_path: Path) -> None:
    url, local = f"s3://{bucket}/lake", tmp_path / "local"
    extract_run(BASIC, store_of(url), ExtractOptions(run_name="basic"))
    extract_run(BASIC, store_of(local), ExtractOptions(run_name="basic"))
    assert cli("views", url) == (0, f"Rebuilt {url}/{layout.CATALOG_FILE}\n")
    remote_audit, local_audit = cli("audit", url), cli("audit", str(local))
    assert remote_audit == local_audit
    # the real fixture's log-probs are noise: miles' own log-prob gate fails it (test_audits.py)
    assert remote_audit[1].splitlines()[-1] == "1 of 15 audits failed; 3 warnings, 1 info."
    page = tmp_path / "report.html"
    code, out = cli("report", url, "-o", str(page))
    assert code == 0, out
    html = page.read_text(encoding="utf-8")
    assert "<h1>tokenlake report</h1>" in html and url in html


@pytest.mark.parametrize("sig", ["INT", "TERM"])
def test_an_extraction_stopped_before_its_first_commit_leaves_no_object(
    bucket: str, monkeypatch: pytest.MonkeyPatch, sig: str
) -> None:
    from tests.fixture_paths import SLIME_REAL
    from tokenlake.orchestrate.extract import ExtractInterrupted
    from tokenlake.orchestrate.scheduler import sigterm_as_ctrl_c
    from tokenlake.processes import KILL_SIGNAL_VARIABLE, KILL_VARIABLE

    url = f"s3://{bucket}/lake"
    monkeypatch.setenv(KILL_VARIABLE, "step:file-written")  # a step written half
    monkeypatch.setenv(KILL_SIGNAL_VARIABLE, sig)
    with pytest.raises(ExtractInterrupted) as stopped, sigterm_as_ctrl_c():
        extract_run(SLIME_REAL / "v2_dp2_cp2", store_of(url), ExtractOptions(workers=1))
    assert (stopped.value.summary.counts["new"], stopped.value.summary.tokens) == (0, 0)
    assert list_keys(bucket) == []  # not a Parquet file: the lock is gone too
    with pytest.raises(LakeError, match="is not a lake: it has no `_manifest/`"):
        verify_lake(store_of(url))


def test_verify_names_an_object_no_manifest_lists_and_extract_sweeps_it(bucket: str) -> None:
    import boto3

    from tests.fixture_paths import SLIME_REAL

    url = f"s3://{bucket}/lake"
    dump = SLIME_REAL / "v2_dp2_cp2"
    extract_run(dump, store_of(url), ExtractOptions(workers=1))
    listed = manifest.load_manifest(store_of(url), "v2_dp2_cp2")
    assert listed is not None
    source = listed.steps["0"].files[schema.TOKENS]
    left = source.rsplit("-", 1)[0] + "-0badf00d.parquet"  # a name the scheme makes
    boto3.client("s3").copy_object(
        Bucket=bucket, Key=f"lake/{left}", CopySource={"Bucket": bucket, "Key": f"lake/{source}"}
    )
    checked, problems = verify_lake(store_of(url))
    assert (checked, [str(p) for p in problems]) == (
        4,
        [
            f"file `{left}` is not listed in any manifest: left by an interrupted extraction,"
            " drop or tag; `tokenlake extract` sweeps it"
        ],
    )
    summary = extract_run(dump, store_of(url), ExtractOptions(workers=1))
    assert summary.counts["unchanged"] == 4
    assert f"lake/{left}" not in list_keys(bucket)
    assert list_keys(bucket) == listed_keys(bucket, "lake", url)
    assert verify_lake(store_of(url)) == (4, [])
