"""Crash safety of the assembly workers: at-least-once delivery, deterministic output
(design §2 invariant 5; issue 4, "Never lose, never duplicate silently").

What is real and what is scripted: the workers under test are real ``titoflow worker``
processes (``cli.dev.stack.start_worker``) in one consumer group on a real broker, killed with
SIGKILL; the segments are read back with the trainer's own ``SegmentConsumer``. No engine and no
ingress run: the step events are synthetic (``tests/support/load.py``, seeded) but schema-valid and
chained exactly as the ingress makes them (TITO steps naming their parent with ``prefix_len`` =
the parent's tokens, mid-session cache misses as ``rendered`` steps that extend the segment,
forks from earlier steps), published straight to ``<prefix>.steps`` keyed by session.

The expected output is the fault-free assembly of the same events in this process
(``workers.assembler.Assembler``); a fault-free run of a real worker must equal it too, which
validates that reference. Randomness is seeded; only timing (when a kill lands relative to a
worker's publish and commit) varies from run to run, and the outcome must not.

Three smaller tests stage, deterministically, moments that random kills hit only by chance: a
rebalance while a worker waits for the ack of its segments, a partition that comes back to the
worker that owned it, and a replay that starts in the middle of a session with a cache miss.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import itertools
import random
import re
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from aiokafka import ConsumerRecord, TopicPartition

from cli.dev.procs import ManagedProcess
from cli.dev.stack import start_worker
from schemas.events import DeadLetter, SegmentFinalized, StepRecorded, steps_topic_adapter
from tests.support.load import ScriptedLoad, reference_segments, scripted_load, segment_summary
from tests.support.topics import (
    dead_letters,
    partition_of,
    read_topic,
    read_until,
    segment_adapter,
)
from titoflow.bus import Publisher, RecordPublisher, make_consumer
from titoflow.client.consumer import SegmentConsumer
from titoflow.settings import Settings
from workers.worker import Worker

SEED = 20261121
SESSIONS = 120
BURSTS = 10
KILLS = 5
# Every segment must be out this long after the last publish, kills included.
ARRIVAL_TIMEOUT_S = 180.0
# Between a kill and the replacement, and between kills: tansu needs the 6 s session timeout to
# drop a SIGKILLed member and ~3 s to rebalance, so kills land in every phase of a rebalance.
REPLACE_AFTER_S = (0.2, 2.5)
KILL_EVERY_S = (3.0, 8.0)
BURST_PAUSE_S = (0.3, 4.0)
# A group rebalance on tansu takes ~3-6 s; a replacement joins and re-reads within ~10 s.
REBALANCE_WAIT_S = 15.0
TAKEOVER_WAIT_S = 25.0


def assignments(worker: ManagedProcess) -> list[list[int]]:
    """Every partition set a worker process logged as assigned to it, in order."""
    found = re.findall(r"assigned partitions \[([0-9, ]*)\]", worker.log_path.read_text())
    return [[int(p) for p in line.split(",") if p.strip()] for line in found]


def holds_partitions(worker: ManagedProcess, count: int) -> bool:
    done = assignments(worker)
    return bool(done) and len(done[-1]) == count


async def publish_burst(
    publisher: Publisher, settings: Settings, load: ScriptedLoad, start: int, end: int
) -> dict[str, list[tuple[int, int]]]:
    """Publish events ``[start, end)`` of the timeline in order; where each landed, by session."""
    placed: dict[str, list[tuple[int, int]]] = {}
    topic = settings.topic("steps")
    for record in load.events[start:end]:
        where = await publisher.publish(topic, record.session_id, record.value)
        placed.setdefault(record.session_id, []).append(where)
    return placed


async def consume_until_complete(
    settings: Settings, expected: set[str], workers: list[ManagedProcess]
) -> tuple[dict[str, bytes], int]:
    """What the trainer's SegmentConsumer yields until every expected id arrived (bounded):
    segment id → JSON, and how many duplicates it dropped on the way."""
    got: dict[str, bytes] = {}
    consumer = SegmentConsumer(settings, unused_samples=True)  # every segment, marked or not
    async with consumer:
        try:
            async with asyncio.timeout(ARRIVAL_TIMEOUT_S):
                async for segment in consumer:
                    got[segment.segment_id] = segment.model_dump_json().encode()
                    if expected <= got.keys():
                        break
        except TimeoutError:
            pass  # the assertions below say what is missing
    dead = [f"{w.name} (exit {w.proc.returncode})" for w in workers if not w.alive()]
    assert not dead, f"workers exited on their own: {dead}"
    return got, consumer.duplicates_dropped


def missing_report(
    missing: set[str],
    reference: dict[str, bytes],
    placed: dict[str, list[tuple[int, int]]],
    log_dir: Path,
) -> str:
    """Each missing segment, where its session's events sit, and what the workers logged."""
    logs = {p.name: p.read_text(errors="replace") for p in sorted(log_dir.glob("*.log"))}
    lines = []
    for segment_id in sorted(missing)[:10]:
        session = SegmentFinalized.model_validate_json(reference[segment_id]).session_id
        mentioned = [name for name, text in logs.items() if session in text]
        lines.append(
            f"{segment_summary(reference[segment_id])}\n"
            f"    events at (partition, offset): {placed.get(session)}\n"
            f"    logs mentioning the session: {mentioned}"
        )
    return "\n".join(lines)


