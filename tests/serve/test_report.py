"""`tokenlake report`: the HTML page, its errors, and how it draws in a real headless Chromium.

The browser test drives Debian's `chromium` over the DevTools protocol (websocket-client),
with the network emulated offline, and reads what the page's own script records: the drawn
mark items of every chart and the cells of every per-token strip.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
import time
from contextlib import AbstractContextManager
from pathlib import Path

import pytest
from click.testing import CliRunner

from benchmarks.chromium import OFFLINE, DevTools, browser
from tests.conftest import store_of
from tests.lakes import build_lake
from tokenlake.cli import main
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve.query import run_query
from tokenlake.serve.report import build_report

SECTIONS = ["summary", "runs", "audits", "reward", "drift", "where", "worst"]


def _invoke(*args: str):
    return CliRunner().invoke(main, list(args))


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory) -> Path:
    """A lake with the built-in example and a CP 2 × TP 2 multi-turn run."""
    root = tmp_path_factory.mktemp("report")
    lake = root / "lake"
    synth.write_dump(root / "example", synth.PRESETS["example"])
    cp_multi_turn = dataclasses.replace(synth.PRESETS["cp-thd"], multi_turn=True, steps=3)
    synth.write_dump(root / "cp", cp_multi_turn)
    extract_run(root / "example", store_of(lake), ExtractOptions(run_name="example", workers=1))
    extract_run(root / "cp", store_of(lake), ExtractOptions(run_name="cp-multi-turn", workers=1))
    return lake


@pytest.fixture(scope="module")
def report_file(two_runs: Path) -> Path:
    out = two_runs.parent / "report.html"
    result = _invoke("report", str(two_runs), "-o", str(out), "--worst", "3")
    assert result.exit_code == 0, result.output
    assert re.fullmatch(
        r"Wrote .*report\.html \(\d+\.\d MB, 2 runs\) in \d+\.\d s\n", result.output
    )
    return out


def _one_step_lake(lake: Path) -> Path:
    """One training step, no eval, no entropy, one sample with a masked token."""
    tokens = [
        {"run": "r", "rollout_id": 0, "batch_position": 0, "position": p, "token_id": 5 + p,
         "loss_mask": int(p != 1), "train_log_prob": None if p == 1 else -0.5,
         "rollout_log_prob": None if p == 1 else -0.52, "lp_diff": None if p == 1 else 0.02}
        for p in range(3)
    ]  # fmt: skip
    samples = [{"run": "r", "rollout_id": 0, "batch_position": 0, "sample_index": 0,
                "response_length": 3, "has_train_row": True, "raw_reward": 1.0}]  # fmt: skip
    runs = [{"run": "r", "source_dir": "/d", "tool": "t", "train_steps": 1}]
    build_lake(lake, tokens=tokens, samples=samples, runs=runs)
    return lake


def test_lake_without_catalog_is_one_line(tmp_path):
    result = _invoke("report", str(tmp_path), "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 1
    assert result.output == (
        f"Error: Lake `{tmp_path}`: has no `tokenlake.duckdb`; run `tokenlake extract` first\n"
    )
    assert not (tmp_path / "r.html").exists()


def test_unknown_run_is_one_line(tmp_path):
    lake = _one_step_lake(tmp_path / "lake")
    result = _invoke("report", str(lake), "--run", "nope", "-o", str(tmp_path / "r.html"))
    assert result.exit_code == 1
    assert result.output == "Error: Unknown run `nope`; the lake has runs: `r`\n"
    assert list(tmp_path.iterdir()) == [lake]  # no report, no temporary file left


def test_unwritable_output_is_one_line(tmp_path):
    lake = _one_step_lake(tmp_path / "lake")
    out = tmp_path / "missing-dir" / "r.html"
    result = _invoke("report", str(lake), "-o", str(out))
    assert result.exit_code == 1
    assert result.output == f"Error: Cannot write `{out}`: No such file or directory\n"
    result = _invoke("report", str(lake), "-o", str(tmp_path))
    assert result.output == f"Error: Cannot write `{tmp_path}`: it is a directory\n"


def test_missing_data_says_so_in_its_section(tmp_path):
    lake = _one_step_lake(tmp_path / "lake")
    summary = build_report(store_of(lake), tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert summary.runs == ("r",)
    assert "Only one training step: each per-step chart shows single points." in text
    assert "Eval reward: no eval files in the selected runs and steps." in text
    assert "By entropy: the dump has no entropy." in text
    payload = _payload(text)
    strip = payload["strips"][0]["cells"]
    assert strip["status"] == [3, 0, 3]  # covered, masked, covered
    assert strip["delta"] == [0.02, None, 0.02]


def _payload(text: str) -> dict:
    match = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S
    )
    assert match
    return json.loads(match.group(1).replace("<\\/", "</"))


@pytest.mark.slow
def test_report_is_one_offline_file_of_aggregates(two_runs, report_file):
    text = report_file.read_text()
    assert [m for m in re.findall(r'<section id="(\w+)"', text)] == SECTIONS
    # Nothing is loaded from elsewhere: no src/href to a URL, no @import, no url(...).
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)""", text)
    assert "@import" not in text and "url(" not in text.split("<script>", 1)[0]
    payload = _payload(text)
    assert {c["id"] for c in payload["charts"]} >= {"reward-mean", "mean-abs", "heatmap", "by-turn"}
    # Aggregates only: the strips hold the worst samples' tokens, 3 per run, nothing else.
    tokens = (
        run_query(store_of(two_runs), "SELECT count(*) AS n FROM tokens").column("n")[0].as_py()
    )
    strip_cells = sum(len(s["cells"]["status"]) for s in payload["strips"])
    assert len(payload["strips"]) == 6 and strip_cells < tokens / 4
    # The failing audits come first, with their offending rows.
    audits = re.findall(r'<div class="audit"><span class="(\w+)">', text)
    assert audits[0] in {"fail", "warn", "info"} and audits[-1] == "pass"
    assert audits == sorted(audits, key=["fail", "warn", "info", "pass"].index)


