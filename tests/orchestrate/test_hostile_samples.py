"""One bad rollout sample, or a bug, or a dying worker costs its step only.

Each case takes a copy of the real `basic` dump (steps 0 and 1, `eval_0`), rewrites one value of
one sample with `torch.save`, runs `tokenlake extract`, and asserts the exact line the user sees,
the exit code, and that the other steps landed in the lake.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests.e2e.test_bad_input import (
    EVAL_AND_STEP_1,
    REPLACE,
    STEP_0_AND_EVAL,
    age,
    copy_dump,
    extract,
    lake_steps,
    summary_line,
)
from tokenlake import layout
from tokenlake.errors import SampleValueError
from tokenlake.orchestrate import step
from tokenlake.read import dump, jsontext

SKIPPED_ONE = "2 new, 0 updated, 0 unchanged, 0 removed, 1 skipped"
BIG = 2**70  # 1180591620717411303424
SAMPLE_3 = "batch position 3, sample_index 11"  # step 1, R = 4 of T = 12 tokens


def _set(key: str, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda sample: sample.__setitem__(key, value)


def _set_entry(key: str, entry: int, value: Any) -> Callable[[dict[str, Any]], None]:
    return lambda sample: sample[key].__setitem__(entry, value)


def _to_tensor(key: str) -> Callable[[dict[str, Any]], None]:
    def change(sample: dict[str, Any]) -> None:
        import torch

        sample[key] = torch.tensor(sample[key])

    return change


# (id, change to sample 3 of step 1, the error after "`.../1.pt` (<sample>): ")
CASES: list[tuple[str, Callable[[dict[str, Any]], None], str]] = [
    ("tokens-tensor", _to_tensor("tokens"), "`tokens` is an int64 array of shape (12,), not a list of integers"),
    ("tokens-none", _set_entry("tokens", 2, None), "`tokens` entry 2 is None, not an integer"),
    ("tokens-2**70", _set_entry("tokens", 0, BIG), f"`tokens` entry 0 is {BIG}, outside the int64 range"),
    ("tokens-nested", _set_entry("tokens", 1, [5, 6]), "`tokens` entry 1 is a list of 2 entries, not an integer"),
    ("tokens-float", _set_entry("tokens", 5, 6.7), "`tokens` entry 5 is 6.7, not an integer"),
    ("tokens-string", _set_entry("tokens", 0, "6"), "`tokens` entry 0 is '6', not an integer"),
    ("tokens-negative", _set_entry("tokens", 4, -1), "`tokens` entry 4 is -1; token ids cannot be negative"),
    ("response_length-ten", _set("response_length", "ten"), "`response_length` is 'ten', not an integer"),
    ("response_length-10.9", _set("response_length", 10.9), "`response_length` is 10.9, not an integer"),
    ("response_length-negative", _set("response_length", -3), "`response_length` is -3; it cannot be negative"),
    ("response_length-too-long", _set("response_length", 13), "`response_length` 13 exceeds the 12 `tokens`"),
    ("response_length-10**5000", _set("response_length", 10**5000), "`response_length` an integer of 16610 bits exceeds the 12 `tokens`"),
    ("response_length-10**400", _set("response_length", 10**400), f"`response_length` {'1' + '0' * 59}… exceeds the 12 `tokens`"),
    ("response_length-minus-10**5000", _set("response_length", -(10**5000)), "`response_length` is an integer of 16610 bits; it cannot be negative"),
    ("index-zero", _set("index", "zero"), "`index` is 'zero', not an integer"),
    ("index-0.5", _set("index", 0.5), "`index` is 0.5, not an integer"),
    ("index-2**70", _set("index", BIG), f"`index` is {BIG}, outside the int64 range"),
    ("group_index-2**64", _set("group_index", 2**64), "`group_index` is 18446744073709551616, outside the int64 range"),
    ("weight_version-5000-digits", _set("weight_versions", ["9" * 5000]), f"`weight_versions` entry 0 is '{'9' * 60}'…, a number outside the int64 range"),
    ("weight_version-10**30", _set("weight_versions", ["2", str(10**30)]), f"`weight_versions` entry 1 is '{10**30}', a number outside the int64 range"),
    ("weight_version-1e30", _set("weight_versions", [1e30]), "`weight_versions` entry 0 is 1e+30, not a string"),
    ("spec_info-string-value", _set("spec_info", {"spec_accept_token_num": "many", "spec_draft_token_num": 4}), "`spec_info.spec_accept_token_num` is 'many', not an integer"),
    ("spec_info-string", _set("spec_info", "fast"), "`spec_info` is 'fast', not a dict of counters"),
    ("reward-10**400", _set("reward", 10**400), f"`reward` is {'1' + '0' * 59}…, beyond the float64 range"),
    ("remove_sample-tensor", _to_tensor("remove_sample"), "`remove_sample` is a bool array of shape (), not a bool"),
    ("status-int", _set("status", 5), "`status` is 5, not a string"),
    ("non_generation_time-string", _set("non_generation_time", "slow"), "`non_generation_time` is 'slow', not a number"),
    ("rollout_log_probs-strings", _set_entry("rollout_log_probs", 0, "-0.5"), "`rollout_log_probs` entry 0 is '-0.5', not a number"),
    ("rollout_log_probs-a-bool", _set_entry("rollout_log_probs", 2, True), "`rollout_log_probs` entry 2 is True, not a number"),
    ("tokens-a-bool", _set_entry("tokens", 7, False), "`tokens` entry 7 is False, not an integer"),
    ("loss_mask-none", _set("loss_mask", [1, None, 1, 1]), "`loss_mask` entry 1 is None, not an integer"),
    ("escaped-in-message", _set("index", "\x1b[2K\r0 skipped" + "x" * 100), "`index` is '\\x1b[2K\\r0 skipped" + "x" * 46 + "'…, not an integer"),
]  # fmt: skip


def _replace_in_pickle(path: Path, placeholder: str, opcodes: bytes) -> None:
    """Swap the pickled string `placeholder` for raw opcodes (values `torch.save` cannot write).

    The zip is written again with `zipfile`, which tokenlake reads like `torch.save`'s."""
    text = placeholder.encode()
    with zipfile.ZipFile(path) as archive:
        members = {name: archive.read(name) for name in archive.namelist()}
    (pkl,) = [name for name in members if name.endswith("/data.pkl")]
    pickled = b"X" + len(text).to_bytes(4, "little") + text
    assert members[pkl].count(pickled) == 1
    members[pkl] = members[pkl].replace(pickled, opcodes)
    path.unlink()
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)


