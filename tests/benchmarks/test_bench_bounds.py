"""`make bench-bounds` (pipeline/benchmarks/bench_bounds.py) runs, so it cannot rot: each
kind's hostile file is built and refused, on the hostile input only. Not timed: the figures are
printed, never compared. The readers' identity checks are measured on a lake of 3 steps. The two 256 MiB line kinds (prime-rl, NeMo-RL), which take real bytes
and minutes on a loaded machine, are left to `make bench-bounds`; their files are built by the
same `line_file` as the metrics kinds here."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks import bench_bounds

pytestmark = pytest.mark.slow  # about fifteen extractions and verifies

LONG_LINES = ("prime-rl's `token_exports", "NeMo-RL's")


def test_every_kind_but_the_long_lines_is_built_and_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kinds = [c.kind for c in bench_bounds.CASES if not c.kind.startswith(LONG_LINES)]
    argv = ["--work", str(tmp_path), "--hostile-only", "--identity-steps", "3"]
    for kind in kinds:
        argv += ["--only", kind]
    assert bench_bounds.main(argv) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("load average before: ") and out[-1].startswith("load average after")
    assert out[-3] == "identity checks of a reader, a lake of 3 steps (37 files):"
    assert re.fullmatch(
        r"  every footer read and compared: [0-9.]+ ms \([0-9]+ us a file\); the whole choice of"
        r" what is served: [0-9.]+ ms; `tokenlake query LAKE \"SELECT 1\"`: [0-9.]+ s",
        out[-2],
    )
    blocks = out[1:-3]
    assert [blocks[i] for i in range(0, len(blocks), 3)] == kinds
    for i in range(1, len(blocks), 3):
        assert re.fullmatch(r"  refused: [0-9.]+ s, [0-9,]+ MB", blocks[i])
    refusals = [blocks[i] for i in range(2, len(blocks), 3)]
    for case, line in zip(
        [c for c in bench_bounds.CASES if c.kind in kinds], refusals, strict=True
    ):
        assert (case.refusal or "the stage was downloaded again") in line


def test_a_run_that_does_not_refuse_is_a_failure_not_a_figure(tmp_path: Path) -> None:
    (case,) = [c for c in bench_bounds.CASES if c.kind == "`dashboard/meta.json`"]
    harmless = bench_bounds.Case(
        case.kind, case.preset, lambda d, lake, h: case.plant(d, lake, False), case.refusal
    )
    with pytest.raises(SystemExit, match="the hostile run did not refuse it"):
        bench_bounds.measure(harmless, tmp_path, clean_too=False)
