"""Storage: the lake's stores (a directory, an object-store prefix), its manifests and locks.

`store_at(location)` is the one place a location becomes a store (`Store`, `base.py`): a
directory (`local.py`, walked by `nofollow.py`) or an object-store prefix (`object.py`, locked
by `object_lock.py`); `manifest.py` is the commit point; `private_cache.py` the user's cache.
"""

from __future__ import annotations

from pathlib import Path

from tokenlake.layout import Location, is_url, local_path
from tokenlake.store.base import Store
from tokenlake.store.local import LocalStore
from tokenlake.store.object import ObjectStore


def store_at(location: Location | Store) -> Store:
    """The store of a directory or an object-store URL (a store is returned as it is)."""
    if not isinstance(location, (str, Path)):
        return location
    if is_url(location):
        return ObjectStore(str(location))
    return LocalStore(local_path(location))
