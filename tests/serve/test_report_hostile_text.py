"""A lake whose run name holds `<!--` and whose token texts hold `</script>` still draws its
report: the page's JSON escapes `<`, `>` and `&`, so neither the HTML parser nor `JSON.parse`
trips on them (in headless Chromium, offline, with test_report.py's DevTools helpers).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow as pa
import pytest

from tests.conftest import store_of
from tests.serve.test_report import (
    _DRAWN,
    _browser,
    _charts_drawn,
    _open_offline,
    _problems,
    _wait_rendered,
)
from tokenlake import schema
from tokenlake.generator import synth
from tokenlake.layout import new_name
from tokenlake.load import write
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve import catalog
from tokenlake.serve.report import build_report
from tokenlake.serve.report_html import script_json
from tokenlake.store import manifest

RUN = "r<!--x"
TEXT = "</script><!--<b>&amp;\u2028"


def test_script_json_is_json_without_markup_characters() -> None:
    payload = {"run": RUN, "text": TEXT}
    text = script_json(payload)
    assert text == (
        '{"run": "r\\u003c!--x", "text": "\\u003c/script\\u003e\\u003c!--\\u003cb\\u003e'
        '\\u0026amp;\\u2028"}'
    )
    assert json.loads(text) == payload


def _with_hostile_vocab(lake: Path, run: str) -> None:
    """Give every token id of the run the text TEXT + its id (as a tokenizer could)."""
    record = manifest.load_manifest(store_of(lake), run)
    assert record is not None
    ids = catalog.connect(store_of(lake)).sql("SELECT DISTINCT token_id FROM tokens").fetchall()
    table = pa.table(
        {"token_id": [i for (i,) in ids], "token_text": [f"{TEXT}{i}" for (i,) in ids]},
        schema=schema.VOCAB_SCHEMA,
    )
    name = new_name(schema.VOCAB, run, "vocab")
    write.write_lake_file(
        store_of(lake), name, schema.VOCAB, table, write.file_metadata("vocab", run, "-")
    )
    record.vocab_file = name
    manifest.save_manifest(store_of(lake), record)
    catalog.build_catalog(store_of(lake))


@pytest.mark.slow
def test_a_report_of_hostile_names_draws_in_headless_chromium(tmp_path: Path) -> None:
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(run_name=RUN, workers=1))
    _with_hostile_vocab(lake, RUN)
    out = tmp_path / "report.html"
    build_report(store_of(lake), out, worst=2)
    html = out.read_text()
    data = re.search(r'<script type="application/json" id="report-data">(.*?)</script>', html, re.S)
    assert data is not None and "<" not in data.group(1)

    with _browser(tmp_path / "profile") as tools:
        _open_offline(tools, out)
        assert _wait_rendered(tools) == "done", _problems(tools.events)
        drawn = json.loads(tools.evaluate(_DRAWN))
        parsed = tools.evaluate(
            "JSON.stringify((d => [d.strips.map(s => s.cells.text[0]),"
            " [...new Set(Object.values(d.datasets).flat().map(r => r.run))]])"
            "(JSON.parse(document.getElementById('report-data').textContent)))"
        )
        assert _problems(tools.events) == []

    strips = _charts_drawn(drawn)
    assert len(strips) == 2 and all(s["run"] == RUN and s["canvas"] > 0 for s in strips)
    texts, runs = json.loads(parsed)
    assert runs == [RUN]  # the page's script read the run name back exactly
    assert len(texts) == 2 and all(t.startswith(TEXT) for t in texts)
