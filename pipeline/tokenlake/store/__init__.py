"""Storage: the lake's stores (a directory, an object-store prefix), its manifests and locks.

`store_at(location)` is the one place a location becomes a store (`Store`, `base.py`): a
directory (`local.py`, walked by `nofollow.py`) or an object-store prefix (`object.py`, locked
by `object_lock.py`); `manifest.py` is the commit point; `private_cache.py` the user's cache,
where `passed_checks.py` keeps the steps whose content checks passed.
`tokenlake.Lake` calls it once, at the front door; everything below takes the store.
`require_lake` is the one check that a store holds a lake (and not a dump).
"""

from __future__ import annotations

import os
from pathlib import Path

from tokenlake.errors import LakeError, UsageError, shown
from tokenlake.layout import ROLLOUT_DIR, Location, is_url, local_path
from tokenlake.store.base import Store
from tokenlake.store.local import LocalStore
from tokenlake.store.object import ObjectStore


def store_at(location: Location | Store) -> Store:
    """The store of a directory or an object-store URL (a store is returned as it is).

    Raises:
        UsageError: The location is empty (`Path("")` is the current folder: an unset
            variable would open, or extract into, wherever the caller runs) or not a
            location at all (None, a number, bytes).
    """
    if isinstance(location, (LocalStore, ObjectStore)):
        return location
    if isinstance(location, os.PathLike) and not isinstance(location, Path):
        location = os.fspath(location)
    if not isinstance(location, (str, Path)):
        raise UsageError(
            f"A lake's location is a folder or a URL (str or os.PathLike), not {shown(location)}."
        )
    if isinstance(location, str) and not location.strip():
        raise UsageError(
            "The lake's location is empty; give its folder (`.` for this one) or its URL."
        )
    if is_url(location):
        return ObjectStore(str(location))
    return LocalStore(local_path(location))


def is_dump(store: Store) -> bool:
    """Whether a location holds a miles or slime dump (its `rollout_data/`): never a lake."""
    return store.holds_folder(ROLLOUT_DIR)


def require_lake(store: Store) -> Store:
    """The store, if it is a lake's, else a one-line LakeError saying what the location is
    (a dump named as one)."""
    if is_dump(store):
        what = " directory" if store.local_catalog is not None else ""
        raise LakeError(
            str(store.location),
            f"is a miles dump (it has `{ROLLOUT_DIR}/`), not a lake; give the --lake{what} of"
            " `tokenlake extract`",
        )
    return store.require()
