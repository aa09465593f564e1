"""A step lands only when it is complete, for every format (pipeline/tokenlake/read/completeness.py).

Each test copies a real fixture dump, takes part of one step away (rank files; lines of a
NeMo-RL log cut at a line boundary), and sets the files' mtimes: fresh (now), the step is not
extracted and the summary says so; settled (an hour ago), it lands with one warning line
naming what is missing, and `tokenlake audit` lists it (`incomplete_steps`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.conftest import store_of
from tests.fixture_paths import NEMO_RL_REAL, NEXT_DUMPS, REAL_DUMPS, SLIME_REAL
from tokenlake.cli import main
from tokenlake.orchestrate.extract import ExtractOptions, extract_run
from tokenlake.store import manifest

pytestmark = pytest.mark.slow  # real extractions

HOUR = 3600.0


def run_cli(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, list(args))
    out = re.sub(r" in \d+\.\d s -> .*", "", result.stdout)
    return result.exit_code, out, result.stderr


def extract(dump: Path, lake: Path) -> tuple[int, str, str]:
    return run_cli("extract", str(dump), "--lake", str(lake), "--silent", "--workers", "1")


FIGURES = {  # (the summary without the settled step, then with it)
    "v1": (
        "Run `v1`: 3 new, 0 updated, 0 unchanged, 0 removed, 1 skipped steps; wrote 40 samples"
        " and 887 tokens\n",
        "Run `v1`: 1 new, 0 updated, 3 unchanged, 0 removed, 0 skipped steps; wrote 16 samples"
        " and 378 tokens\n",
    ),
    "basic": (
        "Run `basic`: 2 new, 0 updated, 0 unchanged, 0 removed, 1 skipped steps; wrote 12"
        " samples and 124 tokens\n",
        "Run `basic`: 1 new, 0 updated, 2 unchanged, 0 removed, 0 skipped steps; wrote 8"
        " samples and 82 tokens\n",
    ),
}


def age(paths: list[Path], seconds: float) -> None:
    stamp = time.time() - seconds
    for path in paths:
        os.utime(path, (stamp, stamp))


def every_file(root: Path) -> list[Path]:
    return [p for p in root.rglob("*") if p.is_file()]


def not_yet(label: str, missing: str) -> str:
    return (
        f"Skipped step {label}: not yet complete: {missing}, and its files changed less than"
        " 30 s ago; extract again once they are written\n"
    )


def warning(label: str, missing: str) -> str:
    return (
        f"Warning: Step {label} is incomplete: {missing}; its files no longer change, so it is"
        " extracted as it is and marked incomplete (`tokenlake audit`: incomplete_steps)\n"
    )


def marks(lake: Path, run: str) -> dict[str, str | None]:
    record = manifest.load_manifest(store_of(lake), run)
    assert record is not None
    return {label: step.incomplete for label, step in sorted(record.steps.items())}


@pytest.mark.parametrize(
    ("source", "run", "fmt"),
    [
        (SLIME_REAL / "v1_tp2", "v1", "Read the dump as slime (train dump format 1) (detected from its layout).\n"),
        (REAL_DUMPS / "basic", "basic", ""),
    ],
)  # fmt: skip
def test_a_step_with_1_of_its_4_rank_files(
    tmp_path: Path, source: Path, run: str, fmt: str
) -> None:
    dump, lake = tmp_path / run, tmp_path / "lake"
    shutil.copytree(source, dump)
    for rank in (1, 2, 3):
        (dump / "train_data" / f"1_{rank}.pt").unlink()
    age(every_file(dump), HOUR)
    age([dump / "train_data" / "1_0.pt"], 0)  # rank 0 just written: the others may follow
    missing = "ranks 1-3 of ranks 0-3 have no train file"

    first, then = FIGURES[run]
    code, out, err = extract(dump, lake)
    assert (code, out, err) == (1, first, f"{fmt}{not_yet('1', missing)}")
    assert "1" not in marks(lake, run)

    age([dump / "train_data" / "1_0.pt"], HOUR)  # settled: the other ranks never came
    code, out, err = extract(dump, lake)
    assert (code, out, err) == (0, then, f"{fmt}{warning('1', missing)}")
    assert marks(lake, run) == {**dict.fromkeys(marks(lake, run)), "1": missing}
    code, out, _ = run_cli("audit", str(lake))
    assert (
        "WARN  incomplete_steps [warning]: Training steps extracted although their files were"
        " incomplete once they had settled: rank files missing from the layout the run's other"
        " steps declare (miles, slime format 1), or a NeMo-RL batch with fewer samples than the"
        " run's other steps. (1 row)\n"
    ) in out
    assert re.search(rf"\n +{run} +1  ranks 1-3 of ranks 0-3 have no train fi…\n", out)


def cut_nemo_step3(tmp_path: Path) -> Path:
    """The NeMo-RL fixture with `train_data_step3.jsonl` cut to its first 5 of 16 lines."""
    dump = tmp_path / "nemo"
    shutil.copytree(NEMO_RL_REAL / "grpo_multiturn", dump)
    log = dump / "train_data_step3.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    assert len(lines) == 16
    log.write_bytes(b"".join(lines[:5]))  # cut at a line boundary: every line parses
    age(every_file(dump), HOUR)
    return log


NEMO = "Read the dump as NeMo-RL (detected from its layout).\n"
SHORT = "it has 5 samples; the run's other training steps have 16"


def test_a_nemo_rl_log_cut_at_a_line_boundary(tmp_path: Path) -> None:
    log, lake = cut_nemo_step3(tmp_path), tmp_path / "lake"
    age([log], 0)  # still being written
    code, out, err = extract(log.parent, lake)
    assert (code, out, err) == (
        1,
        "Run `nemo`: 3 new, 0 updated, 0 unchanged, 0 removed, 1 skipped steps; wrote 36 samples"
        " and 1,087 tokens\n",
        f"{NEMO}{not_yet('3', SHORT)}",
    )
    assert marks(lake, "nemo") == {"1": None, "2": None, "eval_2": None}
    assert list((lake / "tokens" / "run=nemo").glob("rollout_id=3")) == []  # not yet: no file

    age([log], HOUR)  # settled: the rest never came
    code, out, err = extract(log.parent, lake)
    assert (code, out, err) == (
        0,
        "Run `nemo`: 1 new, 0 updated, 3 unchanged, 0 removed, 0 skipped steps; wrote 5 samples"
        " and 199 tokens\n",
        f"{NEMO}{warning('3', SHORT)}",
    )
    assert marks(lake, "nemo") == {"1": None, "2": None, "3": SHORT, "eval_2": None}


def test_a_short_nemo_rl_step_extracted_before_the_others_is_marked_after_them(
    tmp_path: Path,
) -> None:
    """Steps of one extraction finish in any order: a short step committed before the run's
    batch size is known is marked once it is."""
    log, lake = cut_nemo_step3(tmp_path), tmp_path / "lake"
    summary = extract_run(log.parent, store_of(lake), ExtractOptions(steps=[3], workers=1))
    assert (summary.warnings, marks(lake, "nemo")) == ([], {"3": None})  # nothing to compare
    summary = extract_run(log.parent, store_of(lake), ExtractOptions(workers=1))
    assert summary.warnings == [warning("3", SHORT)[len("Warning: ") : -1]]
    assert marks(lake, "nemo") == {"1": None, "2": None, "3": SHORT, "eval_2": None}


def test_a_manifest_whose_mark_is_not_a_line_of_text_is_damaged(tmp_path: Path) -> None:
    log, lake = cut_nemo_step3(tmp_path), tmp_path / "lake"
    extract_run(log.parent, store_of(lake), ExtractOptions(workers=1))
    path = lake / "_manifest" / "nemo.json"
    data = json.loads(path.read_text())
    data["steps"]["3"]["incomplete"] = "x'); DROP TABLE y; --\n"
    path.write_text(json.dumps(data))
    assert run_cli("verify", str(lake)) == (
        1,
        "",
        f"Error: Lake `{path}`: manifest is damaged: a step's `incomplete` is"
        """ "x'); DROP TABLE y; --\\n", not a line of text. Remove the run with `tokenlake"""
        " drop LAKE nemo` or extract it again\n",
    )


