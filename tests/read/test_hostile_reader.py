"""Hand-forged `.pt` files cannot crash the reader, leak memory into it, or blow up its memory
or time. Every file is written opcode by opcode with `tests.forge`.

Amplification cases run in a subprocess under `RLIMIT_AS` and a time limit: the process must
exit normally and print the one-line error, never die of a signal or a MemoryError.
"""

from __future__ import annotations

import os
import pickle
import random
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.forge import BZIP2, DEFLATED, NATIVE, Member, Pickle, laughs, write_pt
from tests.limits import run_limited
from tokenlake.errors import DumpFileError
from tokenlake.read.pt import ptcheck, ptread, ptvector, ptzip

ROOT = Path(__file__).resolve().parents[2]
MEMORY_LIMIT = 512 << 20  # address space of the child: numpy + the reader need ~100 MB
TIME_LIMIT = 60.0
STILL_WRITING = (
    " It was modified less than a minute ago and is probably still being written;"
    " extract again later."
)


def refused(path: Path) -> str:
    """The message `ptread.load` raises for `path`, without the `Cannot read ...: ` prefix."""
    with pytest.raises(DumpFileError) as err:
        ptread.load(path)
    prefix = f"Cannot read `{path}`: "
    text = str(err.value)
    assert text.startswith(prefix) and "\n" not in text
    return text[len(prefix) :]


# --- forged numpy objects ---------------------------------------------------------------------


def _scalar(p: Pickle, spec: str, state: tuple[object, ...] | None, data: bytes) -> Pickle:
    p.glob("numpy._core.multiarray", "scalar").dtype(spec, state).binbytes(data).tuple(2)
    return p.reduce()


FORGED = {
    # a float64 dtype given an object field by BUILD (its __setstate__), then 8 raw bytes
    "dtype_with_object_field": (
        Pickle().dtype("f8", (3, "|", None, ("a",), None, 8, 8, 0)),
        "its pickle sets the state of a numpy `<f8` dtype to something numpy never writes"
        " (a forged dtype).",
    ),
    "dtype_flags_forged": (
        Pickle().dtype("f8", (3, "<", None, None, None, -1, -1, 63)),
        "its pickle sets the state of a numpy `<f8` dtype to something numpy never writes"
        " (a forged dtype).",
    ),
    "object_dtype": (
        Pickle().dtype("O8", (3, "|", None, None, None, -1, -1, 0)),
        "its pickle builds a numpy `|O` dtype; tokenlake reads only plain numeric, bool and"
        " fixed-width string dtypes.",
    ),
    "void_dtype": (
        Pickle().dtype("V8"),
        "its pickle builds a numpy `|V8` dtype; tokenlake reads only plain numeric, bool and"
        " fixed-width string dtypes.",
    ),
    "structured_dtype": (
        Pickle().dtype("f8,O8"),
        "its pickle builds a numpy `|V16` dtype; tokenlake reads only plain numeric, bool and"
        " fixed-width string dtypes.",
    ),
    "scalar_of_forged_dtype": (
        _scalar(Pickle(), "f8", (3, "|", None, ("a",), None, 8, 8, 0), b"\x41" * 8),
        "its pickle sets the state of a numpy `<f8` dtype to something numpy never writes"
        " (a forged dtype).",
    ),
    "scalar_of_object_dtype": (
        _scalar(Pickle(), "O8", None, b"\x41" * 8),
        "its pickle builds a numpy `|O` dtype; tokenlake reads only plain numeric, bool and"
        " fixed-width string dtypes.",
    ),
    "scalar_short_payload": (
        _scalar(Pickle(), "f8", NATIVE["f8"], b"1234567"),
        "its pickle gives a numpy `<f8` scalar 7 bytes; it needs 8.",
    ),
    "array_payload_too_short": (
        Pickle().array((1000,), "f8", b"12345678"),
        "its pickle gives a numpy `<f8` array of shape (1000,) 8 bytes; it needs 8000.",
    ),
    "array_without_build": (
        Pickle().array((3,), "f8", None),
        "its pickle creates a numpy array but never gives it data.",
    ),
    "newobj_ndarray": (  # ndarray.__new__ over uninitialised heap
        Pickle().glob("numpy", "ndarray").mark().value((64,)).text("u1").tuple().newobj(),
        "its pickle is corrupt (UnpicklingError: NEWOBJ class argument must be a type, not tuple).",
    ),
    "reduce_ndarray": (
        Pickle().glob("numpy", "ndarray").mark().value((64,)).text("u1").tuple().reduce(),
        "its pickle is corrupt (TypeError: 'tuple' object is not callable).",
    ),
    "reconstruct_with_a_shape": (
        Pickle()
        .glob("numpy._core.multiarray", "_reconstruct")
        .glob("numpy", "ndarray")
        .value((64,))
        .binbytes(b"b")
        .tuple(3)
        .reduce(),
        "its pickle calls numpy's `_reconstruct` with arguments numpy never writes.",
    ),
}


