"""Reading a topic without a consumer group, from given offsets up to the end offsets at start.

Invariants:
- Partitions are assigned by hand and nothing is ever committed, so a group's offsets (the live
  workers') are never touched.
- A range ends at the end offset found when it started, so a read terminates while producers
  keep writing; a read that stops advancing before then (retention, a recreated topic) fails
  with :class:`ReplayError` instead of hanging.
- Records come in offset order within a partition.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

from titoflow.bus import (
    Consumer,
    ConsumerRecord,
    KafkaError,
    TopicPartition,
    existing_partitions,
    home_partition,
    make_consumer,
)
from titoflow.settings import Settings
from workers.replay.errors import ReplayError
from workers.replay.options import ReplayOptions
from workers.replay.progress import Progress

# A fetch that brings nothing for this long while records are still due means the log changed
# under us (retention deleted them, or the topic was recreated): stop instead of hanging.
STALL_TIMEOUT_S = 60.0
FETCH_TIMEOUT_MS = 1000


async def start_reader(settings: Settings) -> Consumer:
    """A started consumer without a group (it never joins or commits anything)."""
    consumer = make_consumer(settings, group_id=None, enable_auto_commit=False)
    try:
        await consumer.start()
    except (KafkaError, OSError) as exc:
        await consumer.stop()
        raise ReplayError(f"cannot reach {settings.bootstrap_servers!r}: {exc!r}") from exc
    return consumer


async def topic_partitions(consumer: Consumer, topic: str) -> list[TopicPartition]:
    """The partitions of an existing topic."""
    partitions = await existing_partitions(consumer, topic)
    if not partitions:
        raise ReplayError(f"topic {topic!r} does not exist on this broker")
    return partitions


async def start_offsets(
    consumer: Consumer, tps: list[TopicPartition], options: ReplayOptions
) -> tuple[dict[TopicPartition, int], dict[TopicPartition, int]]:
    """``(start, end)`` per partition: where the options say to begin, and the end offsets now."""
    beginning = await consumer.beginning_offsets(tps)
    end = await _end_offsets(consumer, tps, beginning)
    by_time: dict[TopicPartition, int] = {}
    timed = [tp for tp in tps if options.starts_by_time(tp.partition)]
    if timed and options.from_time is not None:
        found = await consumer.offsets_for_times(
            {tp: int(options.from_time * 1000) for tp in timed}
        )
        for tp in timed:
            hit = found.get(tp)
            # None (Kafka) or a negative timestamp (tansu) means no record at or after the time.
            by_time[tp] = end[tp] if hit is None or hit.timestamp < 0 else hit.offset
    starts: dict[TopicPartition, int] = {}
    for tp in tps:
        if tp.partition in options.from_offsets:
            wanted = options.from_offsets[tp.partition]
        elif options.from_offset is not None:
            wanted = options.from_offset
        else:
            wanted = by_time.get(tp, beginning[tp])
        starts[tp] = min(max(wanted, beginning[tp]), end[tp])
    return starts, end


async def _end_offsets(
    consumer: Consumer, tps: list[TopicPartition], beginning: dict[TopicPartition, int]
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


async def read_range(
    consumer: Consumer,
    tp: TopicPartition,
    start: int,
    end: int,
    progress: Progress | None = None,
    from_time: float | None = None,
) -> AsyncIterator[ConsumerRecord]:
    """The records of one partition in ``[start, end)``, in offset order; with ``from_time``,
    from the first whose timestamp is at or after it (tansu's time lookup answers with the
    start of the record batch holding that record, not the record itself)."""
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
        if progress is not None and new_position > position:
            progress.advance(new_position - position)
        if new_position > position:
            stalled_since = time.monotonic()
        elif time.monotonic() - stalled_since > STALL_TIMEOUT_S:
            raise ReplayError(f"{tp.topic}[{tp.partition}]: no records past {position} (< {end})")
        position = new_position


def home_partition_of(key: str, tps: list[TopicPartition]) -> TopicPartition:
    """The partition of ``tps`` (all of a topic's) that a producer puts ``key`` in."""
    chosen = home_partition(key, [tp.partition for tp in tps])
    return next(tp for tp in tps if tp.partition == chosen)
