"""The batch subscription's stop against a real broker: a batch or tick in hand that never ends
(a publish waiting for an ack from a broker that is gone) does not hold the stop back: it is
abandoned, with nothing committed after it (the run returns at all only so: the work never ends);
work that finishes is committed at the end. How long a stop takes, broker dead, is
tests/cli/test_shutdown_bounded.py's."""

from __future__ import annotations

import asyncio
import logging

from titoflow.bus import Publisher
from titoflow.bus.subscription import Batch, BatchSubscription
from titoflow.settings import Settings

log = logging.getLogger("test.subscription")
GRACE_S = 2.0
# Work that never ends holds a stop that does not abandon it for ever: this ends the test then.
HANG_GUARD_S = 60.0


class Service:
    """A subscription on ``<prefix>.steps`` whose batches and ticks can be made to hang."""

    def __init__(self, settings: Settings, *, batch_hangs: bool, tick_hangs: bool) -> None:
        self.settings = settings.model_copy(update={"shutdown_grace_s": GRACE_S})
        self.batch_hangs, self.tick_hangs = batch_hangs, tick_hangs
        self.handled = asyncio.Event()
        self.ticked = asyncio.Event()
        self.abandoned: list[str] = []
        self.commits = 0
        self.subscription = BatchSubscription(
            self.settings,
            self.settings.topic("steps"),
            f"{self.settings.topic_prefix}-subscription",
            self.handle,
            log,
            max_records=10,
        )

    async def hang(self, what: str, hangs: bool, arrived: asyncio.Event) -> None:
        arrived.set()
        if hangs:
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                self.abandoned.append(what)
                raise

    async def handle(self, batch: Batch) -> None:
        assert batch.records
        await self.hang("batch", self.batch_hangs, self.handled)

    async def tick(self) -> None:
        await self.hang("tick", self.tick_hangs, self.ticked)

    async def commit(self) -> None:
        self.commits += 1


async def run_then_stop(service: Service, arrived: asyncio.Event) -> None:
    """Run ``service`` until ``arrived``, then stop it and wait for the run to return."""
    stop = asyncio.Event()
    running = asyncio.create_task(
        service.subscription.run(stop, tick=service.tick, last=service.commit)
    )
    publisher = Publisher(service.settings)
    try:
        await publisher.publish(service.settings.topic("steps"), "a-session", b"a record")
    finally:
        await publisher.stop()
    async with asyncio.timeout(HANG_GUARD_S):
        await arrived.wait()
    stop.set()
    async with asyncio.timeout(HANG_GUARD_S):
        await running


async def test_a_batch_that_never_ends_is_abandoned_at_the_stop(settings: Settings) -> None:
    service = Service(settings, batch_hangs=True, tick_hangs=False)
    await run_then_stop(service, service.handled)
    assert service.abandoned == ["batch"]
    assert service.commits == 0


async def test_a_tick_that_never_ends_is_abandoned_at_the_stop(settings: Settings) -> None:
    service = Service(settings, batch_hangs=False, tick_hangs=True)
    await run_then_stop(service, service.ticked)
    assert service.abandoned == ["tick"]
    assert service.commits == 0  # what the tick left half-done is not committed past


async def test_finished_work_is_committed_at_the_stop(settings: Settings) -> None:
    service = Service(settings, batch_hangs=False, tick_hangs=False)
    await run_then_stop(service, service.handled)
    assert service.abandoned == []
    assert service.commits == 1
