"""The cache of remote dumps is the user's alone, and a stage tokenlake did not make is not trusted.

Others who can write where `$TOKENLAKE_CACHE` points plant links and forge files there: a link
in place of a stage (once made tokenlake delete the link's target recursively), a linked
`tokenizer/` (once overwritten through), forged files with the listed size and mtime and a
forged `.tokenlake-remote.json` (once trusted, poisoning the vocabulary). Each is crafted
against moto's S3 server on 127.0.0.1.
"""

from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.read.test_remote_dump import BASIC, bucket, s3, upload  # noqa: F401 - fixtures
from tests.s3server import cli, rows
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.read.remote import remote_dump, remote_stage

pytestmark = pytest.mark.slow  # a server, and real extractions

OTHER_UID = 4242
OWN_CACHE = "set TOKENLAKE_CACHE to a folder only you can write (tokenlake creates it)"
REMOVE_IT = "remove it (tokenlake makes it again), then extract again"
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="only root can give a file to another uid")


def snapshot(folder: Path) -> dict[str, bytes]:
    found = {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}
    assert found  # a comparison of nothing would pass whatever was deleted
    return found


def victim(tmp_path: Path) -> Path:
    """A folder of the user's that a planted link points to."""
    home = tmp_path / "victim"
    (home / "sub").mkdir(parents=True)
    (home / "notes.txt").write_text("keep me")
    (home / "sub" / "thesis.tex").write_text("years of work")
    return home


def warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]


def local_vocab(tmp_path: Path) -> list[tuple[str, ...]]:
    extract_run(BASIC, store_of(tmp_path / "local"), ExtractOptions(run_name="basic"))
    return rows(tmp_path / "local", "SELECT * FROM vocab")