def dead_letter_report(letters: list[ConsumerRecord], segments: list[ConsumerRecord]) -> str:
    """Each dead letter with the event it holds, and whether its session's segments were
    already on the segments topic (then the dead-lettered event was a replay, not poison)."""
    out_per_session = Counter(segment_adapter.validate_json(r.value).session_id for r in segments)
    reasons: Counter[str] = Counter()
    lines = []
    for record in letters:
        letter = DeadLetter.model_validate_json(record.value)
        reasons[letter.reason] += 1
        event = steps_topic_adapter.validate_json(base64.b64decode(letter.value_b64))
        what = type(event).__name__
        if isinstance(event, StepRecorded):
            what += f" {event.step_id[:8]} prefix={event.prefix} parent={event.parent_step_id}"
        lines.append(
            f"{letter.reason}: {letter.source_topic}[{letter.source_partition}]"
            f"@{letter.source_offset} session={event.session_id} {what}; segment records of the "
            f"session on the segments topic: {out_per_session[event.session_id]}"
        )
    return f"{dict(reasons)}\n" + "\n".join(lines[:20])


def check_segments(
    reference: dict[str, bytes],
    got: dict[str, bytes],
    placed: dict[str, list[tuple[int, int]]],
    log_dir: Path,
) -> None:
    missing = reference.keys() - got.keys()
    assert not missing, (
        f"{len(missing)} of {len(reference)} segments never arrived:\n"
        + missing_report(missing, reference, placed, log_dir)
    )
    extra = got.keys() - reference.keys()
    assert not extra, "segments a fault-free run does not make:\n" + "\n".join(
        segment_summary(got[s]) for s in sorted(extra)[:10]
    )
    wrong = [s for s in reference if got[s] != reference[s]]
    assert not wrong, "segments whose bytes differ from the fault-free run:\n" + "\n".join(
        f"got      {segment_summary(got[s])}\nexpected {segment_summary(reference[s])}"
        for s in wrong[:10]
    )


@dataclass
class TopicCopies:
    """Every segment record on the topic, by id: the first copy (all copies share a key, so one
    partition orders them) and the repeats."""

    first: dict[str, bytes]
    repeats: list[ConsumerRecord]
    records: int

    @classmethod
    def of(cls, records: list[ConsumerRecord]) -> TopicCopies:
        first: dict[str, bytes] = {}
        repeats = []
        for record in records:
            segment_id = segment_adapter.validate_json(record.value).segment_id
            if segment_id in first:
                repeats.append(record)
            else:
                first[segment_id] = record.value
        return cls(first, repeats, len(records))

    def not_identical(self) -> list[ConsumerRecord]:
        return [
            r
            for r in self.repeats
            if r.value != self.first[segment_adapter.validate_json(r.value).segment_id]
        ]

    def not_identical_report(self, reference: dict[str, bytes]) -> str:
        lines = []
        for record in self.not_identical()[:10]:
            segment_id = segment_adapter.validate_json(record.value).segment_id
            lines.append(
                f"repeat at {record.topic}[{record.partition}]@{record.offset}: "
                f"{segment_summary(record.value)}\n"
                f"    fault-free:  {segment_summary(reference[segment_id])}"
            )
        return "\n".join(lines)


