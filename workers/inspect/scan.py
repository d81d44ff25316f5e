"""A session's segments from the topics, read without a consumer group: found on the segments
topic, or re-assembled from the steps topic.

Invariants:
- No group is joined and nothing is committed (the readers of :mod:`workers.replay.reader`),
  so scanning never moves a consumer's offsets; a scan reads up to the end offsets at its start.
- The segments topic is keyed by instance, not session, so every partition is scanned; a
  record is parsed only if its bytes may name the session.
- From the steps topic, sessions still open at the end are closed for viewing and their
  segments marked so.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pydantic import ValidationError

from schemas.events import StepRecorded
from titoflow.settings import Settings
from workers.assembler import StepsEvent
from workers.inspect.load import parse_segment, select
from workers.inspect.view import Loaded
from workers.replay.options import ReplayOptions
from workers.replay.progress import Progress
from workers.replay.reader import read_range, start_offsets, start_reader, topic_partitions
from workers.replay.report import ReplayReport
from workers.replay.sinks import replay_segments


def _may_mention(value: bytes, session: str) -> bool:
    return session.encode() in value or json.dumps(session)[1:-1].encode() in value


async def from_segments_topic(
    settings: Settings,
    session: str,
    segment_id: str | None = None,
    topic: str | None = None,
    progress: Progress | None = None,
) -> list[Loaded]:
    """The session's segments on the segments topic, read with no consumer group up to the end
    offsets at start (every partition: segments are keyed by instance, not session)."""
    name = topic or settings.topic("segments")
    consumer = await start_reader(settings)
    found: list[Loaded] = []
    try:
        tps = await topic_partitions(consumer, name)
        starts, ends = await start_offsets(consumer, tps, ReplayOptions())
        if progress is not None:
            progress.start(sum(ends[tp] - starts[tp] for tp in tps), f"scan {name}")
        for tp in tps:
            async for record in read_range(consumer, tp, starts[tp], ends[tp], progress):
                if record.value is None or not _may_mention(record.value, session):
                    continue
                try:
                    found.append(parse_segment(record.value))
                except (ValueError, ValidationError):
                    continue
    finally:
        if progress is not None:
            progress.close()
        await consumer.stop()
    return select(found, session, segment_id)


@dataclass
class FromSteps:
    loaded: list[Loaded]
    step_events: dict[str, StepRecorded]
    still_open: set[str]  # segment ids of sessions that were still open
    report: ReplayReport


async def from_steps_topic(
    settings: Settings,
    session: str,
    segment_id: str | None = None,
    progress: Progress | None = None,
) -> FromSteps:
    """Replay the steps topic for one session (open sessions closed for viewing)."""
    step_events: dict[str, StepRecorded] = {}

    def observe(event: StepsEvent, partition: int, offset: int) -> None:
        if isinstance(event, StepRecorded):
            step_events[event.step_id] = event

    options = ReplayOptions(session=session, finalize_open=True)
    segments, report = await replay_segments(settings, options, progress=progress, observe=observe)
    loaded = select(
        [Loaded(s, json.loads(s.model_dump_json())) for s in segments], session, segment_id
    )
    still_open = {
        item.segment.segment_id
        for item in loaded
        if item.segment.session_id in report.open_sessions
    }
    return FromSteps(loaded, step_events, still_open, report)
