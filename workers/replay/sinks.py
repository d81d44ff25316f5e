"""Where replayed segments go: a JSONL stream, a topic, or a list.

Invariant: a segment leaves as the bytes the live worker publishes, and onto a topic keyed as
the live worker keys it (instance id, else session id), so with the same partition count each
lands in the partition it has on the live topic.
"""

from __future__ import annotations

import sys
from typing import Any

from schemas.events import SegmentFinalized
from titoflow.bus import BrokerUnavailable, Publisher, TopicLayoutError, create_topics
from titoflow.settings import Settings
from workers.replay.driver import replay
from workers.replay.errors import ReplayError
from workers.replay.options import ReplayOptions
from workers.replay.progress import Progress
from workers.replay.report import ReplayReport


def segment_bytes(segment: SegmentFinalized) -> bytes:
    """A segment exactly as the live worker publishes it."""
    return segment.model_dump_json().encode()


class JsonlSink:
    """One segment per line, the same bytes the live worker publishes."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream  # a binary stream (sys.stdout.buffer, a file opened "wb")

    async def __call__(self, segment: SegmentFinalized) -> None:
        self._stream.write(segment_bytes(segment) + b"\n")


class TopicSink:
    """Publishes segments keyed as the live worker keys them (instance id, else session id)."""

    def __init__(self, publisher: Publisher, topic: str) -> None:
        self._publisher = publisher
        self._topic = topic

    async def __call__(self, segment: SegmentFinalized) -> None:
        key = segment.instance_id or segment.session_id
        await self._publisher.publish(self._topic, key, segment_bytes(segment))


async def replay_to(
    settings: Settings,
    options: ReplayOptions,
    *,
    out: Any = None,
    to_topic: str | None = None,
    progress: Progress | None = None,
) -> ReplayReport:
    """Replay to a binary stream (JSONL) or, with ``to_topic``, to a topic (created if missing,
    with ``segments_partitions`` partitions)."""
    if to_topic is None:
        stream = out if out is not None else sys.stdout.buffer
        try:
            return await replay(settings, options, JsonlSink(stream), progress=progress)
        finally:
            stream.flush()
    publisher = Publisher(settings)
    try:
        try:
            await create_topics(settings, {to_topic: settings.segments_partitions})
        except (BrokerUnavailable, TopicLayoutError) as exc:
            raise ReplayError(f"cannot create topic {to_topic!r}: {exc}") from exc
        await publisher.start()
    except BrokerUnavailable as exc:
        raise ReplayError(f"cannot publish to {to_topic!r}: {exc}") from exc
    try:
        return await replay(settings, options, TopicSink(publisher, to_topic), progress=progress)
    finally:
        await publisher.stop()


async def replay_segments(
    settings: Settings, options: ReplayOptions, **kwargs: Any
) -> tuple[list[SegmentFinalized], ReplayReport]:
    """Replay into a list (tests, ``titoflow inspect``)."""
    segments: list[SegmentFinalized] = []

    async def collect(segment: SegmentFinalized) -> None:
        segments.append(segment)

    report = await replay(settings, options, collect, **kwargs)
    return segments, report