def _chromium() -> str:
    path = shutil.which("chromium") or shutil.which("chromium-browser")
    if path:
        return path
    message = "headless browser `chromium` (Debian package chromium) is not installed"
    if os.environ.get("CI") == "true":
        pytest.fail(message)
    pytest.skip(message)


def _browser(profile: Path, host_rules: str = OFFLINE) -> AbstractContextManager[DevTools]:
    """Headless Chromium with no network (benchmarks/chromium.py); the explorer's tests pass
    `host_rules` excluding 127.0.0.1, where their server listens."""
    return browser(_chromium(), profile, host_rules)


def _wait_rendered(tools: DevTools) -> str:
    deadline = time.monotonic() + 120  # generous: a loaded machine draws slowly
    while (state := tools.evaluate("document.documentElement.dataset.rendered")) not in (
        "done",
        "failed",
    ):
        assert time.monotonic() < deadline, f"page still {state!r}"
        time.sleep(0.2)
    return state


_DRAWN = """JSON.stringify([...document.querySelectorAll('.chart, .strip')].map(e => ({
  id: e.id, section: e.closest('section').id, marks: Number(e.dataset.marks || 0),
  cells: e.dataset.cells === undefined ? null : Number(e.dataset.cells),
  run: e.dataset.run, step: e.dataset.rolloutId, position: e.dataset.batchPosition,
  svgPaths: e.querySelectorAll('svg .role-mark > *').length,
  canvas: [...e.querySelectorAll('canvas')].map(c => c.width * c.height).reduce((a, b) => a + b, 0),
})))"""


