"""Follows ``<prefix>.control`` on every ingress replica: the whole log, no consumer group.

At start it reads from the beginning up to the end offset it finds (so a replica started during
a pause is paused before it serves), then follows. Each event goes to every subscriber in log
order; a subscriber is a plain callable that must not block (start a task for slow work).
Records it cannot decode (an unknown type or schema version) are logged and skipped: control
events from newer titoflows must not stop older replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError
from pydantic import ValidationError

from schemas.control import AnyControl, control_adapter
from titoflow.bus import make_consumer
from titoflow.settings import Settings

log = logging.getLogger("titoflow.control")

Subscriber = Callable[[AnyControl, int], None]  # (event, offset)
POLL_MS = 500


class ControlFollower:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.partition = TopicPartition(settings.topic("control"), 0)
        self._subscribers: list[Subscriber] = []
        self._consumer: AIOKafkaConsumer | None = None  # made in the event loop, on start

    def subscribe(self, subscriber: Subscriber) -> None:
        self._subscribers.append(subscriber)

    async def start(self, timeout_s: float) -> bool:
        """Apply the log up to its current end; whether that worked within ``timeout_s`` (if
        not, :meth:`run` keeps trying and the replica serves meanwhile, as without a broker)."""
        try:
            async with asyncio.timeout(timeout_s):
                consumer = await self._connect()
                end = (await consumer.end_offsets([self.partition]))[self.partition]
                while await consumer.position(self.partition) < end:
                    await self._poll()
        except (TimeoutError, KafkaError) as exc:
            log.warning("control log not read at start (pause state unknown): %r", exc)
            return False
        return True

    async def run(self) -> None:
        """Follow the log until cancelled; broker outages are waited out."""
        while True:
            try:
                await self._poll()
            except KafkaError as exc:
                log.warning("control log unreadable, retrying: %r", exc)
                await asyncio.sleep(1.0)

    async def _connect(self) -> AIOKafkaConsumer:
        if self._consumer is not None:
            return self._consumer
        # Every replica reads everything: no group, nothing committed, always from offset 0.
        consumer = make_consumer(self.settings, group_id=None)
        try:
            await consumer.start()
        except BaseException:
            await consumer.stop()  # one that failed (or was cancelled) half-way is not reused
            raise
        consumer.assign([self.partition])
        await consumer.seek_to_beginning(self.partition)
        self._consumer = consumer
        return consumer

    async def _poll(self) -> None:
        consumer = await self._connect()
        batch = await consumer.getmany(self.partition, timeout_ms=POLL_MS)
        for record in batch.get(self.partition, []):
            try:
                event = control_adapter.validate_json(record.value or b"")
            except ValidationError as exc:
                log.warning("skipping control record @%d: %s", record.offset, exc)
                continue
            log.info("control event @%d: %s", record.offset, event.type)
            for subscriber in self._subscribers:
                subscriber(event, record.offset)

    async def stop(self) -> None:
        if self._consumer is not None:
            await self._consumer.stop()