def test_the_only_training_step_lands_once_every_rank_file_is_there(tmp_path: Path) -> None:
    """A run's first training step has no other step to tell its rank set: with rank 8 of
    ranks 8, 12 just written (#3141's sparse ranks, rank 12 still saving), it landed with half
    its samples trained, exit 0 and no word. While its files change it now waits until its
    train files hold every sample; settled (a batch whose trailing rollouts were dropped) it
    lands as it is, unmarked."""
    dump, lake = tmp_path / "sparse", tmp_path / "lake"
    shutil.copytree(NEXT_DUMPS / "sparse_ranks", dump)
    for name in ("rollout_data/1.pt", "train_data/1_8.pt", "train_data/1_12.pt"):
        (dump / name).unlink()
    (dump / "train_data" / "0_12.pt").unlink()
    age(every_file(dump), HOUR)
    age([dump / "train_data" / "0_8.pt"], 0)

    code, out, err = extract(dump, lake)
    assert (code, out) == (
        1,
        "Run `sparse`: 0 new, 0 updated, 0 unchanged, 0 removed, 1 skipped steps; wrote 0"
        " samples and 0 tokens\n",
    )
    assert err == not_yet("0", "its train files hold 4 of its 8 samples")

    age([dump / "train_data" / "0_8.pt"], HOUR)
    code, out, err = extract(dump, lake)
    assert (code, err) == (0, "")
    assert out.startswith("Run `sparse`: 1 new, 0 updated, 0 unchanged")
    assert marks(lake, "sparse") == {"0": None}
