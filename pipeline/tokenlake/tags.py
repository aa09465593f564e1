"""User tags of a run: `--tag key=value` (repeatable) and `--meta FILE`, validated.

A tag is a (key, value) pair of strings that the user attaches to a run ("precision=fp8",
"team=rl"). Keys start with a letter or `_` and hold letters, digits and `_ . - /` (at most
64 characters), so they are safe as SQL identifiers after quoting and as BI filter names;
values are one line of at most 1,000 characters. `--meta FILE` is a JSON object (or a YAML
mapping, when PyYAML is installed) of such keys; numbers and booleans are kept as their JSON
text (`true`, `3`, `0.5`), null, lists and objects are refused; an integer longer than a value
may be is refused before Python converts it (which it refuses past 4 300 digits), and so is
JSON nested more than `MAX_META_DEPTH` levels. `--tag` overrides the file.

Every problem is one `UsageError` line naming the tag or the file.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from tokenlake import bounded
from tokenlake.errors import SHOWN_PATH_CHARS, BoundedReadError, UsageError, shown

MAX_KEY_CHARS = 64
MAX_VALUE_CHARS = 1000
MAX_META_FILE_BYTES = 1 << 20
MAX_META_DEPTH = 16  # a tags file is one flat object
YAML_SUFFIXES = (".yaml", ".yml")
_KEY = re.compile(rf"[A-Za-z_][A-Za-z0-9_.\-/]{{0,{MAX_KEY_CHARS - 1}}}")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
# Messages quote a key up to MAX_KEY_CHARS (all of a valid key; `…` marks one too long), and
# a `--tag` argument with room for a whole key, its `=` and the start of the value.
_TAG_CHARS = MAX_KEY_CHARS + 16


def check_key(key: str, where: str) -> str:
    """`key` if it is a valid tag key, else a UsageError saying where it came from.

    Examples:
        >>> check_key("precision", "--tag")
        'precision'
        >>> check_key("2x", "--tag")
        Traceback (most recent call last):
        ...
        tokenlake.errors.UsageError: --tag: key `2x` must start with a letter or `_` and hold only letters, digits and `_.-/` (at most 64 characters).
    """
    if not _KEY.fullmatch(key):
        raise UsageError(
            f"{where}: key `{shown(key, MAX_KEY_CHARS, literal=False)}` must start with a letter"
            " or `_` and hold only letters, digits and `_.-/`"
            f" (at most {MAX_KEY_CHARS} characters)."
        )
    return key


def check_value(key: str, value: str, where: str) -> str:
    """`value` if it is a valid tag value (one line, at most `MAX_VALUE_CHARS`)."""
    name = shown(key, MAX_KEY_CHARS, literal=False)
    if len(value) > MAX_VALUE_CHARS:
        raise UsageError(f"{where}: value of `{name}` is longer than {MAX_VALUE_CHARS} characters.")
    if _CONTROL.search(value):
        raise UsageError(f"{where}: value of `{name}` holds a control character (newline, tab).")
    return value


def parse_tag(text: str) -> tuple[str, str]:
    """One `--tag key=value` argument as (key, value); the value may be empty or hold `=`.

    Examples:
        >>> parse_tag("precision=fp8")
        ('precision', 'fp8')
        >>> parse_tag("note=a=b")
        ('note', 'a=b')
        >>> parse_tag("fp8")
        Traceback (most recent call last):
        ...
        tokenlake.errors.UsageError: --tag `fp8` is not `key=value`, e.g. `--tag precision=fp8`.
    """
    key, sep, value = text.partition("=")
    where = f"--tag `{shown(text, _TAG_CHARS, literal=False)}`"
    if not sep:
        raise UsageError(f"{where} is not `key=value`, e.g. `--tag precision=fp8`.")
    return check_key(key, where), check_value(key, value, where)


def parse_tags(texts: Iterable[str]) -> dict[str, str]:
    """Several `--tag` arguments as a dict; a key given twice is an error."""
    tags: dict[str, str] = {}
    for text in texts:
        key, value = parse_tag(text)
        if key in tags and tags[key] != value:
            old, new = shown(tags[key], literal=False), shown(value, literal=False)
            raise UsageError(f"--tag `{key}` is given twice, as `{old}` and `{new}`.")
        tags[key] = value
    return tags


def _value_text(value: Any, key: str, where: str) -> str:
    """A file's value as tag text: strings as they are, numbers and booleans as JSON."""
    if isinstance(value, str):
        return check_value(key, value, where)
    if isinstance(value, bool) or (isinstance(value, int) and not isinstance(value, bool)):
        return json.dumps(value)
    if isinstance(value, float) and math.isfinite(value):
        return json.dumps(value)
    kind = "null" if value is None else type(value).__name__
    name = shown(key, MAX_KEY_CHARS, literal=False)
    raise UsageError(f"{where}: value of `{name}` is a {kind}; give a string, number or boolean.")


class _LongInteger(ValueError):
    def __init__(self, digits: int) -> None:
        super().__init__(
            f"an integer of {digits:,} digits is longer than a tag value may be"
            f" ({MAX_VALUE_CHARS} characters)"
        )


def _check_digits(text: str) -> str:
    """An integer's text, refused when it could not be a tag value anyway."""
    digits = len(text.lstrip("+-").replace("_", ""))
    if digits > MAX_VALUE_CHARS:
        raise _LongInteger(digits)
    return text


def _integer(text: str) -> int:
    """`parse_int` of a JSON tags file."""
    return int(_check_digits(text))


