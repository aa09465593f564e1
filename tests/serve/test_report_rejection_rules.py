"""The report says what each rejection rule removes, with the thresholds it uses, and that
geo_reject's band is tight by design (a high fraction there is not by itself an alarm)."""

from __future__ import annotations

from tests.conftest import store_of
from tests.serve.test_report_summary import two_step_lake
from tokenlake.serve.report import build_report


def test_rules_are_explained_one_line_each(tmp_path):
    build_report(store_of(two_step_lake(tmp_path / "lake")), tmp_path / "r.html")
    text = (tmp_path / "r.html").read_text()
    assert (
        "<h3>Rejected tokens and samples, by rule</h3>\n"
        '<ul class="rules">\n'
        "<li>veto: rejects a sample with any token r &lt; 0.0001.</li>\n"
        "<li>outlier: rejects a token with r outside [0.0001, 100].</li>\n"
        "<li>geo_reject: rejects a sample with exp(mean δ) outside [0.999, 1.001].</li>\n"
        "<li>seq_ratio_reject: rejects a sample with exp(Σδ) outside [0.5, 2].</li>\n"
        "<li>icepop: rejects a token with r outside [0.5, 2].</li>\n"
        "</ul>\n"
        '<p class="note">geo_reject&#x27;s band is tight by design: a sample&#x27;s mean δ must'
        " stay within about ±0.001 nats, so under ordinary bf16 noise many samples leave it; a"
        " high fraction alone is not an alarm.</p>"
    ) in text
    for chart in ("veto", "outlier", "geo-reject", "seq-ratio-reject", "icepop"):
        assert f'<div class="card"><div class="chart" id="reject-{chart}"></div></div>' in text
