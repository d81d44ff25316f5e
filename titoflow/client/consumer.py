"""Trainer side: read finalized segments from ``<prefix>.segments``, each once, across restarts.

Workers deliver at least once (a crashed or rebalanced worker re-emits the segments of sessions
above its committed offset), and a repeat carries the same ``segment_id``; this consumer drops
it. Usage::

    async with SegmentConsumer(settings, group_id="trainer") as segments:
        async for segment in segments:
            ...  # train on it (or on a batch of them), checkpoint
            await segments.commit()

Invariants (the contract is docs/trainer.md "Delivery and restarts"):
- A group's offsets move only in :meth:`commit`, to at most just past what was handed out before
  it: what was handed out and not committed comes again after a crash (at least once into the
  caller).
- A repeat is dropped when its first copy is at most ``dedupe_horizon_s`` older on the same
  partition (a repeat and its first copy share their key, hence their partition), however many
  restarts lie between them: before a group consumer's first record of a partition it reads the
  partition back to one horizon before that record, remembering the ids it finds there.

The topic also carries ``SessionDiscarded`` notices (a session that yields no segment);
iterating gives segments only, :meth:`SegmentConsumer.records` gives both.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from types import TracebackType

from pydantic import BaseModel

from schemas.events import SegmentFinalized, SessionDiscarded, segments_topic_adapter
from titoflow.bus import (
    CommitFailedError,
    Consumer,
    ConsumerRecord,
    RebalanceListener,
    TopicPartition,
    make_consumer,
    pin_to_end,
)
from titoflow.client.dedupe import SeenIds, tail_cutoff_ms
from titoflow.settings import Settings

# Longer than a rollout (open to finalize) plus a worker failover: see docs/trainer.md.
DEDUPE_HORIZON_S = 3600.0
ASSIGNMENT_TIMEOUT_S = 30.0
# Reading back a horizon of one partition on start; past this the broker is not answering.
TAIL_READ_TIMEOUT_S = 300.0
# How long a trainer may take between asking for two records (a training step, a read-back)
# before its group takes the partitions away (aiokafka's max_poll_interval: 5 min by default,
# shorter than many training steps). A dead process loses them after the session timeout.
MAX_STEP_S = 86400.0


def _dedupe_key(segment_id: str | None, session_id: str) -> str:
    # A notice has no segment id: its session's is its id.
    return segment_id if segment_id is not None else f"discarded:{session_id}"


class _Identity(BaseModel):
    """The fields a record's dedupe key is made of; validating only these skips its arrays."""

    type: str
    session_id: str
    segment_id: str | None = None

    @property
    def key(self) -> str:
        return _dedupe_key(
            self.segment_id if self.type == "segment_finalized" else None, self.session_id
        )


class _Assignment(RebalanceListener):  # type: ignore[misc]
    def __init__(self, owner: SegmentConsumer) -> None:
        self.owner = owner

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        # Another member may hand out (and commit) records of these meanwhile: read them back
        # and count from its commit if they return.
        for tp in revoked:
            if self.owner._uncommitted.pop(tp, None) is not None:
                self.owner._lost.add(tp.partition)
            self.owner._seen.pop(tp, None)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        self.owner._resume(assigned)


