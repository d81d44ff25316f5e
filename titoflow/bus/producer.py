"""The acknowledged publisher: a record is reported published only once the broker acknowledged
it (acks=all), within ``publish_timeout_s``, or the publish raises BrokerUnavailable or
EventTooLarge, and aiokafka has given up on it by then (no retry behind the caller's back).
"""

from __future__ import annotations

import asyncio
from typing import Protocol

from aiokafka import AIOKafkaProducer
from aiokafka.errors import KafkaError, MessageSizeTooLargeError
from aiokafka.producer.message_accumulator import BatchBuilder

from titoflow.bus.errors import BrokerUnavailable, translated_errors
from titoflow.bus.options import (
    HEALTH_TIMEOUT_S,
    LINGER_MS,
    MAX_BATCH_BYTES,
    producer_request_timeout_ms,
)
from titoflow.bus.partitioning import home_partition, topic_names
from titoflow.settings import Settings


class RecordPublisher(Protocol):
    """What publishes a service's records: :class:`Publisher` (the ingress) or
    :class:`StreamPublisher` (the FastStream services)."""

    async def publish(self, topic: str, key: str, value: bytes) -> tuple[int, int]: ...

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None: ...


class Publisher:
    """Publishes events and reports success only once the broker acknowledged them (acks=all).

    ``publish`` either returns the record's (partition, offset) or raises ``BrokerUnavailable``
    within ``settings.publish_timeout_s``; by then aiokafka has already given up on the record
    (see ``producer_request_timeout_ms``), so it is not retried behind the caller's back. A
    Publisher whose broker was unreachable at start connects again on the next call.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._timeout_s = settings.publish_timeout_s
        self._request_timeout_ms = producer_request_timeout_ms(settings.publish_timeout_s)
        self._producer: AIOKafkaProducer | None = None
        # Serializes (re)starting, so concurrent first publishes share one producer.
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect within ``publish_timeout_s``; raises ``BrokerUnavailable`` otherwise."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._ensure_producer()
        except TimeoutError as exc:
            raise BrokerUnavailable(
                f"no connection to {self._settings.bootstrap_servers} within {self._timeout_s}s"
            ) from exc

    async def _ensure_producer(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is not None:
                return self._producer
            producer = AIOKafkaProducer(
                bootstrap_servers=self._settings.bootstrap_servers,
                acks="all",
                # tansu rejects InitProducerId; duplicates from retries are handled downstream
                # (at-least-once, content-derived ids).
                enable_idempotence=False,
                linger_ms=LINGER_MS,
                max_batch_size=MAX_BATCH_BYTES,
                max_request_size=self._settings.max_event_bytes,
                request_timeout_ms=self._request_timeout_ms,
            )
            # On failure release the sockets and leave self._producer unset, so the next call
            # connects afresh instead of reusing a client that never bootstrapped.
            try:
                await producer.start()
            except (KafkaError, OSError) as exc:
                await producer.stop()
                raise BrokerUnavailable(
                    f"cannot connect to {self._settings.bootstrap_servers}: {exc!r}"
                ) from exc
            except asyncio.CancelledError:
                await producer.stop()
                raise
            self._producer = producer
            return producer

    async def publish(
        self, topic: str, key: str, value: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, int]:
        """Append one record; return (partition, offset) once the broker acknowledged it."""
        kafka_headers = [(k, v.encode()) for k, v in (headers or {}).items()]
        with translated_errors(self._settings, topic, len(value)):
            async with asyncio.timeout(self._timeout_s):
                producer = await self._ensure_producer()
                metadata = await producer.send_and_wait(
                    topic, value, key=key.encode(), headers=kafka_headers
                )
        return int(metadata.partition), int(metadata.offset)

    async def publish_together(self, topic: str, key: str, values: list[bytes]) -> None:
        """Append ``values`` under ``key`` as one record batch, in order, and return once the
        broker acknowledged it: a broker appends a batch whole or not at all, so either every
        record is durable or none is (no transaction needed). The batch may be as large as one
        event may (``max_event_bytes``); larger is ``EventTooLarge``, nothing appended."""
        size = sum(map(len, values))
        with translated_errors(self._settings, topic, size):
            async with asyncio.timeout(self._timeout_s):
                producer = await self._ensure_producer()
                partitions = sorted(await producer.partitions_for(topic))
                # Uncompressed, as the producer's own batches are (it is made without one).
                batch = BatchBuilder(self._settings.max_event_bytes, 0)
                for value in values:
                    if batch.append(timestamp=None, key=key.encode(), value=value) is None:
                        raise MessageSizeTooLargeError(f"{len(values)} records, {size} bytes")
                batch.close()
                partition = home_partition(key, partitions)
                await (await producer.send_batch(batch, topic, partition=partition))

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None:
        """Append (topic, key, value) records, all in flight at once, and return once the broker
        acknowledged every one (within ``publish_timeout_s`` for the lot).

        Records are handed to the producer in the given order, so those sharing a partition are
        appended in that order; awaiting each ack before sending the next would cost a broker
        round trip per record.
        """
        if not records:
            return
        largest = max(len(value) for _, _, value in records)
        with translated_errors(self._settings, topic_names(records), largest):
            async with asyncio.timeout(self._timeout_s):
                producer = await self._ensure_producer()
                acks = [
                    await producer.send(topic, value, key=key.encode())
                    for topic, key, value in records
                ]
                await asyncio.gather(*acks)

    async def healthy(self) -> bool:
        """Whether a broker answers a metadata request now (bounded by ``HEALTH_TIMEOUT_S``)."""
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                producer = await self._ensure_producer()
                await producer.client.fetch_all_metadata()
        except (TimeoutError, KafkaError, BrokerUnavailable):
            return False
        return True

    async def stop(self) -> None:
        """Flush what is pending (each record resolves within aiokafka's bounds) and close."""
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()
