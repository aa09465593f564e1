"""The report's staleness charts: per token (`drift_by_weight_version`) beside per sample, on
the real weight-span dump."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import store_of
from tests.fixture_paths import NEXT_DUMPS

pytestmark = pytest.mark.slow


def _payload(tmp_path, case: str) -> dict:
    from tokenlake.orchestrate.extract import ExtractOptions, extract_run
    from tokenlake.serve.report import build_report

    lake = tmp_path / case
    extract_run(NEXT_DUMPS / case, store_of(lake), ExtractOptions(run_name=case, strict=True))
    page = tmp_path / f"{case}.html"
    build_report(store_of(lake), page)
    text = page.read_text()
    found = re.search(
        r'<script type="application/json" id="report-data">(.*?)</script>', text, re.S
    )
    assert found is not None
    return json.loads(found.group(1).replace("<\\/", "</"))


def test_token_staleness_chart_shows_the_span_versions(tmp_path):
    payload = _payload(tmp_path, "weight_spans")
    assert "by-token-staleness" in {c["id"] for c in payload["charts"]}
    rows = payload["datasets"]["by_token_staleness"]
    per_step = [r for r in rows if r["rollout_id"] is not None]
    got = sorted((r["rollout_id"], r["token_staleness"], r["tokens"]) for r in per_step)
    assert got == [
        (0, -3, 3), (0, -2, 8), (0, -1, 20), (0, 0, 7),
        (1, -3, 2), (1, -2, 2), (1, -1, 13), (1, 0, 13), (1, 1, 6),
    ]  # fmt: skip
    pooled = sorted((r["token_staleness"], r["tokens"]) for r in rows if r["rollout_id"] is None)
    assert pooled == [(-3, 5), (-2, 10), (-1, 33), (0, 20), (1, 6)]  # all steps, exactly