async def test_fault_free_workers_match_the_in_process_reference(
    settings: Settings, tmp_path: Path
) -> None:
    """Validates the reference: two real workers, no faults, give exactly the in-process
    assembly, and publish each segment once."""
    load = scripted_load(SEED, SESSIONS)
    reference = reference_segments(load)
    workers = [start_worker(settings, tmp_path, f"worker{i}") for i in range(2)]
    publisher = Publisher(settings)
    await publisher.start()
    try:
        # Published once the group is settled, so no rebalance re-reads anything.
        for worker in workers:
            settled = functools.partial(holds_partitions, worker, 4)
            await asyncio.to_thread(worker.wait_until, settled, 60, "4 partitions")
        placed = await publish_burst(publisher, settings, load, 0, len(load.events))
        got, duplicates = await consume_until_complete(settings, set(reference), workers)
        check_segments(reference, got, placed, tmp_path)
    finally:
        await publisher.stop()
        for worker in workers:
            worker.stop()
    records = await read_topic(settings, settings.topic("segments"))
    copies = TopicCopies.of(records)
    assert copies.first == reference
    assert copies.not_identical() == [], copies.not_identical_report(reference)
    print(
        f"\nfault-free: {len(reference)} segments, {len(copies.repeats)} repeats, "
        f"SegmentConsumer dropped {duplicates}"
    )
    letters = await dead_letters(settings)
    assert not letters, dead_letter_report(letters, records)


async def test_membership_changes_lose_nothing_and_replay_byte_identical_segments(
    settings: Settings, tmp_path: Path
) -> None:
    """Two worker processes in one group; the load is published in bursts while, at seeded
    random moments, five membership changes land: the longest-lived worker is SIGKILLed or
    leaves gracefully (SIGTERM) and a replacement starts, or a worker joins. After dedupe the
    trainer gets exactly the fault-free segments, byte for byte (every step in the segments the
    fault-free run puts it in, none made of part of a session); every repeat on the topic is a
    byte-identical copy; no valid event is dead-lettered."""
    started = time.monotonic()
    load = scripted_load(SEED, SESSIONS)
    reference = reference_segments(load)
    burst_rng = random.Random(SEED + 1)  # timing only: the events do not depend on it
    fault_rng = random.Random(SEED + 2)

    alive: dict[str, ManagedProcess] = {}
    everyone: list[ManagedProcess] = []
    kills: list[str] = []
    placed: dict[str, list[tuple[int, int]]] = {}

    def launch(name: str) -> None:
        alive[name] = start_worker(settings, tmp_path, name)
        everyone.append(alive[name])

    async def publish_in_bursts() -> None:
        cuts = sorted(burst_rng.sample(range(1, len(load.events)), BURSTS - 1))
        bounds = [0, *cuts, len(load.events)]
        for start, end in itertools.pairwise(bounds):
            for session, where in (
                await publish_burst(publisher, settings, load, start, end)
            ).items():
                placed.setdefault(session, []).extend(where)
            await asyncio.sleep(burst_rng.uniform(*BURST_PAUSE_S))

    async def kill_and_replace() -> None:
        changes = fault_rng.sample(["sigkill", "sigkill", "leave", "leave", "join"], KILLS)
        for number, change in enumerate(changes):
            await asyncio.sleep(fault_rng.uniform(*KILL_EVERY_S))
            # Membership changes of every kind while sessions are open: a SIGKILL or a graceful
            # leave of the longest-lived worker (every process meets one once it holds state,
            # the original pair included), then its replacement; or a worker joining. Each moves
            # partitions away from their owner, and (eager rebalances) often back to it.
            if change == "join":
                launch(f"joiner{number}")
                kills.append(f"join joiner{number}@{time.monotonic() - started:.1f}s")
                continue
            name = next(iter(alive))
            victim = alive.pop(name)
            assert victim.alive(), f"{name} died before its kill:\n{victim.log_tail()}"
            if change == "leave":
                await asyncio.to_thread(victim.stop)
            else:
                victim.kill()
            kills.append(f"{change} {name}@{time.monotonic() - started:.1f}s")
            await asyncio.sleep(fault_rng.uniform(*REPLACE_AFTER_S))
            launch(f"replacement{number}")

    for index in range(2):
        launch(f"worker{index}")
    publisher = Publisher(settings)
    await publisher.start()
    try:
        await asyncio.gather(publish_in_bursts(), kill_and_replace())
        faults_done = time.monotonic()
        got, duplicates = await consume_until_complete(
            settings, set(reference), list(alive.values())
        )
        arrived = time.monotonic()
    finally:
        await publisher.stop()
        for worker in everyone:
            worker.stop()

    records = await read_topic(settings, settings.topic("segments"))
    copies = TopicCopies.of(records)
    letters = await dead_letters(settings)
    per_segment = Counter(
        Counter(segment_adapter.validate_json(r.value).segment_id for r in records).values()
    )
    print(
        f"\nload: {load.stats}; {len(load.events)} events, {len(reference)} segments expected\n"
        f"membership changes (change, name@time): {kills}\n"
        f"every segment was out {arrived - faults_done:.1f}s after the last publish and kill; "
        f"total {time.monotonic() - started:.1f}s\n"
        f"SegmentConsumer dropped {duplicates} duplicates; the segments topic holds "
        f"{copies.records} records: {len(copies.repeats)} repeats, "
        f"{len(copies.not_identical())} of them not byte-identical to the first copy; "
        f"copies per segment → number of segments: {sorted(per_segment.items())}; "
        f"dead letters: {len(letters)}"
    )
    # Never lose, never a wrong sample: after dedupe, exactly the fault-free segments.
    check_segments(reference, got, placed, tmp_path)
    # The first copy on the topic is what any deduplicating reader keeps, whoever reads it.
    assert copies.first.keys() == reference.keys()
    assert all(copies.first[s] == reference[s] for s in reference)
    # Never duplicate silently: a repeat is the same bytes (a reader that lost its dedupe
    # memory, e.g. a restarted trainer, trains on it again), and a replayed event is no poison.
    problems = []
    if copies.not_identical():
        problems.append(
            f"{len(copies.not_identical())} repeats differ from the first copy:\n"
            + copies.not_identical_report(reference)
        )
    if letters:
        problems.append(f"{len(letters)} dead letters:\n" + dead_letter_report(letters, records))
    assert not problems, "\n".join(problems)


