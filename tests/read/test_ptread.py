"""`tokenlake.read.pt.ptread.load` against `torch.load`, and its refusals (unsafe pickles, bad files)."""

from __future__ import annotations

import math
import mmap
import os
import pickle
import random
import sys
import time
import types
import zipfile
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.fixture_paths import REAL_DUMPS
from tokenlake.errors import DumpFileError, DumpNotFoundError, UnsafePickleError
from tokenlake.read.pt import ptglobals, ptread, ptzip

DUMPS = REAL_DUMPS
REAL_FILES = sorted(DUMPS.glob("*/*/*.pt"))

FRESH_HINT = (
    " It was modified less than a minute ago and is probably still being written;"
    " extract again later."
)

# --- the torch reference and the structural comparison ---------------------------------------


def _to_numpy(value: Any) -> Any:
    """Tensors -> numpy (bf16 widened to float32), containers rebuilt with the same types."""
    import torch

    if isinstance(value, torch.Tensor):
        if value.dtype == torch.bfloat16:
            value = value.float()
        return value.numpy()
    if isinstance(value, dict):
        return type(value)((k, _to_numpy(v)) for k, v in value.items())
    if isinstance(value, (list, tuple)):
        return type(value)(_to_numpy(v) for v in value)
    return value


def load_torch_reference(path: Path) -> Any:
    """What `torch.load` gives, with tensors as numpy arrays (bf16 -> float32)."""
    import torch

    return _to_numpy(torch.load(path, weights_only=False, map_location="cpu"))


def assert_same(got: Any, want: Any, where: str = "root") -> None:
    """Exact structural equality: types, key order, lengths, dtypes, shapes, bits."""
    assert type(got) is type(want), f"{where}: {type(got)} != {type(want)}"
    if isinstance(want, dict):
        assert list(got) == list(want), f"{where}: keys differ"
        for key in want:
            assert_same(got[key], want[key], f"{where}[{key!r}]")
    elif isinstance(want, (list, tuple)):
        assert len(got) == len(want), f"{where}: length {len(got)} != {len(want)}"
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_same(g, w, f"{where}[{i}]")
    elif isinstance(want, np.ndarray):
        assert (got.dtype, got.shape) == (want.dtype, want.shape), where
        # bytes compare NaN payloads and -0.0 exactly, which `==` cannot
        assert np.ascontiguousarray(got).tobytes() == np.ascontiguousarray(want).tobytes(), where
    elif isinstance(want, float) and math.isnan(want):
        assert math.isnan(got), where
    else:
        assert got == want, f"{where}: {got!r} != {want!r}"


def _owner(array: np.ndarray) -> Any:
    """The object whose memory an array views (through views and memoryviews)."""
    base: Any = array
    while isinstance(base, np.ndarray):
        base = base.base
    return base.obj if isinstance(base, memoryview) else base


def _age(path: Path, seconds: float = 3600.0) -> Path:
    """Backdate a file so `load` memory-maps it and never calls it still being written."""
    past = time.time() - seconds
    os.utime(path, (past, past))
    return path


def _save(obj: Any, path: Path, *, old: bool = True) -> Path:
    import torch

    torch.save(obj, path)
    return _age(path) if old else path


# --- differential tests ---------------------------------------------------------------------


def test_real_fixtures_are_present() -> None:
    assert len(REAL_FILES) == 57


@pytest.mark.slow
@pytest.mark.parametrize("path", REAL_FILES, ids=lambda p: "/".join(p.parts[-3:]))
def test_real_dump_equals_torch(path: Path) -> None:
    assert_same(ptread.load(path), load_torch_reference(path))