def _problems(events: list[dict]) -> list[str]:
    """Console errors, uncaught exceptions and any request that is not the file itself."""
    found = []
    for event in events:
        method, params = event.get("method"), event.get("params", {})
        if method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            found.append(f"console: {params['args']}")
        elif method == "Runtime.exceptionThrown":
            found.append(f"exception: {params['exceptionDetails']}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            found.append(f"log: {params['entry']}")
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            if not url.startswith(("file:", "data:", "blob:", "about:")):
                found.append(f"request: {url}")
    return found


def _charts_drawn(drawn: list[dict]) -> list[dict]:
    """Check that every section's charts drew marks; returns the token strips drawn."""
    charts = [d for d in drawn if d["cells"] is None]
    assert {d["section"] for d in charts} == {"reward", "drift", "where", "worst"}
    for chart in charts:
        assert chart["marks"] > 0 and (chart["svgPaths"] > 0 or chart["canvas"] > 0), chart
    return [d for d in drawn if d["cells"] is not None]


def _open_offline(tools, page: Path) -> None:
    """Navigate to `page` with the network switched off, recording console and requests."""
    for domain in ("Runtime", "Log", "Network", "Page"):
        tools.send(f"{domain}.enable")
    tools.send("Network.emulateNetworkConditions", offline=True, latency=0,
               downloadThroughput=-1, uploadThroughput=-1)  # fmt: skip
    tools.send("Page.navigate", url=page.as_uri())


@pytest.mark.slow
def test_report_draws_in_headless_chromium_offline(two_runs, report_file, tmp_path):
    with _browser(tmp_path / "profile") as tools:
        _open_offline(tools, report_file)
        assert _wait_rendered(tools) == "done", _problems(tools.events)
        drawn = json.loads(tools.evaluate(_DRAWN))
        shot = tools.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        (tmp_path / "report.png").write_bytes(__import__("base64").b64decode(shot["data"]))
        # The dark theme redraws every chart without an error: the page says "done" again only
        # once its redraw (started by the theme's change event) has finished.
        tools.evaluate("document.documentElement.dataset.rendered = 'light theme'")
        tools.send("Emulation.setEmulatedMedia", features=[
            {"name": "prefers-color-scheme", "value": "dark"}])  # fmt: skip
        assert _wait_rendered(tools) == "done"
        assert _problems(tools.events) == []

    strips = _charts_drawn(drawn)
    assert len(strips) == 6
    for strip in strips:
        expected = (
            run_query(
                store_of(two_runs),
                "SELECT response_length FROM samples WHERE NOT evaluation AND "
                f"run = '{strip['run']}' AND rollout_id = {strip['step']} "
                f"AND batch_position = {strip['position']}",
            )
            .column(0)[0]
            .as_py()
        )
        assert strip["cells"] == expected and strip["canvas"] > 0, strip


@pytest.mark.slow
def test_run_and_steps_select_what_every_section_reads(two_runs, tmp_path):
    summary = build_report(
        store_of(two_runs), tmp_path / "r.html", runs=["example"], steps=[1], worst=2
    )
    assert summary.runs == ("example",)
    payload = _payload((tmp_path / "r.html").read_text())
    keys = {
        (row["run"], row.get("step", str(row["rollout_id"])))
        for rows in payload["datasets"].values()
        for row in rows
    }
    assert keys == {("example", "1"), ("example", "all")}  # "all": the step 1 rows pooled
    text = (tmp_path / "r.html").read_text()
    strips = re.findall(
        r'class="strip" id="[^"]+" data-run="([^"]+)" data-rollout-id="(\d+)"', text
    )
    assert strips == [("example", "1")] * 2
    # The example's only zero-spread group is at step 0: the info audit lists it for all
    # steps, and nothing for step 1 alone.
    assert '<span class="pass">PASS</span> <code>zero_std_group_list</code> [info]' in text
    whole = build_report(store_of(two_runs), tmp_path / "all.html", runs=["example"], worst=1)
    assert whole.runs == ("example",)
    assert (
        '<span class="info">INFO (1 rows)</span> <code>zero_std_group_list</code> [info]'
        in (tmp_path / "all.html").read_text()
    )