class GatedPublisher:
    """Wraps a worker's publisher: its segment publishes wait for ``gate``, which holds the worker
    between "segments made" and "segments acknowledged", the window a slow broker ack opens."""

    def __init__(self, inner: RecordPublisher, segments_topic: str) -> None:
        self.inner = inner
        self.gate = asyncio.Event()
        self.waiting = asyncio.Event()
        self._segments_topic = segments_topic

    async def publish(self, topic: str, key: str, value: bytes) -> tuple[int, int]:
        return await self.inner.publish(topic, key, value)

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None:
        if any(topic == self._segments_topic for topic, _, _ in records):
            self.waiting.set()
            await self.gate.wait()
        await self.inner.publish_many(records)


async def test_a_rebalance_never_commits_past_segments_not_yet_published(
    settings: Settings, tmp_path: Path
) -> None:
    """The group rebalances while a worker waits for the ack of a session's segments; the
    worker then dies before the ack. Its commit at revocation must not have passed that
    session, or no one ever emits the segments again.

    The worker under test runs in this process (a real ``workers.worker.Worker`` on the real
    broker) so its publish can be held; its death is the cancellation of its task, after which
    it publishes nothing, as after a SIGKILL. A real worker process then takes over.
    """
    load = scripted_load(SEED, sessions=1)
    [(segment_id, expected)] = reference_segments(load).items()
    steps = settings.topic("steps")
    publisher = Publisher(settings)
    await publisher.start()
    try:
        placed = await publish_burst(publisher, settings, load, 0, len(load.events))
    finally:
        await publisher.stop()
    [(session, where)] = placed.items()
    partition, first_offset = where[0]
    worker = Worker(settings)
    gated = GatedPublisher(worker.publisher, settings.topic("segments"))
    worker.publisher = gated
    stop = asyncio.Event()
    task = asyncio.create_task(worker.run(stop))
    newcomer = make_consumer(settings, steps, group_id=settings.worker_group)
    try:
        async with asyncio.timeout(60):
            await gated.waiting.wait()  # the session is finalized, its segment not yet acked
        await newcomer.start()  # a second member: the group rebalances now
        try:
            async with asyncio.timeout(REBALANCE_WAIT_S):
                while not newcomer.assignment():
                    await newcomer.getmany(timeout_ms=200)
        except TimeoutError:
            pass  # a worker may also hold the rebalance until its segments are acked
        committed = await newcomer.committed(TopicPartition(steps, partition))
    finally:
        task.cancel()  # the worker dies with its segment unacknowledged
        await asyncio.gather(task, return_exceptions=True)
        await newcomer.stop()
    replacement = start_worker(settings, tmp_path, "replacement")
    try:
        try:
            out = await read_until(
                settings,
                settings.topic("segments"),
                segment_adapter,
                lambda got: any(s.segment_id == segment_id for s in got),
                timeout_s=TAKEOVER_WAIT_S,
            )
        except TimeoutError:
            out = []
    finally:
        replacement.stop()
    assert out, (
        f"segment {segment_id} of {session} was lost: its events sit at "
        f"steps[{partition}] offsets {[o for _, o in where]}; the worker, revoked while the "
        f"segment's publish was unacknowledged, had committed offset {committed} (past the "
        f"session's first event {first_offset}), so no worker re-reads the session"
    )
    assert next(s for s in out if s.segment_id == segment_id).model_dump_json().encode() == (
        expected
    )


