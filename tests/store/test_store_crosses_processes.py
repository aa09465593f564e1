"""A store crosses to a worker process pickled (an extraction's pool, a Ray task): a lake's
store as it is, an object store as its URL, so the worker opens a filesystem of its own."""

from __future__ import annotations

import multiprocessing
import pickle
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from tests.conftest import local_store, store_of
from tokenlake.store.base import Store


def seen_by_a_worker(store: Store) -> tuple[str, str, str]:
    """What a worker process holds after the store crossed to it."""
    return type(store).__name__, repr(store), str(store.location)


def _in_a_spawned_worker(store: Store) -> tuple[str, str, str]:
    # spawned, as the extraction's pool is: nothing is inherited, all comes pickled
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(seen_by_a_worker, store).result()


def test_an_object_store_travels_as_its_url() -> None:
    store = store_of("memory://bucket/lake/")
    sent = pickle.dumps(store)
    assert b"fsspec" not in sent  # its filesystem stays in this process
    assert b"memory://bucket/lake/" in sent
    back = pickle.loads(sent)
    assert (repr(back), str(back), back.location) == (
        "ObjectStore('memory://bucket/lake')",
        "memory://bucket/lake/",
        "memory://bucket/lake",
    )


def test_an_object_store_crosses_to_a_worker_process() -> None:
    assert _in_a_spawned_worker(store_of("memory://bucket/lake/")) == (
        "ObjectStore",
        "ObjectStore('memory://bucket/lake')",
        "memory://bucket/lake",
    )


def test_a_local_store_crosses_to_a_worker_process(tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    assert _in_a_spawned_worker(local_store(lake)) == (
        "LocalStore",
        f"LocalStore({str(lake)!r})",
        str(lake.resolve()),
    )