def _surrogates(sample: dict[str, Any]) -> None:
    sample.update(
        response="ok \udc80 \ud83d\ude00",
        prompt="\ud800",
        metadata={"note": "\udfff"},
        weight_versions=["\udc00"],
    )


def _shared_references(sample: dict[str, Any]) -> None:
    shared: list[Any] = ["x"]
    for _ in range(20):  # 2**20 leaves, pickled as 20 small lists thanks to the memo
        shared = [shared, shared]
    sample["metadata"] = {"a": shared}


# Steps added to the dump, each a copy of step 1's rollout file (no train files) with one
# change to sample 3, plus `eval_1`, a copy of `eval_0` with a change to sample 1.
FIRST_CASE_STEP = 10
DEEP_STEP, SHARED_STEP, SURROGATE_STEP = 7, 8, 9
EXTRA = {
    DEEP_STEP: _set("metadata", "DEEP-PLACEHOLDER"),
    SHARED_STEP: _shared_references,
    SURROGATE_STEP: _surrogates,
}


def _write_case(rollout: dict[str, Any], path: Path, position: int, change: Callable) -> None:
    import copy

    import torch

    data = copy.deepcopy(rollout)
    data["rollout_id"] = int(path.stem.removeprefix("eval_"))
    change(data["samples"][position])
    torch.save(data, path)


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, int, str, list[str]]:
    """The dump with every case, extracted once: (dump, lake, exit code, stdout, stderr lines)."""
    import torch

    root = tmp_path_factory.mktemp("hostile")
    dump_dir = copy_dump(root)
    rollouts = dump_dir / "rollout_data"
    step_1 = torch.load(rollouts / "1.pt", weights_only=False)
    cases = {FIRST_CASE_STEP + i: change for i, (_, change, _) in enumerate(CASES)}
    for rid, change in {**cases, **EXTRA}.items():
        _write_case(step_1, rollouts / f"{rid}.pt", 3, change)
    eval_0 = torch.load(rollouts / "eval_0.pt", weights_only=False)
    _write_case(eval_0, rollouts / "eval_1.pt", 1, _set("index", BIG))
    depth = 300_000  # EMPTY_LIST n times, then APPEND n - 1 times: each list inside the last
    _replace_in_pickle(
        rollouts / f"{DEEP_STEP}.pt", "DEEP-PLACEHOLDER", b"]" * depth + b"a" * (depth - 1)
    )
    for path in rollouts.iterdir():
        age(path)
    lake = root / "lake"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jsontext, "MAX_VALUES", 1000)  # the same check, reached sooner
        code, out, err = extract(dump_dir, lake)
    return dump_dir, lake, code, out, err


def _line(err: list[str], label: str) -> str:
    (line,) = [line for line in err if line.startswith(f"Skipped step {label}: ")]
    return line


