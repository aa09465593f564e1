"""The user's record of the steps whose content checks passed, so that `verify` decodes a
step's columns again only when its files' bytes, its manifest record or the checking code
changed.

Checking a step's content (its samples' batch positions and response lengths, its token rows,
the checksum of its token ids and loss masks) decodes columns of its two files: most of a
many-step lake's `verify`. The verdict depends only on those files' bytes, the manifest's
record of the step and the code that checks it, so a step that passed is kept as one line, the
blake2b of all three (`step_key`), in `passed-checks.txt` of the lake's folder in the user's
cache (`$TOKENLAKE_CACHE/catalogs/<lake>/`, folders only the user may write,
pipeline/tokenlake/store/private_cache.py; forgotten with the lake's kept catalogs). Every
`verify` still reads and hashes every byte of both files: a changed byte (bit rot, a
stranger's rewrite) gives another key, and the step is checked in full. The file holds keys
only; nothing in it is run or parsed beyond its lines, a key is only looked up; one larger
than MAX_BYTES, or a link, is not used (every step is checked in full).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from pathlib import Path

from tokenlake import bounded
from tokenlake.errors import BoundedReadError, LakeError
from tokenlake.store.local import atomic_write

log = logging.getLogger(__name__)

FILE = "passed-checks.txt"
_KEY_CHARS = 64  # a blake2b of 32 bytes, in hex: a collision takes ~2^128 hashes
# 65 bytes a step: a lake of ~250,000 steps. Of a larger one, the steps checked last are kept.
MAX_BYTES = 16 << 20


def code_digest(parts: Iterable[str], modules: Iterable[str | None]) -> bytes:
    """The digest of the code a verdict depends on: the versions in `parts` and the sources of
    the modules whose files are `modules` (their `__file__`)."""
    digest = hashlib.blake2b(digest_size=16)
    for part in parts:
        digest.update(f"{part}\0".encode("utf-8", "surrogatepass"))
    for module in modules:
        digest.update(Path(str(module)).read_bytes())
    return digest.digest()


def step_key(code: bytes, record: Iterable[object], contents: Iterable[bytes]) -> str:
    """The key of one step's content check: the checking `code`'s digest, the manifest's
    `record` of the step (the values the check compares), and each checked file's whole bytes.

    Examples:
        >>> key = step_key(b"code", [3, "abc"], [b"PAR1", b"PAR1"])
        >>> len(key), key == step_key(b"code", [3, "abc"], [b"PAR1", b"PAR2"])
        (64, False)
    """
    digest = hashlib.blake2b(code, digest_size=_KEY_CHARS // 2)
    # Each value and each file with its length: no two different inputs join to the same bytes.
    for value in record:
        text = repr(value).encode("utf-8", "surrogatepass")
        digest.update(b"%d:" % len(text) + text)
    for content in contents:
        digest.update(b"%d:" % len(content))
        digest.update(content)
    return digest.hexdigest()


class PassedChecks:
    """The keys of steps whose content checks passed, as kept in `folder` (None: no private
    folder for this lake: nothing kept, nothing recorded), checked by the code of digest
    `code` (`code_digest`)."""

    def __init__(self, folder: Path | None, code: bytes) -> None:
        self.folder = folder
        self.code = code
        self.kept: dict[str, None] = {} if folder is None else _read_keys(folder)  # last used first
        self.used: dict[str, None] = {}  # keys found or added by this check, in order

    def passed(self, key: str) -> bool:
        """Whether the step of `key` passed before (then kept again by `save`)."""
        if key in self.kept:
            self.used[key] = None
            return True
        return False

    def add(self, key: str) -> None:
        """Record that the step of `key` passed its content checks."""
        self.used[key] = None

    def save(self, keep_others: bool) -> None:
        """Keep the keys this check used and, with `keep_others` (it checked part of the lake),
        those kept before, within MAX_BYTES (this check's first); unless that is what was kept.
        A whole lake's check forgets the keys of files that changed since."""
        if self.folder is None:
            return
        keys = list(self.used)
        if keep_others:
            keys += [key for key in self.kept if key not in self.used]
        keys = keys[: MAX_BYTES // (_KEY_CHARS + 1)]
        if keys == list(self.kept):
            return
        text = "".join(f"{key}\n" for key in keys)
        try:
            atomic_write(self.folder / FILE, lambda path: _write_text(path, text))
        except LakeError as exc:  # e.g. the cache's disk is full: the next check is in full
            log.info("the passed checks are not kept: %s", exc)


def _read_keys(folder: Path) -> dict[str, None]:
    """The keys kept in `folder` in their order (those used last first), none when the file is
    missing, too large, or a link."""
    try:
        text = bounded.read_file(folder / FILE, MAX_BYTES, "passed checks", follow=False)
    except BoundedReadError:
        return {}
    return dict.fromkeys(line for line in text.decode("ascii", "replace").split("\n") if line)


def _write_text(path: Path, text: str) -> None:
    path.write_text(text, encoding="ascii")
