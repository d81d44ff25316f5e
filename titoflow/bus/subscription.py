"""A FastStream batch subscriber run as a service, for the consumer groups whose offsets matter
(the assembly worker on ``<prefix>.steps``, the recompute stage on ``<prefix>.recompute``).

Invariant: an offset is committed only by the service's own code, after what its records
produced was acknowledged. Acknowledgement is manual, and a batch that raises stops the service
uncommitted: FastStream would log the error and hand over the next batch, whose commit would
pass the failed one's records. One batch (or tick) runs at a time, under ``lock``, which a
rebalance listener takes too; a tick never waits behind a batch (a batch may be waiting on a
broker that is gone, and stopping must not wait behind the tick). Stopping gives the batch or tick
in hand the drain budget; one abandoned then, or cancelled (a death, as SIGKILL), publishes and
commits nothing more, and no final commit follows it. The service's
own start and stop (topics, publisher, engine client) are the FastStream application's hooks
around its broker. Stopping takes at most the drain and close budgets of ``shutdown_grace_s``
(:mod:`titoflow.shutdown`), broker up or down: the final commit gets half the close budget, and
what is unfinished then is abandoned (uncommitted: the next owner re-reads it).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from faststream import FastStream
from faststream.kafka.annotations import KafkaMessage

from titoflow.bus.consumer import Consumer, ConsumerRecord, RebalanceListener
from titoflow.bus.errors import CommitFailedError
from titoflow.bus.stream import batch_records, batch_subscriber, service_broker
from titoflow.settings import Settings
from titoflow.shutdown import Deadline, close_budget, drain_budget

Records = tuple[ConsumerRecord, ...]

Hook = Callable[[], Awaitable[None]]

# How often ``tick`` runs, batches or not.
POLL_TIMEOUT_MS = 500


class Batch:
    """The records one fetch handed over, and their acknowledgement (none for a tick's empty
    batch)."""

    def __init__(self, records: Records = (), message: KafkaMessage | None = None) -> None:
        self.records = records
        self._message = message

    async def commit(self, timeout_s: float) -> bool:
        """Commit the batch's offsets within ``timeout_s`` (aiokafka retries a commit for as long
        as the broker is away: TimeoutError then); False when a rebalance took its partitions
        first (their next owner reads them again)."""
        assert self._message is not None, "an empty batch has nothing to commit"
        try:
            async with asyncio.timeout(timeout_s):
                await self._message.ack()
        except CommitFailedError:
            return False
        return True


class BatchSubscription:
    def __init__(
        self,
        settings: Settings,
        topic: str,
        group_id: str,
        handle: Callable[[Batch], Awaitable[None]],
        logger: logging.Logger,
        max_records: int,
        listener: RebalanceListener | None = None,
    ) -> None:
        self.handle = handle
        self.log = logger
        self.grace_s = settings.shutdown_grace_s
        self.broker = service_broker(settings, logger)
        self.subscriber = batch_subscriber(
            self.broker,
            settings,
            topic,
            group_id=group_id,
            listener=listener,
            max_records=max_records,
        )
        self.subscriber(self._on_batch)
        self.lock = asyncio.Lock()
        self.closing = False
        self._abandoned = False  # a batch or tick was cancelled part-way: commit nothing more
        self._failed: BaseException | None = None
        self._stop = asyncio.Event()

    @property
    def consumer(self) -> Consumer:
        consumer: Consumer | None = self.subscriber.consumer
        assert consumer is not None, "the subscription is not running"
        return consumer

    async def run(
        self,
        stop: asyncio.Event,
        *,
        starting: Sequence[Hook] = (),
        tick: Hook | None = None,
        last: Hook | None = None,
        stopped: Sequence[Hook] = (),
    ) -> None:
        """Consume until ``stop``, as a FastStream application: its startup hooks ``starting``
        (before the broker starts: topics, publishers), then ``tick`` (under the lock, when no
        batch holds it) every poll interval, batches or not; at shutdown the tick in hand gets
        the drain budget, then ``last`` (under the lock, unless a batch is in hand or one failed
        or was abandoned) before the consumer leaves its group, the broker's graceful stop (it
        waits for a batch in hand), then ``stopped``. Raises what a batch raised."""

        async def final() -> None:
            self.closing = True  # a batch fetched from now on is left for the next owner
            unfinished = self._failed is not None or self._abandoned or self.lock.locked()
            if last is not None and not unfinished:
                async with self.lock:
                    # aiokafka retries a commit forever while the broker is away
                    commit = Deadline(close_budget(self.grace_s) / 2, self.log)
                    await commit.run("the final commit", last())

        app = FastStream(
            self.broker,
            logger=self.log,
            on_startup=starting,
            on_shutdown=[final],
            after_shutdown=stopped,
        )
        await app.start()
        relay = asyncio.create_task(self._stop_on(stop))
        stopping = asyncio.create_task(self._stop.wait())
        in_hand: asyncio.Task[None] | None = None
        try:
            while not self._stop.is_set():
                await asyncio.wait({stopping}, timeout=POLL_TIMEOUT_MS / 1000)
                if tick is not None and not self._stop.is_set():
                    in_hand = asyncio.create_task(self._tick_unless_busy(tick))
                    await asyncio.wait({in_hand, stopping}, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            self.closing = True
            for task in [*self.subscriber.tasks, *([in_hand] if in_hand else [])]:
                task.cancel()
            raise
        finally:
            relay.cancel()
            stopping.cancel()
            drain = Deadline(drain_budget(self.grace_s), self.log)
            closing = Deadline(drain_budget(self.grace_s) + close_budget(self.grace_s), self.log)
            if in_hand is not None and not in_hand.done():
                await drain.run("the tick in hand", in_hand)
            await closing.run(
                "stopping (the batch in hand, the final commit, leaving the group, flushing "
                "the producer)",
                app.stop(),
            )
        if self._failed is not None:
            raise self._failed

    async def _stop_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self._stop.set()

    async def _on_batch(self, message: KafkaMessage) -> None:
        batch = Batch(batch_records(message), message)
        await self._guarded(lambda: self.handle(batch))

    async def _tick_unless_busy(self, tick: Hook) -> None:
        """``tick`` under the lock, or nothing while a batch holds it (the next poll ticks)."""
        if not self.lock.locked():  # nothing awaited between this and taking the lock
            await self._guarded(tick)

    async def _guarded(self, work: Callable[[], Awaitable[None]]) -> None:
        async with self.lock:
            if self.closing:
                return
            try:
                await work()
            except asyncio.CancelledError:
                # abandoned (a death, or stopping past the drain budget)
                self.closing = self._abandoned = True
                raise
            except Exception as exc:
                self.closing, self._failed = True, exc
                self._stop.set()
                self.log.exception("batch failed; stopping uncommitted")
