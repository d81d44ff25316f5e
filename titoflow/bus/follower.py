"""Reading whole topics on every replica: no consumer group, every partition from offset 0,
nothing committed, through one FastStream batch subscriber (one consumer, one fetch loop for
every topic).

Invariant: records reach ``apply`` in log order per partition, and :meth:`LogReader.catch_up`
returns only once every partition is applied up to the end offset it found at connecting; a
broker that cannot be reached is BrokerUnavailable, and FastStream's consume loop waits out
outages after that. One consumer for all the topics, because an idle reader's cost is its
fetches (tansu holds each for the whole ``FETCH_MAX_WAIT_MS``): a consumer per topic fetches
twice as often for the same propagation delay (docs/benchmarks.md §4h).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

from faststream.kafka import KafkaBroker
from faststream.kafka import TopicPartition as Assigned  # FastStream's, for its subscriber
from faststream.kafka.annotations import KafkaMessage
from faststream.kafka.subscriber.usecase import LogicSubscriber

from titoflow.bus.consumer import (
    Consumer,
    ConsumerRecord,
    TopicPartition,
    existing_partitions,
    make_consumer,
)
from titoflow.bus.errors import unreachable
from titoflow.bus.stream import batch_records, batch_subscriber, service_broker
from titoflow.settings import Settings

APPLIED_POLL_S = 0.01


class LogReader:
    """Every partition of ``topics``, each record handed to ``apply`` as it is read."""

    def __init__(
        self, settings: Settings, apply: Callable[[ConsumerRecord], None], logger: logging.Logger
    ) -> None:
        self.settings = settings
        self._apply = apply
        self._log = logger
        self._broker: KafkaBroker | None = None  # made in the event loop, on connecting
        self._partitions: list[TopicPartition] = []
        self._applied: dict[TopicPartition, int] = {}  # offset after the last record applied
        self._subscriber: LogicSubscriber[Any] | None = None

    @property
    def connected(self) -> bool:
        return self._broker is not None

    async def catch_up(self, topics: Sequence[str]) -> None:
        """Connect (once), then wait until every partition is applied up to its end now."""
        ends = await self.connect(topics)
        while any(self._applied.get(tp, 0) < end for tp, end in ends.items()):
            await asyncio.sleep(APPLIED_POLL_S)

    async def connect(self, topics: Sequence[str]) -> dict[TopicPartition, int]:
        """Start reading ``topics`` (once); the partitions' end offsets now."""
        with unreachable(f"cannot read {', '.join(topics)}"):
            if self._broker is None:
                # Every replica reads everything: no group, nothing committed, always from
                # offset 0 of each partition the topics have now.
                probe = make_consumer(self.settings, group_id=None)
                partitions: list[TopicPartition] = []
                try:
                    await probe.start()
                    for topic in topics:
                        partitions += await existing_partitions(probe, topic) or [
                            TopicPartition(topic, 0)
                        ]
                finally:
                    await probe.stop()
                broker = self.declare(partitions)
                try:
                    await broker.start()
                except BaseException:
                    await broker.stop()  # one failed (or cancelled) half-way is not reused
                    raise
                self._broker = broker
            consumer: Consumer | None = self._subscriber.consumer if self._subscriber else None
            assert consumer is not None
            ends: dict[TopicPartition, int] = await consumer.end_offsets(self._partitions)
        return ends

    def declare(self, partitions: list[TopicPartition]) -> KafkaBroker:
        """The FastStream broker whose subscriber reads ``partitions`` (not started; a test
        drives it with FastStream's in-memory ``TestKafkaBroker``)."""
        self._partitions = partitions
        broker = service_broker(self.settings, self._log, publishes=False)
        # No group: nothing to commit, and each record is validated once, by its reader.
        self._subscriber = batch_subscriber(
            broker,
            self.settings,
            partitions=[Assigned(tp.topic, tp.partition, declare=False) for tp in partitions],
        )
        self._subscriber(self._on_batch)
        return broker

    async def _on_batch(self, message: KafkaMessage) -> None:
        for record in batch_records(message):
            self._applied[TopicPartition(record.topic, record.partition)] = record.offset + 1
            self._apply(record)

    async def stop(self) -> None:
        if self._broker is not None:
            await self._broker.stop()
