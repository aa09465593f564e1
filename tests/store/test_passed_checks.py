"""`verify` keeps, in the user's private cache, the steps whose content checks passed, keyed by
the blake2b of their step files' whole bytes, their manifest record and the checking code: a
step whose key is kept is not decoded again, and any changed byte or record is checked in full
(pipeline/tokenlake/store/passed_checks.py)."""

from __future__ import annotations

import copy
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.conftest import store_of
from tests.store.test_hostile_lake import cli, copy_dump, extract
from tokenlake.orchestrate import verify
from tokenlake.serve import catalog_cache
from tokenlake.store import parquet, passed_checks

pytestmark = pytest.mark.slow  # extracts a real fixture dump

CLEAN = (0, "3 steps checked, 0 problems\n", [])
CHECKSUM = "run `basic` step 0: token ids or loss masks differ from what was extracted (checksum)"


@pytest.fixture
def lake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The basic dump's lake (3 steps), verified once: its steps' passes kept."""
    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    lake = tmp_path / "lake"
    assert extract(copy_dump(tmp_path), lake)[0] == 0
    assert cli("verify", str(lake)) == CLEAN
    return lake


def kept_keys(lake: Path) -> list[str]:
    folder = catalog_cache.lake_folder(store_of(lake))
    assert folder is not None
    return (folder / passed_checks.FILE).read_text(encoding="ascii").split()


def decoded(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files verify decodes columns of, from now on."""
    names: list[str] = []
    read_columns = parquet.LakeFile.read_columns

    def counted(self: parquet.LakeFile, columns: list[str]) -> object:
        names.append(self.name)
        return read_columns(self, columns)

    monkeypatch.setattr(parquet.LakeFile, "read_columns", counted)
    return names


