"""The `tokenlake` command imports DuckDB with a Ctrl-C held (`threads.hold_ctrl_c_while_importing`,
installed by `tokenlake.__main__.run`): one landing inside its C extension as it registers its
types ended the process with "Critical nanobind error" and SIGABRT. Shown on a module of the
test's that signals itself while it is imported: the import runs to its end, then the Ctrl-C
comes (as a failed import: the command stops).
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tokenlake import threads

MODULE = "tokenlake_test_signals_itself"


@pytest.fixture
def module_path(tmp_path: Path) -> Iterator[Path]:
    (tmp_path / f"{MODULE}.py").write_text(
        "import os, signal\nos.kill(os.getpid(), signal.SIGINT)\nopen(__file__ + '.ran', 'w').close()\n"
    )
    finders = list(sys.meta_path)
    sys.path.insert(0, str(tmp_path))
    try:
        yield tmp_path
    finally:
        sys.path.remove(str(tmp_path))
        sys.meta_path[:] = finders
        sys.modules.pop(MODULE, None)


def test_without_the_hold_a_ctrl_c_cuts_the_import_short(module_path: Path) -> None:
    with pytest.raises(KeyboardInterrupt):
        __import__(MODULE)
    assert not (module_path / f"{MODULE}.py.ran").exists()  # half made: its last line never ran


def test_with_the_hold_the_import_ends_whole_then_the_ctrl_c_comes(module_path: Path) -> None:
    threads.hold_ctrl_c_while_importing([MODULE])
    with pytest.raises(KeyboardInterrupt):
        __import__(MODULE)
    assert (module_path / f"{MODULE}.py.ran").exists()


def test_a_hold_within_a_hold_leaves_the_ctrl_c_to_the_outer_one() -> None:
    """DuckDB's held import inside `drop`'s hold (its catalog build imports it) raised the
    Ctrl-C at the import's end, between the drop's emptied manifest and its deletions."""
    ran = []
    with pytest.raises(KeyboardInterrupt):
        with threads.sigint_held():
            with threads.sigint_held():
                os.kill(os.getpid(), signal.SIGINT)
            ran.append("after the inner block")
    assert ran == ["after the inner block"]
