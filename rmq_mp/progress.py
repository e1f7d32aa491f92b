"""Progress bars for long work (recovery, index rebuild, audits, exports, benchmarks).

A bar is drawn on stderr with rich only when stderr is a terminal, so logs, pipes, daemons and
tests stay clean; ``RMQ_PROGRESS=1`` forces it on and ``RMQ_PROGRESS=0`` off. Callers report
work done in their own unit (bytes, records, files) and never branch on whether a bar shows:

    with progress("recovering commit log", total=end - start, unit="bytes") as bar:
        for phy, req in ...:
            bar.update(phy - start)

Updates are throttled (rich redraws at most 10 times a second), so calling `update` per record
costs a comparison and an attribute store. rich is imported only when a bar is drawn: every
worker process imports recovery, and rich's import cost each of them about 0.1 s of CPU at start.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID

UPDATE_EVERY = 4096
"""Calls to `update` between two hand-offs to rich (keeps per-record updates cheap)."""


def enabled(stream: TextIO | None = None) -> bool:
    """Whether a bar would be drawn on ``stream`` (default stderr)."""
    forced = os.environ.get("RMQ_PROGRESS", "")
    if forced in ("0", "1"):
        return forced == "1"
    stream = stream or sys.stderr
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


class Bar:
    """One task's bar; silent (counting only) when no terminal is attached."""

    def __init__(self, progress: Progress | None, task: TaskID | None) -> None:
        self._progress = progress
        self._task = task
        self._calls = 0
        self.completed = 0

    def update(self, completed: int) -> None:
        """Set the work done so far (in the caller's unit)."""
        self.completed = completed
        self._calls += 1
        if self._progress is not None and self._task is not None and self._calls % UPDATE_EVERY == 0:
            self._progress.update(self._task, completed=completed)

    def advance(self, amount: int = 1) -> None:
        self.update(self.completed + amount)


@contextmanager
def progress(
    description: str, *, total: int | None, unit: str = "", stream: TextIO | None = None
) -> Iterator[Bar]:
    """A bar for one piece of work; ``total`` None when unknown (a spinner-like count)."""
    if not enabled(stream):
        yield Bar(None, None)
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    counter = DownloadColumn() if unit == "bytes" else MofNCompleteColumn()
    console = Console(file=stream or sys.stderr, force_terminal=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        counter,
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    # stdout stays the caller's (printMsg writes its JSON lines there while the bar runs)
    with Progress(
        *columns, console=console, transient=False, redirect_stdout=False, redirect_stderr=False
    ) as bars:
        task = bars.add_task(description, total=total)
        bar = Bar(bars, task)
        try:
            yield bar
        except BaseException:
            bars.update(task, completed=bar.completed)  # show where it stopped
            raise
        bars.update(task, completed=bar.completed if total is None else total)
