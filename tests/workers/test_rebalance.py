"""A steps partition changing hands loses no step and makes no segment of part of a session
(issue 42): the commit bound over random interleavings, and the race that broke it, staged on the
real broker.

The property test runs the worker's own bookkeeping (``workers.partitions.PartitionLedger``, the
``Assembler`` and its commit bound) for two workers over a simulated log: the simulation stands in
for Kafka (positions, commits, assignments) and for the worker's batch loop, which it follows step
for step (``Worker._apply``: a verdict per record, a batch fetched under one assignment and handled
under the next, a revocation between a batch's apply and its publish). The staged test runs a real
``workers.worker.Worker`` on tansu.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, ClassVar

import pytest
from aiokafka import TopicPartition
from faststream.kafka.annotations import KafkaMessage
from hypothesis import given, settings
from hypothesis import strategies as st

import workers.worker
from schemas.events import SegmentFinalized
from tests.support.load import ScriptedLoad, reference_segments, scripted_load
from tests.support.topics import (
    dead_letters,
    partition_of,
    read_until,
    segment_adapter,
)
from titoflow.bus import (
    BatchSubscription,
    Publisher,
    RebalanceListener,
    batch_records,
    make_consumer,
)
from titoflow.settings import Settings
from workers.assembler import Assembler
from workers.partitions import PartitionLedger, Verdict

PARTITIONS = 2


@dataclass
class Log:
    """The steps topic: records per partition, and the offsets each session's events sit at."""

    load: ScriptedLoad
    records: list[list[bytes]] = field(default_factory=lambda: [[] for _ in range(PARTITIONS)])
    spans: dict[str, tuple[int, int, int | None]] = field(default_factory=dict)
    published: int = 0
    committed: dict[int, int] = field(default_factory=dict)

    def publish(self) -> None:
        event = self.load.events[self.published]
        self.published += 1
        partition = int(event.session_id.rsplit("-", 1)[1]) % PARTITIONS
        offset = len(self.records[partition])
        self.records[partition].append(event.value)
        first = self.spans.get(event.session_id, (partition, offset, None))[1]
        ended = b'"session_finalized"' in event.value
        self.spans[event.session_id] = (partition, first, offset if ended else None)

    def commit(self, partition: int, offset: int) -> None:
        """The invariant: a commit never falls inside a session (open, or ended at or past it)."""
        for session, (p, first, end) in self.spans.items():
            if p == partition and first < offset and (end is None or end >= offset):
                raise AssertionError(
                    f"commit {offset} on partition {partition} passes {session}'s first event "
                    f"{first} (ended at {end})"
                )
        self.committed[partition] = offset


@dataclass
class SimWorker:
    """One worker: the real ledger and assembler, a consumer's positions, a batch in hand (fetched,
    not yet applied) and a batch applied whose segments are not yet published."""

    log: Log
    ledger: PartitionLedger = field(default_factory=PartitionLedger)
    assembler: Assembler = field(default_factory=Assembler)
    positions: dict[int, int] = field(default_factory=dict)
    in_hand: list[tuple[int, int, bytes]] = field(default_factory=list)
    unpublished: list[SegmentFinalized] | None = None
    out: list[SegmentFinalized] = field(default_factory=list)
    dead: list[str] = field(default_factory=list)

    def fetch(self) -> None:
        if self.in_hand:
            return
        for partition, position in self.positions.items():
            taken = self.log.records[partition][position : position + 3]
            self.in_hand += [(partition, position + i, v) for i, v in enumerate(taken)]
            self.positions[partition] = position + len(taken)

    def apply(self) -> None:
        """``Worker._apply`` up to the publish."""
        if self.unpublished is not None:
            return
        batch, self.in_hand = self.in_hand, []
        segments: list[SegmentFinalized] = []
        stale: set[int] = set()
        for partition, offset, value in batch:
            if partition in stale:
                continue
            verdict = self.ledger.verdict(partition, offset)
            if verdict is Verdict.GAP:  # no retention here: sent back to the bound
                reading = self.ledger.reading(partition)
                assert reading is not None
                if partition in self.positions:
                    self.positions[partition] = reading.next
            if verdict is Verdict.APPLY:
                applied = self.assembler.apply(value, partition, offset)
                if applied.dead_letter_reason:
                    self.dead.append(f"{partition}@{offset}: {applied.dead_letter_reason}")
                segments += applied.segments
                self.ledger.applied(partition, offset)
            elif verdict is not Verdict.READ:
                stale.add(partition)
        self.unpublished = segments

    def publish_and_commit(self) -> None:
        if self.unpublished is None:
            return
        self.out += self.unpublished
        self.unpublished = None
        self.commit()

    def commit(self) -> None:
        for partition, next_offset in self.ledger.next_offsets().items():
            self.log.commit(partition, self.assembler.commit_offset(partition, next_offset))

    def revoke(self) -> None:
        if self.unpublished is None:  # between batches: the listener commits
            self.commit()
        held = self.ledger.held()
        self.ledger.revoke(held)
        self.assembler.drop_partitions(set(held))
        self.positions = {}

    def assign(self, partitions: list[int]) -> None:
        for partition in partitions:
            bound = self.log.committed.get(partition, 0)
            self.ledger.assign(partition, bound)
            self.positions[partition] = bound  # the seek to the bound


