"""The bench's progress seam (ProgressSink) and its rich bar on stderr (RichProgress)."""

from __future__ import annotations

from typing import Protocol


class ProgressSink(Protocol):
    def start(self, total: int) -> None: ...
    def update(self, description: str) -> None: ...
    def advance(self, n: int = 1) -> None: ...
    def close(self) -> None: ...


class RichProgress:
    """A rich progress bar on stderr: prompt, method, done/total, elapsed and ETA."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._bar = Progress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=Console(stderr=True),
        )
        self._task = None

    def start(self, total: int) -> None:
        self._bar.start()
        self._task = self._bar.add_task("bench", total=total)

    def update(self, description: str) -> None:
        self._bar.update(self._task, description=description)

    def advance(self, n: int = 1) -> None:
        self._bar.advance(self._task, n)

    def close(self) -> None:
        self._bar.stop()
