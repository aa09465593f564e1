"""A symbolic link that leads out of the dump is never followed, in any format's layout.

A dump is a stranger's folder: a link in it (a step file, or a folder on the way to one) to a
file elsewhere would read that file into the lake as if the dump held it (another run's step,
a private file the reader may open). Each case moves one file or folder of a copy of a real
dump outside it, links it back, and asserts the `Ignored` line the user sees and what landed;
a link to a file inside the dump is still followed.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.e2e.test_bad_input import age, copy_dump, extract, summary_line
from tests.fixture_paths import NEMO_RL_REAL, PRIME_RL_REAL

NEVER = "tokenlake never follows one"


def _move_out(dump: Path, relative: str, outside: Path) -> Path:
    """Move `dump/relative` to `outside` and leave a link to it in its place."""
    inside = dump / relative
    outside.parent.mkdir(parents=True, exist_ok=True)
    shutil.move(inside, outside)
    inside.symlink_to(outside)
    return inside


def _ignored(path: Path, target: Path) -> str:
    return f"Ignored `{path}`: is a symbolic link out of the dump (to `{target}`); {NEVER}"


def test_a_linked_train_file_is_ignored_and_its_tp_copy_read(tmp_path: Path) -> None:
    """`basic` is DP 2 x TP 2: rank 1 holds the rows of rank 0, whose file is a link out."""
    dump = copy_dump(tmp_path)
    target = tmp_path / "elsewhere" / "1_0.pt"
    link = _move_out(dump, "train_data/1_0.pt", target)
    code, out, err = extract(dump, tmp_path / "lake")
    counts = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, out) == (0, summary_line("basic", tmp_path / "lake", counts, 20, 206))
    assert err == [_ignored(link, target)]


def test_a_linked_rollout_folder_reads_none_of_its_files(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    _move_out(dump, "rollout_data", tmp_path / "elsewhere")
    code, out, err = extract(dump, tmp_path / "lake")
    names = ["0.pt", "1.pt", "eval_0.pt"]
    assert err[:3] == [
        _ignored(dump / "rollout_data" / name, tmp_path / "elsewhere" / name) for name in names
    ]
    assert err[3] == (
        f"Ignored `{dump / 'train_data' / '0_0.pt'}`: step 0 has no `rollout_data/0.pt` to join"
        " it to"
    )
    counts = "0 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, out) == (0, summary_line("basic", tmp_path / "lake", counts, 0, 0))


def test_a_link_within_the_dump_is_followed(tmp_path: Path) -> None:
    dump = copy_dump(tmp_path)
    kept = dump / "kept" / "1_0.pt"
    _move_out(dump, "train_data/1_0.pt", kept)
    code, out, err = extract(dump, tmp_path / "lake")
    counts = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, out, err) == (0, summary_line("basic", tmp_path / "lake", counts, 20, 206), [])


@pytest.mark.parametrize(
    ("source", "relative", "landed"),
    [
        (NEMO_RL_REAL / "grpo_multiturn", "train_data_step2.jsonl", "3 new"),
        (PRIME_RL_REAL / "packed_2ranks", "token_exports/step_1/rank_1.jsonl", "2 new"),
    ],
    ids=["nemo-rl", "prime-rl"],
)
def test_a_linked_log_or_rank_file_is_ignored(
    tmp_path: Path, source: Path, relative: str, landed: str
) -> None:
    dump = tmp_path / "run"
    shutil.copytree(source, dump, ignore=shutil.ignore_patterns("expected"))
    for path in dump.rglob("*"):
        age(path)
    target = tmp_path / "elsewhere" / Path(relative).name
    link = _move_out(dump, relative, target)
    _, out, err = extract(dump, tmp_path / "lake")
    assert _ignored(link, target) in err
    assert f": {landed}, " in out


def _link_sidecar(dump: Path, relative: str, outside: Path) -> Path:
    """A sidecar moved out of the dump (or written there, `{}`) and linked back."""
    if not (dump / relative).exists():
        outside.parent.mkdir(parents=True, exist_ok=True)
        outside.write_text("{}\n")
        (dump / relative).parent.mkdir(parents=True, exist_ok=True)
        (dump / relative).symlink_to(outside)
        return dump / relative
    return _move_out(dump, relative, outside)


LINKED = "is a symbolic link out of the dump (to `{target}`); tokenlake never follows one"


@pytest.mark.parametrize(
    ("relative", "warnings"),
    [
        (
            "trajectory",
            [
                f"Warning: `{{dump}}/trajectory/{name}.jsonl` {LINKED.format(target='{out}/' + name + '.jsonl')};"
                " the step's conversations are NULL."
                for name in ("0", "1")
            ],
        ),
        (
            "tokenizer",
            [
                f"Ignored `{{dump}}/tokenizer/tokenizer.json`:"
                f" {LINKED.format(target='{out}/tokenizer.json')}; token texts are NULL until"
                " it is fixed"
            ],
        ),
        (
            "dashboard/meta.json",
            [
                f"Warning: `{{dump}}/dashboard/meta.json` {LINKED.format(target='{out}')}; its run"
                " metadata is left NULL."
            ],
        ),
        (
            "dashboard/metrics.jsonl",
            [
                f"Warning: `{{dump}}/dashboard/metrics.jsonl` {LINKED.format(target='{out}')};"
                " skipped."
            ],
        ),
    ],
    ids=["trajectory-folder", "tokenizer-folder", "meta-json", "metrics-jsonl"],
)
def test_a_linked_sidecar_is_one_line_and_the_steps_land(
    tmp_path: Path, relative: str, warnings: list[str]
) -> None:
    dump = copy_dump(tmp_path)
    outside = tmp_path / "elsewhere" / Path(relative).name
    _link_sidecar(dump, relative, outside)
    code, out, err = extract(dump, tmp_path / "lake")
    counts = "3 new, 0 updated, 0 unchanged, 0 removed, 0 skipped"
    assert (code, out) == (0, summary_line("basic", tmp_path / "lake", counts, 20, 206))
    assert err == [line.format(dump=dump, out=outside) for line in warnings]