@pytest.mark.slow
def test_only_the_bad_steps_are_skipped(hostile: tuple[Path, Path, int, str, list[str]]) -> None:
    _, lake, code, out, err = hostile
    skipped = len(CASES) + 3  # the cases, eval_1, the deep and the shared metadata
    counts = f"4 new, 0 updated, 0 unchanged, 0 removed, {skipped} skipped"
    assert (code, out) == (1, summary_line("basic", lake, counts, 28, 288))
    assert len(err) == skipped
    landed = [(0, False, 8), (0, True, 4), (1, False, 8), (SURROGATE_STEP, False, 8)]
    assert lake_steps(lake, "basic") == landed


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rid", "problem"),
    [(FIRST_CASE_STEP + i, problem) for i, (_, _, problem) in enumerate(CASES)],
    ids=[name for name, _, _ in CASES],
)
def test_bad_value_is_one_line_naming_file_step_sample_and_field(
    hostile: tuple[Path, Path, int, str, list[str]], rid: int, problem: str
) -> None:
    dump_dir, *_, err = hostile
    sample = "batch position 3" if problem.startswith("`index`") else SAMPLE_3
    path = dump_dir / "rollout_data" / f"{rid}.pt"
    assert _line(err, str(rid)) == f"Skipped step {rid}: `{path}` ({sample}): {problem}. {REPLACE}"


@pytest.mark.slow
def test_index_beyond_int64_in_an_eval_file(
    hostile: tuple[Path, Path, int, str, list[str]],
) -> None:
    dump_dir, *_, err = hostile
    assert _line(err, "eval_1") == (
        f"Skipped step eval_1: `{dump_dir / 'rollout_data' / 'eval_1.pt'}` (batch position 1):"
        f" `index` is {BIG}, outside the int64 range. {REPLACE}"
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("rid", "problem"),
    [
        (DEEP_STEP, "`metadata` is nested more than 100 levels deep"),
    ],
    ids=["300000-deep"],
)
def test_metadata_that_json_cannot_hold(
    hostile: tuple[Path, Path, int, str, list[str]], rid: int, problem: str
) -> None:
    dump_dir, *_, err = hostile
    path = dump_dir / "rollout_data" / f"{rid}.pt"
    assert (
        _line(err, str(rid)) == f"Skipped step {rid}: `{path}` ({SAMPLE_3}): {problem}. {REPLACE}"
    )


@pytest.mark.slow
def test_lone_surrogates_are_stored_as_replacement_characters(
    hostile: tuple[Path, Path, int, str, list[str]],
) -> None:
    lake = hostile[1]
    with duckdb.connect(str(lake / layout.CATALOG_FILE), read_only=True) as con:
        row = con.execute(
            "SELECT response_text, prompt_text, metadata_json, weight_versions FROM samples"
            f" WHERE rollout_id = {SURROGATE_STEP} AND batch_position = 3"
        ).fetchone()
    assert row == ("ok \ufffd \U0001f600", "\ufffd", '{"note": "\ufffd"}', ["\ufffd"])


# --- a bug in a step, or a worker that dies --------------------------------------------------

_real_load_rollout = dump.load_rollout


def _load_rollout_or_divide(path: Path, rollout_id: int) -> dict[str, Any]:
    if path.name == "1.pt":
        return rollout_id / 0  # type: ignore[return-value]
    return _real_load_rollout(path, rollout_id)


DIVIDE_LINE = _load_rollout_or_divide.__code__.co_firstlineno + 2


def extract_steps_with_a_bug(*args: Any) -> list[step.StepOutcome]:
    """`tokenlake.orchestrate.step.extract_steps`, with step 1's load raising ZeroDivisionError.

    Stands in for it in every process: workers are spawned, so they import this module
    rather than inherit a monkeypatch of the test process."""
    dump.load_rollout = _load_rollout_or_divide
    try:
        return step.extract_steps(*args)
    finally:
        dump.load_rollout = _real_load_rollout


def extract_steps_that_die(batch: list[Any], *args: Any) -> list[step.StepOutcome]:
    """`tokenlake.orchestrate.step.extract_steps`, except that a worker process given step 0
    is killed."""
    in_worker = multiprocessing.parent_process() is not None
    if in_worker and "0" in [files.label for files, _ in batch]:
        os.kill(os.getpid(), signal.SIGKILL)
    return step.extract_steps(batch, *args)


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_unexpected_exception_is_its_steps_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    monkeypatch.setattr("tokenlake.orchestrate.scheduler.extract_steps", extract_steps_with_a_bug)
    dump_dir = copy_dump(tmp_path)
    lake = tmp_path / "lake"
    code, out, err = extract(dump_dir, lake, "--workers", str(workers))
    assert err == [
        f"Skipped step 1: `{dump_dir / 'rollout_data' / '1.pt'}`: unexpected"
        f" ZeroDivisionError('division by zero') at test_hostile_samples.py:{DIVIDE_LINE} in"
        f" _load_rollout_or_divide. {step.BUG_HINT}"
    ]
    assert (code, out) == (1, summary_line("basic", lake, SKIPPED_ONE, 12, 124))
    assert lake_steps(lake, "basic") == STEP_0_AND_EVAL


