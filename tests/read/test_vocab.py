"""Token texts from the dump's tokenizer equal the reference token view's `token_text`."""

from __future__ import annotations

import json

import duckdb
import pytest

from tests.conftest import store_of
from tests.fixture_paths import MILES_REAL
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.store import manifest

REAL = MILES_REAL


@pytest.fixture(scope="module")
def lake(tmp_path_factory):
    root = tmp_path_factory.mktemp("lake")
    extract_run(REAL / "dumps" / "basic", store_of(root), ExtractOptions(run_name="basic"))
    extract_run(
        REAL / "dumps" / "pp2", store_of(root), ExtractOptions(run_name="pp2")
    )  # pp2 saved no tokenizer/
    return root


@pytest.mark.slow
def test_token_texts_equal_the_reference(lake):
    con = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    texts = dict(
        con.execute("SELECT token_id, token_text FROM vocab WHERE run = 'basic'").fetchall()
    )
    checked = 0
    for line in (REAL / "oracle" / "basic" / "tokens.jsonl").read_text().splitlines():
        row = json.loads(line)
        assert [texts[t] for t in row["token_ids"]] == row["token_text"]
        checked += len(row["token_ids"])
    assert checked == 322  # every token id of every sample, prompt included


@pytest.mark.slow
def test_no_tokenizer_means_no_vocab_and_null_texts(lake):
    con = duckdb.connect(str(lake / "tokenlake.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM vocab WHERE run = 'pp2'").fetchall() == [(0,)]
    nulls = con.execute(
        "SELECT count(*), count(token_text) FROM drift_by_token WHERE run = 'pp2'"
    ).fetchall()
    assert nulls[0][0] > 0 and nulls[0][1] == 0


@pytest.mark.slow
def test_vocab_is_rebuilt_only_when_the_tokenizer_changes(lake):
    before = manifest.load_manifest(store_of(lake), "basic").vocab_file
    extract_run(REAL / "dumps" / "basic", store_of(lake), ExtractOptions(run_name="basic"))
    assert manifest.load_manifest(store_of(lake), "basic").vocab_file == before
    assert (lake / before).is_file()
