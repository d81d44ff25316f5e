"""Replay: re-assemble segments from the recorded ``<prefix>.steps`` log, for debugging.

A replay reads the steps topic with **no consumer group** (partitions are assigned by hand and
nothing is ever committed, so the live workers' offsets are never touched), from the beginning,
from an offset or from a time, up to the end offsets it found when it started (so it always
terminates), and feeds every record to :meth:`workers.assembler.Assembler.apply` — the very call
the live worker makes. Segments are a function of the events alone, so a replay with the live
settings re-emits the live segments byte for byte; a replay with other build settings shows what
they would have produced.

Partitions are replayed one after the other, each in offset order (all events of a session live
in one partition, so this is the order the live worker applied them in). What the live worker
decides by its wall clock is not replayed: a session it closed after ``idle_finalize_s`` without
events is still open at the end of a replay, reported, and emitted as ``idle`` with
``--finalize-open`` (then identical to the live segment).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal, Protocol, TextIO

from pydantic import BaseModel, ConfigDict, ValidationError

from schemas.events import SegmentFinalized
from titoflow.bus import (
    BrokerUnavailable,
    Consumer,
    ConsumerRecord,
    KafkaError,
    Publisher,
    TopicLayoutError,
    TopicPartition,
    create_topics,
    existing_partitions,
    home_partition,
    make_consumer,
)
from titoflow.engine.vllm import VLLMEngine
from titoflow.errors import EngineUnavailable
from titoflow.settings import Settings
from workers.assembler import Assembler, StepsEvent, needs_recompute
from workers.recompute import PromptScorer, complete
from workers.worker import assembler_for

# A fetch that brings nothing for this long while records are still due means the log changed
# under us (retention deleted them, or the topic was recreated): stop instead of hanging.
STALL_TIMEOUT_S = 60.0
FETCH_TIMEOUT_MS = 1000
# Kept for the summary; the counts by reason cover the rest.
MAX_LISTED = 20

SegmentSink = Callable[[SegmentFinalized], Awaitable[None]]
EventObserver = Callable[[StepsEvent, int, int], None]


class ReplayError(Exception):
    """The replay cannot start as asked (no such topic or partition, a bad offset or time)."""


# --- what to replay ----------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOptions:
    """Which records to replay and what to do with sessions still open at the end.

    Start: ``from_offsets[p]`` for the partitions it names, else ``from_offset`` for every
    partition, else ``from_time`` (unix seconds, by record timestamp), else the beginning.
    Offsets are clamped to what the log still holds.
    """

    partitions: frozenset[int] | None = None
    from_offset: int | None = None
    from_offsets: dict[int, int] = field(default_factory=dict)
    from_time: float | None = None
    session: str | None = None
    instance: str | None = None
    finalize_open: bool = False

    def starts_by_time(self, partition: int) -> bool:
        return (
            self.from_time is not None
            and self.from_offset is None
            and partition not in self.from_offsets
        )


def parse_from_offsets(values: Sequence[str]) -> tuple[int | None, dict[int, int]]:
    """``["100", "3:50"]`` → every partition from 100, partition 3 from 50."""
    every: int | None = None
    per_partition: dict[int, int] = {}
    for value in values:
        partition, sep, offset = value.partition(":")
        try:
            if sep:
                per_partition[int(partition)] = int(offset)
            else:
                every = int(partition)
        except ValueError:
            raise ReplayError(f"--from-offset {value!r}: expected N or PARTITION:N") from None
    if any(o < 0 for o in [*per_partition.values(), every or 0]):
        raise ReplayError("--from-offset must not be negative")
    return every, per_partition


def parse_time(value: str) -> float:
    """Unix seconds (``1795271354.5``) or ISO 8601 (``2026-11-21T14:29:18Z``; naive = UTC)."""
    try:
        return float(value)
    except ValueError:
        pass
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ReplayError(f"--from-time {value!r}: expected unix seconds or ISO 8601") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.timestamp()


# --- the assembler, built as the live worker would build it ------------------------------------


# --- filters ------------------------------------------------------------------------------------


class _Envelope(BaseModel):
    """Just enough of a steps event to filter it (the assembler decodes it fully)."""

    model_config = ConfigDict(extra="ignore")

    session_id: str
    instance_id: str | None = None


def _peek(value: bytes | None) -> _Envelope | None:
    try:
        return _Envelope.model_validate_json(value or b"")
    except ValidationError:
        return None


class _Filter:
    """``--session`` and ``--instance``. A session belongs to an instance once one of its events
    names it (``session_finalized`` events carry no instance: they follow their session)."""

    def __init__(self, session: str | None, instance: str | None) -> None:
        self.session = session
        self.session_key = session.encode() if session is not None else None
        self.instance = instance
        self.members: set[str] = set()

    def admits(self, key: bytes | None, value: bytes | None) -> bool:
        if self.session is None and self.instance is None:
            return True
        if self.session_key is not None and key is not None:
            if key != self.session_key:  # the steps topic is keyed by session id
                return False
            if self.instance is None:
                return True
        envelope = _peek(value)
        if envelope is None:  # undecodable: only its key can attribute it
            return self.instance is None and key is not None and key == self.session_key
        if self.session is not None and envelope.session_id != self.session:
            return False
        if self.instance is None:
            return True
        if envelope.instance_id == self.instance:
            self.members.add(envelope.session_id)
        return envelope.session_id in self.members


# --- progress -----------------------------------------------------------------------------------


class Progress(Protocol):
    """A bar over records; ``start`` again adds ``total`` more records to it."""

    def start(self, total: int, description: str) -> None: ...
    def advance(self, n: int) -> None: ...
    def close(self) -> None: ...


class NoProgress:
    def start(self, total: int, description: str) -> None:
        pass

    def advance(self, n: int) -> None:
        pass

    def close(self) -> None:
        pass


class _RichProgress:
    def __init__(self, stream: TextIO) -> None:
        progress_module = importlib.import_module("rich.progress")
        console_module = importlib.import_module("rich.console")
        self._progress: Any = progress_module.Progress(
            progress_module.TextColumn("{task.description}"),
            progress_module.BarColumn(),
            progress_module.MofNCompleteColumn(),
            progress_module.TextColumn("records"),
            progress_module.TimeElapsedColumn(),
            progress_module.TimeRemainingColumn(),
            console=console_module.Console(file=stream),
            transient=False,
        )
        self._task: Any = None

    def start(self, total: int, description: str) -> None:
        if self._task is None:
            self._progress.start()
            self._task = self._progress.add_task(description, total=total)
        else:
            more = self._progress.tasks[0].total + total
            self._progress.update(self._task, total=more)

    def advance(self, n: int) -> None:
        self._progress.advance(self._task, n)

    def close(self) -> None:
        if self._task is not None:
            self._progress.stop()


class _TqdmProgress:
    def __init__(self, stream: TextIO) -> None:
        self._tqdm: Any = importlib.import_module("tqdm").tqdm
        self._stream = stream
        self._bar: Any = None

    def start(self, total: int, description: str) -> None:
        if self._bar is None:
            self._bar = self._tqdm(total=total, desc=description, unit="rec", file=self._stream)
        else:
            self._bar.total += total
            self._bar.refresh()

    def advance(self, n: int) -> None:
        self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class PlainProgress:
    """A dependency-free bar, redrawn in place at most five times a second."""

    WIDTH = 30

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream
        self._total = 0
        self._done = 0
        self._description = ""
        self._drawn_at = 0.0

    def start(self, total: int, description: str) -> None:
        self._total += total
        self._description = description
        self._draw()

    def advance(self, n: int) -> None:
        self._done += n
        if time.monotonic() - self._drawn_at > 0.2:
            self._draw()

    def _draw(self) -> None:
        share = self._done / self._total if self._total else 1.0
        filled = math.floor(share * self.WIDTH)
        bar = "#" * filled + "." * (self.WIDTH - filled)
        self._stream.write(
            f"\r{self._description} [{bar}] {share:4.0%} {self._done}/{self._total} records"
        )
        self._stream.flush()
        self._drawn_at = time.monotonic()

    def close(self) -> None:
        self._draw()
        self._stream.write("\n")
        self._stream.flush()


def make_progress(
    mode: Literal["auto", "always", "never"] = "auto", stream: TextIO | None = None
) -> Progress:
    """rich if installed, else tqdm, else a plain bar; ``auto`` shows one only on a terminal."""
    out = stream if stream is not None else sys.stderr
    if mode == "never" or (mode == "auto" and not out.isatty()):
        return NoProgress()
    if importlib.util.find_spec("rich") is not None:
        return _RichProgress(out)
    if importlib.util.find_spec("tqdm") is not None:
        return _TqdmProgress(out)
    return PlainProgress(out)


# --- reading a topic without a group -------------------------------------------------------------


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


# --- the replay -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Noted:
    """One record a replay dead-lettered or skipped (the live worker would have too)."""

    partition: int
    offset: int
    key: str | None
    reason: str


@dataclass
class ReplayReport:
    topic: str
    ranges: dict[int, tuple[int, int]] = field(default_factory=dict)  # partition: [start, end)
    records: int = 0  # read in those ranges
    events: int = 0  # passed the filters, applied to the assembler
    segments: int = 0
    dead_letters: list[Noted] = field(default_factory=list)
    skipped: list[Noted] = field(default_factory=list)
    open_sessions: list[str] = field(default_factory=list)  # still open at the end
    finalized_open: bool = False
    counters: dict[str, int] = field(default_factory=dict)  # the assembler's
    elapsed_s: float = 0.0

    @property
    def filtered_out(self) -> int:
        return self.records - self.events


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
    filters = _Filter(options.session, options.instance)
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


def home_partition_of(key: str, tps: list[TopicPartition]) -> TopicPartition:
    """The partition of ``tps`` (all of a topic's) that a producer puts ``key`` in."""
    chosen = home_partition(key, [tp.partition for tp in tps])
    return next(tp for tp in tps if tp.partition == chosen)


async def _replay_partitions(
    consumer: Consumer,
    tps: list[TopicPartition],
    options: ReplayOptions,
    filters: _Filter,
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
                    Noted(record.partition, record.offset, key, applied.dead_letter_reason)
                )
            if applied.skipped_reason:
                report.skipped.append(
                    Noted(record.partition, record.offset, key, applied.skipped_reason)
                )
            for segment in applied.segments:
                await sink(segment)
                report.segments += 1


async def replay_segments(
    settings: Settings, options: ReplayOptions, **kwargs: Any
) -> tuple[list[SegmentFinalized], ReplayReport]:
    """Replay into a list (tests, ``titoflow inspect``)."""
    segments: list[SegmentFinalized] = []

    async def collect(segment: SegmentFinalized) -> None:
        segments.append(segment)

    report = await replay(settings, options, collect, **kwargs)
    return segments, report


# --- where segments go ----------------------------------------------------------------------------


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
    except (KafkaError, BrokerUnavailable) as exc:
        raise ReplayError(f"cannot publish to {to_topic!r}: {exc}") from exc
    try:
        return await replay(settings, options, TopicSink(publisher, to_topic), progress=progress)
    finally:
        await publisher.stop()


# --- the summary --------------------------------------------------------------------------------


def _reason_class(reason: str) -> str:
    return reason.split(":", 1)[0]


def _listed(title: str, noted: Iterable[Noted]) -> list[str]:
    items = list(noted)
    if not items:
        return []
    lines = [f"{title}: {len(items)}"]
    for reason, count in Counter(_reason_class(n.reason) for n in items).most_common():
        lines.append(f"  {count:>6}  {reason}")
    for n in items[:MAX_LISTED]:
        lines.append(f"    p{n.partition}@{n.offset} key={n.key!r}: {n.reason[:300]}")
    if len(items) > MAX_LISTED:
        lines.append(f"    ... and {len(items) - MAX_LISTED} more")
    return lines


def format_summary(report: ReplayReport) -> str:
    """What a replay did, for a person (stderr)."""
    ranges = " ".join(f"p{p}:[{s},{e})" for p, (s, e) in report.ranges.items() if e > s)
    lines = [
        f"replayed {report.topic}: {ranges or 'nothing to read'}",
        f"records read: {report.records}, applied: {report.events}, "
        f"filtered out: {report.filtered_out}",
        f"segments: {report.segments} in {report.elapsed_s:.2f}s",
    ]
    lines += _listed("dead letters (the live worker sends these to the DLQ)", report.dead_letters)
    lines += _listed("skipped", report.skipped)
    if report.open_sessions:
        verb = "finalized as idle" if report.finalized_open else "not emitted (--finalize-open)"
        shown = ", ".join(report.open_sessions[:MAX_LISTED])
        more = len(report.open_sessions) - MAX_LISTED
        lines.append(
            f"sessions still open at the end: {len(report.open_sessions)}, {verb}: {shown}"
            + (f" ... and {more} more" if more > 0 else "")
        )
    else:
        lines.append("sessions still open at the end: 0")
    if report.counters:
        counters = ", ".join(f"{k}={v}" for k, v in sorted(report.counters.items()))
        lines.append(f"assembler counters: {counters}")
    return "\n".join(lines)
