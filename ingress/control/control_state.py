"""What the control log means for this replica: paused or not, how, and the current weights.

:class:`ControlState` folds control events into a state (plain: no Kafka, no asyncio), so every
replica that applies the same log reaches the same state. :class:`PauseGate` makes requests wait
on it: new generations are held while paused (bounded by ``hold_s``, then a retryable
:class:`~titoflow.errors.Paused`), generations an abort-mode pause ended wait for the resume.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from ingress.turns import metrics
from schemas.control import AnyControl, Pause, PauseMode, Resume, SetWeightVersion
from titoflow.errors import Paused


class ControlState:
    def __init__(self) -> None:
        self.paused = False
        self.mode: PauseMode | None = None  # of the current pause
        self.version: str | None = None  # None until a SetWeightVersion was applied
        self.pauses = 0  # pauses applied so far: tells "a pause came since I started"
        self.offset = -1  # control-log offset of the last event applied

    def apply(self, event: AnyControl, offset: int = -1) -> bool:
        """Apply one event; whether the state changed. Commands for other components (a type
        this class does not handle) leave it as it is."""
        before = (self.paused, self.mode, self.version)
        if isinstance(event, Pause):
            if not self.paused:
                self.pauses += 1
            self.paused, self.mode = True, event.mode
        elif isinstance(event, Resume):
            self.paused, self.mode = False, None
        elif isinstance(event, SetWeightVersion):
            self.version = event.version
        self.offset = max(self.offset, offset)
        return (self.paused, self.mode, self.version) != before

    def snapshot(self) -> dict[str, Any]:
        return {
            "state": "paused" if self.paused else "running",
            "mode": self.mode,
            "weight_version": self.version,
            "pauses": self.pauses,
            "control_offset": self.offset,
        }


class PauseGate:
    """The ingress' side of the state: admission of new generations and waiting for resumes."""

    def __init__(self, state: ControlState, hold_s: float) -> None:
        self.state = state
        self.hold_s = hold_s
        self.held = 0  # requests waiting for a resume right now
        self._running = asyncio.Event()
        self._running.set()
        self._changed = asyncio.Event()  # replaced on every apply: wakes everyone waiting

    @property
    def version(self) -> str | None:
        return self.state.version

    @property
    def pauses(self) -> int:
        return self.state.pauses

    @property
    def paused(self) -> bool:
        return self.state.paused

    def apply(self, event: AnyControl, offset: int = -1) -> None:
        self.state.apply(event, offset)
        if self.state.paused:
            self._running.clear()
        else:
            self._running.set()
        self._changed.set()
        self._changed = asyncio.Event()
        metrics.PAUSED.set(1 if self.state.paused else 0)

    async def admit(self) -> None:
        """Return at once while running; while paused wait for the resume, at most ``hold_s``."""
        if self._running.is_set():
            return
        try:
            with self._holding():
                async with asyncio.timeout(self.hold_s):
                    await self._running.wait()
        except TimeoutError:
            raise Paused(
                f"generation is paused (weight update); not resumed within {self.hold_s}s, retry"
            ) from None

    async def wait_resumed(self) -> None:
        """Wait, without bound, until running (an in-flight generation to be continued)."""
        if not self._running.is_set():
            with self._holding():
                await self._running.wait()

    async def wait_pause_after(self, pauses: int, timeout_s: float) -> bool:
        """Whether a pause beyond the first ``pauses`` is applied within ``timeout_s``."""
        try:
            async with asyncio.timeout(timeout_s):
                while self.state.pauses <= pauses:
                    await self._changed.wait()
        except TimeoutError:
            return False
        return True

    def snapshot(self) -> dict[str, Any]:
        return {**self.state.snapshot(), "held_requests": self.held}

    @contextmanager
    def _holding(self) -> Iterator[None]:
        self.held += 1
        metrics.HELD.set(self.held)
        try:
            yield
        finally:
            self.held -= 1
            metrics.HELD.set(self.held)
