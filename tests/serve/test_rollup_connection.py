"""The connection the rollups are computed on at commit (serve/rollups.py): made ahead in its
own thread while the steps are read, taken when the first rollups are computed, and made again
where it is used when making it ahead failed, so that its error comes where it always came."""

from __future__ import annotations

import threading

import pytest

from tokenlake.errors import LakeError
from tokenlake.serve import rollups

AHEAD = "tokenlake-rollups-connection"


@pytest.fixture
def made(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The threads that made a step connection, in order, on a fresh thread-local state."""
    threads: list[str] = []
    real = rollups._new_step_connection

    def making(*imported):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return real(*imported)

    monkeypatch.setattr(rollups, "_local", threading.local())
    monkeypatch.setattr(rollups, "_new_step_connection", making)
    return threads


def test_a_connection_made_ahead_is_the_one_used(made: list[str]) -> None:
    synchronous = rollups.default_settings_digests()
    rollups._local.con = None
    made.clear()
    rollups.prepare_step_connection()
    rollups.prepare_step_connection()  # one made ahead at a time
    assert rollups.default_settings_digests() == synchronous
    rollups.prepare_step_connection()  # the thread has its connection: nothing to make
    assert rollups.default_settings_digests() == synchronous
    assert made == [AHEAD]


def test_making_it_ahead_failed_so_it_is_made_again_where_it_is_used(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    threads: list[str] = []

    def failing(*imported):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        raise LakeError("sql/drift_tokens.sql", "view cannot be created: broken")

    monkeypatch.setattr(rollups, "_local", threading.local())
    monkeypatch.setattr(rollups, "_new_step_connection", failing)
    rollups.prepare_step_connection()
    with pytest.raises(LakeError) as caught:
        rollups.default_settings_digests()
    assert caught.value.problem == "view cannot be created: broken"
    assert threads == [AHEAD, threading.current_thread().name]


@pytest.mark.slow  # extracts a real fixture dump
def test_an_extraction_in_one_process_makes_one_connection_ahead(made: list[str], tmp_path) -> None:  # type: ignore[no-untyped-def]
    import tokenlake
    from tests.fixture_paths import REAL_DUMPS

    lake = tokenlake.open_lake(tmp_path / "lake", create=True)
    summary = lake.extract(REAL_DUMPS / "basic")
    assert summary.counts["new"] == 3  # its steps' rollups, then the refresh at publish
    assert made == [AHEAD]


def test_waiting_for_its_imports_ends_also_when_making_it_failed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`step_connection_imported` (which an extraction waits for with a Ctrl-C held) returns
    once the thread has imported what it needs, and also when it failed before saying so."""

    def failing(*imported):  # type: ignore[no-untyped-def]
        raise LakeError("sql/drift_tokens.sql", "view cannot be created: broken")

    monkeypatch.setattr(rollups, "_local", threading.local())
    monkeypatch.setattr(rollups, "_new_step_connection", failing)
    rollups.prepare_step_connection()
    rollups.step_connection_imported()
    assert rollups._local.pending.imported.is_set()
