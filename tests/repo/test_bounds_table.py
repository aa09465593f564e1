"""docs/security.md's table of bounds: every file kind tokenlake reads has a row, every row a
case in `make bench-bounds` (pipeline/benchmarks/bench_bounds.py) and the figure it measured."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from benchmarks import bench_bounds

ROOT = Path(__file__).resolve().parents[2]
SECURITY = ROOT / "docs" / "security.md"
HEADER = "| file | bound | beyond it | measured (`make bench-bounds`) |"
# A measured figure as bench-bounds prints it: the refusal's time and peak memory.
FIGURE = re.compile(r"[0-9][0-9.,]* s, [0-9][0-9,]* MB")
# Each byte bound of a file the package reads (a module-level `MAX_..._BYTES`), and the row of
# the table that states it (a part of its first cell).
BOUND_ROWS = {
    "dashboard.MAX_LINE_BYTES": "`dashboard/metrics.jsonl`",
    "dashboard.MAX_META_BYTES": "`dashboard/meta.json`",
    "dashboard.MAX_READ_BYTES": "`dashboard/metrics.jsonl`",
    # the longest list of a JSON line decoded whole-array: longer ones are parsed by json
    "jsonarrays.MAX_LIST_BYTES": "prime-rl's `token_exports/step_{N}/rank_{R}.jsonl`",
    "manifest.MAX_MANIFEST_BYTES": "`_manifest/<run>.json`",
    "nemo_rl.MAX_LINE_BYTES": "NeMo-RL's `train_data_step{N}.jsonl`",
    "object_lock.MAX_LOCK_BYTES": "writer lock `_manifest/.tokenlake.lock`",
    "prime_rl.MAX_FILE_BYTES": "prime-rl's `token_exports/step_{N}/rank_{R}.jsonl`",
    "prime_rl.MAX_LINE_BYTES": "prime-rl's `token_exports/step_{N}/rank_{R}.jsonl`",
    "remote_stage.MAX_STATE_BYTES": "`.tokenlake-remote.json`",
    "tags.MAX_META_FILE_BYTES": "`--meta FILE`",
    "trajectory.MAX_FILE_BYTES": "`trajectory/{step}.jsonl`",
    "trajectory.MAX_LINE_BYTES": "`trajectory/{step}.jsonl`",
    "user_views.MAX_USER_VIEW_BYTES": "`views/*.sql`",
    "vocab.MAX_TOKENIZER_BYTES": "`tokenizer/tokenizer.json`",
    # tokenlake's own cached copy of the report's Vega bundle, in folders only the user may
    # write (docs/security.md, "Caches, stages, symlinks and deletion"): not a stranger's file.
    "report_html.MAX_BUNDLE_BYTES": None,
    # The explorer's own kept per-step rows, in the same private folders (docs/security.md,
    # "The explorer"): not a stranger's file either.
    "step_rows.MAX_FILE_BYTES": None,
    # A reader's kept footer identities, in its private catalogs' folder ("The catalog file
    # itself"): not a stranger's file.
    "catalog_cache.MAX_FOOTERS_BYTES": None,
    # A run name's length, not a file's.
    "layout.MAX_RUN_NAME_BYTES": None,
}


def table_rows() -> list[list[str]]:
    """The cells of each row of the table of bounds."""
    text = SECURITY.read_text(encoding="utf-8")
    section = text.split("## Size bounds for every file read", 1)[1]
    lines = section.splitlines()
    start = lines.index(HEADER)
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in re.split(r"(?<!\\)\|", line.strip())[1:-1]])
    return rows


def byte_bounds() -> list[str]:
    """`module.NAME` of every module-level `MAX_..._BYTES` in the package."""
    found = []
    for path in sorted((ROOT / "pipeline" / "tokenlake").rglob("*.py")):
        for node in ast.parse(path.read_text(encoding="utf-8")).body:
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name) and re.fullmatch(r"MAX_\w*_BYTES", target.id):
                        found.append(f"{path.stem}.{target.id}")
    return found


def test_every_row_has_a_measured_figure_and_a_case_in_the_bench() -> None:
    rows = table_rows()
    assert len(rows) == len(bench_bounds.CASES)
    assert [len(cells) for cells in rows] == [4] * len(rows)
    assert [cells[0] for cells in rows] == [case.kind for case in bench_bounds.CASES]
    unmeasured = [cells[0] for cells in rows if not FIGURE.search(cells[3])]
    assert unmeasured == []


def test_every_byte_bound_of_a_file_read_has_its_row() -> None:
    bounds = byte_bounds()
    assert len(bounds) >= 14  # the scan finds them
    assert sorted(bounds) == sorted(BOUND_ROWS)
    kinds = [cells[0] for cells in table_rows()]
    missing = [
        (bound, row)
        for bound, row in BOUND_ROWS.items()
        if row is not None and not any(row in kind for kind in kinds)
    ]
    assert missing == []


def test_the_table_of_the_lake_s_own_files_names_every_table_read() -> None:
    from tokenlake import schema

    (lake_row,) = [cells[0] for cells in table_rows() if "the lake's own Parquet files" in cells[0]]
    named = set(re.findall(r"`(\w+)`", lake_row))
    assert {schema.TOKENS, schema.SAMPLES, schema.EXPERTS, *schema.SIDE_TABLES} <= named
    assert "every rollup" in lake_row