@pytest.mark.parametrize("name", sorted(FORGED))
def test_forged_numpy_object_is_refused(tmp_path: Path, name: str) -> None:
    pickle, message = FORGED[name]
    wrapped = Pickle().dict().text("metadata").raw(bytes(pickle)[2:]).setitem().stop()
    assert refused(write_pt(tmp_path / "f.pt", wrapped)) == message


def test_genuine_numpy_objects_still_load(tmp_path: Path) -> None:
    p = Pickle().list().array((2, 2), "i4", np.arange(4, dtype=np.int32).tobytes()).append()
    _scalar(p, "f8", NATIVE["f8"], np.float64(0.25).tobytes()).append().stop()
    array, scalar = ptread.load(write_pt(tmp_path / "ok.pt", p))
    assert type(array) is np.ndarray and array.tolist() == [[0, 1], [2, 3]]
    assert array.flags.writeable and array.dtype == np.int32
    assert type(scalar) is np.float64 and scalar == 0.25


# --- amplification: in a child process with a memory and time limit ---------------------------


def _limited_load(path: Path) -> subprocess.CompletedProcess[str]:
    """`ptread.load(path)` in a child limited to MEMORY_LIMIT bytes of address space."""
    code = (
        "from tokenlake.read.pt import ptread\n"
        "from tokenlake.errors import PipelineError\n"
        "try:\n"
        f"    value = ptread.load({str(path)!r})\n"
        "except PipelineError as exc:\n"
        "    print(exc)\n"
        "else:\n"
        "    print('loaded', type(value).__name__)\n"
    )
    return run_limited(code, MEMORY_LIMIT, TIME_LIMIT)


def _bf16_tensors(count: int) -> Pickle:
    """`count` 256-element tensors on one 1 MB bfloat16 untyped storage (`_rebuild_tensor_v3`);
    widening the whole storage per tensor took 4 MB each."""
    p = Pickle().list().mark()
    for index in range(count):
        p.glob("torch._utils", "_rebuild_tensor_v3").mark()
        p.storage("UntypedStorage", "0", 1 << 20).int(index * 256).value((256,)).value((1,))
        p.false()
        p.glob("collections", "OrderedDict").tuple(0).reduce().glob("torch", "bfloat16")
        p.tuple().reduce()
    return p.appends().stop()


EXPANDS = "its values expand to more than {:,} items when shared references are followed"
AMPLIFIED = {
    "billion_laughs_in_metadata": (
        lambda: laughs(Pickle().dict().text("metadata")).setitem().stop(),
        None,
        EXPANDS,
    ),
    "billion_laughs_as_rollout_id": (
        lambda: laughs(Pickle().dict().text("rollout_id")).setitem().stop(),
        None,
        EXPANDS,
    ),
    "billion_laughs_as_persistent_id": (
        lambda: laughs(Pickle()).persid().stop(),
        None,
        "its pickle holds an unknown persistent id (a `list`).",
    ),
    "stride_0_tensor": (
        lambda: Pickle().tensor("FloatStorage", "0", 1, 0, (100_000, 100_000), (0, 0)).stop(),
        {"0": b"\0" * 4},
        EXPANDS,
    ),
    "bytes_of_4e9": (
        lambda: Pickle().glob("builtins", "bytes").int(4 * 10**9).tuple(1).reduce().stop(),
        None,
        "its pickle calls `bytes` with arguments other than bytes or text.",
    ),
    "long_binput_2_28": (
        lambda: Pickle().list().raw(b"r" + (2**28).to_bytes(4, "little")).stop(),
        None,
        "its pickle is corrupt (memo index 268435456 is larger than the whole pickle).",
    ),
    "binbytes8_of_1_tb": (
        lambda: Pickle().raw(b"\x8e" + (2**40).to_bytes(8, "little")).stop(),
        None,
        "its pickle is corrupt (a 1099511627776-byte value runs past its end).",
    ),
    "bf16_storage_widened_per_tensor": (
        lambda: _bf16_tensors(1000),
        {"0": b"\0" * (1 << 20)},
        "loaded list",
    ),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(AMPLIFIED))
