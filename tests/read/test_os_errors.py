"""A file or folder the operating system refuses is named as what it is: one line with the
path, what the OS said, and the fix (access rights, the disk), never "corrupt", never advice to
remove it; for every format's files and folders.

The suite runs as root, whom `chmod 000` does not stop: each command runs in a child process
without the capabilities that let root past file modes (CAP_DAC_OVERRIDE,
CAP_DAC_READ_SEARCH, dropped from its bounding set before it starts), so the OS really
refuses, as it does for any other user.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, REAL_DUMPS, SLIME_REAL
from tokenlake.errors import UnreadableError
from tokenlake.generator import synth
from tokenlake.read.pt import ptread, ptzip

pytestmark = pytest.mark.slow  # a child process per command

_PR_CAPBSET_DROP = 24
_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH = 1, 2
DENIED = "permission denied (the OS says: [Errno 13] Permission denied)"
READ_FIX = (
    "give your user access: `chmod u+r` on it and `chmod u+x` on each folder above it, or"
    " `chown` it to your user"
)
LIST_FIX = (
    "give your user access: `chmod u+rx` on it and `chmod u+x` on each folder above it, or"
    " `chown` it to your user"
)


def _as_a_user() -> None:
    """In the child: drop root's way past file modes, so `chmod 000` holds."""
    if os.geteuid() != 0:
        return  # a user already
    libc = ctypes.CDLL(None, use_errno=True)
    for capability in (_CAP_DAC_OVERRIDE, _CAP_DAC_READ_SEARCH):
        if libc.prctl(_PR_CAPBSET_DROP, capability, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP) failed")


def as_a_user(*args: object) -> tuple[int, list[str]]:
    """Exit code and stderr lines of `tokenlake ARGS` run as a user whom file modes bind."""
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=600,
        preexec_fn=_as_a_user,
    )
    return done.returncode, done.stderr.splitlines()


def extract(dump: Path, lake: Path) -> tuple[int, list[str]]:
    return as_a_user("extract", dump, "--lake", lake, "--silent", "--workers", 1)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """Copies of a miles, a slime format-2 and a NeMo-RL dump, readable by everyone."""
    shutil.copytree(REAL_DUMPS / "basic", tmp_path / "basic")
    shutil.copytree(SLIME_REAL / "v2_dp2_cp2", tmp_path / "slime2")
    shutil.copytree(NEMO_RL_REAL / "grpo_multiturn", tmp_path / "nemo")
    return tmp_path


def test_the_child_is_refused_what_mode_000_closes(tmp_path: Path) -> None:
    closed = tmp_path / "closed.txt"
    closed.write_text("x")
    closed.chmod(0)
    done = subprocess.run(["cat", str(closed)], capture_output=True, preexec_fn=_as_a_user)
    assert done.returncode == 1 and b"Permission denied" in done.stderr


@pytest.mark.parametrize(
    ("dump", "closed", "step"),
    [
        ("basic", "train_data/1_2.pt", "Skipped step 1: rank 2: "),
        ("basic", "rollout_data/1.pt", "Skipped step 1: "),
        ("slime2", "train_data/1.pt", "Skipped step 1: "),
        ("nemo", "train_data_step2.jsonl", "Skipped step 2: "),
    ],
)
def test_an_unreadable_step_file_skips_its_step_with_the_fix(
    folder: Path, dump: str, closed: str, step: str
) -> None:
    (folder / dump / closed).chmod(0)
    code, err = extract(folder / dump, folder / "lake")
    assert code == 1
    assert (
        f"{step}`{folder / dump / closed}` cannot be read: {DENIED}; {READ_FIX}, then extract again."
        in err
    )


@pytest.mark.parametrize(
    ("dump", "closed"),
    [("basic", "train_data"), ("basic", "rollout_data"), ("slime2", "train_data"), ("nemo", "")],
)
def test_an_unlistable_dump_folder_is_one_line_with_the_fix(
    folder: Path, dump: str, closed: str
) -> None:
    (folder / dump / closed).chmod(0)
    path = str(folder / dump / closed).rstrip("/")
    assert extract(folder / dump, folder / "lake") == (
        1,
        [f"Error: `{path}` cannot be listed: {DENIED}; {LIST_FIX}"],
    )
    assert not (folder / "lake").exists()


