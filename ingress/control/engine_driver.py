"""Drives the engines to what the control log says (when ``drive_engine`` is on).

Reconciles rather than replays: after events are applied it compares each engine's own state
(``/is_paused``, ``/weight_info``) with the control state and makes only the calls that differ,
so several replicas driving one engine converge on the same state and a replica that catches up
on an old log makes no calls for pauses long over. The engines are the pool's as they are at
each reconcile, and every control event triggers one: an engine added by the log (applied to
the pool before the driver hears of the event) is paused and versioned like the others, and a
removed one is no longer driven. Each replica pauses an engine at most once
per pause and mode (an abort-mode pause repeated by a second replica finds nothing new to abort:
new requests are held at admission). A failed call is retried until it succeeds or the state
moves on.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterable

from ingress.control.control_state import ControlState
from ingress.turns import metrics
from schemas.control import AnyControl, PauseMode
from titoflow.engine.api import EngineControl
from titoflow.errors import TitoflowError

log = logging.getLogger("titoflow.control")

RETRY_S = 1.0


class EngineDriver:
    def __init__(self, state: ControlState, engines: Callable[[], Iterable[object]]) -> None:
        self.state = state
        self._all = engines  # every engine the ingress knows, asked anew on each reconcile
        self._dirty = asyncio.Event()
        self._dirty.set()  # reconcile once at start: the log may say paused or a version
        self._paused_by_me: dict[str, tuple[int, PauseMode]] = {}

    def engines(self) -> list[EngineControl]:
        """The engines with RL routes to drive (SGLang's are not driven)."""
        return [e for e in self._all() if isinstance(e, EngineControl)]

    def notify(self, event: AnyControl) -> None:
        """Subscription hook of the control follower: something may differ now."""
        self._dirty.set()

    async def run(self) -> None:
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            for engine in self.engines():
                if engine not in self.engines():
                    continue  # removed while others were driven
                try:
                    await self.reconcile(engine)
                except TitoflowError as exc:
                    metrics.ENGINE_CONTROL_FAILURES.inc()
                    log.warning("driving engine %s failed, retrying: %s", engine.url, exc.message)
                    asyncio.get_running_loop().call_later(RETRY_S, self._dirty.set)
                except RuntimeError:
                    if engine in self.engines():
                        raise
                    # Removed (its client closed) while being driven: nothing left to drive.

    async def reconcile(self, engine: EngineControl) -> None:
        state = self.state
        if state.paused and state.mode is not None:
            driven = (state.pauses, state.mode)
            if self._paused_by_me.get(engine.url) != driven or not await engine.is_paused():
                log.info("pausing engine %s (mode %s)", engine.url, state.mode)
                await engine.pause(state.mode)
                self._paused_by_me[engine.url] = driven
        if state.version is not None and await engine.weight_version() != state.version:
            log.info("engine %s: weight version %s", engine.url, state.version)
            await engine.set_weight_version(state.version)
        if not state.paused and await engine.is_paused():
            log.info("resuming engine %s", engine.url)
            await engine.resume()
