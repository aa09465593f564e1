"""The explorer's web server (aiohttp): one page, its assets, and JSON endpoints that read the
lake's catalog.

What every request meets, in order (`_guard`):
1. Only GET and HEAD: no endpoint writes.
2. Bound to a loopback address, the `Host` header must name that address (a web page elsewhere
   cannot reach the server through a DNS name it controls); bound beyond it, the request must
   carry the token printed once at start (`?token=`, then an HttpOnly cookie), as Jupyter does.
3. Routes are fixed strings: the page, the named assets held in memory, the endpoints. No part
   of a request's path is ever joined to a folder.
4. Every answer carries a Content-Security-Policy that runs only the server's own scripts, and
   the page writes every lake value as text (never as HTML).

Queries run in a pool of threads, each on its own cursor with a time limit, so a slow one never
holds up the others; the server's loop only routes.
"""

from __future__ import annotations

import asyncio
import hmac
import importlib.resources
import ipaddress
import json
import logging
import secrets
import socket
import threading
import time
from collections.abc import Awaitable, Callable, Collection, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tokenlake.errors import LakeError, PipelineError, UsageError
from tokenlake.serve import catalog, rollups
from tokenlake.serve.explore import console, data, kept, step_rows
from tokenlake.serve.query import format_table
from tokenlake.serve.served import served_records
from tokenlake.store import manifest
from tokenlake.store.base import Store
from tokenlake.threads import until_ctrl_c

if TYPE_CHECKING:
    import duckdb
    from aiohttp import web

log = logging.getLogger(__name__)
_Read = TypeVar("_Read")

LOOPBACK = "127.0.0.1"
DEFAULT_PORT = 8765
TOKEN_COOKIE = "tokenlake_token"
# A page's own queries are tokenlake's views (tens of milliseconds on the bench lake); the
# limit only stops a lake so large that a page would never come.
PAGE_SECONDS = 120.0
# How often the catalog's identity is looked at (an object store answers over the network).
STAMP_EVERY_SECONDS = 2.0
THREADS = 4
# The audits of one catalog version, run once in the background: every audit file over the
# whole lake (seconds on a large one), stopped only by this.
AUDIT_SECONDS = 1800.0
# On a console download cut at the row limit: the limit (the query had more rows).
TRUNCATED_HEADER = "X-Tokenlake-Truncated"
# How long a stopping server waits for its interrupted audits to let go of DuckDB.
AUDIT_STOP_SECONDS = 30.0
# How long a stopping server interrupts its requests' queries until none runs.
QUERY_STOP_SECONDS = 10.0
AUDITS_COMPUTING = "computing"
AUDITS_READY = "ready"
AUDITS_FAILED = "failed"

# Scripts only from the server itself (no inline script can run, whatever a lake's text holds);
# 'unsafe-eval' because Vega compiles its chart expressions into functions.
CSP = (
    "default-src 'none'; script-src 'self' 'unsafe-eval'; style-src 'self' 'unsafe-inline'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = {
    "Content-Security-Policy": CSP,
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the token never leaves in a Referer
    "X-Frame-Options": "DENY",
    "Cross-Origin-Resource-Policy": "same-origin",
}


@dataclass(frozen=True)
class ServeOptions:
    """How the explorer serves.

    Attributes:
        host: The address to bind; a non-loopback one requires the token.
        port: The TCP port (0: a free one).
        query_rows: The SQL console's row limit.
        query_seconds: The SQL console's time limit, after which a query is interrupted.
        query_bytes: The most bytes a console result may take (Arrow's count): a query that
            would fetch more is refused, so one with huge values cannot exhaust memory.
    """

    host: str = LOOPBACK
    port: int = DEFAULT_PORT
    query_rows: int = 10_000
    query_seconds: float = 10.0
    query_bytes: int = 64 * 2**20