def rebalance(workers: list[SimWorker], owners: list[int]) -> None:
    for worker in workers:
        worker.revoke()
    for index, worker in enumerate(workers):
        worker.assign([p for p in range(PARTITIONS) if owners[p] == index])


ACTIONS = ["publish"] * 4 + ["fetch", "apply", "publish_commit"] * 2 + ["rebalance", "crash"]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(0, 10_000),
    st.lists(
        st.tuples(st.sampled_from(ACTIONS), st.integers(0, 1), st.integers(0, 1)),
        min_size=20,
        max_size=160,
    ),
)
def test_the_commit_bound_holds_and_every_segment_is_whole_over_random_interleavings(
    seed: int, actions: list[tuple[str, int, int]]
) -> None:
    """Steps, finalizes, fetches, applies, publishes, commits, rebalances (a partition moving
    away, back, or staying) and crashes in any order: no commit falls inside a session, and once
    the log is drained under a stable assignment the segments published are exactly the
    fault-free ones (repeats byte-identical), with no dead letter."""
    load = scripted_load(seed, sessions=6)
    log = Log(load)
    workers = [SimWorker(log), SimWorker(log)]
    rebalance(workers, [0, 1])
    for kind, index, owner in actions:
        worker = workers[index]
        if kind == "publish" and log.published < len(load.events):
            log.publish()
        elif kind == "fetch":
            worker.fetch()
        elif kind == "apply":
            worker.apply()
        elif kind == "publish_commit":
            worker.publish_and_commit()
        elif kind == "rebalance":
            rebalance(workers, [owner, 1 - owner])
        elif kind == "crash":
            out = worker.out
            workers[index] = SimWorker(log, out=out)  # all else is lost, unpublished segments too
            rebalance(workers, [owner, 1 - owner])
    while log.published < len(load.events):
        log.publish()
    for worker in workers:  # whatever was in hand or applied finishes first, then a stable drain
        worker.apply()
        worker.publish_and_commit()
    rebalance(workers, [0, 1])
    for _ in range(10 * len(load.events)):
        for worker in workers:
            worker.fetch()
            worker.apply()
            worker.publish_and_commit()
    reference = reference_segments(load)
    got: dict[str, bytes] = {}
    for worker in workers:
        for segment in worker.out:
            value = segment.model_dump_json().encode()
            assert got.setdefault(segment.segment_id, value) == value, "a repeat differs"
    assert [d for w in workers for d in w.dead] == []
    assert got.keys() == reference.keys()
    assert got == reference


class HeldSubscription(BatchSubscription):
    """The worker's subscription, holding one batch between the consumer handing it over and the
    worker applying it, until the worker's partitions are revoked; then it is applied before the
    revocation returns, so before the group hands out the new assignment: a batch applied in the
    window a rebalance leaves open (on tansu ~3 s, or up to the session timeout while the group
    waits for a member that died)."""

    hold_offsets: ClassVar[set[tuple[int, int]]] = set()
    arrived = asyncio.Event()
    release = asyncio.Event()
    applied = asyncio.Event()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        listener: RebalanceListener = kwargs["listener"]
        revoke = listener.on_partitions_revoked

        async def revoke_then_apply(revoked: list[TopicPartition]) -> None:
            await revoke(revoked)
            if revoked and self.arrived.is_set() and not self.release.is_set():
                self.release.set()
                await self.applied.wait()

        listener.on_partitions_revoked = revoke_then_apply

    async def _on_batch(self, message: KafkaMessage) -> None:
        batch = batch_records(message)
        held = any((r.partition, r.offset) in self.hold_offsets for r in batch)
        if held:
            self.hold_offsets.clear()
            self.arrived.set()
            await self.release.wait()
        await super()._on_batch(message)
        if held:
            self.applied.set()


