"""The bounded reader (`tokenlake.bounded`): regular files only, never blocking, at most
a stated size; JSON depth found before a parser recurses; lines at most a stated length."""

from __future__ import annotations

import io
import json
import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tokenlake import bounded
from tokenlake.errors import BoundedReadError


def refusal(path: Path, limit: int = 100, *, follow: bool = True) -> BoundedReadError:
    with pytest.raises(BoundedReadError) as caught:
        bounded.read_file(path, limit, "a test file", follow=follow)
    assert str(caught.value) == f"`{path}` {caught.value.problem}"
    return caught.value


def test_a_fifo_is_refused_without_blocking(tmp_path: Path) -> None:
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)  # no writer: an open without O_NONBLOCK would wait forever
    assert refusal(fifo).problem == "is a FIFO (named pipe), not a regular file"


def test_devices_directories_and_links_are_refused(tmp_path: Path) -> None:
    assert refusal(Path("/dev/zero")).problem == "is a character device, not a regular file"
    assert refusal(tmp_path).problem == "is a directory, not a regular file"
    real = tmp_path / "real.json"
    real.write_text("{}")
    link = tmp_path / "link.json"
    link.symlink_to(real)
    assert bounded.read_file(link, 100, "a test file") == b"{}"  # a dump may link its files
    problem = "is a symbolic link; tokenlake reads only a file it wrote"
    assert refusal(link, follow=False).problem == problem
    assert refusal(tmp_path / "none").problem == (
        "cannot be read: it does not exist (the OS says: [Errno 2] No such file or directory);"
        " check the path, and that nothing moves or deletes it meanwhile"
    )


def test_a_file_over_its_limit_names_its_size_and_the_limit(tmp_path: Path) -> None:
    path = tmp_path / "big.json"
    path.write_bytes(b"x" * 101)
    error = refusal(path)
    assert error.problem == "is 101 bytes; a test file may be at most 100 bytes"
    assert (error.size, error.limit) == (101, 100)
    os.truncate(path, 8 << 30)  # sparse: refused by its size, never read
    assert refusal(path, 64 << 20).problem == (
        "is 8,589,934,592 bytes; a test file may be at most 64 MiB"
    )
    path.write_bytes(b"x" * 100)
    assert bounded.read_file(path, 100, "a test file") == b"x" * 100


@pytest.mark.parametrize(
    ("text", "depth"),
    [
        (b"", 0),
        (b"1", 0),
        (b'"[[["', 0),
        (b'["\\\\", [["\\"]"]]]', 3),  # an escaped backslash ends the string, an escaped quote not
        (b'{"a": {"b": [1, {"c": "}}}}"}]}}', 4),
        (b"]]]][[", 0),  # more closing than opening: not JSON, never negative depth
    ],
)
def test_json_depth_counts_brackets_outside_strings(text: bytes, depth: int) -> None:
    assert bounded.json_depth(text) == depth


@pytest.mark.parametrize("chunk", [1, 2, 3, 5])
def test_json_depth_is_the_same_across_chunk_boundaries(
    monkeypatch: pytest.MonkeyPatch, chunk: int
) -> None:
    value = {"a\\": ['\\\\"[', {"b": [[["]]\\\\"]]]}], "c": "\\"}
    text = json.dumps(value).encode()
    whole = bounded.json_depth(text)
    monkeypatch.setattr(bounded, "SMALL_JSON", 0)  # the vectorised scan, chunk by chunk
    monkeypatch.setattr(bounded, "_DEPTH_CHUNK", chunk)
    assert bounded.json_depth(text) == whole == 6


def test_small_json_is_scanned_as_the_vectorised_scan_does() -> None:
    """Texts of the bytes that matter, in any order (valid JSON or not): the regex scan of
    small texts gives the vectorised scan's depth and object count."""
    generator = random.Random(34)
    alphabet = b'[]{}"\\a,|z~;=\xdb\xfd'  # and bytes one bit or one step from `[\\]{|}`
    texts = [bytes(generator.choices(alphabet, k=generator.randrange(40))) for _ in range(5_000)]
    texts.append(json.dumps({"a\\": ['\\\\"[', {"b": [[["]]\\\\"]]]}], "c": "\\"}).encode())
    differ = [
        text
        for text in texts
        if bounded._small_json_shape(text) != bounded._vectorised_json_shape(text, None)
    ]
    assert differ == []
    assert bounded._small_json_shape(texts[-1]) == bounded.JsonShape(depth=6, objects=12)


