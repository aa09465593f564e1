"""`tokenlake serve` without a browser: the SQL console's time and row limits, a slow query
beside other requests, the command's printed line (`tokenlake serve`, `Lake.serve()`,
`make serve`) from a process the test starts and stops, and an object-store lake served with
the values of the same run extracted locally.
"""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from tests.conftest import store_of
from tests.e2e.test_first_hour import ROOT
from tests.fixture_paths import REAL_DUMPS
from tests.s3server import moto_server, new_bucket
from tests.serve.test_explorer import runs_from_views
from tokenlake.errors import UsageError
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import catalog
from tokenlake.serve.explore import console, data
from tokenlake.serve.explore.server import ServeOptions, start
from tokenlake.serve.query import run_query

pytestmark = pytest.mark.slow  # real extractions, servers and processes

BASIC = REAL_DUMPS / "basic"
# Runs until the console's limit stops it: 10^12 rows, hours of work for DuckDB.
SLOW_QUERY = "SELECT sum(a.range * b.range) AS s FROM range(1000000) a, range(1000000) b"
PATIENCE = 120.0  # seconds a started process may take to answer on a loaded machine


@pytest.fixture(scope="module")
def lake(tmp_path_factory: pytest.TempPathFactory) -> Path:
    lake = tmp_path_factory.mktemp("served") / "lake"
    extract_run(BASIC, store_of(lake), ExtractOptions(run_name="basic", workers=1))
    return lake


def _get(url: str) -> tuple[int, Any]:
    """Status and JSON body of a GET (an error status too)."""
    try:
        with urllib.request.urlopen(url, timeout=PATIENCE) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as refused:
        return refused.code, json.loads(refused.read())


def _sql(server: str, sql: str, **extra: str) -> str:
    return server + "api/sql?" + urllib.parse.urlencode({"q": sql, **extra})


def _console_queries_running() -> int:
    """How many of this process's threads are inside the console's `run_limited` now (the
    server runs on a thread of the test's process)."""
    code = console.run_limited.__code__
    running = 0
    for frame in sys._current_frames().values():
        while frame is not None:
            if frame.f_code is code:
                running += 1
                break
            frame = frame.f_back
    return running


def _until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + PATIENCE
    while not condition():
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.05)


def test_a_slow_query_is_stopped_at_the_limit_while_other_requests_are_answered(lake):
    running = start(store_of(lake), ServeOptions(port=0, query_seconds=10))
    try:
        slow: dict[str, Any] = {}
        asking = threading.Thread(
            target=lambda: slow.update(answer=_get(_sql(running.url, SLOW_QUERY)))
        )
        asking.start()
        _until(lambda: _console_queries_running() == 1, "the slow query to start")

        assert _get(_sql(running.url, "SELECT 41 + 1 AS x")) == (
            200,
            {
                "columns": [{"name": "x", "type": "int32"}],
                "rows": [[42]],
                "truncated": False,
                "limit": 10000,
            },
        )
        assert _get(running.url + "api/version") == (200, {"version": 1, "steps": 3})
        status, runs = _get(running.url + "api/runs")
        assert status == 200 and [r["run"] for r in runs["runs"]] == ["basic"]
        # all answered while the slow query still ran, on its own thread
        assert asking.is_alive() and _console_queries_running() == 1

        asking.join(timeout=PATIENCE)
        assert slow["answer"] == (
            400,
            {"error": "The query was stopped after 10 s (the console's limit)."},
        )
        assert _console_queries_running() == 0  # DuckDB stopped it: its thread is free again
    finally:
        running.stop()


def test_stopping_the_server_stops_the_queries_it_runs(lake):
    # A console query may run for its whole limit, a page's on a large lake for minutes: a
    # Ctrl-C waited for them.
    running = start(store_of(lake), ServeOptions(port=0, query_seconds=3 * PATIENCE))
    slow: dict[str, Any] = {}
    asking = threading.Thread(
        target=lambda: slow.update(answer=_get(_sql(running.url, SLOW_QUERY)))
    )
    asking.start()
    _until(lambda: _console_queries_running() == 1, "the slow query to start")
    stopping = threading.Thread(target=running.stop)
    stopping.start()
    stopping.join(timeout=PATIENCE)
    asking.join(timeout=PATIENCE)
    assert not stopping.is_alive() and _console_queries_running() == 0
    assert slow["answer"] == (400, {"error": "The query was stopped: the server is stopping."})