def test_every_cache_folder_is_made_private_whatever_the_umask(
    bucket: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    url = upload(bucket, "basic")
    old = os.umask(0)
    try:
        root = remote_dump.stage(url)
    finally:
        os.umask(old)
    cache = tmp_path / "cache"
    folders = [cache, cache / "dumps", root.parent, root, root / "rollout_data", root / "tokenizer"]
    assert root.parent.parent == cache / "dumps"
    assert [oct(stat.S_IMODE(os.lstat(f).st_mode)) for f in folders] == ["0o700"] * 6


def test_a_cache_others_may_write_is_refused(bucket: str, tmp_path: Path) -> None:  # noqa: F811
    url, cache, lake = upload(bucket, "basic"), tmp_path / "cache", tmp_path / "lake"
    cache.mkdir()
    cache.chmod(0o777)
    assert cli("extract", url, "--lake", str(lake)) == (
        1,
        f"Error: Cache `{cache}`: may be written by others (mode 0777); run `chmod go-w"
        f" {cache}` or {OWN_CACHE}\n",
    )
    assert list(cache.iterdir()) == [] and not lake.exists()


def test_a_cache_of_another_user_is_refused(
    bucket: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, cache, lake = upload(bucket, "basic"), tmp_path / "cache", tmp_path / "lake"
    cache.mkdir(mode=0o700)
    me = os.getuid()
    monkeypatch.setattr(os, "getuid", lambda: me + OTHER_UID)  # the cache is now another's
    assert cli("extract", url, "--lake", str(lake)) == (
        1,
        f"Error: Cache `{cache}`: belongs to uid {me}, not to you (uid {me + OTHER_UID});"
        f" {OWN_CACHE}\n",
    )
    assert list(cache.iterdir()) == [] and not lake.exists()


@needs_root
def test_a_dump_folder_of_another_user_in_the_cache_is_refused(
    bucket: str,  # noqa: F811
    tmp_path: Path,
) -> None:
    url, lake = upload(bucket, "basic"), tmp_path / "lake"
    theirs = remote_stage.private_folders(remote_dump.stage_root(url).parent)
    os.chown(theirs, OTHER_UID, OTHER_UID)
    assert cli("extract", url, "--lake", str(lake)) == (
        1,
        f"Error: Cache `{theirs}`: belongs to uid {OTHER_UID}, not to you (uid 0); {REMOVE_IT}\n",
    )
    assert list(theirs.iterdir()) == []


@pytest.mark.parametrize("planted", ["stage", "dumps/<hash>"])
def test_a_link_planted_for_a_stage_folder_touches_nothing_behind_it(
    bucket: str,  # noqa: F811
    tmp_path: Path,
    planted: str,
) -> None:
    url, lake, home = upload(bucket, "basic"), tmp_path / "lake", victim(tmp_path)
    before = snapshot(home)
    stage = remote_dump.stage_root(url)
    link = stage if planted == "stage" else stage.parent
    remote_stage.private_folders(link.parent)
    link.symlink_to(home, target_is_directory=True)
    assert cli("extract", url, "--lake", str(lake)) == (
        1,
        f"Error: Cache `{link}`: is a symbolic link, not a folder tokenlake made; {REMOVE_IT}\n",
    )
    assert snapshot(home) == before and not lake.exists()
    link.unlink()  # what the line says
    assert cli("extract", url, "--lake", str(lake), "--silent")[0] == 0
    assert snapshot(home) == before


def test_a_linked_tokenizer_folder_in_the_stage_is_never_written_through(
    bucket: str,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, lake, home = upload(bucket, "basic"), tmp_path / "lake", victim(tmp_path)
    (home / "tokenizer.json").write_text("the victim's own file")
    before = snapshot(home)
    stage = remote_dump.stage(url)
    shutil.rmtree(stage / "tokenizer")
    (stage / "tokenizer").symlink_to(home, target_is_directory=True)
    code, out = cli("extract", url, "--lake", str(lake), "--silent")
    assert (code, out) == (
        0,
        "Run `basic`: 3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped steps; wrote 20"
        f" samples and 206 tokens in T s -> {lake}\n",
    )
    assert warnings(caplog) == [
        f"The stage `{stage}` of `{url}` held `tokenizer` (a symbolic link), which tokenlake"
        " did not make; staging it again"
    ]
    assert snapshot(home) == before
    assert rows(lake, "SELECT * FROM vocab") == local_vocab(tmp_path)
    assert not (stage / "tokenizer").is_symlink()


def test_a_fifo_and_a_link_in_place_of_placeholders_are_staged_again(
    bucket: str,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, home = upload(bucket, "basic"), victim(tmp_path)
    stage = remote_dump.stage(url)
    placeholder = stage / "rollout_data" / "0.pt"
    listed = os.lstat(placeholder)
    placeholder.unlink()
    os.mkfifo(placeholder)
    (stage / "rollout_data" / "1.pt").unlink()
    (stage / "rollout_data" / "1.pt").symlink_to(home / "notes.txt")
    assert remote_dump.stage(url) == stage
    again = os.lstat(placeholder)
    assert stat.S_ISREG(again.st_mode)
    assert (again.st_size, again.st_mtime_ns) == (listed.st_size, listed.st_mtime_ns)
    assert not (stage / "rollout_data" / "1.pt").is_symlink()
    assert (home / "notes.txt").read_text() == "keep me"
    (found,) = warnings(caplog)
    assert found.startswith(f"The stage `{stage}` of `{url}` held `rollout_data/")
    assert found.endswith(", which tokenlake did not make; staging it again")


@needs_root
def test_forged_stage_files_of_another_user_are_not_trusted(
    bucket: str,  # noqa: F811
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url, lake = upload(bucket, "basic"), tmp_path / "lake"
    stage = remote_dump.stage(url)
    tokenizer, state = stage / "tokenizer" / "tokenizer.json", stage / remote_stage.STATE_FILE
    listed = os.lstat(tokenizer)
    real = tokenizer.read_bytes()
    forged = real.replace(b'"t1"', b'"x1"')  # same size: token 1 would read `x1`
    assert forged != real and len(forged) == len(real)
    recorded = state.read_bytes()  # the forger writes the very state tokenlake would
    for path, data in ((tokenizer, forged), (state, recorded)):
        path.unlink()
        path.write_bytes(data)
        os.utime(path, ns=(listed.st_mtime_ns, listed.st_mtime_ns))
        os.chown(path, OTHER_UID, OTHER_UID)
    assert cli("extract", url, "--lake", str(lake), "--silent")[0] == 0
    vocab = rows(lake, "SELECT * FROM vocab")
    assert vocab == local_vocab(tmp_path)
    assert not any("x1" in text for row in vocab for text in row)
    assert tokenizer.read_bytes() == real and os.lstat(tokenizer).st_uid == 0
    assert warnings(caplog) == [
        f"The stage `{stage}` of `{url}` held `{remote_stage.STATE_FILE}` (owned by uid"
        f" {OTHER_UID}), which tokenlake did not make; staging it again"
    ]
