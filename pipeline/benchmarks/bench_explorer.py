"""The explorer's figures for `make bench` (docs/performance.md): each page's data from the
server, the sample page of the lake's longest sample, and the first page drawn in headless
Chromium after the server answers.

Times are seconds of a whole HTTP request to a running explorer (its thread pool, its
DuckDB cursors, the JSON), best of `repeat` after one warm-up request, as a page's script asks:
wall seconds, and the CPU seconds of this process (the server runs on its threads), which a
busy machine disturbs less. The rounds start once the catalog's audits are done, so that their
background work is not counted in a page's.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.chromium import OFFLINE, DevTools, browser
from tokenlake import Lake
from tokenlake.serve import catalog
from tokenlake.serve.explore import step_rows
from tokenlake.serve.explore.server import ServeOptions, start
from tokenlake.serve.served import served_records
from tokenlake.store import manifest

# The runs page's first request to a new server: its per-step rows read for every step (a
# lake never served, or served by another tokenlake), for one step (a step extracted, or
# extracted again, since the lake was last served), or for none (the lake unchanged).
FIRST_RUNS = {
    "every": "runs (/), new server, every step new",
    "one": "runs (/), new server, one step new",
    "none": "runs (/), new server, lake unchanged",
}
PAGE_GOAL = 0.1  # seconds: every page's data (issue 32)
SAMPLE_GOAL = 0.15  # seconds: the sample page of an 8,192-token sample
DRAWN_GOAL = 1.0  # seconds: the first page drawn in Chromium after the server answers


def _one(sql: str, lake: Path, params: tuple[Any, ...] = ()) -> tuple[Any, ...]:
    con = catalog.connect(Lake(lake).store)
    try:
        found = con.execute(sql, list(params)).fetchall()
    finally:
        con.close()
    return tuple(found[0])


def page_requests(lake: Path) -> dict[str, str]:
    """Each page's data request (the path its script asks), on the lake's first run."""
    run, step = _one("SELECT run, min(rollout_id) FROM samples WHERE NOT evaluation GROUP BY run ORDER BY run LIMIT 1", lake)  # fmt: skip
    longest = _one(
        "SELECT rollout_id, batch_position, response_length FROM samples"
        " WHERE run = ? AND NOT evaluation"
        " ORDER BY response_length DESC, rollout_id, batch_position LIMIT 1",
        lake,
        (run,),
    )
    query = urllib.parse.urlencode
    return {
        "runs (/)": "api/runs",
        "run over steps (/runs/RUN)": "api/steps?" + query({"run": run}),
        "step (/runs/RUN/steps/N)": "api/step?" + query({"run": run, "step": step}),
        f"sample of {longest[2]:,} tokens": "api/sample?"
        + query({"run": run, "step": longest[0], "position": longest[1]}),
        "SQL console (step_stats)": "api/sql?" + query({"q": "SELECT * FROM step_stats"}),
        "live check (/api/version)": "api/version",
    }


Timing = tuple[float, float]  # (wall, CPU) seconds


def page_seconds(url: str, requests: dict[str, str], repeat: int = 5) -> dict[str, Timing]:
    """Best wall and best CPU seconds of each request, interleaved rounds after a warm-up
    round, once the catalog's audits are done."""
    audits_ready_seconds(url)
    best = dict.fromkeys(requests, (float("inf"), float("inf")))
    for path in requests.values():
        _fetch(url + path)
    for _ in range(repeat):
        for name, path in requests.items():
            timing = _timed(url + path)
            best[name] = (min(best[name][0], timing[0]), min(best[name][1], timing[1]))
    return best


def _timed(url: str) -> Timing:
    started, cpu = time.perf_counter(), time.process_time()
    _fetch(url)
    return time.perf_counter() - started, time.process_time() - cpu


def audits_ready_seconds(url: str) -> float:
    """Wall seconds from now until the runs page says its audits are done (or failed)."""
    started = time.perf_counter()
    while json.loads(_fetch(url + "api/runs"))["audits"]["state"] == "computing":
        time.sleep(0.02)
    return time.perf_counter() - started


def first_runs_seconds(lake: Path, repeat: int, new: str = "every") -> tuple[Timing, float]:
    """Best seconds of the runs page's first request to a new server (the server keeps that
    page until the catalog changes, so the rounds of `page_seconds` time the kept page; this is
    what the first visit after each extraction waits), each server finding the per-step rows
    of `new` steps not kept (`FIRST_RUNS`: every step, the last training step, none), and the
    best wall seconds until its audits, which it starts in the background, are done."""
    best, ready = (float("inf"), float("inf")), float("inf")
    for _ in range(repeat):
        forget_kept_steps(lake, new)
        running = start(Lake(lake).store, ServeOptions(port=0))
        try:
            timing = _timed(running.url + "api/runs")
            ready = min(ready, timing[0] + audits_ready_seconds(running.url))
            best = (min(best[0], timing[0]), min(best[1], timing[1]))
        finally:
            running.stop()
    return best, ready


