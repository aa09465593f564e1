"""A lake file is opened once for all of verify's checks of it, never through a link, and a
command that reads the manifests in several places parses each once.

`parquet.LakeFile` gives a file's footer identity and its rows from one open file
(`LocalStore.open_listed`: one walk of its folders that refuses links, then an open that
follows none); `manifest.parsed_once` keeps each manifest's record by its exact bytes.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.lakes import build_lake
from tests.serve.test_audits import healthy_rows
from tokenlake.errors import LakeError
from tokenlake.orchestrate import verify
from tokenlake.store import manifest, nofollow, parquet
from tokenlake.store.local import LocalStore, walked_once

RUN_FILE = "_manifest/r.json"
NAME = "tokens/run=a/rollout_id=0/train-0a1b2c3d.parquet"
LINK_RULE = (
    "is a symbolic link; tokenlake never follows a link inside a lake. Remove the link (what it"
    " points to is not touched)"
)


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    """A folder holding one Parquet file under a name a manifest lists."""
    (tmp_path / NAME).parent.mkdir(parents=True)
    rows = pa.table({"token_id": pa.array([7, 8, 9]), "loss_mask": pa.array([1, 0, 1], pa.int8())})
    pq.write_table(rows, tmp_path / NAME)
    return tmp_path


@pytest.mark.parametrize("whole", [True, False], ids=["read-whole", "read-as-a-file"])
def test_a_file_is_read_from_the_one_open_file(
    lake: Path, whole: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if not whole:  # as a file larger than a read at once: its tail, footer and pages by pread
        monkeypatch.setattr(parquet, "_IDENTITY_WHOLE_BYTES", 0)
        monkeypatch.setattr(parquet, "_READ_WHOLE_BYTES", 0)
    store = LocalStore(lake)
    written = parquet.footer_identity(store, NAME)
    lake_file = parquet.LakeFile.open(store, NAME)
    assert lake_file is not None
    with lake_file:
        os.unlink(lake / NAME)  # what is read is what was opened, not the name again
        assert lake_file.identity_change(written) is None
        declared, rows = lake_file.read_columns(["loss_mask", "absent"])
        assert declared.names == ["token_id", "loss_mask"]
        assert rows.to_pydict() == {"loss_mask": [1, 0, 1]}
        assert lake_file.read_table().to_pydict() == {
            "token_id": [7, 8, 9],
            "loss_mask": [1, 0, 1],
        }
        assert lake_file.identity_change(written.replace(":", "0:", 1)) == (
            f"changed since it was written: {int(written.split(':')[0]):,} bytes,"
            f" written {int(written.split(':')[0] + '0'):,}"
        )


@pytest.fixture(params=[False, True], ids=["by-path", "from-the-walked-run-folder"])
def store(lake: Path, request: pytest.FixtureRequest) -> Iterator[LocalStore]:
    """The lake's store; or, as verify reads it, within `walked_once` once `check_links` has
    walked the run (its files opened from the run's folder it holds)."""
    store = LocalStore(lake)
    if not request.param:
        yield store
        return
    with walked_once():
        store.check_links("a")
        yield store


def test_a_file_a_link_reaches_is_refused_and_a_folder_or_fifo_is_missing(
    lake: Path, store: LocalStore
) -> None:
    target = lake / "elsewhere.parquet"
    (lake / NAME).rename(target)
    (lake / NAME).symlink_to(target)
    with pytest.raises(LakeError) as refused:
        parquet.LakeFile.open(store, NAME)
    assert str(refused.value) == f"Lake `{lake.resolve()}`: `{NAME}` {LINK_RULE}"
    (lake / NAME).unlink()
    assert parquet.LakeFile.open(store, NAME) is None  # nothing there: `exists` says so too
    os.mkfifo(lake / NAME)
    assert parquet.LakeFile.open(store, NAME) is None  # never opened: nothing waits on it
    assert not store.exists(NAME)
    (lake / NAME).unlink()
    (lake / NAME).mkdir()
    assert parquet.LakeFile.open(store, NAME) is None
    step = lake / "tokens/run=a/rollout_id=0"
    (lake / NAME).rmdir()
    step.rename(lake / "step")
    step.symlink_to(lake / "step", target_is_directory=True)
    with pytest.raises(LakeError) as refused:
        parquet.LakeFile.open(store, NAME)
    assert str(refused.value) == (
        f"Lake `{lake.resolve()}`: `tokens/run=a/rollout_id=0` {LINK_RULE}"
    )


def test_verify_parses_each_manifest_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    build_lake(tmp_path, *healthy_rows())
    parsed: list[str] = []
    parse = manifest.parse_manifest

    def counted(where: str, raw: bytes) -> manifest.RunManifest:
        parsed.append(Path(where).name)
        return parse(where, raw)

    monkeypatch.setattr(manifest, "parse_manifest", counted)
    checked, _ = verify.verify_lake(LocalStore(tmp_path))
    assert checked == 1
    assert parsed == ["r.json"]  # its checks, the leftovers and the catalog's digest read it


def test_a_manifest_whose_bytes_changed_is_parsed_again(tmp_path: Path) -> None:
    build_lake(tmp_path, *healthy_rows())
    store = LocalStore(tmp_path)
    with manifest.parsed_once():
        first = manifest.load_all(store)[0]
        assert manifest.load_all(store)[0] is first
        tagged = manifest.parse_manifest(RUN_FILE, manifest.manifest_bytes(first))
        tagged.tags = {"kept": "no"}
        manifest.save_manifest(store, tagged)
        again = manifest.load_all(store)[0]
    assert again is not first
    assert (again.tags, first.tags) == ({"kept": "no"}, {})


def test_verify_walks_each_run_folder_once_and_keeps_no_folder_open(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_lake(tmp_path, *healthy_rows())
    _, found = verify.verify_lake(LocalStore(tmp_path))  # the hand-built lake's own lines
    leftover = "tokens/run=r/rollout_id=0/train-99999999.parquet"
    (tmp_path / leftover).write_bytes(b"")
    walked: list[str] = []  # each folder a walk entered, by both walks of a run folder
    for walk in ("made_files", "refuse_links_in"):
        monkeypatch.setattr(nofollow, walk, counted(getattr(nofollow, walk), walked))
    before = sorted(os.listdir("/proc/self/fd"))
    checked, problems = verify.verify_lake(LocalStore(tmp_path))
    assert checked == 1
    assert problems == [*found, verify.Problem("", "", verify.leftover_text(leftover))]
    assert len(walked) == len(set(walked)) > 0  # each run folder once: links and leftovers
    assert "tokens/run=r/rollout_id=0" in walked
    assert sorted(os.listdir("/proc/self/fd")) == before


def counted(walk: Callable[..., Any], walked: list[str]) -> Callable[..., Any]:
    """`walk(folder, where, ...)` recording each `where` it enters in `walked`."""

    where = 2 if walk is nofollow.refuse_links_in else 1  # (root, folder, where, ...)

    def walking(*args: Any, **kwargs: Any) -> Any:
        walked.append(args[where])
        return walk(*args, **kwargs)

    return walking
