"""The writer lock of a lake on an object store: `_manifest/.tokenlake.lock`.

Created with a conditional PUT (`If-None-Match: *`, fsspec's exclusive `xb` mode): of two
writers exactly one succeeds. The object holds its holder (`tokenlake on HOST (PID N)`), a
random token and the end of a lease (`TOKENLAKE_LOCK_LEASE_SECONDS`, default 120 s) that a
thread renews every third of it with `If-Match` on the lock's own ETag. A lock whose lease ran
out, or whose holder was a process of this host that is gone, is taken over by a conditional
PUT on its ETag (one of several takers wins); a writer whose renewal failed commits nothing
more (`check_held`, called before every manifest and catalog PUT).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from typing import Any, Protocol

from tokenlake import bounded
from tokenlake.errors import LakeError
from tokenlake.layout import LOCK_FILE, MANIFEST_DIR
from tokenlake.processes import process_alive


class ObjectStore(Protocol):
    """What the lock needs of the object store it guards (store/object.py's `ObjectStore`)."""

    location: str
    fs: Any

    def key(self, relative: str) -> str: ...

    def error(self, relative: str, problem: str, exc: BaseException) -> LakeError: ...


log = logging.getLogger(__name__)

# How long a writer's lock holds without renewal; renewed every third of it.
LEASE_SECONDS_VARIABLE = "TOKENLAKE_LOCK_LEASE_SECONDS"
DEFAULT_LEASE_SECONDS = 120.0
MAX_LOCK_BYTES = 64 << 10  # a lock object is ~200 bytes of JSON


def lease_seconds() -> float:
    """The writer lock's lease (`TOKENLAKE_LOCK_LEASE_SECONDS`, default 120 s)."""
    try:
        value = float(os.environ.get(LEASE_SECONDS_VARIABLE, DEFAULT_LEASE_SECONDS))
    except ValueError:
        return DEFAULT_LEASE_SECONDS
    return value if 1.0 <= value <= 86400.0 else DEFAULT_LEASE_SECONDS


@contextmanager
def held_lock(store: ObjectStore, relative: str) -> Iterator[None]:
    """Hold the lake's writer lock for the block; registered so `check_held` finds it."""
    lock = _LeaseLock(store, relative)
    lock.acquire()
    _HELD[store.location] = lock
    try:
        yield
    finally:
        del _HELD[store.location]
        lock.release()


def lease_running(store: ObjectStore, relative: str) -> bool:
    """Whether the lock object `relative` holds a lease that runs now, as a writer taking the
    lock would judge it (an unreadable or missing lock holds none)."""
    try:
        held = _LeaseLock(store, relative)._held()
    except (OSError, ValueError):  # FileNotFoundError among them: no writer
        return False
    return isinstance(held, dict) and _lease_runs(held)


def _lease_runs(held: dict[str, Any]) -> bool:
    """Whether the lease `held` (a lock object's JSON) still runs: not expired, and not of a
    process of this host that is gone."""
    try:
        expires = float(held.get("expires", 0) or 0)
    except (TypeError, ValueError):
        return False
    gone = held.get("host") == socket.gethostname() and not process_alive(held.get("pid"))
    return time.time() < expires and not gone


def _shown_time(when: float) -> str:
    """`when` (seconds since the epoch, from a lock object anybody may write) as a UTC time."""
    try:
        return datetime.fromtimestamp(when, timezone.utc).strftime("%H:%M:%S UTC")
    except (OverflowError, ValueError, OSError):
        return "a time past any date"


def check_held(location: str) -> None:
    """Raise if this process holds the lake's lock but lost it (its lease ran out)."""
    held = _HELD.get(location)
    if held is not None:
        held.check()


# The locks this process holds, by lake URL: every `ObjectStore` of that URL checks them.
_HELD: dict[str, _LeaseLock] = {}


class _LeaseLock:
    """`_manifest/.tokenlake.lock`: holder, token and lease end, renewed by a thread."""

    def __init__(self, store: ObjectStore, relative: str) -> None:
        self.store = store
        self.key = store.key(relative)
        self.token = uuid.uuid4().hex
        self.lease = lease_seconds()
        self.etag: str | None = None
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _body(self) -> bytes:
        return json.dumps(
            {
                "holder": f"tokenlake on {socket.gethostname()} (PID {os.getpid()})",
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "token": self.token,
                "expires": time.time() + self.lease,
            }
        ).encode()

    def acquire(self) -> None:
        self._claim()
        self._thread = threading.Thread(
            target=self._renew_loop, daemon=True, name="tokenlake-lease"
        )
        self._thread.start()

    def _claim(self) -> None:
        """Create the lock object, or take over a stale one; `etag` is then ours."""
        try:
            with self.store.fs.open(self.key, "xb") as handle:
                handle.write(self._body())
        except FileExistsError:
            self._take_over_if_stale()
            return
        except (NotImplementedError, ValueError, TypeError) as exc:
            raise LakeError(
                self.store.location,
                f"its store does not support conditional writes ({exc}), so tokenlake cannot"
                " keep two writers apart; it writes only to stores that do (S3 and S3-compatible"
                " stores with If-None-Match)",
            ) from exc
        except OSError as exc:
            raise self.store.error(f"{MANIFEST_DIR}/{LOCK_FILE}", "cannot be written", exc) from exc
        self.etag = self._info()["ETag"]

    def _own_etag(self, put: Any) -> str:
        """The ETag of the lock as this writer's PUT left it: the PUT's own answer where the
        store gives one (S3), so another writer's PUT that lands right after ours is never
        taken for ours; else asked for."""
        if isinstance(put, dict) and put.get("ETag"):
            return str(put["ETag"])
        return str(self._info()["ETag"])

    def _info(self) -> dict[str, Any]:
        self.store.fs.invalidate_cache()
        return dict(self.store.fs.info(self.key))

    def _held(self) -> Any:
        """The lock object's JSON; one larger than `MAX_LOCK_BYTES` (ours are ~200 bytes) or
        nested past 8 levels is a ValueError, as unreadable JSON is."""
        size = int(self.store.fs.size(self.key))
        if size > MAX_LOCK_BYTES:
            raise ValueError(f"it is {size:,} bytes, more than {MAX_LOCK_BYTES:,}")
        return bounded.loads(self.store.fs.cat_file(self.key, start=0, end=MAX_LOCK_BYTES + 1), 8)

    def _take_over_if_stale(self) -> None:
        info: dict[str, Any] = {}
        try:
            info = self._info()
            held = self._held()
        except FileNotFoundError:  # released meanwhile: try once more from the start
            return self._claim()
        except (OSError, ValueError) as exc:  # its ETag (if known) still guards the take-over
            held = {"holder": f"an unreadable lock ({str(exc)[:200]})", "expires": 0}
        if not isinstance(held, dict):
            held = {"holder": "an unreadable lock", "expires": 0}
        if _lease_runs(held):
            until = _shown_time(float(held["expires"]))
            raise LakeError(
                self.store.location,
                f"another tokenlake command (an extraction, a tag, a drop) is writing to it ({held.get('holder')}, lease"
                f" until {until}); wait for it to finish",
            )
        try:  # only one of several takers can match the stale lock's ETag
            if not info.get("ETag"):
                raise OSError("its ETag cannot be read")
            self.etag = self._own_etag(
                self.store.fs.pipe_file(self.key, self._body(), IfMatch=info["ETag"])
            )
        except (OSError, TypeError) as exc:
            raise LakeError(
                self.store.location,
                f"its writer lock `{MANIFEST_DIR}/{LOCK_FILE}` is stale ({held.get('holder')})"
                f" but cannot be taken over ({exc}); delete that object if no extraction runs",
            ) from exc
        log.warning("took over the stale writer lock of %s", held.get("holder"))

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.lease / 3):
            if not self.renew():
                return

    def renew(self) -> bool:
        """Extend the lease once, on the lock's own ETag; False (and `lost` says why) if not."""
        try:
            self.etag = self._own_etag(
                self.store.fs.pipe_file(self.key, self._body(), IfMatch=self.etag)
            )
        except Exception as exc:  # noqa: BLE001 - any failure means the lease may be lost
            self.lost = f"its lease could not be renewed ({str(exc)[:200]})"
            return False
        return True

    def check(self) -> None:
        if self.lost is not None:
            raise LakeError(
                self.store.location,
                f"this extraction lost its writer lock: {self.lost}; nothing more is committed."
                " Extract again",
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.lost is not None:
            return
        try:  # delete only our own lock
            held = self._held()
            if isinstance(held, dict) and held.get("token") == self.token:
                self.store.fs.rm_file(self.key)
        except (OSError, ValueError) as exc:
            log.warning("writer lock of %s not released: %s", self.store.location, exc)
