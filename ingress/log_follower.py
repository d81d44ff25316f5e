"""Follows a broadcast log on every ingress replica: the whole topic, no consumer group.

At start it reads every partition from the beginning up to the end offsets it finds (so a
replica started during a pause is paused, and knows which sessions ended, before it serves),
then follows. Each event goes to every subscriber in log order (per partition); a subscriber is
a plain callable that must not block (start a task for slow work). Records it cannot decode (an
unknown type or schema version) are logged and skipped: events from newer titoflows must not
stop older replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from schemas.control import AnyControl, control_adapter
from schemas.events import SessionEnded, ended_adapter
from titoflow.bus import Consumer, KafkaError, TopicPartition, existing_partitions, make_consumer
from titoflow.settings import Settings

log = logging.getLogger("titoflow.follow")

E = TypeVar("E")
POLL_MS = 500


class LogFollower(Generic[E]):
    def __init__(self, settings: Settings, topic: str, adapter: TypeAdapter[E]) -> None:
        self.settings = settings
        self.topic = topic
        self._adapter = adapter
        self._subscribers: list[Callable[[E, int], None]] = []  # (event, offset)
        self._partitions: list[TopicPartition] = []
        self._consumer: Consumer | None = None  # made in the event loop, on start

    def subscribe(self, subscriber: Callable[[E, int], None]) -> None:
        self._subscribers.append(subscriber)

    async def start(self, timeout_s: float) -> bool:
        """Apply the log up to its current end; whether that worked within ``timeout_s`` (if
        not, :meth:`run` keeps trying and the replica serves meanwhile, as without a broker)."""
        try:
            async with asyncio.timeout(timeout_s):
                consumer = await self._connect()
                ends = await consumer.end_offsets(self._partitions)
                while any([await consumer.position(p) < end for p, end in ends.items()]):
                    await self._poll()
        except (TimeoutError, KafkaError) as exc:
            log.warning("%s not read at start: %r", self.topic, exc)
            return False
        return True

    async def run(self) -> None:
        """Follow the log until cancelled; broker outages are waited out."""
        while True:
            try:
                await self._poll()
            except KafkaError as exc:
                log.warning("%s unreadable, retrying: %r", self.topic, exc)
                await asyncio.sleep(1.0)

    async def _connect(self) -> Consumer:
        if self._consumer is not None:
            return self._consumer
        # Every replica reads everything: no group, nothing committed, always from offset 0.
        consumer = make_consumer(self.settings, group_id=None)
        try:
            await consumer.start()
            partitions = await existing_partitions(consumer, self.topic)
        except BaseException:
            await consumer.stop()  # one that failed (or was cancelled) half-way is not reused
            raise
        self._partitions = partitions or [TopicPartition(self.topic, 0)]
        consumer.assign(self._partitions)
        await consumer.seek_to_beginning(*self._partitions)
        self._consumer = consumer
        return consumer

    async def _poll(self) -> None:
        consumer = await self._connect()
        batch = await consumer.getmany(*self._partitions, timeout_ms=POLL_MS)
        for records in batch.values():
            for record in records:
                try:
                    event = self._adapter.validate_json(record.value or b"")
                except ValidationError as exc:
                    log.warning("skipping %s record @%d: %s", self.topic, record.offset, exc)
                    continue
                for subscriber in self._subscribers:
                    subscriber(event, record.offset)

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()


def control_follower(settings: Settings) -> LogFollower[AnyControl]:
    """``<prefix>.control``: pause, resume, weight versions and engine changes, one order."""
    follower = LogFollower(settings, settings.topic("control"), control_adapter)
    follower.subscribe(lambda event, offset: log.info("control event @%d: %s", offset, event.type))
    return follower


def ended_follower(settings: Settings) -> LogFollower[SessionEnded]:
    """``<prefix>.ended``: how and when sessions ended."""
    return LogFollower(settings, settings.topic("ended"), ended_adapter)
