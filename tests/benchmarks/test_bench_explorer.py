"""`make bench`'s explorer figures: one line per page's data (wall and CPU), the longest
sample's page named by its length, when the audits are done, and the first draw in Chromium,
on a small extracted lake."""

from __future__ import annotations

import re

import pytest

from benchmarks import bench_explorer
from tests.conftest import store_of
from tokenlake.generator import synth
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.serve.query import run_query

pytestmark = pytest.mark.slow  # an extraction, a server and Chromium


def test_the_explorer_figures_name_every_page_and_its_time(tmp_path, capsys):
    synth.write_dump(tmp_path / "dump", synth.PRESETS["example"])
    lake = tmp_path / "lake"
    extract_run(tmp_path / "dump", store_of(lake), ExtractOptions(run_name="example", workers=1))
    longest = (
        run_query(
            store_of(lake), "SELECT max(response_length) AS n FROM samples WHERE NOT evaluation"
        )
        .column("n")[0]
        .as_py()
    )

    seconds = bench_explorer.print_explorer(lake, "the example lake", repeat=1)

    pages = [
        "runs (/)",
        "run over steps (/runs/RUN)",
        "step (/runs/RUN/steps/N)",
        f"sample of {longest:,} tokens",
        "SQL console (step_stats)",
        "live check (/api/version)",
        "runs (/), new server, every step new",
        "runs (/), new server, one step new",
        "runs (/), new server, lake unchanged",
    ]
    assert list(seconds) == pages
    assert all(0 < wall < 600 and 0 < cpu < 600 for wall, cpu in seconds.values())
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == (
        "  explorer pages' data on the example lake, best of 1 (HTTP request, whole answer;"
        " wall, CPU):"
    )
    figure = r" +\d+\.\d ms +\d+\.\d ms CPU(  <- over 0\.1?5? s)?"
    for line, page in zip(lines[1:10], pages, strict=True):
        assert re.fullmatch(rf"  {re.escape(page)}{figure}", line), line
    assert re.fullmatch(r"  audits done after the first runs page +\d+\.\d ms", lines[10])
    drawn = [re.sub(r" +\d+\.\d ms.*", "", line) for line in lines[11:]]
    assert drawn == [
        "  first draw in Chromium, / (first visit)",
        "  first draw in Chromium, / (reload, best of 3)",
        "  first draw in Chromium, step (first visit)",
        "  first draw in Chromium, step (reload, best of 3)",
    ]
