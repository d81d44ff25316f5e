"""The replay driver: the steps topic through the live worker's assembler, segments to a sink.

Invariants:
- Every admitted record goes through :meth:`workers.assembler.Assembler.apply`, the call the
  live worker makes, on an assembler built from the settings as the worker builds its own, so
  with the live settings a replay re-emits the live segments byte for byte.
- Partitions are replayed one after the other, each in offset order (all events of a session
  live in one partition, so this is the order the live worker applied them in).
- What the live worker decides by its wall clock is not replayed: a session it closed after
  ``idle_finalize_s`` without events is still open at the end, reported, and emitted as
  ``idle`` with ``finalize_open`` (then identical to the live segment).
- With ``divergence_policy: recompute`` the replay is its own recompute stage: a segment
  reaches the sink only with its pending logprobs filled in.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from schemas.events import SegmentFinalized
from titoflow.bus import Consumer, TopicPartition
from titoflow.engine.vllm import VLLMEngine
from titoflow.errors import EngineUnavailable
from titoflow.settings import Settings
from workers.assembler import Assembler, StepsEvent
from workers.assembly.pending import needs_recompute
from workers.recompute import PromptScorer, complete
from workers.replay.errors import ReplayError
from workers.replay.filters import SessionFilter
from workers.replay.options import ReplayOptions
from workers.replay.progress import NoProgress, Progress
from workers.replay.reader import (
    home_partition_of,
    read_range,
    start_offsets,
    start_reader,
    topic_partitions,
)
from workers.replay.report import Noted, ReplayReport
from workers.worker import assembler_for

SegmentSink = Callable[[SegmentFinalized], Awaitable[None]]
EventObserver = Callable[[StepsEvent, int, int], None]


async def replay(
    settings: Settings,
    options: ReplayOptions,
    sink: SegmentSink,
    *,
    progress: Progress | None = None,
    observe: EventObserver | None = None,
    assembler: Assembler | None = None,
) -> ReplayReport:
    """Re-assemble the steps topic as ``options`` say and hand every segment to ``sink``.

    With ``divergence_policy=recompute`` the replay is its own recompute stage: segments that
    need logprobs get them from ``engine_url`` before they reach ``sink``."""
    began = time.monotonic()
    topic = settings.topic("steps")
    assembler = assembler if assembler is not None else assembler_for(settings)
    report = ReplayReport(topic=topic)
    filters = SessionFilter(options.session, options.instance)
    bar = progress if progress is not None else NoProgress()
    if settings.recompute_enabled and not settings.engine_url:
        raise ReplayError("divergence_policy=recompute needs --engine-url to recompute logprobs")
    engine = (
        VLLMEngine(settings.engine_url, settings.engine_timeout_s) if settings.engine_url else None
    )
    sink = _recomputing(sink, engine)
    consumer = await start_reader(settings)
    try:
        tps = await topic_partitions(consumer, topic)
        if options.partitions is not None:
            missing = options.partitions - {tp.partition for tp in tps}
            if missing:
                raise ReplayError(f"{topic} has no partitions {sorted(missing)}")
            tps = [tp for tp in tps if tp.partition in options.partitions]
        groups = [tps]
        if options.session is not None and options.partitions is None and tps:
            # The session's events are in the partition its key hashes to: read that one first
            # and the others only if the session is not there.
            home = home_partition_of(options.session, tps)
            groups = [[home], [tp for tp in tps if tp != home]]
        for index, group in enumerate(groups):
            if index > 0 and report.events > 0:
                break
            await _replay_partitions(
                consumer, group, options, filters, assembler, sink, report, bar, observe
            )
        report.open_sessions = assembler.open_sessions
        if options.finalize_open:
            for session_id in report.open_sessions:
                for segment in assembler.finalize(session_id, "idle"):
                    await sink(segment)
                    report.segments += 1
            report.finalized_open = True
    finally:
        bar.close()
        await consumer.stop()
        if engine is not None:
            await engine.close()
    report.counters = dict(assembler.counters)
    report.elapsed_s = time.monotonic() - began
    return report


def _recomputing(sink: SegmentSink, scorer: PromptScorer | None) -> SegmentSink:
    """``sink`` behind the recompute stage's own step (what the live pipeline does between the
    worker and the segments topic)."""

    async def recomputed(segment: SegmentFinalized) -> None:
        if needs_recompute(segment):
            try:
                segment = await complete(segment, scorer)
            except EngineUnavailable as exc:
                raise ReplayError(f"cannot recompute logprobs: {exc}") from exc
        await sink(segment)

    return recomputed


async def _replay_partitions(
    consumer: Consumer,
    tps: list[TopicPartition],
    options: ReplayOptions,
    filters: SessionFilter,
    assembler: Assembler,
    sink: SegmentSink,
    report: ReplayReport,
    bar: Progress,
    observe: EventObserver | None,
) -> None:
    starts, ends = await start_offsets(consumer, tps, options)
    report.ranges.update({tp.partition: (starts[tp], ends[tp]) for tp in tps})
    bar.start(sum(ends[tp] - starts[tp] for tp in tps), f"replay {tps[0].topic}")
    for tp in tps:
        by_time = options.from_time if options.starts_by_time(tp.partition) else None
        async for record in read_range(consumer, tp, starts[tp], ends[tp], bar, by_time):
            report.records += 1
            if not filters.admits(record.key, record.value):
                continue
            report.events += 1
            applied = assembler.apply(record.value, record.partition, record.offset)
            if applied.event is not None and observe is not None:
                observe(applied.event, record.partition, record.offset)
            key = record.key.decode("utf-8", "replace") if record.key is not None else None
            if applied.dead_letter_reason:
                report.dead_letters.append(
                    Noted(
                        record.partition,
                        record.offset,
                        key,
                        applied.dead_letter_reason,
                        applied.dead_letter_detail,
                    )
                )
            if applied.skipped_reason:
                report.skipped.append(
                    Noted(record.partition, record.offset, key, applied.skipped_reason)
                )
            for segment in applied.segments:
                await sink(segment)
                report.segments += 1