async def test_a_batch_handed_over_before_a_revocation_is_not_applied_after_it(
    settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loss of issue 42, staged: a worker holds an open session; the batch with its last
    step and its finalize is handed over; a second member joins, and the worker's partitions are
    revoked (it commits the bound: the session's first event) and the batch is applied before the
    group completes the rebalance; then the member leaves and the worker gets everything back.
    Applied as it came (main at 499a9fc), that batch met forgotten sessions: the step was skipped
    as an orphan, the finalize found nothing, and the commit after it passed the session, which
    no worker then emitted. The session's segment must come out whole, as the fault-free
    assembly makes it, with no dead letter."""
    load = scripted_load(20261128, sessions=8)
    reference = reference_segments(load)
    session, records = max(load.by_session.items(), key=lambda item: len(item[1]))
    expected = {
        i: v for i, v in reference.items() if segment_adapter.validate_json(v).session_id == session
    }
    steps = settings.topic("steps")
    HeldSubscription.arrived, HeldSubscription.release = asyncio.Event(), asyncio.Event()
    HeldSubscription.applied = asyncio.Event()
    monkeypatch.setattr(workers.worker, "BatchSubscription", HeldSubscription)
    worker = workers.worker.Worker(settings)
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    publisher = Publisher(settings)
    await publisher.start()
    newcomer = make_consumer(settings, steps, group_id=settings.worker_group)
    partition = partition_of(session, settings)
    stage = "started"
    try:
        stage = "assignment"
        async with asyncio.timeout(60):
            while len(worker.ledger.held()) < settings.steps_partitions:
                await asyncio.sleep(0.1)
        stage = "head published"
        head = [await publisher.publish(steps, session, r.value) for r in records[:-2]]
        async with asyncio.timeout(30):
            while session not in worker.assembler.open_sessions:
                await asyncio.sleep(0.05)
        stage = "session open"
        next_offset = head[-1][1] + 1
        HeldSubscription.hold_offsets = {(partition, next_offset)}
        tail = [await publisher.publish(steps, session, r.value) for r in records[-2:]]
        assert [p for p, _ in head + tail] == [partition] * len(records)
        stage = "tail published"
        async with asyncio.timeout(30):
            await HeldSubscription.arrived.wait()  # the last step and finalize, handed over
        stage = "batch held"
        await newcomer.start()  # a second member: the worker's partitions are revoked
        async with asyncio.timeout(60):
            await HeldSubscription.applied.wait()  # between the revocation and the assignment
        stage = "applied"
        async with asyncio.timeout(60):
            while not newcomer.assignment():
                await newcomer.getmany(timeout_ms=200)
        stage = "newcomer assigned"
        await newcomer.stop()  # it leaves: the worker gets every partition back
        stage = "newcomer left"
        out = await read_until(
            settings,
            settings.topic("segments"),
            segment_adapter,
            lambda got: expected.keys() <= {s.segment_id for s in got},
            timeout_s=60.0,
        )
        committed = await worker.steps.consumer.committed(TopicPartition(steps, partition))
    except TimeoutError:
        out, committed = [], None
        stage = f"timed out after: {stage}"
    finally:
        HeldSubscription.release.set()
        stop.set()
        await asyncio.gather(task, return_exceptions=True)
        await publisher.stop()
        await newcomer.stop()
    got = {s.segment_id: s.model_dump_json().encode() for s in out if s.session_id == session}
    assert expected.keys() <= got.keys(), (
        f"{session}'s segments never came out whole: its events sit at steps[{partition}] "
        f"offsets {[o for _, o in head + tail]}; committed offset now {committed}; "
        f"got {len(got)} segments of it; {stage}"
    )
    assert {i: got[i] for i in expected} == expected
    letters = await dead_letters(settings)
    assert not letters, f"{len(letters)} dead letters"
