"""On an object store, a manifest or a writer lock larger than its bound is never fetched
whole (its size is asked first), and a dump's tokenizer larger than its bound is never
downloaded (moto's S3 server; the bounds are lowered so that the objects stay small)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixture_paths import REAL_DUMPS
from tests.read.test_remote_dump import upload
from tests.s3server import cli, fresh_s3, new_bucket
from tokenlake.read import vocab
from tokenlake.read.remote import remote_dump
from tokenlake.store import manifest, object_lock

pytestmark = pytest.mark.slow  # a server, and real extractions

BASIC = REAL_DUMPS / "basic"


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with fresh_s3() as env:
        yield env


def put(bucket: str, key: str, body: bytes) -> None:
    import boto3

    boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=body)


def test_a_manifest_object_over_its_bound_is_one_damaged_line(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    bucket = new_bucket()
    url = f"s3://{bucket}/lake"
    assert cli("extract", str(BASIC), "--lake", url, "--silent")[0] == 0
    monkeypatch.setattr(manifest, "MAX_MANIFEST_BYTES", 100_000)
    put(bucket, "lake/_manifest/other.json", b" " * 100_001)
    code, out = cli("verify", url)
    assert (code, out) == (
        1,
        f"Error: Lake `{url}/_manifest/other.json`: manifest is damaged: it is 100,001 bytes;"
        " a run manifest may be at most 100,000 bytes. Remove the run with `tokenlake drop LAKE"
        " other` or extract it again\n",
    )


def test_a_writer_lock_over_its_bound_is_taken_over_as_unreadable(
    s3: dict[str, str], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    bucket = new_bucket()
    url = f"s3://{bucket}/lake"
    monkeypatch.setattr(object_lock, "MAX_LOCK_BYTES", 400)  # ours are ~150 bytes
    forged = b'{"expires": 9e99, "x": "' + b"y" * 400 + b'"}'  # a lease that never ends
    put(bucket, "lake/_manifest/.tokenlake.lock", forged)
    code, out = cli("extract", str(BASIC), "--lake", url, "--silent")
    assert (code, out) == (
        0,
        "Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
        f" samples and 206 tokens in T s -> {url}\n",
    )
    assert [r.getMessage() for r in caplog.records if r.name == object_lock.__name__] == [
        "took over the stale writer lock of an unreadable lock"
        f" (it is {len(forged)} bytes, more than 400)"
    ]


def test_a_tokenizer_object_over_its_bound_is_never_downloaded(
    s3: dict[str, str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(remote_dump.CACHE_VARIABLE, str(tmp_path / "cache"))
    monkeypatch.setattr(vocab, "MAX_TOKENIZER_BYTES", 1000)
    url, lake = upload(new_bucket(), "basic"), tmp_path / "lake"
    code, out = cli("extract", url, "--lake", str(lake), "--workers", "1", "--silent")
    size = (BASIC / "tokenizer" / "tokenizer.json").stat().st_size
    assert (code, out.splitlines()) == (
        0,
        [
            f"Ignored `{url}/tokenizer/tokenizer.json`: is {size:,} bytes; a `tokenizer.json`"
            " may be at most 1,000 bytes; token texts are NULL until it is fixed",
            "Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
            f" samples and 206 tokens in T s -> {lake.resolve()}",
        ],
    )
    staged = remote_dump.stage_root(url) / "tokenizer" / "tokenizer.json"
    assert (staged.stat().st_size, staged.stat().st_blocks) == (size, 0)  # a placeholder
