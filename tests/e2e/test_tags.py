"""pipeline/tokenlake/tags.py: `--tag key=value` and `--meta FILE` as a validated dict of strings."""

from __future__ import annotations

import builtins
import json

import pytest

from tokenlake import tags
from tokenlake.errors import UsageError


def _error(call, *args, **kwargs) -> str:
    with pytest.raises(UsageError) as err:
        call(*args, **kwargs)
    return str(err.value)


def test_tags_parse_and_override_the_file(tmp_path):
    meta = tmp_path / "meta.json"
    meta.write_text(json.dumps({"precision": "bf16", "lr": 1e-06, "seed": 3, "fp8": False}))
    assert tags.user_tags(["precision=fp8", "note=a=b", "empty="], meta) == {
        "precision": "fp8",
        "lr": "1e-06",
        "seed": "3",
        "fp8": "false",
        "note": "a=b",
        "empty": "",
    }
    assert tags.user_tags() == {}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fp8"], "--tag `fp8` is not `key=value`, e.g. `--tag precision=fp8`."),
        (
            ["=x"],
            "--tag `=x`: key `` must start with a letter or `_` and hold only letters, digits"
            " and `_.-/` (at most 64 characters).",
        ),
        (
            ["a b=1"],
            "--tag `a b=1`: key `a b` must start with a letter or `_` and hold only letters,"
            " digits and `_.-/` (at most 64 characters).",
        ),
        (
            ["k" * 65 + "=1"],
            f"--tag `{'k' * 65}=1`: key `{'k' * 64}…` must start with a letter or `_` and hold"
            " only letters, digits and `_.-/` (at most 64 characters).",
        ),
        (
            ["k=" + "v" * 1001],
            f"--tag `k={'v' * 78}…`: value of `k` is longer than 1000 characters.",
        ),
        (["k=a\nb"], "--tag `k=a\\nb`: value of `k` holds a control character (newline, tab)."),
        (["a=1", "a=2"], "--tag `a` is given twice, as `1` and `2`."),
    ],
)
def test_bad_tag_arguments(args, message):
    assert _error(tags.parse_tags, args) == message


def test_errors_stay_on_one_line():
    for args in (["a\nb"], ["a\rb=1"], ["a=1", "a=2\n"]):
        assert "\n" not in _error(tags.parse_tags, args)
        assert "\r" not in _error(tags.parse_tags, args)


def test_same_tag_twice_with_the_same_value_is_fine():
    assert tags.parse_tags(["a=1", "a=1", "team/owner=x.y-z"]) == {"a": "1", "team/owner": "x.y-z"}


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        ("[1]", "holds a list; expected an object of tags."),
        (
            "{",
            "is not valid JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1)).",
        ),
        ('{"a": null}', ": value of `a` is a null; give a string, number or boolean."),
        ('{"a": [1]}', ": value of `a` is a list; give a string, number or boolean."),
        ('{"a": NaN}', ": value of `a` is a float; give a string, number or boolean."),
        (
            '{"1a": "x"}',
            ": key `1a` must start with a letter or `_` and hold only letters, digits and `_.-/`"
            " (at most 64 characters).",
        ),
    ],
)
def test_bad_json_meta_files(tmp_path, content, problem):
    path = tmp_path / "m.json"
    path.write_text(content)
    assert (
        _error(tags.load_meta_file, path)
        == f"--meta `{path}`{'' if problem[0] == ':' else ' '}{problem}"
    )


def test_meta_file_missing_large_or_not_utf8(tmp_path, monkeypatch):
    missing = tmp_path / "none.json"
    assert _error(tags.load_meta_file, missing) == f"--meta `{missing}` is not a file."
    binary = tmp_path / "b.json"
    binary.write_bytes(b"\xff{}")
    assert _error(tags.load_meta_file, binary).startswith(f"--meta `{binary}` cannot be read (")
    monkeypatch.setattr(tags, "MAX_META_FILE_BYTES", 2)
    big = tmp_path / "big.json"
    big.write_text("{}   ")
    assert _error(tags.load_meta_file, big) == f"--meta `{big}` is larger than 2 bytes."


def test_yaml_meta_file(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "m.yaml"
    path.write_text("precision: fp8\nfp8: true\nbatch: 64\nnote: 'a: b'\n")
    assert tags.load_meta_file(path) == {
        "precision": "fp8",
        "fp8": "true",
        "batch": "64",
        "note": "a: b",
    }
    bad = tmp_path / "bad.yml"
    bad.write_text("a: [1\n")
    assert _error(tags.load_meta_file, bad).startswith(f"--meta `{bad}` is not valid YAML (")
    unsafe = tmp_path / "unsafe.yaml"
    unsafe.write_text("a: !!python/object/apply:os.system ['true']\n")
    assert _error(tags.load_meta_file, unsafe).startswith(f"--meta `{unsafe}` is not valid YAML (")
    keys = tmp_path / "keys.yaml"
    keys.write_text("1: x\n")
    assert _error(tags.load_meta_file, keys) == f"--meta `{keys}`: key `1` is not a string."


def test_yaml_without_pyyaml_says_what_to_do(tmp_path, monkeypatch):
    real_import = builtins.__import__

    def no_yaml(name, *args, **kwargs):
        if name == "yaml":
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_yaml)
    path = tmp_path / "m.yml"
    path.write_text("a: b\n")
    assert _error(tags.load_meta_file, path) == (
        f"--meta `{path}`: reading YAML needs PyYAML (`pip install pyyaml`); or give the file as JSON."
    )


def test_change_tags_and_tags_json():
    current = {"a": "1", "b": "2"}
    assert tags.change_tags(current, {"b": "3", "c": "4"}, remove=["a", "zzz"]) == {
        "b": "3",
        "c": "4",
    }
    assert current == {"a": "1", "b": "2"}
    assert _error(tags.change_tags, current, {"a": "9"}, remove=["a"]) == (
        "Tag `a` is both set and removed; give one of the two."
    )
    assert _error(tags.change_tags, current, {}, remove=["9"]).startswith("--remove: key `9`")
    assert tags.tags_json({}) is None
    assert tags.tags_json({"team": "ü", "a": "x"}) == '{"a": "x", "team": "ü"}'
