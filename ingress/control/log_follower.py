"""Follows the broadcast logs on every ingress replica (``<prefix>.control`` and
``<prefix>.ended``): each whole topic, no consumer group, through one FastStream batch subscriber
(one consumer, one fetch loop for every topic) assigned every partition and never committing.

At start it applies every partition from the beginning up to the end offsets it finds (so a
replica started during a pause is paused, and knows which sessions ended, before it serves),
then follows; FastStream's consume loop waits out broker outages. Each event goes to every
subscriber of its topic in log order (per partition); a subscriber is a plain callable that must
not block (start a task for slow work). Records it cannot decode (an unknown type or schema
version) are logged and skipped: events from newer titoflows must not stop older replicas.
One consumer for all the topics, because an idle follower's cost is its fetches (tansu holds
each for the whole ``FETCH_MAX_WAIT_MS``): a consumer per topic fetched twice as often for the
same propagation delay (docs/benchmarks.md §4h).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from faststream.kafka import KafkaBroker
from faststream.kafka import TopicPartition as Assigned  # FastStream's, for its subscriber
from faststream.kafka.annotations import KafkaMessage
from faststream.kafka.subscriber.usecase import LogicSubscriber
from pydantic import TypeAdapter, ValidationError

from schemas.control import AnyControl, control_adapter
from schemas.events import SessionBudgeted, SessionEnded, ended_adapter
from titoflow.bus import (
    Consumer,
    ConsumerRecord,
    KafkaError,
    TopicPartition,
    batch_records,
    batch_subscriber,
    existing_partitions,
    make_consumer,
    service_broker,
)
from titoflow.settings import Settings

log = logging.getLogger("titoflow.follow")

E = TypeVar("E")
APPLIED_POLL_S = 0.01
RETRY_S = 1.0


class FollowedTopic(Generic[E]):
    """One followed topic: how its records decode, and who hears of its events."""

    def __init__(self, topic: str, adapter: TypeAdapter[E]) -> None:
        self.topic = topic
        self._adapter = adapter
        self._subscribers: list[Callable[[E, int], None]] = []  # (event, offset)

    def subscribe(self, subscriber: Callable[[E, int], None]) -> None:
        self._subscribers.append(subscriber)

    def apply(self, record: ConsumerRecord) -> None:
        try:
            event = self._adapter.validate_json(record.value or b"")
        except ValidationError as exc:
            log.warning("skipping %s record @%d: %s", self.topic, record.offset, exc)
            return
        for subscriber in self._subscribers:
            subscriber(event, record.offset)


class LogFollower:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._topics: dict[str, FollowedTopic[Any]] = {}
        self._broker: KafkaBroker | None = None  # made in the event loop, on start
        self._partitions: list[TopicPartition] = []
        self._applied: dict[TopicPartition, int] = {}  # offset after the last record applied
        self._subscriber: LogicSubscriber[Any] | None = None

    def follow(self, topic: str, adapter: TypeAdapter[E]) -> FollowedTopic[E]:
        """Follow ``topic`` too (before :meth:`start`); its events are decoded by ``adapter``."""
        followed = FollowedTopic(topic, adapter)
        self._topics[topic] = followed
        return followed

    async def start(self, timeout_s: float) -> bool:
        """Apply every followed log up to its current end; whether that worked within
        ``timeout_s`` (if not, :meth:`run` keeps trying and the replica serves meanwhile, as
        without a broker)."""
        try:
            async with asyncio.timeout(timeout_s):
                ends = await self._connect()
                while any(self._applied.get(tp, 0) < end for tp, end in ends.items()):
                    await asyncio.sleep(APPLIED_POLL_S)
        except (TimeoutError, KafkaError, OSError) as exc:
            log.warning("%s not read at start: %r", ", ".join(self._topics), exc)
            return False
        return True

    async def run(self) -> None:
        """Follow the logs until cancelled: connect (retrying while the broker is away), then
        FastStream's subscriber follows."""
        while self._broker is None:
            try:
                await self._connect()
            except (KafkaError, OSError) as exc:
                log.warning("%s unreadable, retrying: %r", ", ".join(self._topics), exc)
                await asyncio.sleep(RETRY_S)
        await asyncio.Event().wait()

    async def _connect(self) -> dict[TopicPartition, int]:
        """Start following (once); the partitions' end offsets now."""
        if self._broker is None:
            # Every replica reads everything: no group, nothing committed, always from offset 0
            # of each partition the topics have now.
            probe = make_consumer(self.settings, group_id=None)
            partitions: list[TopicPartition] = []
            try:
                await probe.start()
                for topic in self._topics:
                    partitions += await existing_partitions(probe, topic) or [
                        TopicPartition(topic, 0)
                    ]
            finally:
                await probe.stop()
            broker = self.declare(partitions)
            try:
                await broker.start()
            except BaseException:
                await broker.stop()  # one that failed (or was cancelled) half-way is not reused
                raise
            self._broker = broker
        consumer: Consumer | None = self._subscriber.consumer if self._subscriber else None
        assert consumer is not None
        ends: dict[TopicPartition, int] = await consumer.end_offsets(self._partitions)
        return ends

    def declare(self, partitions: list[TopicPartition]) -> KafkaBroker:
        """The FastStream broker whose subscriber follows ``partitions`` (not started; a test
        drives it with FastStream's in-memory ``TestKafkaBroker``)."""
        self._partitions = partitions
        broker = service_broker(self.settings, log, publishes=False)
        # No group: nothing to commit, and each record is validated once, by its topic's adapter.
        self._subscriber = batch_subscriber(
            broker,
            self.settings,
            partitions=[Assigned(tp.topic, tp.partition, declare=False) for tp in partitions],
        )
        self._subscriber(self._apply)
        return broker

    async def _apply(self, message: KafkaMessage) -> None:
        for record in batch_records(message):
            self._applied[TopicPartition(record.topic, record.partition)] = record.offset + 1
            self._topics[record.topic].apply(record)

    async def stop(self) -> None:
        if self._broker is not None:
            await self._broker.stop()


def control_log(follower: LogFollower) -> FollowedTopic[AnyControl]:
    """``<prefix>.control``: pause, resume, weight versions and engine changes, one order."""
    control = follower.follow(follower.settings.topic("control"), control_adapter)
    control.subscribe(lambda event, offset: log.info("control event @%d: %s", offset, event.type))
    return control


def ended_log(follower: LogFollower) -> FollowedTopic[SessionEnded | SessionBudgeted]:
    """``<prefix>.ended``: how and when sessions ended, and the budgets they were opened with."""
    return follower.follow(follower.settings.topic("ended"), ended_adapter)
