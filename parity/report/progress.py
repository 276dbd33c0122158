"""Progress of long runs: one bar per mode, requests finished out of the scenario's total."""

from __future__ import annotations

import contextlib

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn


class ModeProgress:
    """What `harness.modes.run_modes` reports to: `start(mode, total)`, `advance(mode, n)`."""

    def __init__(self, progress: Progress):
        self._progress = progress
        self._tasks: dict[str, int] = {}

    def start(self, mode: str, total: int) -> None:
        self._tasks[mode] = self._progress.add_task(f"{mode:<20}", total=total)

    def advance(self, mode: str, n: int) -> None:
        self._progress.advance(self._tasks[mode], n)


@contextlib.contextmanager
def mode_progress(show: bool):
    """A ModeProgress drawing transient bars on the terminal, or None when `show` is false."""
    if not show:
        yield None
        return
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  transient=True) as progress:
        yield ModeProgress(progress)
