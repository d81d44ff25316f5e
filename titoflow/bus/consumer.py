"""aiokafka consumers with the shared options: made here, committing only when told to, and
started or pinned within bounds; the services drive them through the names exported here.

Invariant: a metadata request never names a topic that may not exist (some brokers would create
it with default settings), and a consumer made here that cannot reach the broker (at start, or
for a metadata or offsets request) raises BrokerUnavailable, never aiokafka's errors; one that
fails at start is stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator, Callable
from typing import Any

from aiokafka import AIOKafkaConsumer
from aiokafka import ConsumerRecord as ConsumerRecord
from aiokafka import TopicPartition as TopicPartition
from aiokafka.abc import ConsumerRebalanceListener

from titoflow.bus.errors import BrokerUnavailable, ReadStalled, unreachable
from titoflow.bus.options import consumer_options
from titoflow.settings import Settings

Consumer = AIOKafkaConsumer
RebalanceListener = ConsumerRebalanceListener

# A fetch that brings nothing for this long while records are still due means the log changed
# under the reader (retention deleted them, or the topic was recreated): stop instead of hanging.
STALL_TIMEOUT_S = 60.0
FETCH_TIMEOUT_MS = 1000


class _Consumer(AIOKafkaConsumer):  # type: ignore[misc]
    """aiokafka's consumer, its metadata and offset lookups failing as BrokerUnavailable.
    Fetching and committing are aiokafka's own: a fetch retries, and a commit's
    ``CommitFailedError`` is the one error callers catch by name."""

    async def topics(self) -> set[str]:
        with unreachable("the metadata request failed"):
            names: set[str] = await super().topics()
        return names

    async def beginning_offsets(
        self, partitions: list[TopicPartition]
    ) -> dict[TopicPartition, int]:
        with unreachable("the offsets request failed"):
            offsets: dict[TopicPartition, int] = await super().beginning_offsets(partitions)
        return offsets

    async def end_offsets(self, partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
        with unreachable("the offsets request failed"):
            offsets: dict[TopicPartition, int] = await super().end_offsets(partitions)
        return offsets

    async def offsets_for_times(self, timestamps: dict[TopicPartition, int]) -> dict[Any, Any]:
        with unreachable("the offsets request failed"):
            found: dict[Any, Any] = await super().offsets_for_times(timestamps)
        return found


def make_consumer(
    settings: Settings, *topics: str, group_id: str | None, **overrides: Any
) -> AIOKafkaConsumer:
    """An unstarted consumer with :func:`consumer_options`, committing only when told to."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "group_id": group_id,
        "enable_auto_commit": False,
        **consumer_options(settings),
    }
    options.update(overrides)
    return _Consumer(*topics, **options)


async def start_consumer(consumer: AIOKafkaConsumer, settings: Settings) -> AIOKafkaConsumer:
    """``consumer``, started; stopped again and BrokerUnavailable when no broker answers."""
    try:
        with unreachable(f"cannot reach {settings.bootstrap_servers!r}"):
            await consumer.start()
    except BrokerUnavailable:
        await consumer.stop()
        raise
    return consumer


async def existing_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """The partitions of ``topic``, none if it does not exist. All topics' metadata is asked
    for first, because a metadata request naming a missing topic makes some brokers create it."""
    if topic not in await consumer.topics():
        return []
    return [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]


async def pin_to_end(consumer: AIOKafkaConsumer, timeout_s: float) -> None:
    """Wait for a group-less consumer's assignment, then fix every partition's position at its
    end now: left to the first fetch, "the end" would be wherever the log is then, past what was
    published in between. On tansu a partition's end is the first record of its last
    multi-record batch, so that batch is read again (docs/debugging.md)."""
    async with asyncio.timeout(timeout_s):
        while not consumer.assignment():
            await asyncio.sleep(0.05)
    partitions = list(consumer.assignment())
    await consumer.seek_to_end(*partitions)
    for tp in partitions:
        await consumer.position(tp)


async def end_offsets(
    consumer: AIOKafkaConsumer, tps: list[TopicPartition], beginning: dict[TopicPartition, int]
) -> dict[TopicPartition, int]:
    """End offsets now. tansu answers ListOffsets(latest) with the base offset of the last record
    batch + 1, short of the end when that batch holds several records (the ingress publishes
    concurrently, so it often does); the high watermark of a fetch is right on any broker, so
    one fetch at the reported end settles it."""
    reported = await consumer.end_offsets(tps)
    ends = dict(reported)
    for tp in tps:
        if reported[tp] <= beginning[tp]:
            continue  # no batch at all
        consumer.assign([tp])
        consumer.seek(tp, reported[tp] - 1)
        await consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)
        highwater = consumer.highwater(tp)
        if highwater is not None and highwater > ends[tp]:
            ends[tp] = highwater
    return ends


async def read_to_end(
    consumer: AIOKafkaConsumer,
    tp: TopicPartition,
    start: int,
    end: int,
    advanced: Callable[[int], None] | None = None,
    from_time: float | None = None,
) -> AsyncGenerator[ConsumerRecord, None]:
    """The records of one partition in ``[start, end)`` (``end`` as :func:`end_offsets` found
    it), in offset order, telling ``advanced`` how many offsets each fetch moved past; with
    ``from_time``, from the first whose timestamp is at or after it (tansu's time lookup answers
    with the start of the record batch holding that record, not the record itself). A read that
    stops advancing short of ``end`` (retention, a recreated topic) raises ReadStalled."""
    if start >= end:
        return
    consumer.assign([tp])
    consumer.seek(tp, start)
    position = start
    stalled_since = time.monotonic()
    from_ms = int(from_time * 1000) if from_time is not None else None
    while position < end:
        batch = await consumer.getmany(tp, timeout_ms=FETCH_TIMEOUT_MS)
        records = batch.get(tp, [])
        for record in records:
            if record.offset >= end:
                break
            if from_ms is not None:
                if record.timestamp < from_ms:
                    continue
                from_ms = None
            yield record
        new_position = min(await consumer.position(tp), end)
        if advanced is not None and new_position > position:
            advanced(new_position - position)
        if new_position > position:
            stalled_since = time.monotonic()
        elif time.monotonic() - stalled_since > STALL_TIMEOUT_S:
            raise ReadStalled(f"{tp.topic}[{tp.partition}]: no records past {position} (< {end})")
        position = new_position
