"""The assembly worker: a consumer-group member on ``<prefix>.steps`` publishing segments, as a
FastStream batch subscriber with manual acknowledgement (:mod:`titoflow.bus.subscription`).

Crash safety (at-least-once, deterministic output): segments are published (acked) before
offsets are committed, and a partition's committed offset never passes the first event of a
session still open in it, so a restarted or rebalanced worker re-reads every open session from
its start and rebuilds identical segments; consumers drop the duplicates by segment id.

A rebalance moves that bound with the partition: revoking a partition commits (between batches)
and forgets its sessions, and a partition assigned, new or given back, is read from the position
the consumer starts it at, record after record (:mod:`workers.partitions`). A batch handed over
before a revocation and handled after it is not applied: applied to forgotten sessions it would
start them mid-way, and a commit after it would pass their first events.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterable

from prometheus_client import start_http_server

from schemas.events import (
    RecomputeRequested,
    SegmentFinalized,
    SessionDiscarded,
    SessionEnded,
    SessionFinalized,
    StepRecorded,
)
from schemas.reasons import DeadLetterReason
from titoflow.bus import (
    Batch,
    BatchSubscription,
    ConsumerRecord,
    RebalanceListener,
    RecordPublisher,
    StreamPublisher,
    TopicPartition,
    ensure_topics,
    send_to_dlq,
)
from titoflow.gc_pauses import freeze_startup, watch_full_collections
from titoflow.settings import Settings
from titoflow.tito.image_grid import ImageProcessing
from titoflow.tito.render import ChatRenderer
from titoflow.tito.tokenizer import load_tokenizer
from workers import metrics
from workers.assembler import Assembler
from workers.assembly.pending import needs_recompute
from workers.partitions import PartitionLedger, Verdict
from workers.rebuild import Rebuilder

log = logging.getLogger("titoflow.worker")

# What a batch publishes: segments and notices to <prefix>.segments (or via recompute), and
# the ends of sessions this worker closed itself (idle) to <prefix>.ended.
Output = SegmentFinalized | SessionDiscarded | SessionEnded

MAX_RECORDS = 1000


class _Rebalance(RebalanceListener):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        self.worker = worker

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        # aiokafka calls this from its own task. A batch in hand may hold segments not yet
        # published, so commit only between batches: skipping a commit is always safe (the next
        # owner re-reads a little more), and a rebalance never waits on a slow publish.
        lock = self.worker.steps.lock
        if not lock.locked():
            async with lock:
                await self.worker.commit()
        self.worker.forget(revoked)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        # A new assignment is read from the committed bound, or with none from the log's start
        # (the reset policy). aiokafka hands out its records before calling this, which a batch
        # then drops (its partition is not held yet): the seek fetches them again.
        consumer = self.worker.steps.consumer
        bounds = {}
        for tp in assigned:
            committed = await consumer.committed(tp)
            if committed is None:
                committed = (await consumer.beginning_offsets([tp]))[tp]
            bounds[tp] = committed
        live = consumer.assignment()
        for tp, bound in bounds.items():
            if tp in live:  # else a newer rebalance took it meanwhile
                self.worker.ledger.assign(tp.partition, bound)
                consumer.seek(tp, bound)
        log.info(
            "assigned partitions %s",
            sorted(tp.partition for tp in assigned),
            extra={"from": self.worker.ledger.next_offsets()},
        )


async def publish_dead_letter(
    publisher: RecordPublisher,
    settings: Settings,
    record: ConsumerRecord,
    reason: DeadLetterReason,
    detail: str = "",
) -> None:
    """Send ``record`` to the DLQ; logged and counted by why once the broker acked it (a send
    that fails raises instead, and the batch stops uncommitted)."""
    await send_to_dlq(publisher, settings, record, reason, detail)
    where = f"{record.topic}[{record.partition}]@{record.offset}"
    log.warning("dead letter %s: %s %s", where, reason, detail)
    metrics.DEAD_LETTERS.labels(reason.value).inc()


def assembler_for(settings: Settings) -> Assembler:
    """The assembler ``settings`` call for; live workers and replays build theirs here.

    The policy's tokenizer, when the worker can see it, tells retokenization from template
    divergences and provides the chat template that ``last-step`` and ``recompute`` re-render
    with; without it divergences count as template, segments stay concat and divergences split.
    """
    if not (settings.model_path / "tokenizer_config.json").exists():
        log.warning("no tokenizer at %s: concat and split only", settings.model_path)
        return Assembler(
            settings.max_segment_tokens,
            mask_stale_versions=settings.mask_stale_versions,
            partial_rollout=settings.partial_rollout,
        )
    tokenizer = load_tokenizer(settings.model_path, settings.trust_remote_code)

    def decode(ids: list[int]) -> str:
        return str(tokenizer.decode(ids, skip_special_tokens=False))

    return Assembler(
        settings.max_segment_tokens,
        decode,
        Rebuilder(
            ChatRenderer.for_setting(tokenizer, settings.model_family),
            ImageProcessing.of_model(settings.model_path),
        ),
        settings.build_mode,
        settings.recompute_enabled,
        settings.mask_stale_versions,
        settings.partial_rollout,
    )


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.assembler = assembler_for(settings)
        self.steps = BatchSubscription(
            settings,
            settings.topic("steps"),
            settings.worker_group,
            self._apply,
            log,
            MAX_RECORDS,
            listener=_Rebalance(self),
        )
        self.publisher: RecordPublisher = StreamPublisher(self.steps.broker, settings)
        self.ledger = PartitionLedger()
        self._last_seen: dict[str, float] = {}
        self._divergences_seen: dict[str, int] = {}
        self._masked_seen = 0
        self._partial_seen = 0
        # Sessions with a segment on <prefix>.recompute: their later segments follow it there,
        # so none overtakes it on the way to <prefix>.segments (last_of_session comes last).
        self._via_recompute: set[str] = set()

    async def run(self, stop: asyncio.Event) -> None:
        if self.settings.worker_metrics_port:
            start_http_server(self.settings.worker_metrics_port, addr=self.settings.metrics_host)
        # Sessions go idle while no steps arrive, and no batch comes then: the tick closes them.
        await self.steps.run(
            stop,
            starting=[self._start],
            tick=lambda: self._apply(Batch()),
            last=self.commit,
        )

    async def _start(self) -> None:
        # Before any client touches a topic: a broker that auto-creates topics would otherwise
        # pick its own partition counts.
        await ensure_topics(self.settings)
        watch_full_collections()
        freeze_startup()  # the tokenizer and the app: out of every full collection's walk

    async def _apply(self, batch: Batch) -> None:
        segments: list[Output] = []
        stale: set[int] = set()  # partitions whose reading this batch does not continue
        for record in batch.records:
            partition = record.partition
            if partition in stale:
                continue
            reading = self.ledger.reading(partition)
            verdict = self.ledger.verdict(partition, record.offset)
            if verdict is Verdict.GAP:
                verdict = await self._gap(record)
            if verdict is Verdict.APPLY:
                segments += await self._handle(record)
                if self.ledger.reading(partition) is reading:  # not revoked meanwhile
                    self.ledger.applied(partition, record.offset)
            elif verdict is not Verdict.READ:
                stale.add(partition)  # not held, or re-read from the bound
        if stale:
            log.debug(
                "records of partitions %s not applied: fetched before their assignment", stale
            )
        segments += self._finalize_idle()
        if batch.records or segments:
            await self._publish_segments(segments)
            await self.commit()
        self._observe()

    async def _gap(self, record: ConsumerRecord) -> Verdict:
        """A record past the next offset of its reading: one fetched under an earlier assignment
        (the consumer is then sent back to the bound) or the first after records retention
        deleted unread (reading goes on; the sessions that lost steps are partial)."""
        tp = TopicPartition(record.topic, record.partition)
        reading = self.ledger.reading(record.partition)
        assert reading is not None
        consumer = self.steps.consumer
        beginning = (await consumer.beginning_offsets([tp]))[tp]
        if self.ledger.reading(record.partition) is not reading:
            return Verdict.NOT_HELD  # revoked (or re-assigned) while asking
        if beginning <= reading.next and reading.sent_back_at != reading.next:
            metrics.REREADS.inc()
            reading.sent_back_at = reading.next
            if tp in consumer.assignment():
                consumer.seek(tp, reading.next)
            return Verdict.GAP
        if beginning > reading.next:
            lost = self.assembler.lose_partition(record.partition)
            log.warning(
                "steps[%d] %d..%d deleted unread (retention): %d open sessions are partial",
                record.partition,
                reading.next,
                beginning - 1,
                len(lost),
            )
        else:  # sent back there, and the log still goes on past it: offsets without records
            log.warning(
                "steps[%d] has no records at %d..%d", tp.partition, reading.next, record.offset - 1
            )
        self.ledger.skip_to(record.partition, record.offset)
        return Verdict.APPLY

    async def _handle(self, record: ConsumerRecord) -> list[Output]:
        applied = self.assembler.apply(record.value, record.partition, record.offset)
        event = applied.event
        if event is not None:
            ids = {"session_id": event.session_id, "offset": record.offset}
            if isinstance(event, StepRecorded):
                ids["step_id"] = event.step_id
                log.debug("step %s", event.step_id, extra=ids)
            if isinstance(event, SessionFinalized | SessionDiscarded):
                self._last_seen.pop(event.session_id, None)
            else:
                self._last_seen[event.session_id] = time.monotonic()
            if applied.skipped_reason:
                log.info("event skipped: %s", applied.skipped_reason, extra=ids)
        if applied.dead_letter_reason:
            await publish_dead_letter(
                self.publisher,
                self.settings,
                record,
                applied.dead_letter_reason,
                applied.dead_letter_detail,
            )
        return [*applied.segments, *([applied.notice] if applied.notice else [])]

    def _observe(self) -> None:
        consumer = self.steps.consumer
        for tp in consumer.assignment():
            highwater = consumer.highwater(tp)
            reading = self.ledger.reading(tp.partition)
            if highwater is not None:
                lag = highwater - (reading.next if reading else highwater)
                metrics.CONSUMER_LAG.labels(str(tp.partition)).set(max(lag, 0))
        metrics.OPEN_SESSIONS.set(len(self.assembler.open_sessions))
        masked = self.assembler.counters["version_masked_tokens"]
        metrics.VERSION_MASKED_TOKENS.inc(masked - self._masked_seen)
        self._masked_seen = masked
        partial = self.assembler.counters["partial_sessions"]
        metrics.PARTIAL_SESSIONS.inc(partial - self._partial_seen)
        self._partial_seen = partial
        for name, value in self.assembler.counters.items():
            if name.startswith("divergence_"):
                kind = name.removeprefix("divergence_")
                counted = self._divergences_seen.get(kind, 0)
                metrics.DIVERGENCES.labels(kind).inc(value - counted)
                self._divergences_seen[kind] = value

    def _finalize_idle(self) -> Iterable[Output]:
        cutoff = time.monotonic() - self.settings.idle_finalize_s
        idle = [sid for sid, seen in self._last_seen.items() if seen < cutoff]
        for session_id in idle:
            del self._last_seen[session_id]
            now = time.time()
            try:
                closed = self.assembler.close(session_id, "idle", at=now)
            except Exception:  # a bug must cost one session, not the partition
                log.exception("closing idle session %s failed", session_id)
                continue
            yield from closed.segments
            if closed.notice:
                yield closed.notice
            if closed.segments or closed.notice:
                # Replicas then refuse the driver's late finalize (409), which would else set
                # a reward on nothing.
                yield SessionEnded(session_id=session_id, event_time=now, how="idle")

    async def _publish_segments(self, segments: list[Output]) -> None:
        records: list[tuple[str, str, bytes]] = []
        for segment in segments:
            if isinstance(segment, SessionEnded):
                end = (segment.session_id, segment.model_dump_json().encode())
                records.append((self.settings.topic("ended"), *end))
                continue
            key = segment.instance_id or segment.session_id
            if isinstance(segment, SegmentFinalized) and (
                needs_recompute(segment) or segment.session_id in self._via_recompute
            ):
                # finished and published by the recompute stage, in this order
                self._via_recompute.add(segment.session_id)
                if segment.last_of_session:
                    self._via_recompute.discard(segment.session_id)
                request = RecomputeRequested(
                    session_id=segment.session_id, event_time=segment.event_time, segment=segment
                )
                records.append(
                    (self.settings.topic("recompute"), key, request.model_dump_json().encode())
                )
                metrics.RECOMPUTE_REQUESTED.inc()
            else:
                self._via_recompute.discard(segment.session_id)  # a notice ends the session
                records.append(
                    (self.settings.topic("segments"), key, segment.model_dump_json().encode())
                )
        # The batch's segments travel together (one round trip, not one per segment), all acked
        # before the offsets move past their steps.
        started = time.perf_counter()
        await self.publisher.publish_many(records)
        elapsed = time.perf_counter() - started
        for segment in segments:
            metrics.PUBLISH_SECONDS.observe(elapsed)
            if isinstance(segment, SessionEnded):
                continue
            if isinstance(segment, SessionDiscarded):
                metrics.DISCARDED.labels(segment.reason).inc()
                log.info(
                    "session discarded",
                    extra={"session_id": segment.session_id, "reason": segment.reason},
                )
                continue
            metrics.SEGMENTS.labels(segment.finalize_reason).inc()
            log.info(
                "segment published",
                extra={
                    "session_id": segment.session_id,
                    "segment_id": segment.segment_id,
                    "tokens": len(segment.token_ids),
                    "steps": len(segment.steps),
                    "finalize_reason": segment.finalize_reason,
                },
            )

    def forget(self, partitions: list[TopicPartition]) -> None:
        """Drop state of revoked partitions: whoever is assigned them next (this worker too)
        re-reads them from the commit."""
        numbers = [tp.partition for tp in partitions]
        self.ledger.revoke(numbers)
        for session_id in self.assembler.drop_partitions(set(numbers)):
            self._last_seen.pop(session_id, None)
            self._via_recompute.discard(session_id)

    async def commit(self) -> None:
        topic = self.settings.topic("steps")
        offsets = {
            TopicPartition(topic, partition): self.assembler.commit_offset(partition, next_offset)
            for partition, next_offset in self.ledger.next_offsets().items()
        }
        assigned = self.steps.consumer.assignment()
        offsets = {tp: off for tp, off in offsets.items() if tp in assigned}
        if offsets:
            # aiokafka retries a commit forever while the broker is away: fail the batch instead
            # (the worker stops uncommitted, as when its publish fails)
            async with asyncio.timeout(self.settings.publish_timeout_s):
                await self.steps.consumer.commit(offsets)