def test_an_unreadable_tokenizer_and_trajectory_are_warnings_with_the_fix(folder: Path) -> None:
    tokenizer = folder / "basic" / "tokenizer" / "tokenizer.json"
    trajectory = folder / "basic" / "trajectory" / "0.jsonl"
    tokenizer.chmod(0)
    trajectory.chmod(0)
    code, err = extract(folder / "basic", folder / "lake")
    assert code == 0
    assert err == [
        f"Ignored `{tokenizer}`: cannot be read: {DENIED}; {READ_FIX}; token texts are NULL"
        " until it is fixed",
        f"Warning: `{trajectory}` cannot be read: {DENIED}; {READ_FIX}; the step's"
        " conversations are NULL.",
    ]


def test_unreadable_dashboard_files_are_warnings_with_the_fix(tmp_path: Path) -> None:
    dump = tmp_path / "dump"
    synth.write_dump(dump, replace(synth.PRESETS["rollout-only"], miles_dashboard=True))
    meta, metrics = dump / "dashboard" / "meta.json", dump / "dashboard" / "metrics.jsonl"
    meta.chmod(0)
    metrics.chmod(0)
    code, err = extract(dump, tmp_path / "lake")
    assert code == 0
    assert err == [
        f"Warning: `{metrics}` cannot be read: {DENIED}; {READ_FIX}; skipped.",
        f"Warning: `{meta}` cannot be read: {DENIED}; {READ_FIX}; its run metadata is left NULL.",
    ]


def test_an_io_error_and_a_directory_are_named_as_what_they_are(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "0_0.pt"
    folder.mkdir()
    with pytest.raises(UnreadableError) as caught:
        ptread.load(folder)
    assert str(caught.value) == (
        f"`{folder}` cannot be read: it is a directory where a file should be (the OS says:"
        " [Errno 21] Is a directory); put the file back under this name; the directory is not"
        " tokenlake's"
    )
    real = REAL_DUMPS / "basic" / "train_data" / "0_0.pt"

    def failing_disk(path: Path, size: int, fresh: bool) -> bytes:
        raise OSError(errno.EIO, "Input/output error", str(path))

    monkeypatch.setattr(ptzip, "_read_buffer", failing_disk)
    with pytest.raises(UnreadableError) as caught:
        ptread.load(real)
    assert str(caught.value) == (
        f"`{real}` cannot be read: an input/output error (the OS says: [Errno 5] Input/output"
        " error); check the disk or the network file system it is on (`dmesg`)"
    )


OPEN_FIX = LIST_FIX


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run

    lake = tmp_path / "lake"
    assert extract_run(REAL_DUMPS / "basic", store_of(lake), ExtractOptions(workers=1)).failed == []
    return lake


def test_an_unopenable_lake_folder_is_one_line_for_every_command(lake: Path) -> None:
    (lake / "tokens").chmod(0)
    line = f"Error: `{lake / 'tokens'}` cannot be opened: {DENIED}; {OPEN_FIX}"
    assert as_a_user("verify", lake) == (1, [line])
    assert extract(REAL_DUMPS / "basic", lake) == (1, [line])
    assert as_a_user("drop", lake, "basic") == (1, [line])
    (lake / "tokens").chmod(0o755)
    (lake / "_manifest").chmod(0)
    line = f"Error: `{lake / '_manifest'}` cannot be listed: {DENIED}; {LIST_FIX}"
    assert as_a_user("verify", lake) == (1, [line])  # never "0 steps checked, 0 problems"
    assert as_a_user("query", lake, "SELECT count(*) FROM tokens") == (1, [line])


def test_an_unreadable_lake_file_is_named_with_the_fix_never_deleted(lake: Path) -> None:
    token_file = sorted(lake.glob("tokens/run=basic/rollout_id=1/*.parquet"))[0]
    name = token_file.relative_to(lake)
    token_file.chmod(0)
    done = subprocess.run(
        [sys.executable, "-m", "tokenlake", "verify", str(lake)],
        capture_output=True,
        text=True,
        preexec_fn=_as_a_user,
    )
    assert done.returncode == 1
    assert done.stdout == (
        f"run `basic` step 1: file `{name}` cannot be read: permission denied (the OS says:"
        f" [Errno 13] Permission denied); {READ_FIX}\n3 steps checked, 1 problem\n"
    )
    # A reader serves the other steps and names the file it cannot read, with the fix.
    assert as_a_user("query", lake, "SELECT count(*) FROM tokens") == (
        0,
        [
            f"Warning: run `basic` step 1: not served: `{name}` cannot be read: permission"
            f" denied (the OS says: [Errno 13] Permission denied); {READ_FIX}"
        ],
    )
    token_file.chmod(0o644)
    manifest_file = lake / "_manifest" / "basic.json"
    manifest_file.chmod(0)
    assert as_a_user("verify", lake) == (
        1,
        [f"Error: Lake `{manifest_file}`: cannot be read: {DENIED}; {READ_FIX}"],
    )