async def test_a_partition_that_comes_back_is_replayed_without_dead_letters(
    settings: Settings, tmp_path: Path
) -> None:
    """A worker owns a partition with one session still open and others finalized after it;
    the commit stays below the open session. A second member joins and leaves again, so the
    worker gets the partition back and re-reads it from that commit: the finalized sessions'
    steps are replays of work already published, not events to dead-letter, and the open
    session still completes exactly."""
    load = scripted_load(SEED, sessions=40)
    reference = reference_segments(load)
    partitions = list(range(settings.steps_partitions))
    by_partition: dict[int, list[str]] = {}
    for session in load.by_session:
        by_partition.setdefault(partition_of(session, settings), []).append(session)
    partition, [open_session, *done_sessions] = max(
        by_partition.items(), key=lambda item: len(item[1])
    )
    assert done_sessions, "the seed puts every session on its own partition"

    def segments_of(sessions: list[str]) -> set[str]:
        return {
            segment_id
            for segment_id, value in reference.items()
            if segment_adapter.validate_json(value).session_id in sessions
        }

    def arrived(segment_ids: set[str]) -> Callable[[list[SegmentFinalized]], bool]:
        return lambda got: segment_ids <= {s.segment_id for s in got}

    *open_events, open_finalize = load.by_session[open_session]
    worker = start_worker(settings, tmp_path, "worker")
    publisher = Publisher(settings)
    await publisher.start()
    try:
        steps = settings.topic("steps")
        where = [await publisher.publish(steps, open_session, r.value) for r in open_events]
        for session in done_sessions:
            where += [
                await publisher.publish(steps, session, r.value) for r in load.by_session[session]
            ]
        assert {p for p, _ in where} == {partition}
        await read_until(
            settings,
            settings.topic("segments"),
            segment_adapter,
            arrived(segments_of(done_sessions)),
            timeout_s=60.0,
        )
        newcomer = make_consumer(settings, steps, group_id=settings.worker_group)
        await newcomer.start()
        try:
            async with asyncio.timeout(60):
                while not newcomer.assignment():
                    await newcomer.getmany(timeout_ms=200)
        finally:
            await newcomer.stop()  # leaves the group: the worker gets every partition back
        await asyncio.to_thread(
            worker.wait_until,
            lambda: len(assignments(worker)) >= 3 and assignments(worker)[-1] == partitions,
            60,
            "all partitions back",
        )
        await publisher.publish(steps, open_session, open_finalize.value)
        out = await read_until(
            settings,
            settings.topic("segments"),
            segment_adapter,
            arrived(segments_of([open_session])),
            timeout_s=60.0,
        )
    finally:
        await publisher.stop()
        worker.stop()
    records = await read_topic(settings, settings.topic("segments"))
    copies = TopicCopies.of(records)
    expected = segments_of([open_session, *done_sessions])
    assert copies.first.keys() == expected
    assert all(copies.first[s] == reference[s] for s in expected)
    assert copies.not_identical() == [], copies.not_identical_report(reference)
    assert out
    letters = await dead_letters(settings)
    assert not letters, (
        f"partition {partition}: {open_session} open from offset {where[0][1]}, "
        f"{len(done_sessions)} sessions finalized after it; after the partition came back, "
        f"{len(letters)} replayed events were dead-lettered:\n"
        + dead_letter_report(letters, records)
    )