def _every_kind_of_value() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(0)
    base = torch.randn(4, 6, generator=g)
    shared = torch.arange(20, dtype=torch.int64)
    special = torch.tensor([math.nan, math.inf, -math.inf, -0.0, 1e-40, 3.0e38, 1.5])
    return {
        "f32": base,
        "f64": base.double(),
        "f16": special.half(),
        "bf16": special.bfloat16(),
        "bf16_matrix": base.bfloat16().t(),
        "i64": torch.tensor([-(2**62), 0, 2**62]),
        "i32": torch.tensor([-7, 8], dtype=torch.int32),
        "i16": torch.tensor([-300, 300], dtype=torch.int16),
        "i8": torch.tensor([-128, 127], dtype=torch.int8),
        "u8": torch.tensor([0, 255], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True]),
        "transposed": base.t(),
        "sliced": base[1:3, 2:5],
        "shared": [shared[3:9], shared.view(4, 5), shared[::2]],
        "scalar_0d": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
        "expanded": torch.tensor([1.0, 2.0]).expand(3, 2),
        "routed_experts": np.arange(2 * 3 * 4, dtype=np.int32).reshape(2, 3, 4),
        "np_f64": np.float64(0.25),
        "np_bool": np.bool_(True),
        "np_i64": np.int64(-3),
        "od": OrderedDict([("z", 1), ("a", [1.0, None, "s"])]),
        "nested": {"a": {"b": [{"c": (1, 2.0)}], "t": (True, None)}, "bytes": b"\x00\xff", "": b""},
        "floats": [random.Random(1).random() for _ in range(50_000)] + [math.nan, -0.0],
        "ints": list(range(-5, 50_000)),
        "misc": {1, 2},
    }


@pytest.mark.slow
def test_every_value_kind_equals_torch(tmp_path: Path) -> None:
    path = _save(_every_kind_of_value(), tmp_path / "all.pt")
    got = ptread.load(path)
    assert_same(got, load_torch_reference(path))
    assert got["bf16"].dtype == np.float32 and got["f16"].dtype == np.float16


@pytest.mark.slow
def test_uint16_and_untyped_storage_equal_torch(tmp_path: Path) -> None:
    """Dtypes without a legacy storage class go through `_rebuild_tensor_v3`."""
    import torch

    value = {"u16": torch.tensor([[1, 65535]], dtype=torch.uint16), "raw": torch.arange(3.0)}
    path = _save(value, tmp_path / "v3.pt")
    got = ptread.load(path)
    assert got["u16"].tolist() == [[1, 65535]] and got["u16"].dtype == np.uint16
    assert_same(got, load_torch_reference(path))


DTYPES = ["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8"]


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(
    dtype=st.sampled_from([*DTYPES, "bool"]),
    shape=st.lists(st.integers(0, 4), min_size=0, max_size=3),
    transpose=st.booleans(),
    offset=st.integers(0, 3),
)
def test_random_tensor_equals_torch(
    tmp_path_factory: pytest.TempPathFactory,
    dtype: str,
    shape: list[int],
    transpose: bool,
    offset: int,
) -> None:
    import torch

    numel = math.prod(shape)
    flat = torch.randn(numel + offset, generator=torch.Generator().manual_seed(numel)) * 50
    tensor = flat.to(getattr(torch, dtype))[offset:].view(shape)
    if transpose and tensor.dim() >= 2:
        tensor = tensor.transpose(0, -1)
    path = _save({"t": tensor}, tmp_path_factory.mktemp("h") / "t.pt")
    assert_same(ptread.load(path), load_torch_reference(path))