def _parse_yaml(text: str, where: str) -> Any:
    try:
        import yaml
    except ImportError:
        raise UsageError(
            f"{where}: reading YAML needs PyYAML (`pip install pyyaml`); or give the file as JSON."
        ) from None

    class Loader(yaml.SafeLoader):  # safe_load's loader: plain data only, never objects
        def construct_yaml_int(self, node: Any) -> Any:
            _check_digits(str(self.construct_scalar(node)))
            return super().construct_yaml_int(node)

    Loader.add_constructor("tag:yaml.org,2002:int", Loader.construct_yaml_int)
    try:
        return yaml.load(text, Loader=Loader)  # noqa: S506 - a SafeLoader subclass
    except _LongInteger as exc:
        raise UsageError(f"{where}: {exc}.") from None
    except RecursionError:
        raise UsageError(f"{where} is not valid YAML (nested too deeply).") from None
    except yaml.YAMLError as exc:
        raise UsageError(f"{where} is not valid YAML ({str(exc).splitlines()[0]}).") from None


def _parse_text(text: str, path: Path, where: str) -> Any:
    if path.suffix.lower() in YAML_SUFFIXES:
        return _parse_yaml(text, where)
    try:
        return bounded.loads(text, MAX_META_DEPTH, parse_int=_integer)
    except _LongInteger as exc:
        raise UsageError(f"{where}: {exc}.") from None
    except ValueError as exc:  # also JsonTooDeep: `nested more than 16 levels deep`
        raise UsageError(f"{where} is not valid JSON ({str(exc).splitlines()[0]}).") from None


def load_meta_file(path: Path | str) -> dict[str, str]:
    """The tags of a `--meta FILE`: a JSON object, or a YAML mapping (`.yaml`/`.yml`).

    Raises:
        UsageError: The file is missing, too large, not UTF-8, not valid JSON/YAML, not an
            object, or holds a bad key or value.
    """
    path = Path(path)
    where = f"--meta `{shown(path, SHOWN_PATH_CHARS)}`"
    try:
        if not path.is_file():
            raise UsageError(f"{where} is not a file.")
        text = bounded.read_file(path, MAX_META_FILE_BYTES, "a `--meta` file").decode("utf-8")
    except BoundedReadError as exc:
        if exc.limit is not None:
            raise UsageError(f"{where} is larger than {exc.limit} bytes.") from None
        raise UsageError(f"{where} {exc.problem}.") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"{where} cannot be read ({exc}).") from None
    data = _parse_text(text, path, where)
    if not isinstance(data, dict):
        raise UsageError(f"{where} holds a {type(data).__name__}; expected an object of tags.")
    return _tags_of(data, where)


def checked_tags(tags: object, where: str = "tags") -> dict[str, str]:
    """Tags the Python API was given (`Lake.tag`, `Lake.extract(tags=...)`), checked as
    `--meta`'s are: a mapping of valid keys to strings (numbers and booleans as their JSON
    text). A value of another type would be written into the run's manifest, which every
    later command then refuses as damaged.

    Examples:
        >>> checked_tags({"precision": "fp8", "lr": 0.001, "ema": True})
        {'precision': 'fp8', 'lr': '0.001', 'ema': 'true'}
        >>> checked_tags({"note": None})
        Traceback (most recent call last):
        ...
        tokenlake.errors.UsageError: tags: value of `note` is a null; give a string, number or boolean.
    """
    if not isinstance(tags, Mapping):
        raise UsageError(f"{where} is {shown(tags)}; give a dict of tags (key: value).")
    return _tags_of(tags, where)


def _tags_of(data: Mapping[Any, Any], where: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise UsageError(f"{where}: key `{shown(key)}` is not a string.")
        tags[check_key(key, where)] = _value_text(value, key, where)
    return tags


def user_tags(tag_args: Iterable[str] = (), meta_file: Path | str | None = None) -> dict[str, str]:
    """The tags of one extraction: `--meta FILE` first, then `--tag` arguments over it.

    Examples:
        >>> user_tags(["precision=fp8", "team=rl"])
        {'precision': 'fp8', 'team': 'rl'}
    """
    tags = load_meta_file(meta_file) if meta_file is not None else {}
    tags.update(parse_tags(tag_args))
    return tags


def change_tags(
    current: Mapping[str, str], set_tags: Mapping[str, str], remove: Iterable[str] = ()
) -> dict[str, str]:
    """`current` with `remove` dropped and `set_tags` applied (for `tokenlake tag`).

    Examples:
        >>> change_tags({"a": "1", "b": "2"}, {"c": "3"}, remove=["a"])
        {'b': '2', 'c': '3'}
    """
    if isinstance(remove, str):  # its letters would be removed as keys
        raise UsageError(f"--remove `{shown(remove, literal=False)}`: give a list of keys.")
    for key in remove:
        if not isinstance(key, str):
            raise UsageError(f"--remove: key `{shown(key)}` is not a string.")
    removed = [check_key(key, "--remove") for key in remove]
    set_tags = checked_tags(set_tags)
    clash = sorted(set(removed) & set(set_tags))
    if clash:
        raise UsageError(f"Tag `{clash[0]}` is both set and removed; give one of the two.")
    tags = {key: value for key, value in current.items() if key not in removed}
    tags.update(set_tags)
    return tags


def tags_json(tags: Mapping[str, str]) -> str | None:
    """The `runs.tags_json` text of a run's tags (keys sorted), or None when it has none.

    Examples:
        >>> tags_json({"team": "rl", "precision": "fp8"})
        '{"precision": "fp8", "team": "rl"}'
    """
    return json.dumps(dict(tags), sort_keys=True, ensure_ascii=False) if tags else None
