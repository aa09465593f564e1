"""Legend labels of long run names keep the part that tells the runs apart."""

from __future__ import annotations

from tokenlake.serve.report_html import short_runs

LONG = "qwen3-30b-a3b-grpo-{}-lr1e-6-0"


def test_the_common_prefix_and_suffix_are_elided():
    runs = [LONG.format("bf16"), LONG.format("fp8"), LONG.format("fp8-tp4")]
    assert list(short_runs(runs).values()) == ["…bf16…", "…fp8…", "…fp8-tp4…"]


def test_a_name_that_ends_where_another_goes_on_keeps_a_word():
    runs = ["qwen3-30b-a3b-grpo-bf16-lr1e-6", "qwen3-30b-a3b-grpo-bf16-lr1e-6-resumed"]
    assert list(short_runs(runs).values()) == ["…6", "…6-resumed"]


def test_short_names_and_a_lone_run_stay_whole():
    assert short_runs(["tp-a", "tp-b"]) == {"tp-a": "tp-a", "tp-b": "tp-b"}
    assert short_runs([LONG.format("bf16")]) == {LONG.format("bf16"): LONG.format("bf16")}