def test_a_step_that_passed_is_not_decoded_again(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert len(kept_keys(lake)) == 3
    names = decoded(monkeypatch)
    assert cli("verify", str(lake)) == CLEAN
    assert names == []
    assert cli("verify", str(lake), "--deep") == CLEAN  # --deep reads every file whole
    assert names == []
    assert len(kept_keys(lake)) == 3


def test_a_changed_byte_in_a_file_whose_check_passed_is_still_found(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tokens = next(lake.glob("tokens/run=basic/rollout_id=0/train-*.parquet"))
    written = parquet.footer_identity(store_of(lake), str(tokens.relative_to(lake)))
    _change_a_token_id(tokens)
    # Its size and footer are those the manifest records: only its bytes tell.
    assert parquet.footer_identity(store_of(lake), str(tokens.relative_to(lake))) == written
    names = decoded(monkeypatch)
    assert cli("verify", str(lake)) == (1, f"{CHECKSUM}\n3 steps checked, 1 problem\n", [])
    assert cli("verify", str(lake)) == (1, f"{CHECKSUM}\n3 steps checked, 1 problem\n", [])
    assert len(names) == 4  # step 0's two files, at each verify
    assert len(kept_keys(lake)) == 2  # a whole lake's check keeps only the keys it used


def test_a_changed_manifest_record_is_checked_again(lake: Path) -> None:
    (path,) = lake.glob("_manifest/*.json")
    text = json.loads(path.read_text(encoding="utf-8"))
    step = text["steps"]["0"]
    step["checksum"] = "0" * len(step["checksum"])
    path.write_text(json.dumps(text), encoding="utf-8")
    assert cli("verify", str(lake)) == (1, f"{CHECKSUM}\n3 steps checked, 1 problem\n", [])


def test_a_steps_files_listed_again_as_its_evaluation_are_found(lake: Path) -> None:
    # A second record, of eval step 1, lists byte-for-byte copies of step 1's files: every
    # reader served step 1's rows twice (their `evaluation` is false), and verify passed it,
    # its bytes and record (but the flag) those of a kept pass.
    path = lake / "_manifest" / "basic.json"
    data = json.loads(path.read_text())
    again = copy.deepcopy(data["steps"]["1"])
    again["evaluation"] = True
    for table, name in again["files"].items():
        again["files"][table] = name.replace("/train-", "/eval-")
        shutil.copy(lake / name, lake / again["files"][table])
    data["steps"]["eval_1"] = again
    path.write_text(json.dumps(data))
    assert cli("views", str(lake))[0] == 0  # the catalog lists the manifests' files
    found = (
        "run `basic` step eval_1: `tokens` has 82 rows of a training step (`evaluation` false),"
        " not of this evaluation step; extract the run again\n"
        "run `basic` step eval_1: `samples` has 8 rows of a training step (`evaluation` false),"
        " not of this evaluation step; extract the run again\n"
    )
    for _ in range(2):  # the failed check is not kept
        assert cli("verify", str(lake)) == (1, f"{found}4 steps checked, 2 problems\n", [])


def test_a_step_listing_no_tokens_file_is_one_line(lake: Path) -> None:
    # verify raised a KeyError traceback: its checks read a step's tokens and samples
    path = lake / "_manifest" / "basic.json"
    data = json.loads(path.read_text())
    step = data["steps"]["1"]
    (lake / step["files"].pop("tokens")).unlink()  # else verify names it a leftover
    del step["identities"]["tokens"]
    path.write_text(json.dumps(data))
    assert cli("views", str(lake))[0] == 0  # the catalog lists the manifests' files
    assert cli("verify", str(lake)) == (
        1,
        "run `basic` step 1: lists no `tokens` file; extract the run again\n"
        "3 steps checked, 1 problem\n",
        [],
    )


def test_kept_passes_of_other_code_do_not_count(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(verify, "_checking_code", lambda: b"another tokenlake")
    names = decoded(monkeypatch)
    assert cli("verify", str(lake)) == CLEAN
    assert len(names) == 6
    assert len(kept_keys(lake)) == 3  # those of this code only


def test_a_check_of_one_run_keeps_the_other_runs_passes(
    lake: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = catalog_cache.lake_folder(store_of(lake))
    assert folder is not None
    other = "f" * 64  # a pass of a step not checked now
    (folder / passed_checks.FILE).write_text(f"{other}\n" + "\n".join(kept_keys(lake)))
    assert cli("verify", str(lake), "--run", "basic") == CLEAN
    assert other in kept_keys(lake)
    assert cli("verify", str(lake)) == CLEAN
    assert other not in kept_keys(lake)


def test_a_record_that_is_a_link_is_not_read(lake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    folder = catalog_cache.lake_folder(store_of(lake))
    assert folder is not None
    record = folder / passed_checks.FILE
    os.replace(record, folder / "elsewhere.txt")
    record.symlink_to(folder / "elsewhere.txt")
    names = decoded(monkeypatch)
    assert cli("verify", str(lake)) == CLEAN
    assert len(names) == 6  # every step checked in full, and its passes kept as a file
    assert not record.is_symlink()
    assert len(kept_keys(lake)) == 3


def _change_a_token_id(path: Path) -> None:
    """Change one byte of the `token_id` page of `path` so that it still decodes, to other
    token ids; its size and footer are left as they were."""
    data = path.read_bytes()
    metadata = pq.read_metadata(path)
    columns = metadata.row_group(0)
    (chunk,) = [
        columns.column(i)
        for i in range(columns.num_columns)
        if columns.column(i).path_in_schema == "token_id"
    ]
    ids = pq.read_table(path).column("token_id")
    start = chunk.data_page_offset
    for at in range(start + chunk.total_compressed_size // 2, start + chunk.total_compressed_size):
        changed = bytearray(data)
        changed[at] ^= 1
        path.write_bytes(changed)
        try:
            if not pq.read_table(path).column("token_id").equals(ids):
                return
        except (OSError, pa.ArrowException):  # this byte breaks the page
            continue
    raise AssertionError("no byte of the page changes a token id and still decodes")


def test_a_cache_others_may_write_is_not_used(lake: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cache = Path(os.environ["TOKENLAKE_CACHE"])
    cache.chmod(0o777)
    names = decoded(monkeypatch)
    assert cli("verify", str(lake)) == CLEAN
    assert len(names) == 6  # every step checked in full, nothing kept


@pytest.mark.parametrize("keep_others", [True, False])
def test_the_record_keeps_the_keys_used_first_within_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, keep_others: bool
) -> None:
    monkeypatch.setattr(passed_checks, "MAX_BYTES", 3 * 65)  # three keys
    old = [f"{n:064x}" for n in range(3)]
    (tmp_path / passed_checks.FILE).write_text("".join(f"{key}\n" for key in old))
    record = passed_checks.PassedChecks(tmp_path, b"code")
    new = "e" * 64
    assert record.passed(old[1]) and not record.passed(new)
    record.add(new)
    record.save(keep_others)
    kept = (tmp_path / passed_checks.FILE).read_text().split()
    assert kept == ([old[1], new, old[0]] if keep_others else [old[1], new])