@pytest.mark.slow
def test_tensors_are_writable_zero_copy_views(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import torch

    shared = torch.arange(10, dtype=torch.float32)
    path = _save({"a": shared[2:6], "b": shared.view(2, 5)}, tmp_path / "v.pt")
    before = path.read_bytes()
    small = ptread.load(path)  # a small file is copied into a bytearray, as private
    assert isinstance(_owner(small["a"]), bytearray) and small["a"].flags.writeable
    monkeypatch.setattr(ptzip, "HEAP_MAX", 0)  # larger files: an anonymous map
    got = ptread.load(path)
    assert np.shares_memory(got["a"], got["b"])
    assert isinstance(_owner(got["a"]), mmap.mmap) and got["a"].flags.writeable
    got["a"][0] = 99.0
    assert got["b"][0].tolist() == [0.0, 1.0, 99.0, 3.0, 4.0]
    assert path.read_bytes() == before  # the map is private: the file never changes


@pytest.mark.slow
def test_compressed_entries_are_read_into_memory(tmp_path: Path) -> None:
    import torch

    source = _save({"x": torch.arange(6).view(2, 3).t(), "y": [0.5] * 3}, tmp_path / "s.pt")
    packed = tmp_path / "packed.pt"
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(packed, "w", zipfile.ZIP_DEFLATED) as dst:
        for info in src.infolist():
            dst.writestr(info.filename, src.read(info))
    assert_same(ptread.load(_age(packed)), load_torch_reference(source))


# --- miles dataclasses -> local stand-ins ------------------------------------------------------


def _fake_miles_types(slots: bool) -> types.ModuleType:
    """A stand-in `miles.utils.types` so torch.save can pickle the real class names."""
    module = types.ModuleType("miles.utils.types")

    @dataclass(frozen=True, slots=slots)
    class AdapterRef:
        name: str
        slot: int

    @dataclass(frozen=True, slots=slots)
    class RewardSpec:
        rm_type: str | None = None
        custom_rm_path: str | None = None

    class Sample:
        @dataclass
        class SpecInfo:
            spec_accept_token_num: int = 0
            spec_draft_token_num: int = 0
            spec_verify_ct: int = 0
            completion_token_num: int = 0

    for cls, qualname in [
        (AdapterRef, "AdapterRef"),
        (RewardSpec, "RewardSpec"),
        (Sample, "Sample"),
        (Sample.SpecInfo, "Sample.SpecInfo"),
    ]:
        cls.__module__, cls.__qualname__ = module.__name__, qualname
    module.AdapterRef, module.RewardSpec, module.Sample = AdapterRef, RewardSpec, Sample
    return module


@pytest.mark.slow
@pytest.mark.parametrize("slots", [False, True])
def test_miles_dataclasses_become_stand_ins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slots: bool
) -> None:
    fake = _fake_miles_types(slots)
    for name in ("miles", "miles.utils"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "miles.utils.types", fake)
    sample = {
        "adapter": fake.AdapterRef(name="math", slot=2),
        "reward_spec": fake.RewardSpec(rm_type="deepscaler"),
        "spec_info": fake.Sample.SpecInfo(5, 8, 3, 11),
    }
    got = ptread.load(_save({"samples": [sample]}, tmp_path / "m.pt"))["samples"][0]
    assert got["adapter"] == ptglobals.AdapterRef(name="math", slot=2)
    assert got["reward_spec"] == ptglobals.RewardSpec(rm_type="deepscaler", custom_rm_path=None)
    info = got["spec_info"]
    assert type(info) is ptglobals.SpecInfo
    assert (info.spec_accept_token_num, info.spec_draft_token_num) == (5, 8)
    assert (info.spec_verify_ct, info.completion_token_num) == (3, 11)
    assert info.to_dict() == {
        "spec_accept_token_num": 5,
        "spec_draft_token_num": 8,
        "spec_verify_ct": 3,
        "completion_token_num": 11,
    }
    with pytest.raises(AttributeError):
        info.spec_verify_ct = 0  # frozen


def test_stand_in_classes_cannot_be_patched() -> None:
    with pytest.raises(TypeError, match="class SpecInfo is read-only"):
        ptglobals.SpecInfo.__setstate__ = None  # type: ignore[method-assign]


# --- unsafe pickles ---------------------------------------------------------------------------