def test_the_structural_bytes_are_marked_and_only_they_and_the_pipe() -> None:
    codes = np.arange(256, dtype=np.uint8)
    marked = bytes(codes[bounded._structural(codes)].tolist())
    assert marked == b'"[\\]{|}'


def test_loads_refuses_deep_json_before_parsing() -> None:
    with pytest.raises(bounded.JsonTooDeep, match="^nested more than 16 levels deep$"):
        bounded.loads("[" * 200_000 + "]" * 200_000, 16)
    assert bounded.loads(b"[" * 16 + b"]" * 16, 16) == json.loads("[" * 16 + "]" * 16)


def test_lines_skips_a_long_line_and_resumes_inside_one(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bounded, "READ_CHUNK", 4)
    data = b"ab\n" + b"x" * 20 + b"\ncd\n" + b"y" * 20
    got = [
        (line.start, line.end, line.text, line.complete)
        for line in bounded.lines(io.BytesIO(data), 0, len(data), 5)
    ]
    assert got == [
        (0, 3, b"ab", True),
        (3, 24, None, True),
        (24, 27, b"cd", True),
        (27, 47, None, False),
    ]
    rest = data + b"zz\nok\n"
    resumed = list(bounded.lines(io.BytesIO(rest), 47, len(rest), 5, inside_long=True))
    assert [(line.text, line.complete) for line in resumed] == [(None, True), (b"ok", True)]


def _lines_as_split(data: bytes, start: int, max_line: int, inside_long: bool) -> list[Any]:
    """What `bounded.lines` must give, found by splitting the bytes at each newline."""
    got, position = [], start
    for number, piece in enumerate(data[start:].split(b"\n")):
        complete = position + len(piece) < len(data)
        if not complete and not piece and not (inside_long and number == 0):
            break
        end = position + len(piece) + complete
        skipped = len(piece) > max_line or (inside_long and number == 0)
        got.append((position, end, None if skipped else piece, complete))
        position = end
    return got


def test_lines_are_the_lines_split_at_each_newline_whatever_the_chunks(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    generator = random.Random(34)
    for _ in range(3_000):
        data = bytes(generator.choices(b"ab\n", weights=(4, 4, 1), k=generator.randrange(60)))
        start = generator.randrange(len(data) + 1)
        max_line, inside_long = generator.randrange(12), generator.random() < 0.2
        monkeypatch.setattr(bounded, "READ_CHUNK", generator.randrange(1, 9))
        handle = io.BytesIO(data)
        got = bounded.lines(handle, start, len(data), max_line, inside_long=inside_long)
        assert [(line.start, line.end, line.text, line.complete) for line in got] == (
            _lines_as_split(data, start, max_line, inside_long)
        ), (data, start, max_line, inside_long, bounded.READ_CHUNK)


def test_lines_skips_the_holes_of_a_sparse_file(tmp_path: Path) -> None:
    path = tmp_path / "sparse.jsonl"
    path.write_bytes(b"a\n{")
    os.truncate(path, 16 << 30)
    with open(path, "ab") as handle:
        handle.write(b"}\nb\n")
    with open(path, "rb") as raw:
        handle = Counting(raw)
        size = os.fstat(handle.fileno()).st_size
        got = [(line.text, line.end) for line in bounded.lines(handle, 0, size, 1 << 20)]  # type: ignore[arg-type]
    assert got == [(b"a", 2), (None, size - 2), (b"b", size)]
    assert handle.bytes_read < 4 << 20  # the 16 GiB hole was never read


class Counting:
    """A file handle that counts the bytes read through it."""

    def __init__(self, handle: io.BufferedReader) -> None:
        self.handle = handle
        self.bytes_read = 0

    def readinto(self, buffer: memoryview) -> int:
        got = self.handle.readinto(buffer)
        self.bytes_read += got
        return got

    def seek(self, offset: int) -> int:
        return self.handle.seek(offset)

    def fileno(self) -> int:
        return self.handle.fileno()