@pytest.mark.slow
@pytest.mark.parametrize("workers", [2, 3])
def test_worker_killed_mid_step_fails_that_step_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, workers: int
) -> None:
    """With 2 workers step 0 runs in the only process; with 3 it shares the pool with eval_0,
    which the kill interrupts too: eval_0 is retried alone and lands."""
    monkeypatch.setattr("tokenlake.orchestrate.scheduler.extract_steps", extract_steps_that_die)
    dump_dir = copy_dump(tmp_path)
    lake = tmp_path / "lake"
    code, out, err = extract(dump_dir, lake, "--workers", str(workers))
    assert err == [
        f"Skipped step 0: `{dump_dir / 'rollout_data' / '0.pt'}`: the worker process extracting"
        " this step died, also when retried alone (killed, out of memory, or crashed). Unless it"
        " was killed on purpose, this is a tokenlake bug: please report it with this line and"
        " `tokenlake --version`."
    ]
    assert (code, out) == (1, summary_line("basic", lake, SKIPPED_ONE, 12, 124))
    assert lake_steps(lake, "basic") == EVAL_AND_STEP_1


# --- values the spec allows are read as they are (fast, no dump) ------------------------------


def test_numpy_values_of_allowed_types_are_accepted() -> None:
    import numpy as np

    from tokenlake.read import validate
    from tokenlake.transform.summary import sample_summary

    sample = {
        "index": np.int64(7),
        "group_index": np.int32(2),
        "tokens": [np.int64(5), 6, np.uint64(2**63 - 1)],
        "response_length": np.int64(2),
        "loss_mask": np.array([1, 0], dtype=np.int32),
        "rollout_log_probs": [np.float32(-0.5), -1],
        "remove_sample": np.bool_(True),
        "non_generation_time": np.float32(1.5),
        "weight_versions": ["3", 4],
        "spec_info": {"spec_accept_token_num": np.int64(1), "spec_draft_token_num": 4},
        "metadata": {"arr": np.arange(3), (1, "k"): {np.str_("x"): None}},
    }
    validate.check_sample(sample)
    row = sample_summary(9, False, 0, sample, None)
    assert [row[k] for k in ("sample_index", "group_index", "prompt_length", "remove_sample")] == [
        7,
        2,
        1,
        True,
    ]
    assert (row["weight_version_min"], row["spec_accept_rate"]) == (3, 0.25)
    assert row["non_generation_time"] == 1.5
    assert row["metadata_json"] == '{"arr": [0, 1, 2], "[1, \\"k\\"]": {"x": null}}'


def test_an_array_too_large_for_json_is_refused_before_it_is_built() -> None:
    import numpy as np

    from tokenlake.errors import SampleValueError

    huge = np.lib.stride_tricks.as_strided(np.zeros(1), shape=(100_000, 100_000), strides=(0, 0))
    with pytest.raises(SampleValueError) as raised:
        jsontext.to_json({"a": huge}, "metadata")
    assert str(raised.value) == (
        "`metadata` holds an array of 10,000,000,000 values, more than 1,000,000"
    )


@pytest.mark.slow
def test_shared_references_are_refused_by_the_reader_first(
    hostile: tuple[Path, Path, int, str, list[str]],
) -> None:
    """The reader refuses a value graph larger than 4 items per byte of the file before any
    later stage sees it (docs/live-runs.md); to_json's own limit stays as a second line."""
    dump_dir, *_, err = hostile
    path = dump_dir / "rollout_data" / f"{SHARED_STEP}.pt"
    assert _line(err, str(SHARED_STEP)).startswith(
        f"Skipped step {SHARED_STEP}: Cannot read `{path}`: its values expand to more than "
    )
    assert _line(err, str(SHARED_STEP)).endswith(
        " items when shared references are followed (at most 4 per byte of the file), so it is"
        f" refused as an amplification attack. {REPLACE}"
    )


def test_to_json_refuses_a_cycle_and_shared_expansion() -> None:
    """The second line of defence, for values that reach it from memory."""
    cyclic: dict[str, object] = {}
    cyclic["self"] = cyclic
    with pytest.raises(SampleValueError) as info:
        jsontext.to_json(cyclic, "metadata")
    assert str(info.value) == "`metadata` contains itself (a reference cycle)"
    leaf: list[object] = [0] * 10
    for _ in range(7):
        leaf = [leaf] * 10  # 10**8 values through shared references, 80 objects in memory
    with pytest.raises(SampleValueError) as info:
        jsontext.to_json(leaf, "metadata")
    assert (
        str(info.value) == "`metadata` expands to more than 1,000,000 values (shared references?)"
    )