def test_amplification_is_bounded(tmp_path: Path, name: str) -> None:
    make, storages, message = AMPLIFIED[name]
    path = write_pt(tmp_path / "a.pt", make(), storages)
    started = time.monotonic()
    done = _limited_load(path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stderr == ""
    line = done.stdout.rstrip("\n")
    assert "\n" not in line and time.monotonic() - started < TIME_LIMIT
    if message == EXPANDS:
        budget = 4 * path.stat().st_size + (1 << 20)
        assert line.startswith(f"Cannot read `{path}`: " + EXPANDS.format(budget))
    elif message.startswith("loaded"):
        assert line == message
    else:
        assert line == f"Cannot read `{path}`: {message}"


def _bomb(tmp_path: Path, method: int, declared: int | None = None) -> Path:
    """A storage member of 64 MB of zeros, compressed (~60 KB deflate, ~50 B bzip2)."""
    member = Member("archive/data/0", b"\0" * (64 << 20), method, declared)
    p = Pickle().tensor("ByteStorage", "0", 16, 0, (16,), (1,)).stop()
    return write_pt(tmp_path / "bomb.pt", p, extra=[member])


@pytest.mark.slow
@pytest.mark.parametrize("method", [DEFLATED, BZIP2], ids=["deflate", "bzip2"])
def test_zip_bomb_member_is_refused(tmp_path: Path, method: int) -> None:
    path = _bomb(tmp_path, method)
    done = _limited_load(path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == (
        f"Cannot read `{path}`: entry `archive/data/0` would inflate to 67108864 bytes, more"
        f" than 8 times the file's size allows (a zip bomb).\n"
    )


@pytest.mark.slow
def test_bomb_that_understates_its_size_is_cut_at_the_declared_size(tmp_path: Path) -> None:
    path = _bomb(tmp_path, BZIP2, declared=16)
    done = _limited_load(path)
    assert (done.returncode, done.stderr, done.stdout) == (0, "", "loaded ndarray\n")


def test_thousands_of_compressed_storages_are_read_once_each(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = 6000
    p = Pickle().list().mark()
    for key in range(count):
        p.tensor("FloatStorage", str(key), 4, 0, (4,), (1,))
    p.appends().stop()
    data = {str(k): np.full(4, k, np.float32).tobytes() for k in range(count)}
    path = write_pt(tmp_path / "many.pt", p, data, method=DEFLATED)
    inflated: list[str] = []
    real_inflate = ptzip._inflate

    def counted(archive: Any, entry: Any, name: str, data: int, size: int) -> memoryview:
        inflated.append(name)
        return real_inflate(archive, entry, name, data, size)

    monkeypatch.setattr(ptzip, "_inflate", counted)
    started = time.monotonic()
    tensors = ptread.load(path)
    # Under a second here, even on a loaded machine; re-copying the file per storage took 97 s.
    assert time.monotonic() - started < 30.0
    members = ["archive/data.pkl", *(f"archive/data/{k}" for k in range(count))]
    assert sorted(inflated) == sorted(members)  # the pickle and each storage inflated once
    assert len(tensors) == count and tensors[-1].tolist() == [5999.0] * 4


def test_bf16_untyped_storage_is_widened_once(tmp_path: Path) -> None:
    path = write_pt(tmp_path / "bf.pt", _bf16_tensors(3), {"0": b"\x80\x3f" * (1 << 19)})
    tensors = ptread.load(path)
    assert all(np.shares_memory(tensors[0].base, t) for t in tensors)
    assert tensors[2].dtype == np.float32 and tensors[2].tolist() == [1.0] * 256


def test_cyclic_and_deep_shared_values_are_refused(tmp_path: Path) -> None:
    cyclic = Pickle().list().put(0).get(0).append().stop()
    assert refused(write_pt(tmp_path / "c.pt", cyclic)) == (
        "its pickle holds a cyclic reference (a container inside itself)."
    )
    # nesting is checked when the values are walked (shared references or numpy objects)
    deep = Pickle().list().put(0).get(0).raw(b"0" + b"]" * 101 + b"a" * 100).stop()
    assert refused(write_pt(tmp_path / "d.pt", deep)) == (
        "its values are nested more than 100 levels deep."
    )
    tree = Pickle().raw(b"]" * 101 + b"a" * 100).stop()  # a tree is no bigger than its pickle
    assert len(str(ptread.load(write_pt(tmp_path / "t.pt", tree)))) == 202


def test_error_messages_quote_a_short_prefix(tmp_path: Path) -> None:
    name = "A" * 10_000
    p = Pickle().glob("builtins", "getattr").glob("miles.utils.types", "Sample").text(name)
    message = refused(write_pt(tmp_path / "g.pt", p.tuple(2).reduce().stop()))
    assert message == (
        f"its pickle references `miles.utils.types.Sample.{'A' * 60}…`, which is not on"
        " tokenlake's allow-list of safe classes (nothing from the file was executed)."
    )


def test_error_messages_escape_and_cut_a_name_from_the_file(tmp_path: Path) -> None:
    key = "\x1b[2J\r0 skipped\n" + "k" * 100  # a storage key moving the cursor, then long
    path = write_pt(tmp_path / "k.pt", Pickle().storage("FloatStorage", key, 1).stop())
    assert refused(path) == (
        f"the zip archive has no entry `archive/data/\\x1b[2J\\r0 skipped\\n{'k' * 32}…`."
    )


# --- files that change while they are read ---------------------------------------------------


def test_file_truncated_while_read_is_an_error_not_sigbus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    p = Pickle().tensor("FloatStorage", "0", 1 << 18, 0, (1 << 18,), (1,)).stop()
    path = write_pt(tmp_path / "t.pt", p, {"0": b"\0" * (1 << 20)})
    size = path.stat().st_size
    real_open = open

    def open_then_truncate(file: Path, mode: str) -> object:
        handle = real_open(file, mode)
        os.truncate(file, size // 2)  # another process cuts the file after we opened it
        return handle

    monkeypatch.setattr(ptzip, "open", open_then_truncate, raising=False)
    with pytest.raises(DumpFileError) as err:
        ptread.load(path)
    assert err.value.still_writing
    assert str(err.value) == (
        f"Cannot read `{path}`: the file changed size while it was read ({size} bytes when"
        f" opened, {size // 2} after).{STILL_WRITING}"
    )


@pytest.mark.slow
def test_truncating_a_file_in_a_reading_loop_never_kills_the_process(tmp_path: Path) -> None:
    """A child reads (and sums) an old 64 MB file in a loop while this process cuts it to 1 MB
    and writes it back in place; the memory-mapping reader died of SIGBUS here (exit -7)."""
    p = Pickle().tensor("ByteStorage", "0", 64 << 20, 0, (64 << 20,), (1,)).stop()
    path = write_pt(tmp_path / "big.pt", p, {"0": b"\1" * (64 << 20)})
    whole = path.read_bytes()
    code = (
        "from tokenlake.read.pt import ptread\nfrom tokenlake.errors import PipelineError\n"
        f"for _ in range(40):\n    try:\n        ptread.load({str(path)!r}).sum()\n"
        "    except PipelineError as exc:\n        assert '\\n' not in str(exc)\n"
        "print('survived')\n"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    while child.poll() is None:
        os.truncate(path, 1 << 20)
        time.sleep(0.005)
        with path.open("r+b") as f:
            f.write(whole)
        past = time.time() - 7200  # old again: the reader must not treat it as being written
        os.utime(path, (past, past))
        time.sleep(0.02)
    assert child.returncode == 0 and child.stdout is not None
    assert child.stdout.read() == "survived\n"


# --- end to end: the CLI prints one line, the other steps land -------------------------------


@pytest.mark.slow
def test_extract_skips_a_hostile_rollout_file_and_lands_the_rest(tmp_path: Path) -> None:
    from tests.e2e.test_bad_input import (
        REPLACE,
        STEP_0_AND_EVAL,
        copy_dump,
        extract,
        lake_steps,
        summary_line,
    )

    dump = copy_dump(tmp_path)
    hostile = laughs(Pickle().dict().text("metadata")).setitem().stop()
    bad = write_pt(dump / "rollout_data" / "1.pt", hostile)
    code, out, err = extract(dump, tmp_path / "lake")
    budget = 4 * bad.stat().st_size + (1 << 20)
    assert err == [
        f"Skipped step 1: Cannot read `{bad}`: {EXPANDS.format(budget)} (at most 4 per byte of"
        f" the file), so it is refused as an amplification attack. {REPLACE}"
    ]
    counts = "2 new, 0 updated, 0 unchanged, 0 removed, 1 skipped"
    assert (code, out) == (1, summary_line("basic", tmp_path / "lake", counts, 12, 124))
    assert lake_steps(tmp_path / "lake", "basic") == STEP_0_AND_EVAL


@pytest.mark.slow
def test_extract_skips_a_forged_dtype_in_a_train_file(tmp_path: Path) -> None:
    from tests.e2e.test_bad_input import EVAL_AND_STEP_1, REPLACE, copy_dump, extract, lake_steps

    dump = copy_dump(tmp_path)
    pickle, message = FORGED["dtype_with_object_field"]
    bad = write_pt(dump / "train_data" / "0_1.pt", Pickle().raw(bytes(pickle)[2:]).stop())
    code, _, err = extract(dump, tmp_path / "lake")
    assert err == [f"Skipped step 0: rank 1: Cannot read `{bad}`: {message} {REPLACE}"]
    assert code == 1 and lake_steps(tmp_path / "lake", "basic") == EVAL_AND_STEP_1


def test_integers_chosen_to_collide_in_a_dict_are_refused(tmp_path: Path) -> None:
    modulus = sys.hash_info.modulus  # every multiple hashes to 0: n keys cost n**2 / 2
    p = Pickle().dict().mark()
    for k in range(1, 20_001):
        p.int(k * modulus).none()
    message = refused(write_pt(tmp_path / "h.pt", p.raw(b"u").stop()))
    assert message == (
        "its pickle holds more than 4096 integers of 2**61 or more; tokenlake refuses them"
        " (such integers can be chosen to share a hash and stall any dict or set holding them)."
    )
    ok = Pickle().list().mark()
    for k in range(1, 4097):
        ok.int(k * modulus)
    assert len(ptread.load(write_pt(tmp_path / "ok.pt", ok.appends().stop()))) == 4096


def test_train_columns_of_stride_0_tensors_are_refused(tmp_path: Path) -> None:
    from tokenlake.read import dump

    p = Pickle().dict().text("rollout_data").dict().mark()
    for column in ("sample_indices", "response_lengths", "total_lengths", "tokens", "loss_masks"):
        p.text(column).tensor("LongStorage", "0", 1, 0, (10**8,), (0,))
    p.raw(b"u").setitem().stop()
    path = write_pt(tmp_path / "0_0.pt", p, {"0": b"\0" * 8})
    with pytest.raises(DumpFileError) as err:
        dump.load_train(path, 0, 0)
    budget = 4 * path.stat().st_size + (1 << 20)
    assert str(err.value) == (
        f"Cannot read `{path}`: {EXPANDS.format(budget)} (at most 4 per byte of the file),"
        " so it is refused as an amplification attack."
    )


# --- the opcode check's fast paths (runs of floats, single opcodes) -----------------------------


def _floats(count: int, value: float = 0.5) -> Pickle:
    """A list of `count` BINFLOATs: the opcode check counts them by their opcode bytes 9 apart."""
    p = Pickle().list().mark()
    for _ in range(count):
        p.float(value)
    return p.appends()


# 'G' * 8 as float payload: opcode-like bytes inside the data must never be read as opcodes
GGG = struct.unpack(">d", b"G" * 8)[0]


@pytest.mark.parametrize("count", [1, 2, 4095, 4096, 4097, 9000])
@pytest.mark.parametrize("value", [0.5, GGG])
def test_memo_index_after_a_run_of_floats_is_refused(count: int, value: float) -> None:
    bad = _floats(count, value).raw(b"r" + (2**28).to_bytes(4, "little")).stop()
    with pytest.raises(ptzip.Corrupt) as err:
        ptcheck.check_opcodes(bytes(bad))
    assert err.value.reason == (
        "its pickle is corrupt (memo index 268435456 is larger than the whole pickle)"
    )
    assert ptcheck.check_opcodes(bytes(_floats(count, value).put(0).stop())) is False


@pytest.mark.parametrize("count", [1, 4096, 4097])
def test_a_list_shared_after_a_run_of_floats_is_noticed(count: int) -> None:
    p = _floats(count).put(0).get(0).get(0).tuple(2).stop()
    assert ptcheck.check_opcodes(bytes(p)) is True
    atom = _floats(count).text("a").put(0).get(0).get(0).tuple(3).stop()
    assert ptcheck.check_opcodes(bytes(atom)) is False


@pytest.mark.parametrize("tail", [b"", b"\x00\x01", b"\x00" * 7])
@pytest.mark.parametrize("count", [0, 1, 4096])
def test_a_float_cut_off_by_the_end_is_left_to_the_unpickler(
    tmp_path: Path, count: int, tail: bytes
) -> None:
    p = _floats(count).raw(b"G" + tail)
    assert ptcheck.check_opcodes(bytes(p)) is False
    assert refused(write_pt(tmp_path / "cut.pt", p)) == (
        "its pickle is corrupt (UnpicklingError: pickle data was truncated)."
    )


def test_single_opcodes_between_memo_opcodes_are_checked_one_by_one() -> None:
    # a fixed-size opcode alone (not a run) before a LONG_BINPUT, a BINUNICODE and a bad length
    p = Pickle().list().put(0).int(7).raw(b"r" + (2**28).to_bytes(4, "little")).stop()
    with pytest.raises(ptzip.Corrupt, match="memo index 268435456"):
        ptcheck.check_opcodes(bytes(p))
    q = Pickle().int(3).put(1).text("x").raw(b"X" + (2**31 - 1).to_bytes(4, "little"))
    with pytest.raises(ptzip.Corrupt, match=r"a 2147483647-byte value runs past its end"):
        ptcheck.check_opcodes(bytes(q))


def _mixed() -> Pickle:
    """A list of floats mixed with ints: runs of fewer than 8 floats in a row."""
    p = Pickle().list().mark()
    for k in range(3000):
        p.float(0.5).int(k % 200) if k % 3 else p.float(GGG).float(0.25).int(70_000)
    return p.appends()


def test_floats_mixed_with_other_opcodes_are_checked_to_the_end_of_their_run() -> None:
    bad = _mixed().raw(b"r" + (2**28).to_bytes(4, "little")).stop()
    with pytest.raises(ptzip.Corrupt, match="memo index 268435456"):
        ptcheck.check_opcodes(bytes(bad))
    assert ptcheck.check_opcodes(bytes(_mixed().put(0).get(0).get(0).tuple(2).stop())) is True
    assert ptcheck.check_opcodes(bytes(_mixed().put(0).stop())) is False


# --- the vectorised opcode check gives the exact scan's verdicts ----------------------------------


def _exact(data: bytes) -> bool | str:
    """The reference: the opcode-by-opcode scan's verdict or its error text."""
    try:
        return ptcheck._Scan(data).run()
    except ptzip.Corrupt as err:
        return err.reason


def _verdict(data: bytes) -> bool | str:
    try:
        return ptcheck.check_opcodes(data)
    except ptzip.Corrupt as err:
        return err.reason


def _random_value(rng: random.Random, depth: int = 0) -> object:
    pick = rng.random()
    if depth > 3 or pick < 0.3:
        return rng.choice(
            [
                rng.randint(-300, 70_000),
                rng.random(),
                2 ** rng.randint(50, 80),
                "x" * rng.randint(0, 80),
                b"y" * rng.randint(0, 70),
                None,
                True,
            ]
        )
    if pick < 0.5:
        return [_random_value(rng, depth + 1) for _ in range(rng.randint(0, 6))]
    if pick < 0.65:
        return tuple(_random_value(rng, depth + 1) for _ in range(rng.randint(0, 4)))
    return {rng.randint(0, 9): _random_value(rng, depth + 1) for _ in range(rng.randint(0, 4))}


# Inserted by the mutations: memo opcodes, texts, huge integers, cut-offs, unknown opcodes.
_INSERTS = [b"h", b"q", b"j", b"r", b"2", b"\x94", b"p1\n", b"g1\n", b"G", b"\x8a", b"X"]
_INSERTS += [b"I1234567890123456789012\n", b"\x80", b"\x95", b"\xff", b".", b"(", b"\n", b"c"]


def _mutated(rng: random.Random, data: bytes) -> bytes:
    out = bytearray(data)
    for _ in range(rng.randint(1, 4)):
        pick, at = rng.random(), rng.randrange(len(out) + 1)
        if pick < 0.3 and out:
            out[min(at, len(out) - 1)] = rng.randrange(256)
        elif pick < 0.5:
            out[at:at] = rng.choice(_INSERTS) + rng.randbytes(rng.randint(0, 4))
        elif pick < 0.6:
            del out[at:]
        elif pick < 0.7:
            del out[at : at + rng.randint(1, 5)]
        else:
            source = rng.randrange(len(out) + 1)
            out[at:at] = out[source : source + rng.randint(1, 12)]
    return bytes(out)


@pytest.mark.parametrize("seed", range(4))
def test_vector_scan_agrees_with_the_exact_scan(seed: int) -> None:
    rng = random.Random(seed)
    decided = 0
    for _ in range(1500):
        value = _random_value(rng)
        data = pickle.dumps([value, value] if rng.random() < 0.5 else value, rng.choice([2, 3]))
        data = _mutated(rng, data) if rng.random() < 0.8 else data
        exact, vector = _exact(data), ptvector.vector_scan(data)
        assert vector is None or vector is exact, data
        assert _verdict(data) == exact, data
        decided += vector is not None
    assert decided > 300  # most unmutated pickles and some mutated ones are decided


@pytest.mark.parametrize("seed", range(2))
def test_vector_scan_path_walk_agrees_with_pointer_doubling(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    texts = [bytes(_metadata(rng.randint(1, 300)).stop())]
    for _ in range(600):
        value = _random_value(rng)
        data = pickle.dumps([value, value] if rng.random() < 0.5 else value, rng.choice([2, 3]))
        texts.append(_mutated(rng, data) if rng.random() < 0.8 else data)
    paths = []
    for data in texts:
        codes = np.frombuffer(data, np.uint8)
        paths.append(ptvector._next_opcodes(codes, ptvector._KIND[codes], data + bytes(4))[0])
    walked = [ptvector._path(nxt).tolist() for nxt in paths]
    monkeypatch.setattr(ptvector, "_MAX_SKIPS", -1)  # every path by pointer doubling
    assert [ptvector._path(nxt).tolist() for nxt in paths] == walked
    assert all(path[-1] == len(data) for path, data in zip(walked, texts, strict=True))


def _metadata(tensors: int) -> Pickle:
    """Tensor metadata like a rank file's: memo PUTs between short runs of opcodes."""
    p = Pickle().dict().put(0).mark()
    for k in range(tensors):
        p.text(f"column_{k}").put(1 + 2 * k)
        p.tensor("LongStorage", str(k), 8, 0, (8,), (1,)).put(2 + 2 * k)
    return p.raw(b"u")


@pytest.mark.parametrize(
    ("tail", "verdict"),
    [
        (lambda p: p.stop(), False),
        (lambda p: p.get(2).get(2).tuple(2).stop(), True),  # a tensor referenced again
        (lambda p: p.get(1).get(1).tuple(2).stop(), False),  # a short string referenced again
        (lambda p: p.raw(b"r" + (2**28).to_bytes(4, "little")).stop(), None),
        (lambda p: p.raw(b"X" + (2**31 - 1).to_bytes(4, "little")), None),
        (lambda p: p.raw(b"\x8a\x09" + b"\xff" * 8 + b"\x7f").stop(), False),
    ],
)
def test_vector_scan_decides_tensor_metadata(tail: Any, verdict: bool | None) -> None:
    data = bytes(tail(_metadata(300)))
    assert ptvector.vector_scan(data) is verdict
    assert _verdict(data) == _exact(data)
    if verdict is None:  # an error: left to the exact scan, which words it
        assert isinstance(_exact(data), str)


def test_vector_scan_counts_huge_integers_like_the_exact_scan() -> None:
    huge = b"\x8a\x09" + b"\x00" * 8 + b"\x01"  # LONG1 2**64
    for count, verdict in [(ptcheck.MAX_HUGE_INTS, False), (ptcheck.MAX_HUGE_INTS + 1, None)]:
        data = bytes(_metadata(2).raw(b"(" + huge * count + b"l").stop())
        assert ptvector.vector_scan(data) is verdict
        assert _verdict(data) == _exact(data)
    assert "more than 4096 integers of 2**61 or more" in str(_exact(data))