@pytest.mark.parametrize("digits", ["%C2%B2", "%D9%A1"], ids=["superscript-2", "arabic-1"])
def test_a_step_or_position_in_digits_other_than_ascii_is_a_400_not_a_traceback(lake, digits):
    # `"²".isdigit()` is true and `int("²")` raised: a 500 and a traceback in the server's log;
    # `int("١")` is 1, so `step=١` answered step 1's page.
    running = start(store_of(lake), ServeOptions(port=0))
    try:
        step = _get(f"{running.url}api/step?run=basic&step={digits}")
        sample = _get(f"{running.url}api/sample?run=basic&step=1&position={digits}")
    finally:
        running.stop()
    assert step == (400, {"error": "Give the step as a whole number."})
    assert sample == (400, {"error": "Give the step and the batch position as whole numbers."})


def test_a_query_with_more_rows_than_the_limit_is_cut_and_says_so(lake):
    running = start(store_of(lake), ServeOptions(port=0, query_rows=5))
    try:
        assert _get(_sql(running.url, "SELECT range AS n FROM range(12)")) == (
            200,
            {
                "columns": [{"name": "n", "type": "int64"}],
                "rows": [[0], [1], [2], [3], [4]],
                "truncated": True,
                "limit": 5,
            },
        )
        assert _get(_sql(running.url, "SELECT range AS n FROM range(5)"))[1]["truncated"] is False
        csv = _sql(running.url, "SELECT range AS n FROM range(12)", format="csv")
        with urllib.request.urlopen(csv, timeout=PATIENCE) as answer:
            assert answer.read() == b'"n"\n0\n1\n2\n3\n4\n'
            assert answer.headers["X-Tokenlake-Truncated"] == "5"
            assert answer.headers["Content-Disposition"] == (
                'attachment; filename="tokenlake-query-first-5-rows.csv"'
            )
        cut = _sql(running.url, "SELECT range AS n FROM range(12)", format="parquet")
        with urllib.request.urlopen(cut, timeout=PATIENCE) as answer:
            table = pq.read_table(io.BytesIO(answer.read()))
            assert table.column("n").to_pylist() == [0, 1, 2, 3, 4]
            assert answer.headers["X-Tokenlake-Truncated"] == "5"
            assert answer.headers["Content-Disposition"] == (
                'attachment; filename="tokenlake-query-first-5-rows.parquet"'
            )
        whole = _sql(running.url, "SELECT range AS n FROM range(5)", format="csv")
        with urllib.request.urlopen(whole, timeout=PATIENCE) as answer:
            assert answer.read() == b'"n"\n0\n1\n2\n3\n4\n'
            assert "X-Tokenlake-Truncated" not in answer.headers
            assert answer.headers["Content-Disposition"] == (
                'attachment; filename="tokenlake-query.csv"'
            )
    finally:
        running.stop()


def test_a_query_whose_result_exceeds_the_byte_limit_is_refused_before_it_is_fetched(lake):
    """What bounds a console query's memory beyond its rows: its result's bytes, counted as
    the rows are fetched (256 at a time), so 10,000 rows of 100 kB are never held."""
    running = start(store_of(lake), ServeOptions(port=0, query_bytes=1_000_000))
    try:
        wide = "SELECT repeat('x', 100000) AS s FROM range(10000)"  # 1 GB if fetched whole
        for extra in ({}, {"format": "csv"}, {"format": "parquet"}):
            assert _get(_sql(running.url, wide, **extra)) == (
                400,
                {
                    "error": "Refused: its result takes more than 1,000,000 bytes (the console's"
                    " limit); select fewer or narrower columns, or run it with `tokenlake query`."
                },
            )
        status, narrow = _get(_sql(running.url, "SELECT repeat('x', 1000) AS s FROM range(900)"))
        assert status == 200 and len(narrow["rows"]) == 900 and narrow["truncated"] is False
    finally:
        running.stop()


# --- the command, the Python API and make, as processes -----------------------------------


