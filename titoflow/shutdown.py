"""Bounded shutdown: a service told to stop exits within its grace (``shutdown_grace_s``),
whether the broker answers or not.

Invariant: the grace splits into the work in hand (``drain_budget``: an ingress' turns in
flight, a worker's batch), then closing (commit, flush, close: ``close_budget``), each closing
step bounded by what is left of it (a step that runs out is logged by name and abandoned), and a
reserve; once :func:`arm_hard_exit` ran, the process ends at the grace at the latest: a watchdog
*thread* (a blocked event loop cannot hold it) logs one line and calls ``os._exit``. Nothing here
knows Kafka: aiokafka's commit and coordinator lookup retry forever against a dead broker, which
is why every step needs a bound from outside.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections.abc import Awaitable

# Share of the grace for the work in hand; what remains, less the reserve, is for closing.
DRAIN_SHARE = 0.6
# Kept back from the closing steps so a clean exit comes before the watchdog's.
RESERVE_SHARE = 0.1
HARD_EXIT_STATUS = 1

_armed = threading.Event()


def drain_budget(grace_s: float) -> float:
    return grace_s * DRAIN_SHARE


def close_budget(grace_s: float) -> float:
    return grace_s * (1 - DRAIN_SHARE - RESERVE_SHARE)


class Deadline:
    """A time budget shared by consecutive shutdown steps."""

    def __init__(self, budget_s: float, log: logging.Logger) -> None:
        self._end = time.monotonic() + budget_s
        self._log = log

    def left(self) -> float:
        return max(0.0, self._end - time.monotonic())

    async def run(self, what: str, work: Awaitable[object]) -> bool:
        """Await ``work`` (described by ``what``, e.g. "the final commit") within what is left;
        False, logged, if it did not finish (it is cancelled)."""
        try:
            async with asyncio.timeout(self.left()):
                await work
        except TimeoutError:
            self._log.warning("shutdown: %s did not finish within the grace; abandoned", what)
            return False
        return True


def arm_hard_exit(grace_s: float, log: logging.Logger) -> None:
    """From now on the process ends within ``grace_s``: if it is still running then, one log
    line and ``os._exit``. Idempotent (a second signal does not move the deadline)."""
    if _armed.is_set():
        return
    _armed.set()
    log.info("stopping (within %.1fs)", grace_s)

    def expire() -> None:
        log.error(
            "shutdown grace of %.1fs exceeded: exiting now; what was not yet committed or "
            "flushed (the steps logged above as abandoned) is left to the next owner or lost",
            grace_s,
        )
        for handler in logging.getLogger().handlers:
            handler.flush()
        os._exit(HARD_EXIT_STATUS)

    timer = threading.Timer(grace_s, expire)
    timer.daemon = True
    timer.start()
