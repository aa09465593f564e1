"""`tokenlake serve`: the explorer, driven in a real headless Chromium (test_report.py's
DevTools helpers) over a lake of miles, slime and NeMo-RL runs and a run with a hostile name.

Screenshots of each page land in the test's folder, or in $TOKENLAKE_SCREENSHOTS when set
(how docs/images/explorer-*.png are made).
"""

from __future__ import annotations

import base64
import dataclasses
import json
import math
import os
import shutil
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, SLIME_REAL
from tests.serve.test_report import _browser, _problems
from tests.serve.test_report_hostile_text import _with_hostile_vocab
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import catalog
from tokenlake.serve import report_data as rd
from tokenlake.serve.explore import data
from tokenlake.serve.explore.server import ServeOptions, start
from tokenlake.serve.query import run_query
from tokenlake.serve.run_colours import run_colours
from tokenlake.serve.served import served_records
from tokenlake.store import manifest

HOSTILE_RUN = "<b>x<i>y'\"&amp;<!--"
# The last message of the hostile run's first sample: a thinking block, then markup that
# would run if the page wrote it as HTML.
THINKING = "<b>weigh</b> the </pre> options"
HOSTILE_MESSAGE = (
    "<img src=x onerror=\"document.title='owned'\"><script>document.title='owned'</script>"
    "</pre><b>bold</b>"
)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def lake(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("explorer")
    lake = root / "lake"
    synth.write_dump(root / "example", synth.PRESETS["example"])
    multi_turn = dataclasses.replace(synth.PRESETS["cp-thd"], multi_turn=True, steps=2)
    synth.write_dump(root / "cp", multi_turn)
    extract_run(root / "example", store_of(lake), ExtractOptions(run_name="example", workers=1))
    extract_run(root / "cp", store_of(lake), ExtractOptions(run_name="multi-turn", workers=1))
    extract_run(
        SLIME_REAL / "v2_dp2_cp2", store_of(lake), ExtractOptions(run_name="slime", workers=1)
    )
    extract_run(
        NEMO_RL_REAL / "grpo_multiturn", store_of(lake), ExtractOptions(run_name="nemo", workers=1)
    )
    _with_hostile_message(root / "example", root / "hostile")
    extract_run(root / "hostile", store_of(lake), ExtractOptions(run_name=HOSTILE_RUN, workers=1))
    _with_hostile_vocab(lake, HOSTILE_RUN)
    return lake


def _with_hostile_message(dump: Path, out: Path) -> None:
    """A copy of `dump` whose step 0's first conversation ends in THINKING and HOSTILE_MESSAGE."""
    shutil.copytree(dump, out)
    trajectory = out / "trajectory" / "0.jsonl"
    records = [json.loads(line) for line in trajectory.read_text().splitlines()]
    records[0]["messages"][-1]["content"] = f"<think>{THINKING}</think>{HOSTILE_MESSAGE}"
    trajectory.write_text("".join(json.dumps(r) + "\n" for r in records))


@pytest.fixture(scope="module")
def server(lake):
    running = start(store_of(lake), ServeOptions(port=0))
    yield running.url
    running.stop()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    rules = "MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"
    with _browser(tmp_path_factory.mktemp("profile"), rules) as tools:
        tools.socket.settimeout(PATIENCE)  # a screenshot of a long page, on a loaded machine
        for domain in ("Runtime", "Log", "Network", "Page"):
            tools.send(f"{domain}.enable")
        yield tools


def _outside(events: list[dict], server: str) -> list[str]:
    """Console errors, exceptions, and any request that does not go to the explorer."""
    return [p for p in _problems(events) if not p.startswith(f"request: {server}")]


def _open(tools, url: str) -> None:
    tools.evaluate("document.documentElement.dataset.rendered = 'leaving'")
    tools.send("Page.navigate", url=url)
    _wait(tools)


PATIENCE = 120.0  # seconds: generous, a loaded machine draws slowly


def _until(tools, expression: str, what: str):
    """Wait until `expression` is truthy in the page (never a fixed sleep); its value."""
    deadline = time.monotonic() + PATIENCE
    while not (value := tools.evaluate_soft(expression)):
        assert time.monotonic() < deadline, f"still waiting for {what}"
        time.sleep(0.1)
    return value


def _wait(tools) -> None:
    state = _until(
        tools,
        "(r => ['done', 'failed'].includes(r) && location.href + ' ' + r)"
        "(document.documentElement.dataset.rendered)",
        "the page to be drawn",
    )
    assert state.endswith("done"), (state, tools.evaluate("document.body.innerText"))


def _click(tools, selector: str) -> None:
    tools.evaluate("document.documentElement.dataset.rendered = 'leaving'")
    tools.evaluate(f"document.querySelector({json.dumps(selector)}).click()")
    _wait(tools)


def _shot(tools, name: str, folder: Path) -> None:
    target = Path(os.environ.get("TOKENLAKE_SCREENSHOTS") or folder)
    shot = tools.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    (target / f"explorer-{name}.png").write_bytes(base64.b64decode(shot["data"]))


def _cells(tools, selector: str) -> list[str]:
    return tools.evaluate(
        f"[...document.querySelectorAll({json.dumps(selector)})].map(e => e.textContent)"
    )


def test_runs_to_step_to_sample_and_back_with_the_views_values(lake, server, browser, tmp_path):
    _open(browser, server)
    names = _cells(browser, "a.run-link")
    assert names == sorted(["example", "multi-turn", "slime", "nemo", HOSTILE_RUN])
    expected = run_query(
        store_of(lake),
        "SELECT run, sum(tokens * mean_abs_lp_diff_tm) / sum(tokens) AS m FROM drift_steps"
        " WHERE tokens > 0 GROUP BY run ORDER BY run",
    ).to_pylist()
    headers = _cells(browser, "thead th")
    column = headers.index("mean_abs_lp_diff") + 1
    shown = _cells(browser, f"tbody tr td:nth-child({column})")
    for row, text in zip(expected, shown, strict=True):
        assert float(text) == pytest.approx(row["m"], rel=1e-3), row
    frameworks = _cells(browser, f"tbody tr td:nth-child({headers.index('framework') + 1})")
    assert sorted(set(frameworks)) == ["miles", "nemo-rl", "slime"]
    _shot(browser, "runs", tmp_path)

    browser.evaluate("document.documentElement.dataset.rendered = 'leaving'")  # not the old page's
    browser.evaluate(
        "[...document.querySelectorAll('a.run-link')].find(a => a.textContent === 'multi-turn').click()"
    )
    _wait(browser)
    assert browser.evaluate("location.pathname") == "/runs/multi-turn"
    assert browser.evaluate("Object.keys(explorer.charts).includes('mean-abs')")
    _shot(browser, "run", tmp_path)

    _click(browser, "a.step-link")
    assert browser.evaluate("location.pathname") == "/runs/multi-turn/steps/0"
    samples = (
        run_query(
            store_of(lake),
            "SELECT count(*) AS n FROM samples WHERE run = 'multi-turn' AND rollout_id = 0"
            " AND NOT evaluation",
        )
        .column("n")[0]
        .as_py()
    )
    assert f"{samples} sample(s)" in browser.evaluate(
        "document.getElementById('samples').innerText"
    )
    _shot(browser, "step", tmp_path)

    _click(browser, "a.sample-link")
    assert browser.evaluate("location.pathname") == "/runs/multi-turn/steps/0/samples/0"
    length = (
        run_query(
            store_of(lake),
            "SELECT count(*) AS n FROM tokens WHERE run = 'multi-turn' AND rollout_id = 0"
            " AND NOT evaluation AND batch_position = 0",
        )
        .column("n")[0]
        .as_py()
    )
    browser.evaluate(
        "document.getElementById('window').value = 'all';"
        "document.getElementById('window').dispatchEvent(new Event('change'))"
    )
    assert browser.evaluate("document.getElementById('strip').dataset.cells") == str(length)
    _shot(browser, "sample", tmp_path)

    browser.evaluate("document.documentElement.dataset.rendered = 'leaving'")
    browser.send(
        "Page.navigateToHistoryEntry",
        entryId=browser.send("Page.getNavigationHistory")["entries"][-2]["id"],
    )
    _wait(browser)
    assert browser.evaluate("location.pathname") == "/runs/multi-turn/steps/0"
    assert _outside(browser.events, server) == []


def _masked_sample(lake: Path) -> tuple[int, int, int]:
    """(step, batch position, tokens without an lp_diff) of a multi-turn sample with masked
    tokens between covered ones."""
    row = run_query(
        store_of(lake),
        "SELECT rollout_id, batch_position, count(*) FILTER (WHERE loss_mask = 0 OR lp_diff IS NULL"
        " OR NOT isfinite(lp_diff)) AS blank FROM tokens WHERE run = 'multi-turn'"
        " AND NOT evaluation GROUP BY ALL HAVING max(turn_index) > 0 ORDER BY ALL LIMIT 1",
    ).to_pylist()[0]
    return row["rollout_id"], row["batch_position"], row["blank"]


def test_masked_tokens_are_drawn_as_no_value_and_reload_keeps_the_state(
    lake, server, browser, tmp_path
):
    step, position, blank = _masked_sample(lake)
    _open(
        browser, f"{server}runs/multi-turn/steps/{step}/samples/{position}?window=all&stat=lp_diff"
    )
    assert blank > 0
    cells = browser.evaluate(
        "[...document.querySelectorAll('#strip .tok')].map(c => [c.dataset.state,"
        " c.style.background, c.title.split('\\n')[1]])"
    )
    empty = [c for c in cells if c[0] == "none"]
    assert len(empty) == blank
    assert {c[1] for c in empty} == {""}  # no colour at all, never the colour of 0
    assert {c[2] for c in empty} == {"lp_diff: masked (loss_mask = 0): no value, drawn blank"}
    legend = browser.evaluate("document.getElementById('legend-text').textContent")
    assert legend.startswith("lp_diff: colour symmetric around 0, clipped at ±")
    assert "the 99th percentile of |lp_diff| over the " in legend

    browser.evaluate(
        "document.getElementById('stat').value = 'train_log_prob';"
        "document.getElementById('stat').dispatchEvent(new Event('change'))"
    )
    browser.evaluate(
        "document.getElementById('window').value = '256';"
        "document.getElementById('window').dispatchEvent(new Event('change'))"
    )
    browser.evaluate("document.documentElement.dataset.rendered = 'leaving'")
    browser.send("Page.reload")
    _wait(browser)
    assert browser.evaluate(
        "[document.getElementById('stat').value, document.getElementById('window').value]"
    ) == ["train_log_prob", "256"]


def test_one_run_keeps_its_colour_on_every_chart(lake, server, browser):
    colours = {}
    for url in (
        f"{server}compare?run=example&run=multi-turn&run=nemo&run=slime",
        f"{server}runs/nemo",
        f"{server}compare?run=nemo&run=slime",
    ):
        _open(browser, url)
        drawn = browser.evaluate(
            "Object.entries(explorer.charts).filter(([id]) => id !== 'profile').map(([id, v]) =>"
            " [id, v.scale('color') ? v.scale('color')('nemo') : null])"
        )
        assert drawn
        for chart, colour in drawn:
            colours.setdefault(colour, []).append((url, chart))
    assert len(colours) == 1, colours
    # the lake's colour for the run, the report's too (tokenlake.serve.run_colours)
    assert set(colours) == {
        run_colours(["example", "multi-turn", "slime", "nemo", HOSTILE_RUN])["nemo"]
    }


def test_nothing_leaves_a_420_px_screen(server, browser, lake, tmp_path):
    step, position, _ = _masked_sample(lake)
    browser.send(
        "Emulation.setDeviceMetricsOverride",
        width=420,
        height=800,
        deviceScaleFactor=1,
        mobile=True,
    )
    try:
        for path in (
            "",
            "runs/nemo",
            f"runs/multi-turn/steps/{step}",
            f"runs/multi-turn/steps/{step}/samples/{position}",
            "sql?q=SELECT%20*%20FROM%20runs",
        ):
            _open(browser, server + path)
            width = browser.evaluate("[document.documentElement.scrollWidth, innerWidth]")
            assert width[0] <= width[1] == 420, (path, width)
        _shot(browser, "narrow", tmp_path)
    finally:
        browser.send("Emulation.clearDeviceMetricsOverride")


@pytest.mark.parametrize(
    ("sql", "line"),
    [
        (
            "COPY (SELECT 1) TO '/tmp/x.csv'",
            "Refused: its query is not one SELECT (Only SELECT statements can be serialized to json!).",
        ),
        (
            "ATTACH '/tmp/other.db' AS o",
            "Refused: its query is not one SELECT (Only SELECT statements can be serialized to json!).",
        ),
        (
            "SELECT * FROM read_text('/etc/passwd')",
            "Refused: it calls table function `read_text`; a user view may read only the lake's tables and views (and generate_series, range, unnest).",
        ),
        (
            "SELECT getenv('HOME')",
            "Refused: it calls `getenv`, which a user view may not (it reads the reader's environment).",
        ),
    ],
)
def test_the_sql_console_refuses_what_a_user_view_may_not(server, browser, sql, line):
    _open(browser, server + "sql?" + urllib.parse.urlencode({"q": sql}))
    assert browser.evaluate("document.getElementById('sql-error').textContent") == line


def test_the_sql_console_shows_a_query_and_its_downloads(lake, server, browser, tmp_path):
    _open(browser, server + "sql?q=SELECT%20run%2C%20framework%20FROM%20runs%20ORDER%20BY%20run")
    assert _cells(browser, "#result tbody td:nth-child(1)") == sorted(
        ["example", "multi-turn", "slime", "nemo", HOSTILE_RUN]
    )
    with urllib.request.urlopen(server + "api/sql?format=csv&q=SELECT%201%20AS%20x") as answer:
        assert answer.read() == b'"x"\n1\n'
    _shot(browser, "sql", tmp_path)


def test_a_hostile_run_name_and_token_texts_stay_text(lake, server, browser):
    browser.events.clear()  # the console's refusals before this are answers of 400
    _open(browser, server)
    assert HOSTILE_RUN in _cells(browser, "a.run-link")
    step_path = f"runs/{urllib.parse.quote(HOSTILE_RUN, safe='')}/steps/0/samples/0?window=all"
    _open(browser, server + step_path)
    assert (
        browser.evaluate(
            "document.querySelectorAll('main b, main i, main img, main script').length"
        )
        == 0
    )
    texts = browser.evaluate(
        "[...document.querySelectorAll('#strip .tok')].map(c => c.textContent)"
    )
    assert texts and all(t.startswith("</script><!--<b>&amp;") for t in texts)
    assert browser.evaluate("document.querySelector('h1').textContent").startswith(HOSTILE_RUN)
    assert _outside(browser.events, server) == []


def test_a_run_named_with_a_comma_is_ticked_compared_and_opened_as_one_run(browser, tmp_path):
    # The page joined the ticked runs with commas and the server split them: the page of the
    # run `a,b` drew the runs `a` and `b` under its name.
    from tests.lakes import build_lake

    names = ["a", "b", "a,b"]
    samples = [{"run": name, "rollout_id": 0, "batch_position": 0, "sample_index": 0,
                "response_length": 0, "has_train_row": True, "raw_reward": 0.5}
               for name in names]  # fmt: skip
    runs = [{"run": name, "source_dir": "/d", "tool": "t", "train_steps": 1} for name in names]
    build_lake(tmp_path / "lake", samples=samples, runs=runs)
    running = start(store_of(tmp_path / "lake"), ServeOptions(port=0))
    try:
        _open(browser, running.url)
        browser.evaluate("document.querySelector('input[aria-label=\"compare a,b\"]').click()")
        _click(browser, "#compare")
        assert _cells(browser, "main > p .badge a") == ["a,b"]
        assert browser.evaluate("location.search") == "?run=a%2Cb"
        _click(browser, "main > p .badge a")
        assert _cells(browser, "h1") == ["a,b"]
        assert _cells(browser, "main > p .badge a") == ["a,b"]
    finally:
        running.stop()


def test_a_comparison_link_of_the_earlier_runs_form_still_opens(browser, server):
    # Links shared before runs travelled as one `run=` each named them `?runs=a,b`.
    _open(browser, server + "compare?runs=example,slime")
    assert _cells(browser, "main > p .badge a") == ["example", "slime"]
    _open(browser, server + "?runs=slime")
    ticked = browser.evaluate(
        "[...document.querySelectorAll('input[aria-label^=\"compare \"]')]"
        ".filter((box) => box.checked).map((box) => box.getAttribute('aria-label'))"
    )
    assert ticked == ["compare slime"]


def test_beyond_localhost_a_request_without_the_token_is_refused(lake):
    running = start(store_of(lake), ServeOptions(host="0.0.0.0", port=0))
    try:
        assert "?token=" in running.url
        port = running.url.split(":")[2].split("/")[0]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs")
        assert refused.value.code == 403
        assert refused.value.read().decode() == (
            "Refused: this explorer needs its token; open the URL `tokenlake serve` printed"
            " (it ends with ?token=...).\n"
        )
        token = running.url.split("?token=")[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs?token={token}") as answer:
            assert answer.status == 200
            assert "HttpOnly" in answer.headers["Set-Cookie"]
    finally:
        running.stop()


def test_on_localhost_another_host_name_and_writes_are_refused(server):
    port = server.split(":")[2].rstrip("/")
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/api/runs", headers={"Host": f"evil.example:{port}"}
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 403
    request = urllib.request.Request(server + "api/runs", data=b"x", method="POST")
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request)
    assert refused.value.code == 405
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(server + "assets/..%2F..%2Fexplore.html")
    assert refused.value.code == 404


def _click_point(tools, chart: str, match: str) -> dict:
    """A real mouse click (DevTools input events, as a user's) on a point of `chart` whose
    datum satisfies the JavaScript condition `match` on `d` and that no other point covers;
    waits for the page it opens. Returns the point's datum."""
    found = tools.evaluate(
        "(() => { for (const mark of document.querySelectorAll("
        f"{json.dumps('#' + chart + ' .mark-symbol path')})) {{"
        f" const d = mark.__data__ && mark.__data__.datum; if (!d || !({match})) continue;"
        " mark.scrollIntoView({block: 'center'}); const r = mark.getBoundingClientRect();"
        " const x = r.x + r.width / 2, y = r.y + r.height / 2;"
        " if (document.elementFromPoint(x, y) === mark) return [x, y, d]; } return null; })()"
    )
    assert found, f"no uncovered point of {chart} where {match}"
    tools.evaluate("document.documentElement.dataset.rendered = 'leaving'")
    x, y, datum = found
    tools.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
    for kind in ("mousePressed", "mouseReleased"):
        tools.send("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)
    _wait(tools)
    return datum


def test_clicking_a_chart_point_opens_its_step_and_a_scatter_point_its_sample(
    lake, server, browser
):
    _open(browser, server + "compare?run=example&run=multi-turn")
    _click_point(browser, "mean-abs", "d.run === 'multi-turn' && d.rollout_id === 1")
    assert browser.evaluate("location.pathname") == "/runs/multi-turn/steps/1"
    assert browser.evaluate("document.querySelector('h1').textContent") == "multi-turn · step 1"

    point = _click_point(browser, "scatter", "d.batch_position > 0")
    position = point["batch_position"]
    assert browser.evaluate("location.pathname") == f"/runs/multi-turn/steps/1/samples/{position}"
    assert browser.evaluate("document.querySelector('h1').textContent") == (
        f"multi-turn · step 1 · sample {position}"
    )


def test_the_console_page_says_where_rows_were_cut(lake, browser):
    running = start(store_of(lake), ServeOptions(port=0, query_rows=5))
    try:
        _open(browser, running.url + "sql?q=SELECT%20range%20AS%20n%20FROM%20range(12)")
        assert browser.evaluate("document.querySelector('#result p').textContent") == (
            "5 row(s), cut at the limit of 5CSVParquet"
        )
        assert _cells(browser, "#result tbody td") == ["0", "1", "2", "3", "4"]
        names = "[...document.querySelectorAll('#result a[download]')].map(a => a.download)"
        assert browser.evaluate(names) == [
            "tokenlake-query-first-5-rows.csv",
            "tokenlake-query-first-5-rows.parquet",
        ]
    finally:
        running.stop()


def test_a_step_committed_while_a_page_is_open_is_offered_without_a_restart(browser, tmp_path):
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(
        tmp_path / "dump", store_of(lake), ExtractOptions(run_name="live", workers=1, steps=[0])
    )
    running = start(store_of(lake), ServeOptions(port=0))
    try:
        version = running.url + "api/version"
        _open(browser, running.url + "runs/live")
        assert _cells(browser, "a.step-link") == ["0"]
        with urllib.request.urlopen(version) as answer:
            assert json.load(answer) == {"version": 1, "steps": 2}  # step 0 and its eval file
        assert browser.evaluate("document.getElementById('live').hidden") is True

        extract_run(
            tmp_path / "dump", store_of(lake), ExtractOptions(run_name="live", workers=1, steps=[1])
        )
        _until(browser, "!document.getElementById('live').hidden", "the new-steps banner")
        with urllib.request.urlopen(version) as answer:
            seen = json.load(answer)
        assert seen["steps"] == 3 and seen["version"] > 1  # the server read the new catalog
        assert browser.evaluate("document.getElementById('live').textContent") == (
            "New steps in the lake: reload"
        )
        assert browser.evaluate("document.getElementById('live').href") == running.url + "runs/live"

        browser.evaluate("document.documentElement.dataset.rendered = 'leaving'")
        browser.evaluate("document.getElementById('live').click()")
        _wait(browser)
        assert _cells(browser, "a.step-link") == ["0", "1"]
        assert browser.evaluate("document.getElementById('live').hidden") is True
    finally:
        running.stop()


def test_the_runs_page_is_drawn_before_its_audits_and_fills_them_in_when_ready(
    lake, browser, monkeypatch
):
    release = threading.Event()
    real = data.failing_audits

    def held(con, stopped):
        assert release.wait(PATIENCE)
        return real(con, stopped)

    monkeypatch.setattr(data, "failing_audits", held)
    running = start(store_of(lake), ServeOptions(port=0))
    try:
        _open(browser, running.url)
        assert browser.evaluate("document.getElementById('audits-state').textContent") == (
            "audits: computing (this catalog's audits run once, in the background)"
        )
        names = _cells(browser, "a.run-link")
        assert _cells(browser, "span.audits") == ["computing"] * len(names) and len(names) == 5

        release.set()  # the page asks again by itself and fills the column in place
        _until(browser, "document.documentElement.dataset.audits === 'ready'", "the audits")
        con = catalog.connect(store_of(lake))
        try:
            failing = real(con)
        finally:
            con.close()
        expected = [[a["name"] for a in failing.get(name, [])] for name in names]
        shown = browser.evaluate(
            "[...document.querySelectorAll('span.audits')]"
            ".map(c => [...c.querySelectorAll('.badge')].map(b => b.textContent))"
        )
        assert shown == expected and any(expected)
        assert browser.evaluate("document.getElementById('audits-state').hidden") is True
    finally:
        release.set()
        running.stop()


def test_every_step_page_read_over_its_own_files_equals_it_read_over_every_file(lake, server):
    """The server plans a step page over that step's files only (TEMP views shadowing the
    catalog's base views) and takes the per-step rows of it and of the run-over-steps page
    from rows kept per catalog version (its groups too); read over the whole catalog instead,
    every value is the same."""
    con = catalog.connect(store_of(lake))
    try:
        store = store_of(lake)
        kept = data.kept_rows(con, served_records(store, manifest.load_all(store))[0])
        steps = con.execute(
            "SELECT DISTINCT run, rollout_id, evaluation FROM samples ORDER BY ALL"
        ).fetchall()
        assert len(steps) >= 10 and len({run for run, _, _ in steps}) == 5
        for run, step, evaluation in steps:
            query = {"run": run, "step": step, **({"eval": "1"} if evaluation else {})}
            with urllib.request.urlopen(
                server + "api/step?" + urllib.parse.urlencode(query)
            ) as answer:
                shown = json.load(answer)
            whole = data.step_page(con, kept, run, step, evaluation)
            assert shown == json.loads(json.dumps(whole, default=str)), (run, step, evaluation)
            groups = data.rows(
                con,
                "SELECT * FROM group_stats WHERE run = ? AND rollout_id = ? AND evaluation = ?"
                " ORDER BY group_index",
                [run, step, evaluation],
            )
            assert groups and shown["groups"] == json.loads(json.dumps(groups, default=str))
            if not evaluation:  # the kept rows are the views' own
                drift = data.rows(
                    con, "SELECT * FROM drift_steps WHERE run = ? AND rollout_id = ?", [run, step]
                )
                assert [shown["drift"]] == json.loads(json.dumps(drift, default=str))
        for chosen in (["slime"], ["example", "multi-turn"], sorted({r for r, _, _ in steps})):
            query = urllib.parse.urlencode([("run", run) for run in chosen])
            with urllib.request.urlopen(server + "api/steps?" + query) as answer:
                shown = json.load(answer)
            # what the page showed before it kept rows: the views read for these runs
            read = {
                **rd.step_datasets(con, rd.Selection(tuple(chosen))),
                "runs": chosen,
                "all_runs": data.run_names(con),
                "colours": run_colours(data.run_names(con)),
            }
            assert {k: shown[k] for k in read} == json.loads(json.dumps(read, default=str))
            assert shown["step_stats"] and {r["run"] for r in shown["drift_steps"]} == set(chosen)
    finally:
        con.close()


def runs_from_views(con) -> list[dict]:
    """The runs page's runs as the views give them: each run's metadata, `runs_overview`
    (its token count replaced by the summary's drift tokens) and `run_summary`."""
    names = data.run_names(con)
    sel = rd.Selection(tuple(names))
    overview = {r["run"]: r for r in rd.runs_overview(con, sel)}
    summary = {r["run"]: r for r in rd.run_summary(con, sel)}
    meta = {
        r["run"]: r
        for r in data.rows(
            con,
            "SELECT run, framework, dump_format, format_version, tool, start_ts,"
            " hf_checkpoint, wandb_project, wandb_run_id, tags_json FROM runs",
        )
    }
    expected = []
    for name in names:
        row = {**meta[name], **overview[name], **summary[name]}
        row["tags"] = json.loads(row.pop("tags_json") or "{}")
        expected.append(row)
    return expected


def test_the_runs_page_pooled_from_kept_rows_equals_it_read_from_the_views(lake, server):
    """The runs page is pooled from rows kept per step (`drift_steps`' rows, each step's
    reward sums); read from the views over every sample and token instead (the overview, the
    summary and the runs' metadata), every value of every run is the same."""
    con = catalog.connect(store_of(lake))
    try:
        level = data.run_level_rows(con)
        names = data.run_names(con)
        expected = runs_from_views(con)
    finally:
        con.close()
    assert len(expected) == 5
    assert data.runs_page(level) == {"runs": expected, "colours": run_colours(names)}
    with urllib.request.urlopen(server + "api/runs") as answer:
        shown = json.load(answer)
    assert [{k: v for k, v in r.items() if k != "audits"} for r in shown["runs"]] == json.loads(
        json.dumps(expected, default=str)
    )


def test_the_step_page_gets_one_step_views_of_the_tables_it_reads_only(lake):
    """The step page's cursor gets one-step TEMP views of the tables its views read, through
    every view and macro they name, and of no other (each costs time to create)."""
    from tokenlake import schema

    con = catalog.connect(store_of(lake))
    try:
        tables = data.step_page_tables(con)
    finally:
        con.close()
    assert tables >= set(data.STEP_PAGE_READS) | {"drift_statistics", "with_sample_properties"}
    assert sorted(tables & {*schema.TABLES, *schema.ROLLUP_TABLES}) == [
        "drift_breakdown_parts",
        "drift_sample_parts",
        "drift_token_id_parts",
        "sample_token_parts",
        "samples",
        "tokens",
        "vocab",
    ]


def _rows(lake: Path, sql: str) -> list[dict]:
    return run_query(store_of(lake), sql).to_pylist()


def _literal(text: str) -> str:
    return "'" + text.replace("'", "''") + "'"


def _hrefs(tools, selector: str) -> list[str]:
    return tools.evaluate(
        f"[...document.querySelectorAll({json.dumps(selector)})].map(a => a.getAttribute('href'))"
    )


def _segment(run: str) -> str:
    """A run name as the page puts it in a path (JavaScript's encodeURIComponent)."""
    return urllib.parse.quote(run, safe="!'()*")


def test_a_sample_page_links_its_neighbours_its_group_and_its_index_in_other_runs(
    lake, server, browser
):
    step = _rows(
        lake,
        "SELECT batch_position, sample_index, group_index FROM samples WHERE run = 'example'"
        " AND rollout_id = 0 AND NOT evaluation ORDER BY batch_position",
    )
    before, here, after = step[0], step[1], step[2]
    _open(browser, f"{server}runs/example/steps/0/samples/{here['batch_position']}")
    path = "/runs/example/steps/0/samples/"
    assert _hrefs(browser, "#previous") == [f"{path}{before['batch_position']}"]
    assert _hrefs(browser, "#next") == [f"{path}{after['batch_position']}"]
    group = [r["batch_position"] for r in step if r["group_index"] == here["group_index"]]
    assert len(group) > 1
    assert _cells(browser, "#siblings tbody td:first-child") == [str(p) for p in group]
    assert _hrefs(browser, "#siblings tbody a") == [f"{path}{p}" for p in group]
    others = _rows(
        lake,
        "SELECT run, batch_position FROM samples WHERE run <> 'example' AND rollout_id = 0"
        f" AND NOT evaluation AND sample_index = {here['sample_index']} ORDER BY ALL",
    )
    assert HOSTILE_RUN in [o["run"] for o in others]
    assert _cells(browser, "#other-runs a") == [o["run"] for o in others]
    assert _hrefs(browser, "#other-runs a") == [
        f"/runs/{_segment(o['run'])}/steps/0/samples/{o['batch_position']}" for o in others
    ]

    _click(browser, "#other-runs a")  # the first: the hostile run's name sorts before the others
    first = others[0]
    assert browser.evaluate("location.pathname") == (
        f"/runs/{_segment(first['run'])}/steps/0/samples/{first['batch_position']}"
    )
    assert browser.evaluate("document.querySelector('h1').textContent") == (
        f"{first['run']} · step 0 · sample {first['batch_position']}"
    )
    _open(browser, f"{server}runs/example/steps/0/samples/{here['batch_position']}")
    _click(browser, "#next")
    assert browser.evaluate("document.querySelector('h1').textContent") == (
        f"example · step 0 · sample {after['batch_position']}"
    )
    assert _cells(browser, "#sample-facts tbody td:first-child") == [str(after["sample_index"])]


def test_the_conversation_draws_roles_tool_calls_and_thinking_and_hostile_text_stays_text(
    lake, server, browser
):
    (found,) = _rows(
        lake,
        "SELECT batch_position, messages_json FROM samples WHERE run = "
        f"{_literal(HOSTILE_RUN)} AND rollout_id = 0 AND NOT evaluation"
        " AND messages_json LIKE '%<think>%'",
    )
    messages = json.loads(found["messages_json"])
    _open(
        browser,
        f"{server}runs/{_segment(HOSTILE_RUN)}/steps/0/samples/{found['batch_position']}",
    )
    assert _cells(browser, "#conversation .role") == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
    ]
    calls = messages[2]["tool_calls"]
    assert _cells(browser, "#conversation .tool-calls") == [
        "tool calls: " + json.dumps(calls, indent=2, ensure_ascii=False)
    ]
    # the reasoning beside a message's content and a <think> block in it, both folded
    assert _cells(browser, "#conversation details.think pre") == [
        messages[2]["reasoning_content"],
        THINKING,
    ]
    assert browser.evaluate(
        "[...document.querySelectorAll('#conversation details.think')].map(d => d.open)"
    ) == [False, False]
    assert _cells(browser, "#conversation .message:last-child > pre") == [HOSTILE_MESSAGE]
    assert _cells(browser, "#conversation .message:nth-child(4) > pre") == ['{"result": 42}']
    assert (
        browser.evaluate("document.querySelectorAll('main img, main script, main b').length") == 0
    )
    assert browser.evaluate("document.title") != "owned"


def test_the_statistic_against_position_shades_the_prompt_and_the_masked_spans(
    lake, server, browser
):
    step, position, _ = _masked_sample(lake)
    where = (
        f"run = 'multi-turn' AND rollout_id = {step} AND NOT evaluation"
        f" AND batch_position = {position}"
    )
    (sample,) = _rows(lake, f"SELECT prompt_length FROM samples WHERE {where}")
    tokens = _rows(
        lake, f"SELECT position, loss_mask, lp_diff FROM tokens WHERE {where} ORDER BY position"
    )
    masked_spans, start = [], None
    for token in tokens:
        if token["loss_mask"] == 0 and start is None:
            start = token["position"]
        if token["loss_mask"] > 0 and start is not None:
            masked_spans.append({"from": start, "to": token["position"]})
            start = None
    if start is not None:
        masked_spans.append({"from": start, "to": tokens[-1]["position"] + 1})
    assert len(masked_spans) > 1 and sample["prompt_length"] > 0

    _open(browser, f"{server}runs/multi-turn/steps/{step}/samples/{position}?stat=lp_diff")
    shaded = browser.evaluate(
        "[...document.querySelectorAll('#profile .mark-rect')].map(g =>"
        " [...g.querySelectorAll('path')].map(p => p.__data__.datum))"
    )
    assert shaded == [[{"from": -sample["prompt_length"], "to": 0}], masked_spans]
    drawn = browser.evaluate("explorer.charts.profile.data('data_2')")
    covered = [
        {"position": t["position"], "value": t["lp_diff"]}
        for t in tokens
        if t["loss_mask"] > 0 and t["lp_diff"] is not None and math.isfinite(t["lp_diff"])
    ]
    assert (
        drawn == covered and len(covered) > 1
    )  # the line: the covered tokens' values, and nothing at a masked one
    assert browser.evaluate("document.querySelector('#profile .role-title-text').textContent") == (
        "lp_diff against position (blue: the prompt, grey: masked spans; neither has a value)"
    )


def _shown(value: float) -> str:
    """A number as the page writes it (explore.js `fmt`, for the values used here)."""
    rounded = float(f"{value:.4g}")
    return str(int(rounded)) if rounded.is_integer() else repr(rounded)


def test_the_run_charts_draw_the_alarm_thresholds_and_zoom(lake, server, browser):
    (settings,) = _rows(lake, "SELECT * FROM drift_settings")
    alarms = {
        "mean-abs": "alarm_mean_abs_lp_diff_smtm",
        "k3": "alarm_k3_kl",
        "ess": "alarm_ess_min",
    }
    expected = {chart: settings[name] for chart, name in alarms.items()}
    _open(browser, f"{server}compare?run=example&run=multi-turn")
    for chart, threshold in expected.items():
        rule = browser.evaluate(
            f"(v => [...document.querySelectorAll('#{chart} .role-mark.mark-rule line')].map(l =>"
            " [l.__data__.datum.t, l.__data__.y, v.scale('y')(l.__data__.datum.t)]))"
            f"(explorer.charts[{json.dumps(chart)}])"
        )
        assert len(rule) == 1 and rule[0][0] == threshold, (chart, rule)
        assert rule[0][1] == pytest.approx(rule[0][2])  # drawn at the threshold's height
        assert _cells(browser, f"#{chart} .role-mark.mark-text text") == [
            f"alarm {_shown(threshold)}"
        ]

    domain = "explorer.charts['mean-abs'].scale('x').domain()"
    before = browser.evaluate(domain)
    x, y = browser.evaluate(
        "(s => { s.scrollIntoView({block: 'center'}); const r = s.getBoundingClientRect();"
        " return [r.x + r.width / 2, r.y + r.height / 2]; })"
        "(document.querySelector('#mean-abs svg'))"
    )
    browser.send("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)
    browser.send("Input.dispatchMouseEvent", type="mouseWheel", x=x, y=y, deltaX=0, deltaY=-400)
    after = _until(
        browser,
        f"(d => (d[0] !== {before[0]} || d[1] !== {before[1]}) && d)({domain})",
        "the chart to zoom",
    )
    assert before[0] < after[0] < after[1] < before[1]  # zoomed in around the pointer


# One step of 52 samples (two pages of the samples table) up to 4,600 tokens long (every
# window of the token strip), a removed one, and its eval file.
LONG = dataclasses.replace(
    synth.PRESETS["example"],
    steps=1,
    prompts_per_step=13,
    samples_per_prompt=4,
    response_length=(1, 4600),
    removed_positions=(3,),
    eval_steps=(0,),
)


@pytest.fixture(scope="module")
def long_lake(tmp_path_factory):
    """(lake, served URL) of one run of LONG."""
    root = tmp_path_factory.mktemp("long")
    synth.write_dump(root / "dump", LONG)
    extract_run(root / "dump", store_of(root / "lake"), ExtractOptions(run_name="long", workers=1))
    running = start(store_of(root / "lake"), ServeOptions(port=0))
    yield root / "lake", running.url
    running.stop()


def _same(text: str, value) -> bool:
    """Whether a cell's text is how the page writes `value` (explore.js `fmt`)."""
    if value is None:
        return text == "NULL"
    if isinstance(value, bool):
        return text == str(value).lower()
    if isinstance(value, int):
        return text == f"{value:,}"
    if isinstance(value, float):
        return float(text) == pytest.approx(value, rel=1e-3, abs=1e-12)
    return text == str(value)


def _table(tools) -> tuple[list[str], list[list[str]]]:
    """The samples table's headers and its rows' cells, as shown."""
    return tools.evaluate(
        "[[...document.querySelectorAll('#samples thead th')].map(h => h.textContent),"
        " [...document.querySelectorAll('#samples tbody tr')].map(r =>"
        " [...r.querySelectorAll('td')].map(d => d.textContent))]"
    )


def test_the_samples_table_shows_every_column_sorts_filters_and_pages(long_lake, browser):
    lake, url = long_lake
    stats = _rows(lake, "SELECT * FROM sample_stats WHERE rollout_id = 0 AND NOT evaluation")
    drift = {
        r["batch_position"]: r
        for r in _rows(lake, "SELECT * FROM drift_samples WHERE rollout_id = 0 AND NOT evaluation")
    }
    columns = [r["column_name"] for r in _rows(lake, "DESCRIBE drift_samples")]
    no_drift = dict.fromkeys(columns)  # a removed sample has no drift_samples row: NULLs
    shown = {}
    for row in stats:
        found = drift.get(row["batch_position"], no_drift)
        extra = {k: v for k, v in found.items() if k not in row}
        extra["drift_tokens"] = extra.pop("tokens")
        shown[row["batch_position"]] = {**row, **extra}
    _open(browser, url + "runs/long/steps/0")
    headers, cells = _table(browser)
    assert headers[0] == "batch_position ▲"  # sorted by it
    headers[0] = "batch_position"
    assert sorted(headers) == sorted(set(next(iter(shown.values()))) - {"run", "rollout_id"})
    assert headers[:3] == ["batch_position", "sample_index", "group_index"]
    assert len(shown) == 52 and len(cells) == 50
    for line in cells:  # every value as the views hold it
        row = shown[int(line[0])]
        wrong = [h for h, t in zip(headers, line, strict=True) if not _same(t, row[h])]
        assert (
            wrong == [] or wrong == ["remove_sample"] and line[headers.index(wrong[0])] == "removed"
        ), (line[0], wrong)
    removed = browser.evaluate(
        "[...document.querySelectorAll('#samples tr.removed td:first-child')].map(d => d.textContent)"
    )
    assert removed == [str(p) for p, r in sorted(shown.items()) if r["remove_sample"]] == ["3"]

    order = sorted(
        shown,
        key=lambda p: (
            shown[p]["mean_abs_lp_diff"] is None,
            -(shown[p]["mean_abs_lp_diff"] or 0),
            p,
        ),
    )
    for _ in range(2):  # ascending, then descending
        browser.evaluate(
            "[...document.querySelectorAll('#samples th')]"
            ".find(h => h.textContent.startsWith('mean_abs_lp_diff')).click()"
        )
    headers, cells = _table(browser)
    assert "mean_abs_lp_diff ▼" in headers
    assert [int(line[0]) for line in cells] == order[:50]
    browser.evaluate(
        "[...document.querySelectorAll('#samples button')].find(b => b.textContent === 'next').click()"
    )
    _, cells = _table(browser)
    assert [int(line[0]) for line in cells] == order[50:]
    assert browser.evaluate("document.querySelector('#samples .controls').textContent") == (
        "previouspage 2 of 2 · 52 sample(s)next"
    )
    assert browser.evaluate("location.search") == "?sort=mean_abs_lp_diff&desc=1&page=1"

    browser.evaluate(
        "const box = document.querySelector('input[type=search]'); box.value = 'truncated';"
        " box.dispatchEvent(new Event('input'))"
    )
    _, cells = _table(browser)
    truncated = [p for p in order if shown[p]["status"] == "truncated"]
    assert truncated and len(truncated) < 50
    assert [int(line[0]) for line in cells] == truncated

    _open(browser, url + "runs/long/steps/0?eval=1")
    headers, cells = _table(browser)
    evaluation = headers.index("evaluation")
    (evals,) = _rows(lake, "SELECT count(*) AS n FROM samples WHERE rollout_id = 0 AND evaluation")
    assert len(cells) == evals["n"] > 0 and {line[evaluation] for line in cells} == {"eval"}
    assert browser.evaluate("document.querySelectorAll('#samples tbody tr:not(.eval)').length") == 0


def test_the_token_windows_and_the_clipped_colour_scale_of_a_long_sample(long_lake, browser):
    lake, url = long_lake
    (longest,) = _rows(
        lake,
        "SELECT batch_position, response_length FROM samples WHERE rollout_id = 0"
        " AND NOT evaluation ORDER BY response_length DESC, batch_position LIMIT 1",
    )
    total = longest["response_length"]
    assert total > 4096
    page = f"{url}runs/long/steps/0/samples/{longest['batch_position']}"

    def strip() -> list:
        return browser.evaluate(
            "(s => [s.dataset.cells, s.firstChild.dataset.position, s.lastChild.dataset.position])"
            "(document.getElementById('strip'))"
        )

    for window, size in (("256", 256), ("1k", 1024), ("4k", 4096), ("all", total)):
        _open(browser, f"{page}?window={window}")
        assert strip() == [str(size), "0", str(size - 1)], window
    _open(browser, f"{page}?window=4k")
    browser.evaluate(
        "[...document.querySelectorAll('.controls button')]"
        ".find(b => b.textContent === 'later →').click()"
    )
    # the last window is a whole one, ending at the last token
    assert strip() == ["4096", str(total - 4096), str(total - 1)]
    assert f"tokens {total - 4096}–{total - 1} of {total}" in browser.evaluate(
        "document.getElementById('stat').closest('.controls').textContent"
    )

    tokens = _rows(
        lake,
        "SELECT position, lp_diff FROM tokens WHERE rollout_id = 0 AND NOT evaluation"
        f" AND batch_position = {longest['batch_position']} AND loss_mask > 0"
        " AND isfinite(lp_diff) ORDER BY position",
    )
    spread = sorted(abs(t["lp_diff"]) for t in tokens)
    clip = spread[min(len(spread) - 1, max(0, math.ceil(0.99 * len(spread)) - 1))]
    beyond = sum(1 for v in spread if v > clip)
    assert 1e-3 <= clip < 1e5 and beyond > 0
    _open(browser, f"{page}?window=all&stat=lp_diff")
    assert browser.evaluate("document.getElementById('legend-text').textContent") == (
        f"lp_diff: colour symmetric around 0, clipped at ±{_shown(clip)} = the 99th percentile"
        f" of |lp_diff| over the {len(spread)} covered tokens with a value (the whole sample);"
        f" {beyond} beyond it take the end colour."
    )
    extreme = max(tokens, key=lambda t: abs(t["lp_diff"]))
    end = "rgb(178, 24, 43)" if extreme["lp_diff"] > 0 else "rgb(33, 102, 172)"
    assert (
        browser.evaluate(
            f"document.querySelector('#strip .tok[data-position=\"{extreme['position']}\"]')"
            ".style.background"
        )
        == end
    )  # the largest |lp_diff| takes the end colour and does not flatten the rest
