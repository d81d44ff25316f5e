"""Progress bars over the records a replay or a scan reads.

Invariant: a bar goes to stderr unless the caller names another stream (only segments go to
stdout), and ``auto`` draws one only on a terminal, so redirected output carries none. It uses
``rich`` when installed, else ``tqdm``, else a plain bar.
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import time
from typing import Any, Literal, Protocol, TextIO


class Progress(Protocol):
    """A bar over records; ``start`` again adds ``total`` more records to it."""

    def start(self, total: int, description: str) -> None: ...
    def advance(self, n: int) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class _RichProgress:
    def __init__(self, stream: TextIO) -> None:
        progress_module = importlib.import_module("rich.progress")
        console_module = importlib.import_module("rich.console")
        self._progress: Any = progress_module.Progress(
            progress_module.TextColumn("{task.description}"),
            progress_module.BarColumn(),
            progress_module.MofNCompleteColumn(),
            progress_module.TextColumn("records"),
            progress_module.TimeElapsedColumn(),
            progress_module.TimeRemainingColumn(),
            console=console_module.Console(file=stream),
            transient=False,
        )
        self._task: Any = None

    def start(self, total: int, description: str) -> None:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(description, total=total)
        else:
            more = self._progress.tasks[0].total + total
            self._progress.update(self._task, total=more)

    def advance(self, n: int) -> None:
        self._progress.advance(self._task, n)

    def close(self) -> None:
        if self._task is not None:
            self._progress.stop()


class _TqdmProgress:
    def __init__(self, stream: TextIO) -> None:
        self._tqdm: Any = importlib.import_module("tqdm").tqdm
        self._stream = stream
        self._bar: Any = None

    def start(self, total: int, description: str) -> None:
        if self._bar is None:
            self._bar = self._tqdm(total=total, desc=description, unit="rec", file=self._stream)
        else:
            self._bar.total += total
            self._bar.refresh()

    def advance(self, n: int) -> None:
        self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class PlainProgress:
    """A dependency-free bar, redrawn in place at most five times a second."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._total = 0
        self._done = 0
        self._description = ""
        self._drawn_at = 0.0

    def start(self, total: int, description: str) -> None:
        self._total += total
        self._description = description
        self._draw()

    def advance(self, n: int) -> None:
        self._done += n
        if time.monotonic() - self._drawn_at > 0.2:
            self._draw()

    def _draw(self) -> None:
        share = self._done / self._total if self._total else 1.0
        filled = math.floor(share * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self._stream.write(
            f"\r{self._description} [{bar}] {share:4.0%} {self._done}/{self._total} records"
        )
        self._stream.flush()
        self._drawn_at = time.monotonic()

    def close(self) -> None:
        self._draw()
        self._stream.write("\n")
        self._stream.flush()


def make_progress(
    mode: Literal["auto", "always", "never"] = "auto", stream: TextIO | None = None
) -> Progress:
    """rich if installed, else tqdm, else a plain bar; ``auto`` shows one only on a terminal."""
    out = stream if stream is not None else sys.stderr
    if mode == "never" or (mode == "auto" and not out.isatty()):
        return NoProgress()
    if importlib.util.find_spec("rich") is not None:
        return _RichProgress(out)
    if importlib.util.find_spec("tqdm") is not None:
        return _TqdmProgress(out)
    return PlainProgress(out)