def _pt_zip(path: Path, pickle_bytes: bytes, byteorder: bytes = b"little") -> Path:
    """A `.pt`-shaped zip around hand-written pickle bytes."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr("archive/data.pkl", pickle_bytes)
        zf.writestr("archive/byteorder", byteorder)
        zf.writestr("archive/.format_version", b"1")
    return path


def _system_pickle(marker: Path) -> bytes:
    """Protocol-2 pickle of ``{"x": os.system("touch <marker>")}``."""
    command = f"touch {marker}".encode()
    call = b"cos\nsystem\nX" + len(command).to_bytes(4, "little") + command + b"\x85R"
    return b"\x80\x02}X\x01\x00\x00\x00x" + call + b"s."


def test_os_system_is_refused_and_never_runs(tmp_path: Path) -> None:
    # The payload is live: the standard unpickler does run it.
    armed = tmp_path / "armed"
    pickle.loads(_system_pickle(armed))
    assert armed.exists()

    marker = tmp_path / "marker"
    path = _age(_pt_zip(tmp_path / "evil.pt", _system_pickle(marker)))
    with pytest.raises(UnsafePickleError) as err:
        ptread.load(path)
    assert str(err.value) == (
        f"Cannot read `{path}`: its pickle references `os.system`, which is not on tokenlake's"
        " allow-list of safe classes (nothing from the file was executed)."
    )
    assert err.value.global_name == "os.system" and not err.value.still_writing
    assert not marker.exists()


def _getattr_pickle(owner: bytes, name: bytes) -> bytes:
    """Protocol-2 pickle of ``getattr(<owner global>, name)``."""
    attr = b"X" + len(name).to_bytes(4, "little") + name
    return b"\x80\x02c__builtin__\ngetattr\nc" + owner + b"\n" + attr + b"\x86R."


@pytest.mark.parametrize(
    ("owner", "name", "refused"),
    [
        (
            b"miles.utils.types\nSample",
            b"PrefixCacheInfo",
            "miles.utils.types.Sample.PrefixCacheInfo",
        ),
        (b"collections\nOrderedDict", b"fromkeys", "getattr(collections.OrderedDict, 'fromkeys')"),
        (b"numpy\nndarray", b"__class__", "getattr(numpy.ndarray, '__class__')"),
    ],
)
def test_getattr_reaches_only_spec_info(
    tmp_path: Path, owner: bytes, name: bytes, refused: str
) -> None:
    ok = _age(
        _pt_zip(tmp_path / "ok.pt", _getattr_pickle(b"miles.utils.types\nSample", b"SpecInfo"))
    )
    assert ptread.load(ok) is ptglobals.SpecInfo
    path = _age(_pt_zip(tmp_path / "bad.pt", _getattr_pickle(owner, name)))
    with pytest.raises(UnsafePickleError) as err:
        ptread.load(path)
    assert err.value.global_name == refused


@pytest.mark.parametrize(
    ("global_line", "refused"),
    [
        (b"c__builtin__\neval\n", "builtins.eval"),
        (b"cposix\nsystem\n", "posix.system"),
        (b"ctorch\nload\n", "torch.load"),
        (b"cnumpy\nload\n", "numpy.load"),
        (b"cmiles.utils.types\nSample.Status\n", "miles.utils.types.Sample.Status"),
    ],
)
def test_other_globals_are_refused(tmp_path: Path, global_line: bytes, refused: str) -> None:
    path = _age(_pt_zip(tmp_path / "g.pt", b"\x80\x02" + global_line + b"."))
    with pytest.raises(UnsafePickleError) as err:
        ptread.load(path)
    assert err.value.global_name == refused


def test_codecs_encode_accepts_only_text_codecs(tmp_path: Path) -> None:
    path = _age(
        _pt_zip(
            tmp_path / "c.pt",
            b"\x80\x02c_codecs\nencode\nX\x01\x00\x00\x00aX\x04\x00\x00\x00zlib\x86R.",
        )
    )
    with pytest.raises(UnsafePickleError) as err:
        ptread.load(path)
    assert err.value.global_name == "_codecs.encode(str, 'zlib')"


# --- unreadable files -------------------------------------------------------------------------


def _message(path: Path, reason: str, fresh: bool) -> str:
    return f"Cannot read `{path}`: {reason}." + (FRESH_HINT if fresh else "")


def _torch_file(path: Path) -> Path:
    import torch

    torch.save({"x": torch.arange(1000, dtype=torch.float32), "y": [1.5] * 10}, path)
    return path


def _rezip(source: Path, target: Path, skip: str) -> Path:
    with zipfile.ZipFile(source) as src, zipfile.ZipFile(target, "w") as dst:
        for info in src.infolist():
            if not info.filename.endswith(skip):
                dst.writestr(info, src.read(info))
    return target


def _empty(tmp: Path) -> Path:
    path = tmp / "empty.pt"
    path.write_bytes(b"")
    return path


def _random(tmp: Path) -> Path:
    path = tmp / "random.pt"
    path.write_bytes(random.Random(0).randbytes(4096))
    return path


def _text(tmp: Path) -> Path:
    path = tmp / "text.pt"
    path.write_text("not a torch file\n")
    return path


def _truncated(tmp: Path) -> Path:
    whole = _torch_file(tmp / "whole.pt").read_bytes()
    path = tmp / "truncated.pt"
    path.write_bytes(whole[: len(whole) // 2])
    return path


def _no_pickle(tmp: Path) -> Path:
    return _rezip(_torch_file(tmp / "src.pt"), tmp / "nopkl.pt", "data.pkl")


def _no_storage(tmp: Path) -> Path:
    return _rezip(_torch_file(tmp / "src.pt"), tmp / "nostorage.pt", "/data/0")


def _bad_pickle(tmp: Path) -> Path:
    return _pt_zip(tmp / "badpkl.pt", b"\x80\x02}q\x00(X\x01\x00\x00\x00a")


BROKEN = [
    (_empty, "the file is empty (0 bytes)"),
    (_random, "it is not a zip archive, so `torch.save` did not write it"),
    (_text, "it is not a zip archive, so `torch.save` did not write it"),
    (
        _truncated,
        "the zip archive is incomplete (no central directory at its end), so the file is truncated",
    ),
    (_no_pickle, "the zip archive has no `data.pkl` entry, so `torch.save` did not write it"),
    (_no_storage, "the zip archive has no entry `src/data/0`"),
    (_bad_pickle, "its pickle is corrupt (EOFError: Ran out of input)"),
]


@pytest.mark.slow
@pytest.mark.parametrize("fresh", [True, False], ids=["fresh", "old"])
@pytest.mark.parametrize(("make", "reason"), BROKEN, ids=[m.__name__ for m, _ in BROKEN])
def test_unreadable_file_message(tmp_path: Path, make: Any, reason: str, fresh: bool) -> None:
    path = make(tmp_path)
    if not fresh:
        _age(path)
    with pytest.raises(DumpFileError) as err:
        ptread.load(path)
    assert type(err.value) is DumpFileError
    assert err.value.still_writing is fresh
    assert str(err.value) == _message(path, reason, fresh)


def test_big_endian_is_refused_even_when_fresh(tmp_path: Path) -> None:
    path = _pt_zip(tmp_path / "be.pt", pickle.dumps({"a": 1}, protocol=2), byteorder=b"big")
    with pytest.raises(DumpFileError) as err:
        ptread.load(path)
    assert str(err.value) == _message(
        path,
        "it was written on a big-endian machine (`byteorder` is `big`);"
        " tokenlake reads only little-endian dumps",
        fresh=False,
    )


def test_plain_pickle_in_zip_loads(tmp_path: Path) -> None:
    value = {"a": [1, 2.5, None, "x"], "b": OrderedDict(c=np.float64(1.0))}
    got = ptread.load(_pt_zip(tmp_path / "p.pt", pickle.dumps(value, protocol=2)))
    assert_same(got, value)


def test_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.pt"
    with pytest.raises(DumpNotFoundError) as err:
        ptread.load(path)
    assert str(err.value) == f"`{path}` does not exist"


@pytest.mark.slow
def test_fresh_file_is_copied_not_mapped_and_loads_the_same(tmp_path: Path) -> None:
    import torch

    path = _save(
        {"x": torch.arange(6.0).view(2, 3).t(), "b": torch.ones(2).bfloat16()},
        tmp_path / "f.pt",
        old=False,
    )
    got = ptread.load(path)
    assert isinstance(_owner(got["x"]), bytearray)  # a private copy: no SIGBUS if rewritten
    assert_same(got, load_torch_reference(path))


def test_fast_zip_directory_agrees_with_zipfile() -> None:
    buf = REAL_FILES[0].read_bytes()
    assert ptzip._fast_directory(buf) == ptzip._slow_directory(buf)
    assert ptzip._fast_directory(buf[:-10]) is None  # no end record: left to zipfile