def _started(command: list[str], cwd: Path = ROOT) -> subprocess.Popen[str]:
    # A session of its own: Ctrl-C (SIGINT) goes to its process group only, as a terminal's
    # would, reaching `make`'s shell and the server under it.
    return subprocess.Popen(
        command,
        cwd=cwd,
        # A process that hangs is ended with SIGABRT, and faulthandler then prints every
        # thread's stack: the failure shows where it hung.
        env={**os.environ, "PWD": str(cwd), "PYTHONFAULTHANDLER": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _first_line(process: subprocess.Popen[str]) -> str:
    """The first line the process prints (read on a thread: a hung process fails the test)."""
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.append(process.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    reader.start()
    reader.join(timeout=PATIENCE)
    assert seen, "the server printed nothing"
    return seen[0]


def _stopped(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """Ctrl-C to the process's group; its exit code and what it wrote after its first line
    (stdout, then stderr)."""
    os.killpg(process.pid, signal.SIGINT)
    return _ended(process)


def _ended(process: subprocess.Popen[str]) -> tuple[int, str, str]:
    """The process's exit code, stdout and stderr once it ends; one still running after
    PATIENCE fails the test with every thread's stack (see `_started`)."""
    try:
        out, err = process.communicate(timeout=PATIENCE)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGABRT)
        try:
            _, stacks = process.communicate(timeout=PATIENCE)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            _, stacks = process.communicate()
        raise AssertionError(f"the process did not end; its threads:\n{stacks}") from None
    return process.returncode, out, err


def _answers_runs(url: str) -> list[str]:
    status, page = _get(url + "api/runs")
    assert status == 200
    return [run["run"] for run in page["runs"]]


def _port(line: str) -> int:
    return int(line.split("http://127.0.0.1:")[1].split("/")[0])


def test_tokenlake_serve_prints_its_url_serves_and_stops_on_ctrl_c(lake):
    process = _started([sys.executable, "-m", "tokenlake", "serve", str(lake), "--port", "0"])
    try:
        line = _first_line(process)
        port = _port(line)
        assert line == f"Serving `{lake}` at http://127.0.0.1:{port}/ (Ctrl-C stops)\n"
        assert _answers_runs(f"http://127.0.0.1:{port}/") == ["basic"]
    finally:
        stopped = _stopped(process)
    assert stopped == (1, "", "\nAborted!\n")  # click's line for a Ctrl-C, no traceback


def test_lake_serve_announces_the_url_it_serves(lake):
    script = (
        "import sys, tokenlake\n"
        "try:\n"
        "    tokenlake.open_lake(sys.argv[1]).serve(port=0, announce=lambda url: print(url, flush=True))\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped', flush=True)\n"
    )
    process = _started([sys.executable, "-c", script, str(lake)])
    try:
        line = _first_line(process)
        port = _port(line)
        assert line == f"http://127.0.0.1:{port}/\n"
        assert _answers_runs(line.strip()) == ["basic"]
    finally:
        stopped = _stopped(process)
    assert stopped == (0, "stopped\n", "")  # Ctrl-C reaches the caller as KeyboardInterrupt


def test_serve_stops_on_a_ctrl_c_that_another_thread_took(lake):
    # The kernel may hand a process's SIGINT to any of its threads (DuckDB's, the server's);
    # here one of them takes it for sure (a thread-directed signal), once the server's main
    # thread waits for a Ctrl-C.
    script = (
        "import signal, sys, threading, time, tokenlake\n"
        "def serving():\n"
        "    frame = sys._current_frames()[threading.main_thread().ident]\n"
        "    names = [frame.f_code.co_name]\n"
        "    while frame.f_back:\n"
        "        frame = frame.f_back\n"
        "        names.append(frame.f_code.co_name)\n"
        "    return names[0] == 'wait' and 'start' not in names and 'serve_forever' in names\n"
        "def ctrl_c():\n"
        "    while not serving():\n"
        "        time.sleep(0.01)\n"
        "    signal.pthread_kill(threading.get_ident(), signal.SIGINT)\n"
        "def announce(url):\n"
        "    print(url, flush=True)\n"
        "    threading.Thread(target=ctrl_c).start()\n"
        "try:\n"
        "    tokenlake.open_lake(sys.argv[1]).serve(port=0, announce=announce)\n"
        "except KeyboardInterrupt:\n"
        "    print('stopped', flush=True)\n"
    )
    code, out, err = _ended(_started([sys.executable, "-c", script, str(lake)]))
    assert (code, out, err) == (0, f"http://127.0.0.1:{_port(out)}/\nstopped\n", "")


def test_make_serve_serves_the_lake_it_is_given(lake, tmp_path):
    venv = Path(sys.executable).parent.parent
    command = ["make", "--no-print-directory", "-C", str(ROOT), f"VENV={venv}",
               "-o", f"{venv}/.installed-run", "-o", f"{venv}/.installed-test",
               "serve", f"LAKE={lake.name}", "PORT=0"]  # fmt: skip
    dry = subprocess.run([*command[:1], "-n", *command[1:]], cwd=lake.parent,
                         env={**os.environ, "PWD": str(lake.parent)}, capture_output=True,
                         text=True, timeout=PATIENCE)  # fmt: skip
    assert dry.returncode == 0, dry.stderr
    assert "-m tokenlake serve" in dry.stdout and '--port "${TL_PORT:-8765}"' in dry.stdout

    process = _started(command, cwd=lake.parent)  # LAKE relative to where make is called
    try:
        line = _first_line(process)
        port = _port(line)
        assert line == f"Serving `{lake}` at http://127.0.0.1:{port}/ (Ctrl-C stops)\n"
        assert _answers_runs(f"http://127.0.0.1:{port}/") == ["basic"]
    finally:
        _stopped(process)


# --- an object-store lake -------------------------------------------------------------------


@pytest.fixture(scope="module")
def s3() -> Iterator[dict[str, str]]:
    with moto_server() as env:
        yield env


# When each lake was extracted: the one value two extractions of a dump do not share.
WHEN = "extracted_at"


def _same(remote: Any, local: Any, where: str = "") -> None:
    """Equal JSON, floats to the last bits DuckDB's parallel sums leave to chance."""
    if isinstance(local, dict):
        assert isinstance(remote, dict) and remote.keys() == local.keys(), where
        for key in local.keys() - {WHEN}:
            _same(remote[key], local[key], f"{where}.{key}")
    elif isinstance(local, list):
        assert isinstance(remote, list) and len(remote) == len(local), where
        for i, (far, near) in enumerate(zip(remote, local, strict=True)):
            _same(far, near, f"{where}[{i}]")
    elif isinstance(local, float):
        assert remote == pytest.approx(local, rel=1e-9, abs=1e-12), where
    else:
        assert remote == local, where


def test_an_object_store_lake_is_served_with_the_values_of_a_local_one(s3, lake):
    url = f"s3://{new_bucket()}/lake"
    extract_run(BASIC, store_of(url), ExtractOptions(run_name="basic", workers=1))
    far, near = (
        start(store_of(url), ServeOptions(port=0)),
        start(store_of(lake), ServeOptions(port=0)),
    )
    try:
        pages = [
            "api/runs",
            "api/steps?run=basic",
            "api/step?run=basic&step=1",
            "api/sample?run=basic&step=1&position=3",
            "api/version",
            "api/sql?" + urllib.parse.urlencode({"q": "SELECT * FROM step_stats ORDER BY ALL"}),
        ]
        for page in pages:
            remote, local = _get(far.url + page), _get(near.url + page)
            assert remote[0] == local[0] == 200, (page, remote)
            _same(remote[1], local[1], page)
        assert len(_get(near.url + pages[3])[1]["tokens"]["position"]) > 0
    finally:
        far.stop()
        near.stop()


# --- a lake that changes under the server ----------------------------------------------------


def test_the_runs_page_shows_a_step_committed_while_the_server_runs(tmp_path):
    from tokenlake.generator import synth

    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(
        tmp_path / "dump", store_of(lake), ExtractOptions(run_name="live", workers=1, steps=[0])
    )
    running = start(store_of(lake), ServeOptions(port=0))
    try:

        def shown() -> tuple[int, int]:
            status, page = _get(running.url + "api/runs")
            assert status == 200
            (run,) = page["runs"]
            return run["steps"], run["eval_steps"]

        def step_one() -> tuple[int, Any, Any, list[Any]]:
            status, page = _get(running.url + "api/step?run=live&step=1")
            steps = [(s["rollout_id"], s["evaluation"]) for s in page.get("steps", [])]
            return status, page.get("numbers"), page.get("drift"), steps

        assert shown() == shown() == (1, 1)  # asked twice: the second from the kept page
        assert step_one() == (400, None, None, [])  # no step 1 yet; the kept rows say so
        extract_run(
            tmp_path / "dump", store_of(lake), ExtractOptions(run_name="live", workers=1, steps=[1])
        )
        _until(lambda: _get(running.url + "api/version")[1]["steps"] == 3, "the new catalog")
        assert shown() == (2, 1)
        # the step page's kept rows were read again for the new catalog: step 1's own rows
        expected = run_query(
            store_of(lake), "SELECT * FROM drift_steps WHERE rollout_id = 1"
        ).to_pylist()
        status, numbers, drift, steps = step_one()
        assert status == 200 and steps == [(0, False), (0, True), (1, False)]
        assert numbers["rollout_id"] == drift["rollout_id"] == 1
        assert drift["prev_rollout_id"] == expected[0]["prev_rollout_id"] == 0
        assert drift["k3_kl_change"] == pytest.approx(expected[0]["k3_kl_change"])
    finally:
        running.stop()


def test_the_runs_page_reads_only_new_and_changed_steps_and_equals_the_views(tmp_path, monkeypatch):
    """The runs page's per-step rows are kept per step identity, across catalog versions and
    servers: a step extracted under a running server, then a step extracted again from other
    files, are the only ones read, and a new server on the unchanged lake reads none. Each
    time the runs page equals the views, and every step page's `drift_steps` row (its change
    from the run's previous step computed again over the kept rows) equals the view's."""
    from tokenlake.generator import synth
    from tokenlake.serve.explore import step_rows

    monkeypatch.setenv("TOKENLAKE_CACHE", str(tmp_path / "cache"))
    spec = synth.PRESETS["example"]
    synth.write_dump(tmp_path / "dump", spec)
    synth.write_dump(tmp_path / "other", replace(spec, seed=spec.seed + 1))
    lake = tmp_path / "lake"

    def extracted(steps: list[int]) -> None:
        options = ExtractOptions(run_name="live", workers=1, steps=steps)
        extract_run(tmp_path / "dump", store_of(lake), options)

    read: list[Any] = []  # per read of step rows: the steps chosen, or "every step"
    tables = step_rows.StepRowsKept.tables

    def spied(kept: Any, identities: Any, reader: Any) -> Any:
        def recorded(chosen: Any) -> Any:
            read.append("every step" if chosen is None else sorted(chosen))
            return reader(chosen)

        return tables(kept, identities, recorded)

    monkeypatch.setattr(step_rows.StepRowsKept, "tables", spied)

    def checked(url: str) -> dict[tuple[int, bool], Any]:
        """The runs page and every step page against the views; the step pages' drift."""
        _, page = _get(url + "api/runs")
        con = catalog.connect(store_of(lake))
        try:
            expected = runs_from_views(con)
            drift = {r["rollout_id"]: r for r in data.rows(con, "SELECT * FROM drift_steps")}
            steps = con.execute(
                "SELECT DISTINCT rollout_id, evaluation FROM samples ORDER BY ALL"
            ).fetchall()
        finally:
            con.close()
        assert [{k: v for k, v in r.items() if k != "audits"} for r in page["runs"]] == (
            json.loads(json.dumps(expected, default=str))
        )
        shown = {}
        for step, evaluation in steps:
            query = {"run": "live", "step": step, **({"eval": "1"} if evaluation else {})}
            status, answer = _get(url + "api/step?" + urllib.parse.urlencode(query))
            assert status == 200
            want = None if evaluation else json.loads(json.dumps(drift[step], default=str))
            assert answer["drift"] == want, (step, evaluation)
            shown[(step, evaluation)] = answer["drift"]
        return shown

    def next_catalog(url: str, version: int) -> None:
        # (an answer while the extraction commits may be an error: asked again)
        _until(lambda: _get(url + "api/version")[1].get("version", 0) > version, "the new catalog")

    extracted([0, 1])
    running = start(store_of(lake), ServeOptions(port=0))
    try:
        first = checked(running.url)
        assert read == ["every step"] and sorted(first) == [(0, False), (0, True), (1, False)]
        read.clear()
        extracted([2])
        next_catalog(running.url, 1)
        grown = checked(running.url)
        assert read == [[("live", 2, False)]] and grown[(1, False)] == first[(1, False)]
        assert grown[(2, False)]["prev_rollout_id"] == 1
        read.clear()
        for name in ("train_data/1_0.pt", "train_data/1_1.pt", "train_data/1_2.pt",
                     "train_data/1_3.pt", "rollout_data/1.pt", "trajectory/1.jsonl",
                     "dashboard_columns/rollout_1.parquet"):  # fmt: skip
            (tmp_path / "dump" / name).write_bytes((tmp_path / "other" / name).read_bytes())
        extracted([1])
        next_catalog(running.url, 2)
        again = checked(running.url)
        assert read == [[("live", 1, False)]]
        # step 1 holds other values now, and so does step 2's change from it
        assert again[(1, False)]["k3_kl"] != grown[(1, False)]["k3_kl"]
        assert again[(2, False)]["k3_kl"] == grown[(2, False)]["k3_kl"]
        assert again[(2, False)]["k3_kl_change"] != grown[(2, False)]["k3_kl_change"]
    finally:
        running.stop()
    read.clear()
    running = start(store_of(lake), ServeOptions(port=0))
    try:
        assert checked(running.url) == again
        assert read == []  # a new server on the same lake: every step's rows from the cache
    finally:
        running.stop()
    assert [p.name for p in (tmp_path / "cache" / step_rows.FOLDER).glob("*/*")] == [step_rows.FILE]


# --- the runs page's audits, run once per catalog in the background --------------------------


def test_the_runs_page_answers_while_its_audits_run_then_shows_them(lake, monkeypatch):
    release = threading.Event()
    real = data.failing_audits

    def held(con: Any, stopped: Any) -> Any:
        assert release.wait(PATIENCE)
        return real(con, stopped)

    monkeypatch.setattr(data, "failing_audits", held)
    running = start(store_of(lake), ServeOptions(port=0))
    try:
        status, page = _get(running.url + "api/runs")
        assert status == 200 and page["audits"] == {"state": "computing"}
        assert [(r["run"], r["audits"]) for r in page["runs"]] == [("basic", None)]
        release.set()
        _until(
            lambda: _get(running.url + "api/runs")[1]["audits"]["state"] != "computing", "audits"
        )
        status, page = _get(running.url + "api/runs")
        con = catalog.connect(store_of(lake))
        try:
            expected = real(con)["basic"]
        finally:
            con.close()
        assert status == 200 and page["audits"] == {"state": "ready"}
        assert expected and page["runs"][0]["audits"] == expected
    finally:
        release.set()
        running.stop()


def test_audits_that_fail_say_so_on_the_runs_page(lake, monkeypatch):
    def failing(con: Any, stopped: Any) -> Any:
        raise UsageError("Query failed: an audit could not run.")

    monkeypatch.setattr(data, "failing_audits", failing)
    running = start(store_of(lake), ServeOptions(port=0))
    try:
        _get(running.url + "api/runs")
        _until(
            lambda: _get(running.url + "api/runs")[1]["audits"]["state"] != "computing", "audits"
        )
        status, page = _get(running.url + "api/runs")
        assert status == 200
        assert page["audits"] == {
            "state": "failed",
            "error": "Query failed: an audit could not run.",
        }
        assert page["runs"][0]["audits"] is None and page["runs"][0]["run"] == "basic"
    finally:
        running.stop()


# --- run names with a comma ------------------------------------------------------------------


def test_a_run_named_with_a_comma_is_one_run_to_the_steps_api(tmp_path):
    # `runs=a,b` was split at every comma: the page of the run `a,b` asked for the runs `a` and
    # `b` and drew their steps under its name. Each run is now one `run=` parameter.
    from tests.lakes import build_lake

    names, samples = ["a", "b", "a,b"], []
    for number, name in enumerate(names):
        samples.append({"run": name, "rollout_id": number, "batch_position": 0,
                        "sample_index": 0, "response_length": 0, "has_train_row": True,
                        "raw_reward": float(number)})  # fmt: skip
    runs = [{"run": name, "source_dir": "/d", "tool": "t", "train_steps": 1} for name in names]
    build_lake(tmp_path / "lake", samples=samples, runs=runs)
    server = start(store_of(tmp_path / "lake"), ServeOptions(port=0))
    try:
        status, body = _get(server.url + "api/steps?" + urllib.parse.urlencode({"run": "a,b"}))
        drawn = {row["run"] for rows in body.values() if isinstance(rows, list) for row in rows
                 if isinstance(row, dict) and "run" in row}  # fmt: skip
        assert (status, body["runs"], drawn) == (200, ["a,b"], {"a,b"})
        both = urllib.parse.urlencode([("run", "b"), ("run", "a")])
        assert _get(server.url + "api/steps?" + both)[1]["runs"] == ["a", "b"]
    finally:
        server.stop()