async def test_a_replay_from_mid_session_re_emits_byte_identical_segments(
    settings: Settings, tmp_path: Path
) -> None:
    """Session S has a mid-session cache miss (a ``rendered`` step). Session T, on the same
    partition, opens between S's first step and that rendered step and stays open while S
    finalizes and its segments are published. The worker is SIGKILLed; its replacement re-reads
    from the committed offset. Every segment it re-emits must be byte-identical to the first
    copy, which holds because the commit never falls inside a session (here: S's first event)."""
    load = scripted_load(SEED, sessions=40)
    reference = reference_segments(load)

    def rendered_after_start(session: str) -> int | None:
        """Index (among the session's records) of a cache-miss step after its first step."""
        events = [steps_topic_adapter.validate_json(r.value) for r in load.by_session[session]]
        steps = [i for i, e in enumerate(events) if isinstance(e, StepRecorded)]
        later = [i for i in steps[1:] if cast(StepRecorded, events[i]).prefix == "rendered"]
        return later[0] if later else None

    candidates = [
        (s, t, cut)
        for s in load.by_session
        if (cut := rendered_after_start(s)) is not None
        for t in load.by_session
        if t != s and partition_of(t, settings) == partition_of(s, settings)
    ]
    assert candidates, "the seed gives no session with a mid-session cache miss"
    s_session, t_session, cut = candidates[0]
    s_records, t_records = load.by_session[s_session], load.by_session[t_session]
    s_segments = {
        i for i, v in reference.items() if segment_adapter.validate_json(v).session_id == s_session
    }
    t_segments = {
        i for i, v in reference.items() if segment_adapter.validate_json(v).session_id == t_session
    }
    steps_topic = settings.topic("steps")
    partition = partition_of(s_session, settings)
    worker = start_worker(settings, tmp_path, "worker")
    replacement: ManagedProcess | None = None
    publisher = Publisher(settings)
    await publisher.start()
    watcher = make_consumer(settings, group_id=settings.worker_group)  # reads commits only
    await watcher.start()
    try:
        where = [await publisher.publish(steps_topic, s_session, r.value) for r in s_records[:cut]]
        _, t_first = await publisher.publish(steps_topic, t_session, t_records[0].value)
        where += [await publisher.publish(steps_topic, s_session, r.value) for r in s_records[cut:]]
        assert {p for p, _ in where} == {partition}
        await read_until(
            settings,
            settings.topic("segments"),
            segment_adapter,
            lambda got: s_segments <= {s.segment_id for s in got},
            timeout_s=60.0,
        )
        tp = TopicPartition(steps_topic, partition)
        # The commit may not fall inside S: it stays at S's first event while T, opened in the
        # middle of S, is open (before the fix it sat at T's first event, inside S).
        async with asyncio.timeout(30):
            while await watcher.committed(tp) is None:
                await asyncio.sleep(0.2)
        assert await watcher.committed(tp) == where[0][1]
        worker.kill()
        replacement = start_worker(settings, tmp_path, "replacement")
        for record in t_records[1:]:
            await publisher.publish(steps_topic, t_session, record.value)
        await read_until(
            settings,
            settings.topic("segments"),
            segment_adapter,
            lambda got: t_segments <= {s.segment_id for s in got},
            timeout_s=60.0,
        )
    finally:
        await watcher.stop()
        await publisher.stop()
        worker.stop()
        if replacement is not None:
            replacement.stop()
    records = await read_topic(settings, settings.topic("segments"))
    copies = TopicCopies.of(records)
    assert copies.first.keys() == s_segments | t_segments
    assert all(copies.first[s] == reference[s] for s in copies.first)
    s_offsets = [o for _, o in where]
    assert copies.not_identical() == [], (
        f"steps[{partition}]: {s_session} at offsets {s_offsets} (its cache-miss step at "
        f"offset {s_offsets[cut]}), {t_session} open from offset {t_first}; the replacement "
        f"re-emitted:\n" + copies.not_identical_report(reference)
    )
    letters = await dead_letters(settings)
    assert not letters, dead_letter_report(letters, records)