def forget_kept_steps(lake: Path, new: str) -> None:
    """Drop the per-step rows a server kept for the lake (in the user's cache) of every step,
    of its last training step, or of none (`new`), as an extraction of those steps would: a
    step extracted again has another identity, so its rows are read again."""
    store = Lake(lake).store
    records = served_records(store, manifest.load_all(store))[0]
    con = catalog.connect(store)
    try:
        identities = step_rows.step_identities(store, records, step_rows.runs_rows(con))
    finally:
        con.close()
    training = [step for step in identities if not step[2]]
    chosen = {"every": list(identities), "one": [max(training)] if training else [], "none": []}
    step_rows.StepRowsKept.of_lake(store).forget(chosen[new], identities)


def _fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=600) as answer:
        return bytes(answer.read())


def print_explorer(lake: Path, label: str, repeat: int = 5) -> dict[str, Timing]:
    """The page figures of one lake, printed; returns them."""
    running = start(Lake(lake).store, ServeOptions(port=0))
    try:
        requests = page_requests(lake)
        seconds = page_seconds(running.url, requests, repeat)
        print(
            f"  explorer pages' data on {label}, best of {repeat} (HTTP request, whole answer;"
            " wall, CPU):"
        )
        ready = float("inf")
        for new, name in FIRST_RUNS.items():
            seconds[name], audited = first_runs_seconds(lake, repeat, new)
            ready = min(ready, audited)
        for name, (wall, cpu) in seconds.items():
            goal = SAMPLE_GOAL if name.startswith("sample") else PAGE_GOAL
            flag = f"  <- over {goal} s" if wall > goal else ""
            print(f"  {name:<36} {wall * 1000:8.1f} ms {cpu * 1000:8.1f} ms CPU{flag}")
        print(f"  {'audits done after the first runs page':<36} {ready * 1000:8.1f} ms")
        drawn = drawn_seconds(running.url, ["/", "step"], lake)
        for name, value in drawn.items():
            flag = f"  <- over {DRAWN_GOAL} s" if value > DRAWN_GOAL else ""
            print(f"  first draw in Chromium, {name:<23} {value * 1000:8.1f} ms{flag}")
        return seconds
    finally:
        running.stop()


def drawn_seconds(url: str, kinds: list[str], lake: Path) -> dict[str, float]:
    """Seconds from navigating to a page until it says it is drawn (`data-rendered`), in a
    fresh headless Chromium: its first visit (the scripts fetched) and, best of 3, a reload."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        import websocket  # noqa: F401  (websocket-client, installed by `make setup-test`)
    except ImportError:
        chromium = None
    if chromium is None:
        print("  first draw in Chromium: skipped (needs `chromium` and websocket-client)")
        return {}
    run, step = _one("SELECT run, min(rollout_id) FROM samples WHERE NOT evaluation GROUP BY run ORDER BY run LIMIT 1", lake)  # fmt: skip
    pages = {"/": url, "step": f"{url}runs/{urllib.parse.quote(run, safe='')}/steps/{step}"}
    found: dict[str, float] = {}
    # Chromium's helper processes may still write its profile as it ends: left to the system.
    with (
        tempfile.TemporaryDirectory(
            prefix="tokenlake-bench-chromium-", ignore_cleanup_errors=True
        ) as profile,
        browser(chromium, Path(profile), f"{OFFLINE}, EXCLUDE 127.0.0.1") as tools,
    ):
        for kind in kinds:
            found[f"{kind} (first visit)"] = _draw(tools, pages[kind])
            found[f"{kind} (reload, best of 3)"] = min(_draw(tools, pages[kind]) for _ in range(3))
    return found


def _draw(tools: DevTools, url: str) -> float:
    tools.evaluate("document.documentElement.dataset.rendered = 'leaving'")
    started = time.perf_counter()
    tools.send("Page.navigate", url=url)
    while True:
        state = tools.evaluate_soft("document.documentElement.dataset.rendered")
        if state in ("done", "failed"):
            break
        if time.perf_counter() - started > 120:
            raise RuntimeError(f"{url} was not drawn in 120 s")
        time.sleep(0.005)
    seconds = time.perf_counter() - started
    if state != "done":
        raise RuntimeError(f"{url} failed to draw")
    return seconds


def print_step_growth(lakes: dict[int, Path], repeat: int = 5) -> None:
    """The runs and step pages on lakes that differ only in their number of small steps: CPU
    seconds (what the machine's other work disturbs least) and their ratio, then wall."""
    times: dict[int, dict[str, Timing]] = {}
    for steps, lake in lakes.items():
        running = start(Lake(lake).store, ServeOptions(port=0))
        try:
            requests = page_requests(lake)
            chosen = {name: path for name, path in requests.items() if not name.startswith(("sample", "live"))}  # fmt: skip
            times[steps] = page_seconds(running.url, chosen, repeat)
        finally:
            running.stop()
        for new, name in FIRST_RUNS.items():
            times[steps][name] = first_runs_seconds(lake, repeat, new)[0]
    low, high = sorted(lakes)
    print(f"  explorer pages' data on lakes of {low} and {high} small steps (CPU; wall):")
    for name in times[low]:
        (low_wall, low_cpu), (high_wall, high_cpu) = times[low][name], times[high][name]
        growth = high_cpu / low_cpu
        flag = "  <- grows over 1.5x" if growth > 1.5 else ""
        print(
            f"  {name:<36} {low_cpu * 1000:8.1f} ms -> {high_cpu * 1000:8.1f} ms"
            f"  {growth:5.2f}x; wall {low_wall * 1000:.1f} -> {high_wall * 1000:.1f} ms"
            f" ({high_wall / low_wall:.2f}x){flag}"
        )
