"""FastStream for the Kafka services: their broker, batch subscribers and the publisher on the
broker's producer.

Invariant: a FastStream client takes the options :class:`~titoflow.bus.producer.Publisher` and
:func:`~titoflow.bus.options.consumer_options` give aiokafka's (acks=all, no idempotence, no
linger, the event size limit, the short fetch wait), never auto-creates a topic
(``ensure_topics`` owns their layout) and never commits on its own (manual acknowledgement).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from aiokafka import AIOKafkaProducer, ConsumerRecord
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaPublishMessage
from faststream.kafka.subscriber.usecase import LogicSubscriber
from faststream.message import StreamMessage

from titoflow.bus.errors import translated_errors
from titoflow.bus.options import FETCH_MAX_WAIT_MS, LINGER_MS, MAX_BATCH_BYTES, consumer_options
from titoflow.bus.partitioning import partition_batches, topic_names
from titoflow.settings import Settings
from titoflow.shutdown import drain_budget

Broker = KafkaBroker

# How long a FastStream batch fetch waits for records. Its subscriber sleeps this long again
# after an empty fetch, so it bounds the latency an idle service adds to the next record.
BATCH_WAIT_MS = FETCH_MAX_WAIT_MS


async def undecoded(message: StreamMessage[Any]) -> Any:
    """A FastStream decoder that leaves record values as bytes. Without it every record would be
    JSON-parsed before the handler runs (no content-type header: FastStream tries JSON), and
    then parsed again into its event model (docs/benchmarks.md)."""
    return message.body


def service_broker(
    settings: Settings, logger: logging.Logger, publishes: bool = True
) -> KafkaBroker:
    """A FastStream broker for a Kafka service: its subscribers take :func:`consumer_options`,
    its producer the settings :class:`Publisher` uses (acks=all, no idempotence, no linger, the
    event size limit); topics are never
    auto-created (``ensure_topics`` owns their layout), and per-message lines are at DEBUG.
    ``publishes=False``: no producer at all."""
    return KafkaBroker(
        settings.bootstrap_servers,
        consumer_only=not publishes,
        acks="all",
        enable_idempotence=False,
        linger_ms=LINGER_MS,
        max_batch_size=MAX_BATCH_BYTES,
        max_request_size=settings.max_event_bytes,
        # No request_timeout_ms: the broker's clients share it, and a consumer's JoinGroup waits
        # for the whole rebalance (shorter, it times out and never joins). A publish that gets
        # no ack in publish_timeout_s fails its batch, whose service then stops: a record that
        # lands later is a duplicate, which consumers drop by id.
        allow_auto_create_topics=False,
        logger=logger,
        log_level=logging.DEBUG,
        # A handler runs at most one batch; stopping waits for it (its publish and commit) for
        # the drain share of the shutdown grace, then cancels it uncommitted.
        graceful_timeout=drain_budget(settings.shutdown_grace_s),
    )


def batch_subscriber(
    broker: KafkaBroker, settings: Settings, *topics: str, **options: Any
) -> LogicSubscriber[Any]:
    """A batch subscriber with the services' settings: :func:`consumer_options`, manual
    acknowledgement (what is committed, if anything, is the service's call), record values left
    as bytes (:func:`undecoded`), the batch wait at ``BATCH_WAIT_MS``; ``options`` add the rest
    (group, listener, partitions, batch size)."""
    subscriber: LogicSubscriber[Any] = broker.subscriber(
        *topics,
        batch=True,
        ack_policy=AckPolicy.MANUAL,
        batch_timeout_ms=BATCH_WAIT_MS,
        decoder=undecoded,
        **consumer_options(settings),
        **options,
    )
    return subscriber


def batch_records(message: StreamMessage[Any]) -> tuple[ConsumerRecord, ...]:
    """The records of a batch subscriber's message (a tuple from Kafka, a list from FastStream's
    in-memory test broker)."""
    records = message.raw_message
    return tuple(records) if isinstance(records, tuple | list) else (records,)


class StreamPublisher:
    """:class:`Publisher`'s contract on a FastStream broker's producer (started and stopped with
    the broker, i.e. the service's FastStream application): ``publish_many`` hands records over
    in order, all in flight at once, and returns once the broker acknowledged every one, within
    ``publish_timeout_s``, or raises BrokerUnavailable / EventTooLarge. Values are exactly the
    events' bytes; FastStream adds a ``correlation_id`` header (one per record batch)."""

    def __init__(self, broker: KafkaBroker, settings: Settings) -> None:
        self._broker = broker
        self._settings = settings

    async def publish(self, topic: str, key: str, value: bytes) -> tuple[int, int]:
        with translated_errors(self._settings, topic, len(value)):
            async with asyncio.timeout(self._settings.publish_timeout_s):
                metadata = await self._broker.publish(value, topic, key=key.encode())
        return int(metadata.partition), int(metadata.offset)

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None:
        """One FastStream ``publish_batch`` per partition (several when its records exceed one
        batch), each record in its key's home partition as the producer's partitioner would put
        it. FastStream's per-message ``publish`` (a command, its middlewares, a correlation id
        and headers for each record) costs well over aiokafka's ``send`` in CPU per record; its
        batch path costs about what ``send`` does (docs/benchmarks.md §4i)."""
        if not records:
            return
        largest = max(len(value) for _, _, value in records)
        with translated_errors(self._settings, topic_names(records), largest):
            async with asyncio.timeout(self._settings.publish_timeout_s):
                batches = partition_batches(
                    records,
                    {topic: await self._partitions(topic) for topic in {t for t, _, _ in records}},
                    self._settings.max_event_bytes,
                )
                acks = [
                    await self._broker.publish_batch(
                        *(KafkaPublishMessage(value, key=key) for key, value in batch),
                        topic=topic,
                        partition=partition,
                        no_confirm=True,
                    )
                    for topic, partition, batch in batches
                ]
                await asyncio.gather(*acks)

    async def _partitions(self, topic: str) -> list[int]:
        # The partitions the broker's own producer knows (and refreshes), so a key lands where
        # a plain publish of it would. FastStream 0.7 has no public accessor for its producer.
        producer: AIOKafkaProducer = self._broker.config.producer._producer.producer  # type: ignore[attr-defined]
        return sorted(await producer.partitions_for(topic))
