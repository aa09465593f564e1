"""Commands that change a lake without reading a dump: `tokenlake tag` and `tokenlake views`."""

from __future__ import annotations

from pathlib import Path

from tokenlake import tags
from tokenlake.errors import LakeError
from tokenlake.layout import Location
from tokenlake.load import lake_files
from tokenlake.processes import crash_point
from tokenlake.read import dump
from tokenlake.serve import catalog
from tokenlake.store import manifest, store_at
from tokenlake.store.base import Store


def tag_run(
    lake: Location | Store,
    run: str,
    set_tags: dict[str, str],
    remove: list[str] | tuple[str, ...] = (),
    warnings: list[str] | None = None,
) -> dict[str, str]:
    """Change a run's tags without reading its dump: runs row, manifest, catalog, under the
    writer lock. Returns the run's tags after the change; `warnings` as in `build_catalog`.

    Each step leaves a consistent lake (a new runs row is unlisted until the manifest, the
    commit point, lists it; readers follow the manifest until the catalog is rebuilt), so a
    kill at any point is repaired by tagging again.

    Raises:
        LakeError: Not a lake, no such run, or another writer holds the lake.
        UsageError: A bad key, or a key both set and removed.
    """
    store = dump.require_lake(store_at(lake))
    with store.lock():
        record = manifest.load_manifest(store.location, run)
        if record is None:
            runs = ", ".join(f"`{name}`" for name in store.manifest_runs()) or "none"
            raise LakeError(store.location, f"has no run `{run}` (runs: {runs})")
        store.delete_stale_temporaries()  # of a command killed earlier
        record.tags = tags.change_tags(record.tags, set_tags, remove)
        lake_files.write_run_row(
            store.location, record, keep=lake_files.stored_run_row(store.location, record)
        )
        crash_point("tag:row")
        manifest.save_manifest(store.location, record)
        crash_point("tag:manifest")
        catalog.build_catalog(store.location, warnings)
        crash_point("tag:catalog")
        store.delete_unlisted(record)
    return record.tags


def rebuild_views(lake: Location | Store, warnings: list[str] | None = None) -> Path | str:
    """Rebuild the catalog from the manifests, under the writer lock; returns its path or URL.

    Never in a dump or a stray folder (`require`), never while an extraction writes the lake,
    nor under another program holding the catalog for writing; a catalog half-built by a
    killed command is swept first. `warnings` as in `build_catalog`.
    """
    store = dump.require_lake(store_at(lake))
    with store.lock():
        catalog.refuse_if_held(store)
        store.delete_stale_temporaries()
        return catalog.build_catalog(store, warnings)