class SegmentConsumer:
    def __init__(
        self,
        settings: Settings,
        group_id: str | None = None,
        from_end: bool = False,
        unused_samples: bool = False,
        dedupe_horizon_s: float = DEDUPE_HORIZON_S,
        start_offsets: Mapping[int, int] | None = None,
    ) -> None:
        """``group_id=None`` reads the whole topic without committing (inspection, tests);
        with ``from_end`` too, only what is published after ``__aenter__`` returned (a rollout
        driver waiting for the sessions it is about to run; on tansu also the last batch before
        it, see ``pin_to_end``). Iterating skips segments marked ``unused_sample`` (a client's
        retry, an unpicked best-of-n candidate: the reward was not earned through them) unless
        ``unused_samples``; :meth:`records` yields every one. ``start_offsets`` (partition →
        offset, as :meth:`offsets` gave them to the caller's checkpoint) overrides the group's
        committed offsets of those partitions when first assigned here."""
        if start_offsets and group_id is None:
            raise ValueError("start_offsets resume a consumer group: give a group_id too")
        self._settings = settings
        self._unused_samples = unused_samples
        self._group_id = group_id
        self._from_end = from_end and group_id is None
        self._horizon_ms = int(dedupe_horizon_s * 1000)
        topic = settings.topic("segments")
        if group_id is None:
            self._consumer = make_consumer(settings, topic, group_id=None)
        else:
            self._consumer = make_consumer(
                settings, group_id=group_id, max_poll_interval_ms=int(MAX_STEP_S * 1000)
            )
            self._consumer.subscribe([topic], listener=_Assignment(self))
        self._tail_reader: Consumer | None = None
        # Keys read back from a JSON checkpoint are strings.
        self._start_offsets = {int(p): int(o) for p, o in (start_offsets or {}).items()}
        self._resumed: set[int] = set()
        self._seen: dict[TopicPartition, SeenIds] = {}
        self._handed: dict[int, int] = {}  # partition → offset past what was handed out
        self._uncommitted: dict[TopicPartition, int] = {}  # the same, not committed yet
        self._lost: set[int] = set()  # taken away with records handed out, uncommitted
        self.duplicates_dropped = 0
        self.tail_records_read = 0  # records read back on (re)start to know their ids
        self.position: tuple[str, int, int] = (
            "",
            -1,
            -1,
        )  # (topic, partition, offset) last yielded

    async def __aenter__(self) -> SegmentConsumer:
        await self._consumer.start()
        if self._from_end:
            await pin_to_end(self._consumer, ASSIGNMENT_TIMEOUT_S)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self._consumer.stop()
        finally:
            if self._tail_reader is not None:
                await self._tail_reader.stop()

    def _resume(self, assigned: list[TopicPartition]) -> None:
        for tp in assigned:
            offset = self._start_offsets.get(tp.partition)
            if offset is not None and tp.partition not in self._resumed:
                self._resumed.add(tp.partition)
                self._consumer.seek(tp, offset)

    async def commit(self, offsets: Mapping[int, int] | None = None) -> None:
        """Commit, in the consumer group, everything handed out so far: call it once what you
        took is trained on (and saved, if you checkpoint). With ``offsets`` (partition → offset),
        only those partitions, each up to the lower of the given offset and what was handed out
        (a caller that holds records back, :mod:`titoflow.client.torch_data`). Raises
        ``TimeoutError`` when the broker does not answer within ``publish_timeout_s`` (nothing is
        lost: call it again), and ``CommitFailedError`` once after a rebalance took partitions
        away with records handed out and not committed (their new owner hands those out again)."""
        if self._group_id is None:
            raise RuntimeError("commit() needs a consumer group: SegmentConsumer(group_id=...)")
        commits = (
            dict(self._uncommitted)
            if offsets is None
            else {
                tp: min(handed, offsets[tp.partition])
                for tp, handed in self._uncommitted.items()
                if tp.partition in offsets
            }
        )
        if commits:
            # aiokafka retries a commit for as long as the broker is away.
            async with asyncio.timeout(self._settings.publish_timeout_s):
                await self._consumer.commit(commits)
            for tp, offset in commits.items():
                if self._uncommitted.get(tp) == offset:
                    del self._uncommitted[tp]
        if self._lost:
            lost, self._lost = sorted(self._lost), set()
            raise CommitFailedError(f"partitions {lost} were reassigned before this commit")

    def offsets(self) -> dict[int, int]:
        """Partition → the offset just past what was handed out (where ``start_offsets``
        resumed, for partitions nothing was handed out of yet): save it with your checkpoint."""
        return self._start_offsets | self._handed

    async def _reader(self) -> Consumer:
        if self._tail_reader is None:
            reader = make_consumer(self._settings, group_id=None)
            await reader.start()
            self._tail_reader = reader
        return self._tail_reader

    async def _read_back(self, tp: TopicPartition, first: ConsumerRecord, seen: SeenIds) -> None:
        """Remember the ids of the records one horizon before ``first``: the only ones a repeat
        from ``first`` on can repeat."""
        reader = await self._reader()
        cutoff = max(0, tail_cutoff_ms(first.timestamp, self._horizon_ms))
        found = (await reader.offsets_for_times({tp: cutoff})).get(tp)
        # None, or tansu's timestamp -1: no record that recent, so none before ``first`` either.
        if found is None or found.timestamp < 0 or found.offset >= first.offset:
            return
        reader.assign([tp])
        reader.seek(tp, found.offset)
        async with asyncio.timeout(TAIL_READ_TIMEOUT_S):
            while await reader.position(tp) < first.offset:
                batch = await reader.getmany(tp, timeout_ms=1000)
                for record in batch.get(tp, []):
                    if record.offset < first.offset:
                        seen.first_time(
                            _Identity.model_validate_json(record.value).key, record.timestamp
                        )
                        self.tail_records_read += 1

    async def __aiter__(self) -> AsyncIterator[SegmentFinalized]:
        async for record in self.records():
            if isinstance(record, SegmentFinalized) and (
                self._unused_samples or not record.unused_sample
            ):
                yield record

    async def records(self) -> AsyncIterator[SegmentFinalized | SessionDiscarded]:
        """Segments and discard notices, each once (a notice's id is its session's)."""
        while True:
            batch = await self._consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                seen = self._seen.get(tp)
                if seen is None:
                    seen = self._seen[tp] = SeenIds(self._horizon_ms)
                    if self._group_id is not None:
                        await self._read_back(tp, records[0], seen)
                for record in records:
                    if self._seen.get(tp) is not seen:
                        break  # revoked meanwhile: its next owner reads on from the commit
                    event = segments_topic_adapter.validate_json(record.value)
                    self._handed[tp.partition] = self._uncommitted[tp] = record.offset + 1
                    segment_id = event.segment_id if isinstance(event, SegmentFinalized) else None
                    if not seen.first_time(
                        _dedupe_key(segment_id, event.session_id), record.timestamp
                    ):
                        self.duplicates_dropped += 1
                        continue
                    self.position = (record.topic, record.partition, record.offset)
                    yield event
