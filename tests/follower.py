"""`follow_run` driven by a test: in a thread, on a clock the test moves, waited on by rounds.

A step that is complete only once its files settled is extracted when the test says so
(`settle`), never because time passed, so a loaded machine cannot reorder what a test sees.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

from tests.conftest import store_of
from tokenlake.orchestrate.extract import ExtractOptions, ExtractSummary
from tokenlake.orchestrate.follow import follow_run

# Longer than any real pause: a step settles only when the test moves the follower's clock.
SETTLE = 3600.0
ROUND_WAIT = 120.0  # generous: a round takes well under a second on an idle machine


def counts(summary: ExtractSummary) -> tuple[int, ...]:
    return tuple(summary.counts.values())  # new, updated, unchanged, removed, skipped


class Follower:
    """`follow_run` in a thread, on a clock the test moves forward to let files settle; the
    test waits for the follower's rounds instead of for time to pass."""

    def __init__(
        self, dump: Path | str, lake: Path | str, run: str | None, poll_seconds: float
    ) -> None:
        self.rounds: list[ExtractSummary] = []
        self.errors: list[BaseException] = []
        self.offset = 0.0
        self._stop = threading.Event()
        self._changed = threading.Condition()
        self._thread = threading.Thread(
            target=self._follow, args=(dump, lake, run, poll_seconds), daemon=True
        )
        self._thread.start()

    def _follow(self, dump: Path | str, lake: Path | str, run: str | None, poll: float) -> None:
        try:
            options = ExtractOptions(
                run_name=run, follow=True, poll_seconds=poll, settle_seconds=SETTLE
            )
            follow_run(
                dump,
                store_of(lake),
                options,
                on_round=self._record,
                should_stop=self._stop.is_set,
                clock=self._clock,
            )
        except BaseException as exc:  # surfaced by the test's assertions
            self.errors.append(exc)
        with self._changed:
            self._changed.notify_all()

    def _clock(self) -> float:
        return time.time() + self.offset

    def _record(self, summary: ExtractSummary) -> None:
        with self._changed:
            self.rounds.append(summary)
            self._changed.notify_all()

    def _wait(self, done: Callable[[], bool]) -> None:
        with self._changed:
            finished = self._changed.wait_for(
                lambda: done() or self.errors or not self._thread.is_alive(), ROUND_WAIT
            )
        assert finished and self.errors == [], (finished, self.errors)

    def whole_round(self) -> None:
        """Wait until a round that began after this call has ended (the round under way may
        have listed the directory before the caller's last write)."""
        target = len(self.rounds) + 2
        self._wait(lambda: len(self.rounds) >= target)

    def settle(self) -> None:
        """Every file written so far counts as settled from the next round on."""
        self.offset += 2 * SETTLE
        self.whole_round()

    def new_steps(self) -> list[int]:
        """How many steps each round that extracted any extracted new, in order."""
        return [s.counts["new"] for s in self.rounds if s.counts["new"]]

    def quiet(self) -> None:
        """Wait for three rounds in a row with nothing to do."""

        def idle(summary: ExtractSummary) -> bool:
            return counts(summary)[:2] == (0, 0) and counts(summary)[3:] == (0, 0)

        self._wait(lambda: len(self.rounds) >= 3 and all(map(idle, self.rounds[-3:])))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=ROUND_WAIT)
        assert not self._thread.is_alive()
