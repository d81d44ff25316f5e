"""Where ``titoflow export`` reads segments: a segments topic (the live one, or a replay's
``--to-topic``), optionally a time window of it, or a JSONL file (``titoflow replay --out``).

Invariants:
- A topic is read with no consumer group up to the end offsets at the start (the readers of
  :mod:`workers.replay.reader`): nothing is committed, and an export terminates while workers
  keep publishing.
- A time window ``[from_time, to_time)`` is by record timestamp: each partition starts at
  ``offsets_for_times(from_time)`` and stops at the first record at or past
  ``offsets_for_times(to_time)`` whose timestamp is at or after ``to_time`` (a broker that answers
  a time lookup with the start of a record batch, as tansu does, still loses no record).
- Values are yielded as the bytes read, each with where it came from, for the caller to parse.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from titoflow.bus import Consumer, ConsumerRecord, TopicPartition
from titoflow.settings import Settings
from workers.replay.errors import ReplayError
from workers.replay.options import ReplayOptions
from workers.replay.progress import Progress
from workers.replay.reader import read_range, start_offsets, start_reader, topic_partitions


@dataclass(frozen=True)
class Read:
    """One record's value and where it was: ``topic[partition]@offset`` or ``file:line``."""

    value: bytes
    where: str


async def from_topic(
    settings: Settings,
    topic: str,
    progress: Progress,
    from_time: float | None = None,
    to_time: float | None = None,
) -> AsyncIterator[Read]:
    """The records of ``topic`` (all partitions, one after the other) in the time window."""
    if from_time is not None and to_time is not None and to_time <= from_time:
        raise ReplayError("--to-time must be after --from-time")
    consumer = await start_reader(settings)
    try:
        tps = await topic_partitions(consumer, topic)
        starts, ends = await start_offsets(consumer, tps, ReplayOptions(from_time=from_time))
        stops = await _stop_offsets(consumer, tps, ends, to_time)
        progress.start(sum(max(stops[tp] - starts[tp], 0) for tp in tps), f"export {topic}")
        to_ms = int(to_time * 1000) if to_time is not None else None
        for tp in tps:
            # A generator, closed when the window ends before the partition does.
            records = cast(
                AsyncGenerator[ConsumerRecord, None],
                read_range(consumer, tp, starts[tp], ends[tp], progress, from_time),
            )
            async with aclosing(records):
                async for record in records:
                    if to_ms is not None and record.timestamp >= to_ms:
                        if record.offset >= stops[tp]:
                            break
                        continue
                    if record.value is not None:
                        yield Read(record.value, f"{topic}[{tp.partition}]@{record.offset}")
    finally:
        await consumer.stop()


async def _stop_offsets(
    consumer: Consumer,
    tps: list[TopicPartition],
    ends: dict[TopicPartition, int],
    to_time: float | None,
) -> dict[TopicPartition, int]:
    """Per partition, the offset from which records are at or after ``to_time`` (the end
    offset when none is, or with no ``to_time``)."""
    if to_time is None:
        return dict(ends)
    found = await consumer.offsets_for_times({tp: int(to_time * 1000) for tp in tps})
    stops = {}
    for tp in tps:
        hit = found.get(tp)
        # None (Kafka) or a negative timestamp (tansu): no record at or after the time.
        stops[tp] = ends[tp] if hit is None or hit.timestamp < 0 else min(hit.offset, ends[tp])
    return stops


async def from_jsonl(path: Path, progress: Progress) -> AsyncIterator[Read]:
    """The lines of a JSONL file (``-``: stdin, no total for the bar), blank ones skipped,
    streamed: the file is counted once for the bar, then read line by line."""
    try:
        if str(path) == "-":
            progress.start(0, "export stdin")
            stream = sys.stdin.buffer
        else:
            progress.start(_count_lines(path), f"export {path}")
            stream = path.open("rb")
    except OSError as exc:
        raise ReplayError(f"cannot read {path}: {exc.strerror or exc}") from None
    with stream:
        for number, line in enumerate(stream, start=1):
            progress.advance(1)
            if line.strip():
                yield Read(line, f"{path}:{number}")


def _count_lines(path: Path) -> int:
    with path.open("rb") as file:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: file.read(1 << 20), b""))
