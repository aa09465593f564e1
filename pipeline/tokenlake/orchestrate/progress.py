"""Progress of an extraction: the reporter the library calls, and the CLI's two displays.

The library calls a `Reporter` (no-op by default). On a terminal the CLI shows a tqdm bar with
steps done/total, tokens/s and ETA; off a terminal (a `make` log, CI) one plain line per step,
never a carriage return.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import IO, Any

from tokenlake.terminal import plural
from tokenlake.transform.tables import StepResult

ProgressCallback = Callable[[StepResult], None]


class Reporter:
    """Progress of one extraction; this base reports nothing (the CLI draws a bar).

    A plain `ProgressCallback` passed as `progress` is wrapped: it sees each written step.
    """

    def planned(self, total: int) -> None:
        """The number of steps this extraction will read (known before the first starts)."""

    def done(self, result: StepResult) -> None:
        """A step was written; it is committed with the steps that finish beside it, at the
        latest when the extraction ends or stops (pipeline/tokenlake/orchestrate/extract.py)."""

    def skipped(self, label: str) -> None:
        """A step failed and was skipped."""

    def stopping(self, in_flight: list[str]) -> None:
        """Ctrl-C (or a stop) came: `in_flight` steps are being waited for, then publishing."""


class _CallbackReporter(Reporter):
    def __init__(self, callback: ProgressCallback) -> None:
        self.callback = callback

    def done(self, result: StepResult) -> None:
        self.callback(result)


def as_reporter(progress: ProgressCallback | Reporter | None) -> Reporter:
    """`progress` as a Reporter (a plain callback sees each written step)."""
    if isinstance(progress, Reporter):
        return progress
    return Reporter() if progress is None else _CallbackReporter(progress)


class _Counting(Reporter):
    """Counts steps and tokens, and says at once what a stop waits for."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.total = 0
        self.finished = 0
        self.committed = 0
        self.tokens = 0
        self.started = time.perf_counter()

    def planned(self, total: int) -> None:
        self.total = total
        self.started = time.perf_counter()

    def done(self, result: StepResult) -> None:
        self.finished += 1
        self.committed += 1
        self.tokens += result.tokens

    def skipped(self, label: str) -> None:
        self.finished += 1

    def rate(self) -> float:
        return self.tokens / max(time.perf_counter() - self.started, 1e-9)

    def stopping(self, in_flight: list[str]) -> None:
        self.close()
        if in_flight:
            steps = ", ".join(in_flight)
            text = (
                f"Stopping: waiting for {plural(len(in_flight), 'step')} in flight ({steps})"
                " to finish; they are not committed (the next extraction redoes them)."
            )
        else:
            text = (
                f"Stopping: publishing the {plural(self.committed, 'step')} committed so far"
                " (manifest and catalog)."
            )
        self.line(text)

    def line(self, text: str) -> None:
        self.stream.write(text + "\n")
        self.stream.flush()

    def close(self) -> None:
        """End the display (before other lines are printed)."""


class PlainReporter(_Counting):
    """Off a terminal: one plain line per step, never a carriage return."""

    def done(self, result: StepResult) -> None:
        super().done(result)
        kind = "eval step" if result.evaluation else "step"
        self.line(
            f"{kind.capitalize()} {result.rollout_id} done ({self.finished}/{self.total} steps):"
            f" {result.tokens:,} tokens, {self.rate():,.0f} tokens/s"
        )

    def skipped(self, label: str) -> None:
        super().skipped(label)
        self.line(f"Step {label} failed ({self.finished}/{self.total} steps); the reason is below.")


class BarReporter(_Counting):
    """On a terminal: a bar with steps done/total, tokens/s and the ETA."""

    def __init__(self, stream: IO[str]) -> None:
        super().__init__(stream)
        self.bar: Any = None

    def planned(self, total: int) -> None:
        from tqdm import tqdm

        super().planned(total)
        if total:
            self.bar = tqdm(total=total, unit="step", file=self.stream, dynamic_ncols=True)

    def done(self, result: StepResult) -> None:
        super().done(result)
        self._advance()

    def skipped(self, label: str) -> None:
        super().skipped(label)
        self._advance()

    def _advance(self) -> None:
        if self.bar is not None:
            self.bar.set_postfix_str(f"{self.tokens:,} tokens, {self.rate():,.0f} tokens/s", False)
            self.bar.update(1)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def cli_reporter(stream: IO[str]) -> _Counting:
    """The bar on a terminal, plain lines otherwise."""
    isatty = getattr(stream, "isatty", None)
    return BarReporter(stream) if isatty is not None and isatty() else PlainReporter(stream)