def is_loopback(host: str) -> bool:
    """Whether `host` is a loopback address (or `localhost`)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class ServedLake:
    """The lake's catalog, built once and again whenever an extraction replaces it."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._con: duckdb.DuckDBPyConnection | None = None
        self._stamp: object = None
        self._looked_at = 0.0
        self.version = 0
        self._records: list[manifest.RunManifest] = []
        self.relations: set[str] = set()

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of the current catalog (its own connection: queries run side by side)."""
        return self.versioned_cursor()[0]

    def versioned_cursor(self, renew: bool = False) -> tuple[duckdb.DuckDBPyConnection, int]:
        """A cursor of the current catalog and that catalog's version, taken together (`renew`:
        of a new version built now, the lake having changed since the current one was)."""
        with self._lock:
            now = time.monotonic()
            if self._con is None or renew or now - self._looked_at >= STAMP_EVERY_SECONDS:
                self._looked_at = now
                stamp = self.store.catalog_stamp()
                if self._con is None or renew or stamp != self._stamp:
                    self._connect(stamp)
            assert self._con is not None
            return self._con.cursor(), self.version

    def records(self, version: int) -> list[manifest.RunManifest]:
        """The manifests as served (`serve.served`) when catalog `version` was built (read
        again for another version)."""
        with self._lock:
            if version == self.version:
                return self._records
        return served_records(self.store, manifest.load_all(self.store))[0]

    def _connect(self, stamp: object) -> None:
        con = catalog.connect(self.store)
        # Read with the catalog: the pages that read one step's files, and the identities of
        # the steps whose rows are kept, name the files of this version.
        records = served_records(self.store, manifest.load_all(self.store))[0]
        self._con, self._stamp = con, stamp  # the old one closes once its cursors are done
        self._records = records
        self.relations = console.catalog_relations(con)
        self.version += 1

    def close(self) -> None:
        with self._lock:
            if self._con is not None:
                self._con.close()
            self._con = None


def _asset_bytes(name: str) -> bytes:
    return (importlib.resources.files("tokenlake.serve.explore") / "assets" / name).read_bytes()


def _assets() -> dict[str, tuple[bytes, str]]:
    """Every file the page loads, by the path it asks for: read once, held in memory."""
    from tokenlake.serve import report_html

    return {
        "/assets/explore.js": (_asset_bytes("explore.js"), "text/javascript; charset=utf-8"),
        "/assets/explore.css": (_asset_bytes("explore.css"), "text/css; charset=utf-8"),
        "/assets/vega.js": (
            report_html.vega_bundle().encode("utf-8"),
            "text/javascript; charset=utf-8",
        ),
    }


PAGE_PATHS = (
    "/",
    "/compare",
    "/sql",
    "/runs/{run}",
    "/runs/{run}/steps/{step}",
    "/runs/{run}/steps/{step}/samples/{position}",
)


class Explorer:
    """The aiohttp application over one lake."""

    def __init__(self, served: ServedLake, options: ServeOptions, token: str | None) -> None:
        self.served = served
        self.options = options
        self.token = token
        self.port = options.port
        self.pool = ThreadPoolExecutor(max_workers=THREADS, thread_name_prefix="tokenlake-serve")
        self.queries = _RunningQueries()
        self.console = console.Console()
        self.kept = kept.KeptByVersion[kept.Kept]()
        self.run_level = kept.KeptByVersion[kept.RunLevel]()
        # Per step identity, across catalog versions and servers: what the runs page pools.
        self.step_rows = step_rows.StepRowsKept.of_lake(served.store)
        # The audits of the latest catalog version: started by its first runs page, on a
        # thread of their own so that no page waits for them.
        self._audits_lock = threading.Lock()
        self._audits: _AuditRun | None = None
        self.assets = _assets()
        self.page = _asset_bytes("explore.html")

    def app(self) -> web.Application:
        from aiohttp import web

        app = web.Application(middlewares=[self._guard], client_max_size=64 * 1024)
        for path in PAGE_PATHS:
            app.router.add_get(path, self._page)
        for path in self.assets:
            app.router.add_get(path, self._asset)
        endpoints: dict[str, Callable[[web.Request], Awaitable[web.StreamResponse]]] = {
            "/api/runs": self._runs,
            "/api/steps": self._steps,
            "/api/step": self._step,
            "/api/sample": self._sample,
            "/api/sql": self._sql,
            "/api/version": self._version,
        }
        for path, handler in endpoints.items():
            app.router.add_get(path, handler)
        return app

    def interrupt(self) -> None:
        """Stop every query running now, the audits' too, and start no other: what a stopping
        server does before it waits for its requests."""
        with self._audits_lock:
            running = self._audits
        if running is not None:
            running.stop()
        self.queries.stop(QUERY_STOP_SECONDS)

    def close(self) -> None:
        """After `interrupt`: the audits' thread waited for, the console closed."""
        self.pool.shutdown(wait=False, cancel_futures=True)
        with self._audits_lock:
            running = self._audits
        # Waited for before the catalog's connection closes: a DuckDB query still running on a
        # closed database (or at the interpreter's exit) aborts the process.
        if running is not None and running.thread is not None:
            running.thread.join(timeout=AUDIT_STOP_SECONDS)
        self.console.close()

    # --- what every request meets ----------------------------------------------------------

    @property
    def _guard(self) -> Any:
        from aiohttp import web

        @web.middleware
        async def guard(request: web.Request, handler: Any) -> web.StreamResponse:
            refusal = self._refusal(request)
            if refusal is not None:
                response: web.StreamResponse = web.Response(
                    status=refusal[0], text=refusal[1] + "\n", content_type="text/plain"
                )
            else:
                try:
                    response = await handler(request)
                except web.HTTPException as exc:
                    response = web.Response(
                        status=exc.status, text=f"{exc.reason}\n", content_type="text/plain"
                    )
                if self.token is not None and request.query.get("token") == self.token:
                    response.set_cookie(
                        TOKEN_COOKIE, self.token, httponly=True, samesite="Strict", path="/"
                    )
            response.headers.update(SECURITY_HEADERS)
            return response

        return guard

    def _refusal(self, request: web.Request) -> tuple[int, str] | None:
        """(status, line) when the request may not be answered."""
        if request.method not in ("GET", "HEAD"):
            return 405, "Refused: the explorer only reads (GET); nothing can be written."
        if self.token is None:
            if request.host not in self._loopback_hosts():
                return 403, "Refused: this server answers only to its own address on this machine."
            return None
        given = request.query.get("token") or request.cookies.get(TOKEN_COOKIE) or ""
        if not hmac.compare_digest(given.encode("utf-8"), self.token.encode("utf-8")):
            return 403, (
                "Refused: this explorer needs its token; open the URL `tokenlake serve` printed"
                " (it ends with ?token=...)."
            )
        return None

    def _loopback_hosts(self) -> set[str]:
        return {f"{name}:{self.port}" for name in ("127.0.0.1", "localhost", "[::1]")}

    # --- the page and its assets -----------------------------------------------------------

    async def _page(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        return web.Response(
            body=self.page,
            content_type="text/html",
            charset="utf-8",
            headers={"Cache-Control": "no-store"},
        )

    async def _asset(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        body, kind = self.assets[request.path]
        return web.Response(
            body=body, headers={"Content-Type": kind, "Cache-Control": "private, max-age=3600"}
        )

    # --- data --------------------------------------------------------------------------------

    async def _answer(
        self,
        request: web.Request,
        compute: Callable[[duckdb.DuckDBPyConnection, int], Any],
        seconds: float = PAGE_SECONDS,
    ) -> web.StreamResponse:
        """`compute(cursor, catalog version)` in the pool, as JSON; a refusal or error as
        `{"error": line}`."""
        from aiohttp import web

        def work() -> Any:
            return self._read_current(compute, self.served.versioned_cursor(), seconds)

        try:
            result = await asyncio.get_running_loop().run_in_executor(self.pool, work)
        except UsageError as exc:
            return _json({"error": str(exc)}, 400)
        except PipelineError as exc:
            return _json({"error": str(exc)}, 500)
        except Exception as exc:  # noqa: BLE001 - one line for the page, the rest in the log
            log.error("an explorer request (%s) failed: %s", request.path_qs, _first(exc))
            log.debug("the failure", exc_info=True)
            return _json(
                {"error": f"The server failed on this request ({type(exc).__name__})."}, 500
            )
        if isinstance(result, web.StreamResponse):
            return result
        return _json(result)

    def _kept(self, cursor: duckdb.DuckDBPyConnection, version: int) -> kept.Kept:
        def read() -> kept.Kept:
            records = self.served.records(version)
            return data.kept_rows(cursor, records, self._run_level(cursor, version))

        return self.kept.get(version, read)

    def _run_level(self, cursor: duckdb.DuckDBPyConnection, version: int) -> kept.RunLevel:
        def read() -> kept.RunLevel:
            store, records = self.served.store, self.served.records(version)

            def read_steps(chosen: Collection[step_rows.StepId] | None) -> Any:
                if chosen is None:
                    return data.read_step_rows(cursor)
                settled = rollups.settings_digests(cursor)
                queries = catalog.steps_view_queries(store, records, chosen, settled)
                return data.read_step_rows(cursor, queries)

            runs = step_rows.runs_rows(cursor)
            identities = step_rows.step_identities(store, records, runs)
            return data.run_level_rows(cursor, self.step_rows.tables(identities, read_steps))

        return self.run_level.get(version, read)

    def _step_answer(
        self, cursor: duckdb.DuckDBPyConnection, version: int, run: str, step: int, evaluation: bool
    ) -> dict[str, Any]:
        """The step page, its queries planned over that step's files only (those of the tables
        it reads): a view over every file of the lake costs time in proportion to the lake's
        files to plan."""
        rows = self._kept(cursor, version)
        queries = catalog.step_view_queries(
            self.served.store, rows.records, run, step, evaluation, rows.settings_digests
        )
        data.read_only_step(cursor, {n: q for n, q in queries.items() if n in rows.step_tables})
        return data.step_page(cursor, rows, run, step, evaluation)

    def _runs_answer(self, cursor: duckdb.DuckDBPyConnection, version: int) -> dict[str, Any]:
        """The runs page of this catalog version (pooled from its kept per-step rows), with the
        audits if they are done."""
        page = data.runs_page(self._run_level(cursor, version))
        # Started once the page is read: on a new catalog, the two would share the CPU.
        return _with_audits(page, self._audits_of(version))

    def _audits_of(self, version: int) -> Future[dict[str, Any]]:
        """The audits of this catalog version, started in the background if they are not (an
        older version's, still running, are stopped: no page will show them)."""
        with self._audits_lock:
            if self._audits is not None and self._audits.version >= version:
                return self._audits.result
            if self._audits is not None:
                self._audits.stop()
            # A connection of its own (a cursor serves one thread); the catalog may have
            # changed since the page's cursor was taken: the audits are then that newer one's.
            cursor, own_version = self.served.versioned_cursor()
            run = _AuditRun(own_version, cursor)
            self._audits = run
            run.thread = threading.Thread(target=self._audit, args=(run,), name="tokenlake-audits")
            run.thread.start()
            return run.result

    def _audit(self, run: _AuditRun) -> None:
        """Every audit's failing runs, and the kept rows of the version on the way: the step
        pages that follow find them read."""
        try:
            run.result.set_result(self._failing_audits(run))
        except BaseException as exc:  # noqa: BLE001 - shown by the runs page, as one line
            run.result.set_exception(exc)

    def _failing_audits(self, run: _AuditRun) -> dict[str, Any]:
        def audit(cursor: duckdb.DuckDBPyConnection, version: int) -> dict[str, Any]:
            with self._audits_lock:  # the audits are those of the version they read
                run.cursor, run.version = cursor, version
            self._kept(cursor, version)
            return data.failing_audits(cursor, run.stopped.is_set)

        return self._read_current(audit, (run.cursor, run.version), AUDIT_SECONDS, run.stopped)

    def _read_current(
        self,
        read: Callable[[duckdb.DuckDBPyConnection, int], _Read],
        first: tuple[duckdb.DuckDBPyConnection, int],
        seconds: float,
        stopped: threading.Event | None = None,
    ) -> _Read:
        """`read(cursor, catalog version)` on the `first` cursor and version, stopped after
        `seconds`. Another command of the user (an extraction, a tag) may commit new manifests
        since that version was built, and delete files it lists: a read that then fails is
        made again on a version built now, up to `catalog.READ_ATTEMPTS` reads in all (not
        once `stopped`: nothing would show it)."""
        cursor, version = first
        attempts = catalog.READ_ATTEMPTS
        while True:
            with _limited(cursor, seconds, self.queries) as limited:
                try:
                    return read(limited, version)
                except Exception:
                    attempts -= 1
                    if (
                        attempts == 0
                        or (stopped is not None and stopped.is_set())
                        or not catalog.changed_since_built(limited, self.served.store)
                    ):
                        raise
            cursor, version = self.served.versioned_cursor(renew=True)

    async def _runs(self, request: web.Request) -> web.StreamResponse:
        return await self._answer(request, self._runs_answer)

    async def _steps(self, request: web.Request) -> web.StreamResponse:
        # one `run=` per run: a run's name may hold a comma (`a,b` is one run, not `a` and `b`)
        runs = [name for name in request.query.getall("run", []) if name]
        return await self._answer(
            request,
            lambda cursor, version: data.steps_page(cursor, self._kept(cursor, version), runs),
        )

    async def _step(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        run, step, evaluation = query.get("run", ""), _integer(query, "step"), _flag(query)
        if step is None:
            return _json({"error": "Give the step as a whole number."}, 400)
        return await self._answer(
            request,
            lambda cursor, version: self._step_answer(cursor, version, run, step, evaluation),
        )

    async def _sample(self, request: web.Request) -> web.StreamResponse:
        query = request.query
        run, evaluation = query.get("run", ""), _flag(query)
        step, position = _integer(query, "step"), _integer(query, "position")
        if step is None or position is None:
            return _json({"error": "Give the step and the batch position as whole numbers."}, 400)
        return await self._answer(
            request, lambda cursor, _: data.sample_page(cursor, run, step, position, evaluation)
        )

    async def _version(self, request: web.Request) -> web.StreamResponse:
        def version(cursor: duckdb.DuckDBPyConnection, _: int) -> dict[str, Any]:
            found = cursor.execute(
                "SELECT count(*) FROM (SELECT DISTINCT run, rollout_id, evaluation FROM samples)"
            ).fetchall()
            return {"version": self.served.version, "steps": found[0][0] if found else 0}

        return await self._answer(request, version)

    async def _sql(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web

        sql, fmt = request.query.get("q", ""), request.query.get("format", "json")
        if fmt not in ("json", "csv", "parquet"):
            return _json({"error": "Give format json, csv or parquet."}, 400)
        options = self.options

        def run(cursor: duckdb.DuckDBPyConnection, _: int) -> Any:
            self.console.check(sql, self.served.relations)
            result = console.run_limited(
                cursor, sql, options.query_rows, options.query_seconds, options.query_bytes
            )
            if fmt == "json":
                return _table_json(result, options.query_rows)
            rendered = format_table(result.table, fmt)
            body = rendered.encode("utf-8") if isinstance(rendered, str) else rendered
            kind = "text/csv" if fmt == "csv" else "application/vnd.apache.parquet"
            name = download_name(fmt, options.query_rows if result.truncated else None)
            headers = {
                "Content-Type": kind,
                "Content-Disposition": f'attachment; filename="{name}"',
            }
            if result.truncated:
                headers[TRUNCATED_HEADER] = str(options.query_rows)
            return web.Response(body=body, headers=headers)

        return await self._answer(request, run, seconds=options.query_seconds + 5)


def download_name(fmt: str, cut_at: int | None) -> str:
    """A console download's file name; one cut at the row limit says so in its name.

    Examples:
        >>> download_name("csv", None), download_name("parquet", 10000)
        ('tokenlake-query.csv', 'tokenlake-query-first-10000-rows.parquet')
    """
    return (
        f"tokenlake-query.{fmt}" if cut_at is None else f"tokenlake-query-first-{cut_at}-rows.{fmt}"
    )


@dataclass
class _AuditRun:
    """One catalog version's audits, running on a thread of their own."""

    version: int
    cursor: duckdb.DuckDBPyConnection
    result: Future[dict[str, Any]] = field(default_factory=Future)
    stopped: threading.Event = field(default_factory=threading.Event)
    thread: threading.Thread | None = None

    def stop(self) -> None:
        """Stop after the running query, which is interrupted now."""
        import duckdb

        self.stopped.set()
        if not self.result.done():
            try:
                self.cursor.interrupt()
            except duckdb.ConnectionException:  # closed: its query is over
                pass


def _with_audits(page: dict[str, Any], audits: Future[dict[str, Any]]) -> dict[str, Any]:
    """The runs page with each run's failing audits once they are computed; until then each
    run's `audits` is None and the page's `audits.state` says why."""
    if not audits.done():
        state: dict[str, Any] = {"state": AUDITS_COMPUTING}
        failing: dict[str, Any] | None = None
    elif audits.exception() is not None:
        state = {"state": AUDITS_FAILED, "error": _audit_failure(audits.exception())}
        failing = None
    else:
        state, failing = {"state": AUDITS_READY}, audits.result()
    runs = [
        {**row, "audits": None if failing is None else failing.get(row["run"], [])}
        for row in page["runs"]
    ]
    return {**page, "runs": runs, "audits": state}


def _audit_failure(exc: BaseException | None) -> str:
    if isinstance(exc, (UsageError, PipelineError)):
        return str(exc)
    log.error("the explorer's audits failed: %s", _first(exc) if exc else "")
    return f"the audits failed ({type(exc).__name__})"


class _RunningQueries:
    """The cursors of the queries running now: a stopping server interrupts them (a console
    query runs up to its limit, a page's on a large lake for minutes) and starts no other."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cursors: set[duckdb.DuckDBPyConnection] = set()
        self._stopping = False

    @contextmanager
    def running(self, cursor: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """Raises UsageError once the server is stopping."""
        with self._lock:
            if self._stopping:
                raise UsageError("The server is stopping.")
            self._cursors.add(cursor)
        try:
            yield
        finally:
            with self._lock:
                self._cursors.discard(cursor)

    def stop(self, seconds: float) -> None:
        """Interrupt every query running now, again until none runs or `seconds` have passed
        (an interrupt that comes before a statement starts, or between a page's statements,
        stops nothing), and start no other."""
        deadline = time.monotonic() + seconds
        while True:
            with self._lock:  # a cursor is closed only once it left the set
                self._stopping = True
                for cursor in self._cursors:
                    cursor.interrupt()
                if not self._cursors:
                    return
            if time.monotonic() > deadline:
                return
            time.sleep(0.05)


@contextmanager
def _limited(
    cursor: duckdb.DuckDBPyConnection, seconds: float, queries: _RunningQueries
) -> Iterator[Any]:
    """The cursor, interrupted after `seconds` or when the server stops, closed afterwards."""
    try:
        with queries.running(cursor):
            timer = threading.Timer(seconds, cursor.interrupt)
            timer.start()
            try:
                yield cursor
            finally:
                timer.cancel()
    finally:
        cursor.close()


def _table_json(result: console.ConsoleResult, limit: int) -> dict[str, Any]:
    from tokenlake.serve import report_data as rd

    table = result.table
    columns = [{"name": f.name, "type": str(f.type)} for f in table.schema]
    values = [[rd.clean(v) for v in row.values()] for row in table.to_pylist()]
    return {"columns": columns, "rows": values, "truncated": result.truncated, "limit": limit}


def _first(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0][:300] if text else ''}"


def _integer(query: Any, name: str) -> int | None:
    """A query parameter of ASCII digits (at most 12) as an int, else None. `isdigit` alone
    also passes `²` (which `int` refuses) and `١` (which it reads as 1).

    Examples:
        >>> _integer({"step": "12"}, "step"), _integer({"step": "²"}, "step")
        (12, None)
        >>> _integer({"step": "١"}, "step") is None
        True
    """
    text = str(query.get(name, ""))
    if not (text.isascii() and text.isdigit()) or len(text) > 12:
        return None
    return int(text)


def _flag(query: Any) -> bool:
    return str(query.get("eval", "0")) == "1"


def _json(payload: Any, status: int = 200) -> web.Response:
    from aiohttp import web

    text = json.dumps(payload, allow_nan=False, default=str, ensure_ascii=False)
    return web.Response(
        text=text,
        status=status,
        content_type="application/json",
        headers={"Cache-Control": "no-store"},
    )


# --- starting and stopping -------------------------------------------------------------------


@dataclass
class Running:
    """A started explorer: its URL (with the token when there is one) and how to stop it."""

    url: str
    stop: Callable[[], None]


def _bind(options: ServeOptions) -> socket.socket:
    family = socket.AF_INET6 if ":" in options.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((options.host, options.port))
    except OSError as exc:
        sock.close()
        raise UsageError(
            f"Cannot listen on {options.host}:{options.port} ({exc.strerror or exc});"
            " give another --port or --host."
        ) from None
    sock.listen(128)
    sock.setblocking(False)
    return sock


def _url(host: str, port: int, token: str | None) -> str:
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/" + (f"?token={token}" if token else "")


def start(store: Store, options: ServeOptions = ServeOptions()) -> Running:
    """Start the explorer on a thread of its own; returns once it answers.

    Raises:
        LakeError: The lake cannot be read (not a lake, no catalog).
        UsageError: The address cannot be bound.
    """
    from aiohttp import web

    served = ServedLake(store)
    served.cursor().close()  # the catalog now: a lake that cannot be read fails here
    sock = _bind(options)
    port = sock.getsockname()[1]
    token = None if is_loopback(options.host) else secrets.token_urlsafe(32)
    explorer = Explorer(served, ServeOptions(**{**options.__dict__, "port": port}), token)
    explorer.port = port
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(explorer.app(), access_log=None)
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.SockSite(runner, sock).start())
    thread = threading.Thread(target=loop.run_forever, name="tokenlake-serve", daemon=True)
    thread.start()

    def stop() -> None:
        explorer.interrupt()  # the requests it waits for next then end at once
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=30)
        loop.close()
        explorer.close()
        served.close()

    return Running(_url(options.host, port, token), stop)


def serve_forever(store: Store, options: ServeOptions, announce: Callable[[str], None]) -> None:
    """Serve until Ctrl-C (`tokenlake serve`), announcing the URL once."""
    running = start(store, options)
    try:
        announce(running.url)
        until_ctrl_c()
    finally:
        running.stop()


__all__ = ["LakeError", "ServeOptions", "Running", "start", "serve_forever", "is_loopback"]
