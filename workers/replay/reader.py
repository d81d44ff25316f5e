"""Reading a topic without a consumer group, from given offsets up to the end offsets at start
(:func:`titoflow.bus.read_to_end`), for a replay, an export or a scan.

Invariants:
- Partitions are assigned by hand and nothing is ever committed, so a group's offsets (the live
  workers') are never touched.
- A range ends at the end offset found when it started, so a read terminates while producers
  keep writing; a read that stops advancing before then (retention, a recreated topic) fails
  with :class:`ReplayError` instead of hanging.
- Records come in offset order within a partition.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing

from titoflow.bus import (
    BrokerUnavailable,
    Consumer,
    ConsumerRecord,
    ReadStalled,
    TopicPartition,
    end_offsets,
    existing_partitions,
    home_partition,
    make_consumer,
    read_to_end,
    start_consumer,
)
from titoflow.settings import Settings
from workers.replay.errors import ReplayError
from workers.replay.options import ReplayOptions
from workers.replay.progress import Progress


async def start_reader(settings: Settings) -> Consumer:
    """A started consumer without a group (it never joins or commits anything)."""
    consumer = make_consumer(settings, group_id=None, enable_auto_commit=False)
    try:
        return await start_consumer(consumer, settings)
    except BrokerUnavailable as exc:
        raise ReplayError(exc.message) from exc


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
    end = await end_offsets(consumer, tps, beginning)
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


async def read_range(
    consumer: Consumer,
    tp: TopicPartition,
    start: int,
    end: int,
    progress: Progress | None = None,
    from_time: float | None = None,
) -> AsyncIterator[ConsumerRecord]:
    """The records of one partition in ``[start, end)``, in offset order, counted on
    ``progress``; with ``from_time``, from the first whose timestamp is at or after it."""
    advanced = progress.advance if progress is not None else None
    try:
        async with aclosing(read_to_end(consumer, tp, start, end, advanced, from_time)) as read:
            async for record in read:
                yield record
    except ReadStalled as exc:
        raise ReplayError(str(exc)) from exc


def home_partition_of(key: str, tps: list[TopicPartition]) -> TopicPartition:
    """The partition of ``tps`` (all of a topic's) that a producer puts ``key`` in."""
    chosen = home_partition(key, [tp.partition for tp in tps])
    return next(tp for tp in tps if tp.partition == chosen)
