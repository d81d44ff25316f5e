"""``titoflow replay`` against a real broker: a recorded steps topic, assembled live by a real
worker process, replays to the very same segment bytes — from the beginning, filtered by session
or instance, from an offset or a time, to stdout, a file or a topic — and the live group's
offsets never move."""

from __future__ import annotations

import asyncio
import io
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from aiokafka import TopicPartition
from aiokafka.partitioner import DefaultPartitioner

from cli.dev.stack import start_worker
from cli.main import main
from schemas.events import (
    DeadLetter,
    SegmentFinalized,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
    VersionSpan,
)
from schemas.reasons import DeadLetterReason
from tests.support.factories import recorded_step
from titoflow.bus import Publisher, ensure_topics, make_consumer
from titoflow.settings import PROJECT_ROOT, Settings
from workers.inspect.decode import TokenDecoder
from workers.inspect.scan import from_segments_topic, from_steps_topic
from workers.inspect.view import build_view
from workers.replay.driver import replay
from workers.replay.options import ReplayOptions, parse_time
from workers.replay.report import ReplayReport, format_summary
from workers.replay.sinks import JsonlSink, replay_to
from workers.worker import assembler_for

IDLE_S = 2.0  # the live worker closes the never-finalized session after this long
LIVE_TIMEOUT_S = 90.0


# --- a recorded steps topic -----------------------------------------------------------------------


def step(
    session: str,
    step_id: str,
    tail: list[int],
    completion: list[int],
    parent: str | None = None,
    prefix_len: int = 0,
    **extra: Any,
) -> StepRecorded:
    return recorded_step(
        f"{session}/{step_id}",
        tail,
        completion,
        f"{session}/{parent}" if parent else None,
        prefix_len,
        session=session,
        event_time=time.time(),
        chain_id=extra.pop("chain_id", f"{session}/chain"),
        completion_logprobs=[-0.25 * (i + 1) for i in range(len(completion))],
        model="policy",
        engine_url="http://engine",
        engine_request_id=f"req-{step_id}",
        new_messages=[{"role": "user", "content": step_id}],
        response_message={"role": "assistant", "content": "..."},
        render_ms=1.0,
        engine_ms=2.0,
        **extra,
    )


def finalize(session: str, **metadata: Any) -> SessionFinalized:
    return SessionFinalized(session_id=session, event_time=time.time(), metadata=metadata)


def first_batch() -> list[tuple[str, bytes]]:
    """Sessions with forks, cache misses, a rewrite, a duplicate, a late step, an open session
    and a poison record: every path the live worker takes."""
    a, b, g, d = "alpha", "beta", "gamma", "delta"
    events: list[Any] = [
        # alpha: announced with its instance, three TITO turns, finalized, then a late step.
        SessionOpened(
            session_id=a, event_time=time.time(), instance_id="prompt-A", metadata={"task": 1}
        ),
        step(a, "1", [1, 2, 3], [10, 11], instance_id="prompt-A"),
        step(a, "2", [4], [12], parent="1", prefix_len=5, instance_id="prompt-A"),
        step(
            a,
            "3",
            [5, 6],
            [13, 14, 15],
            parent="2",
            prefix_len=7,
            instance_id="prompt-A",
            weight_versions=[VersionSpan(version="v2", start=0, end=3)],
        ),
        finalize(a, reward=1.0),
        # beta: same instance, a duplicate, and a fork from its first turn (two segments).
        step(b, "1", [1, 2], [20, 21], instance_id="prompt-A"),
        step(b, "2", [3], [22], parent="1", prefix_len=4, instance_id="prompt-A"),
        step(b, "2", [3], [22], parent="1", prefix_len=4, instance_id="prompt-A"),  # redelivered
        step(b, "3", [4, 4], [23], parent="1", prefix_len=4, instance_id="prompt-A"),
        finalize(b, reward=0.0),
        # gamma: no announcement; a rendered cache miss that extends, sent twice, then a
        # rewritten history.
        step(g, "1", [7, 8, 9], [30], instance_id="prompt-B"),
        step(g, "2", [7, 8, 9, 30, 5], [31, 32], instance_id="prompt-B"),
        step(g, "2", [7, 8, 9, 30, 5], [31, 32], instance_id="prompt-B"),
        step(g, "3", [7, 99, 9, 30, 5, 31, 32, 6], [33], instance_id="prompt-B"),
        finalize(g),
        # delta: never finalized, no instance: the live worker closes it as idle.
        step(d, "1", [40, 41], [42]),
        step(d, "2", [43], [44, 45], parent="1", prefix_len=3),
    ]
    records = [(e.session_id, e.model_dump_json().encode()) for e in events]
    records.append(("poison", b"\xff not an event"))
    records.append(
        (a, step(a, "4", [7], [16], parent="3", prefix_len=12).model_dump_json().encode())
    )
    return records


def by_key(records: list[tuple[str, bytes]]) -> list[list[tuple[str, bytes]]]:
    groups: dict[str, list[tuple[str, bytes]]] = {}
    for key, value in records:
        groups.setdefault(key, []).append((key, value))
    return list(groups.values())


def same_partition_as(session: str, partitions: int, prefix: str) -> str:
    """A session id whose key lands in the same steps partition as ``session``."""
    partitioner = DefaultPartitioner()
    ids = list(range(partitions))
    target = partitioner(session.encode(), ids, ids)
    return next(
        name
        for name in (f"{prefix}-{i}" for i in range(10_000))
        if partitioner(name.encode(), ids, ids) == target
    )


def second_batch(zeta: str) -> list[tuple[str, bytes]]:
    e = "epsilon"
    events: list[Any] = [
        step(zeta, "1", [50, 51], [52], instance_id="prompt-Z"),
        step(zeta, "2", [53], [54, 55], parent="1", prefix_len=3, instance_id="prompt-Z"),
        finalize(zeta),
        step(e, "1", [60], [61, 62], instance_id="prompt-C"),
        step(e, "2", [63], [64], parent="1", prefix_len=3, instance_id="prompt-C"),
        finalize(e, reward=0.5),
    ]
    return [(ev.session_id, ev.model_dump_json().encode()) for ev in events]


@dataclass(frozen=True)
class Live:
    """A segment as the live worker published it."""

    partition: int
    key: bytes
    value: bytes

    @property
    def segment(self) -> SegmentFinalized:
        return SegmentFinalized.model_validate_json(self.value)


@dataclass
class Recording:
    settings: Settings
    positions: dict[str, list[tuple[int, int]]]  # session: (partition, offset) of its records
    boundary: float  # between the two batches
    zeta: str
    live: list[Live]
    letters: list[tuple[int, int, DeadLetterReason]]  # the live DLQ: partition, offset, reason
    committed: dict[TopicPartition, int | None] = field(default_factory=dict)

    def live_bytes(self, keep: Callable[[SegmentFinalized], bool] = lambda s: True) -> list[bytes]:
        return sorted(item.value for item in self.live if keep(item.segment))

    def first_offset(self, session: str) -> tuple[int, int]:
        return min(self.positions[session], key=lambda p: p[1])


async def read_topic(settings: Settings, topic: str) -> list[Any]:
    """Every record of ``topic`` up to its end offsets now, without a group."""
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    records: list[Any] = []
    try:
        tps = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        ends = await consumer.end_offsets(tps)
        async with asyncio.timeout(60):
            for tp in tps:
                while await consumer.position(tp) < ends[tp]:
                    batch = await consumer.getmany(tp, timeout_ms=500)
                    # tansu's end offset stops at the last batch's first record (workers
                    # publish a batch's segments together); a fetch's high watermark is right.
                    ends[tp] = max(ends[tp], consumer.highwater(tp) or 0)
                    records += [r for r in batch.get(tp, []) if r.offset < ends[tp]]
    finally:
        await consumer.stop()
    return records


async def group_offsets(settings: Settings) -> dict[TopicPartition, tuple[int | None, int]]:
    """The live group's committed offset and resulting position on every steps partition, asked
    by a consumer that has the group id but never joins (nor commits)."""
    topic = settings.topic("steps")
    consumer = make_consumer(settings, group_id=settings.worker_group)
    await consumer.start()
    try:
        tps = [TopicPartition(topic, p) for p in range(settings.steps_partitions)]
        consumer.assign(tps)
        return {tp: (await consumer.committed(tp), await consumer.position(tp)) for tp in tps}
    finally:
        await consumer.stop()


@pytest.fixture(scope="module")
async def recording(kafka_bootstrap: str, tmp_path_factory: pytest.TempPathFactory) -> Recording:
    """Publish both batches, let a real worker process assemble them, and keep what it did."""
    tag = uuid.uuid4().hex[:8]
    settings = Settings(
        bootstrap_servers=kafka_bootstrap,
        topic_prefix=f"test-replay-{tag}",
        worker_group=f"live-{tag}",
        idle_finalize_s=IDLE_S,
    )
    await ensure_topics(settings)
    zeta = same_partition_as("alpha", settings.steps_partitions, "zeta")
    positions: dict[str, list[tuple[int, int]]] = {}
    publisher = Publisher(settings)

    async def publish(records: list[tuple[str, bytes]]) -> None:
        for key, value in records:
            placed = await publisher.publish(settings.topic("steps"), key, value)
            positions.setdefault(key, []).append(placed)

    try:
        # Sessions side by side, each in order (as the ingress writes them): the producer packs
        # several records into one batch.
        await asyncio.gather(*(publish(records) for records in by_key(first_batch())))
        await asyncio.sleep(1.0)
        boundary = time.time()
        await asyncio.sleep(1.0)
        await publish(second_batch(zeta))
    finally:
        await publisher.stop()
    assert positions[zeta][0][0] == positions["alpha"][0][0]

    worker = start_worker(settings, tmp_path_factory.mktemp("live-worker"))
    try:
        # The worker publishes before it commits, and commits past a session only once it is
        # closed: committed == end on every partition means every segment is out.
        steps = await read_topic(settings, settings.topic("steps"))
        ends: dict[int, int] = {}
        for record in steps:
            ends[record.partition] = record.offset + 1
        async with asyncio.timeout(LIVE_TIMEOUT_S):
            while True:
                offsets = await group_offsets(settings)
                if all(offsets[tp][0] == end for tp, end in _tps(settings, ends).items()):
                    break
                assert worker.alive(), worker.log_tail()
                await asyncio.sleep(0.5)
    finally:
        worker.stop()
    committed = {tp: c for tp, (c, _) in (await group_offsets(settings)).items()}
    live = [
        Live(r.partition, r.key, r.value)
        for r in await read_topic(settings, settings.topic("segments"))
    ]
    letters = [
        (letter.source_partition, letter.source_offset, letter.reason)
        for letter in (
            DeadLetter.model_validate_json(r.value)
            for r in await read_topic(settings, settings.topic("dlq"))
        )
    ]
    recorded = Recording(settings, positions, boundary, zeta, live, letters, committed)
    sessions = {item.segment.session_id for item in live}
    assert sessions == {"alpha", "beta", "gamma", "delta", "epsilon", zeta}, worker.log_tail()
    assert {i.segment.finalize_reason for i in live if i.segment.session_id == "delta"} == {"idle"}
    assert sum(i.segment.session_id == "beta" for i in live) == 2  # the fork
    assert len(letters) == 2  # the poison record and alpha's late step
    return recorded


def _tps(settings: Settings, ends: dict[int, int]) -> dict[TopicPartition, int]:
    return {TopicPartition(settings.topic("steps"), p): end for p, end in ends.items()}


async def assert_group_untouched(recorded: Recording) -> None:
    offsets = await group_offsets(recorded.settings)
    assert {tp: c for tp, (c, _) in offsets.items()} == recorded.committed
    assert {tp: p for tp, (_, p) in offsets.items()} == {
        tp: c if c is not None else 0 for tp, c in recorded.committed.items()
    }


async def cli(*argv: str) -> int:
    """``titoflow ...`` in this process (in a thread: the CLI runs its own event loop)."""
    return await asyncio.to_thread(main, list(argv))


async def replay_bytes(
    settings: Settings, options: ReplayOptions
) -> tuple[list[bytes], ReplayReport]:
    out = io.BytesIO()
    report = await replay(settings, options, JsonlSink(out))
    lines = out.getvalue().splitlines()
    assert len(lines) == report.segments
    return sorted(lines), report


# --- the tests ------------------------------------------------------------------------------------


async def test_replay_reproduces_the_live_segments_byte_for_byte(recording: Recording) -> None:
    replayed, report = await replay_bytes(recording.settings, ReplayOptions(finalize_open=True))
    assert replayed == recording.live_bytes()
    # The same records dead-lettered, for the same reasons, as the live worker's DLQ holds.
    noted = sorted((n.partition, n.offset, n.reason) for n in report.dead_letters)
    assert noted == sorted(recording.letters)
    assert report.open_sessions == ["delta"] and report.finalized_open
    assert "duplicate step id" in {n.reason for n in report.skipped}
    assert report.records == report.events == sum(len(p) for p in recording.positions.values())

    # Without --finalize-open the open session is reported, not emitted.
    replayed, report = await replay_bytes(recording.settings, ReplayOptions())
    assert replayed == recording.live_bytes(lambda s: s.session_id != "delta")
    summary = format_summary(report)
    assert "sessions still open at the end: 1, not emitted (--finalize-open): delta" in summary
    assert "dead letters (the live worker sends these to the DLQ): 2" in summary
    assert "late_step" in summary and "undecodable_event" in summary
    await assert_group_untouched(recording)


async def test_replay_reads_concurrently_written_partitions_to_their_end(
    settings: Settings,
) -> None:
    """Many sessions written at once land in multi-record batches, whose end tansu under-reports
    to ListOffsets; the replay still reads every record, and each session assembles as the
    worker's assembler assembles it alone."""
    sessions = [f"many-{i}" for i in range(60)]
    events = {
        sid: [
            step(sid, "1", [1, i], [2, 3], instance_id=f"prompt-{i % 5}"),
            step(sid, "2", [4], [5, i], parent="1", prefix_len=4, instance_id=f"prompt-{i % 5}"),
            finalize(sid, reward=float(i)),
        ]
        for i, sid in enumerate(sessions)
    }
    publisher = Publisher(settings)

    async def publish(sid: str) -> None:
        for event in events[sid]:
            await publisher.publish(settings.topic("steps"), sid, event.model_dump_json().encode())

    try:
        await asyncio.gather(*(publish(sid) for sid in sessions))
    finally:
        await publisher.stop()
    expected = []
    assembler = assembler_for(settings)  # sessions are independent: one at a time
    for sid in sessions:
        for offset, event in enumerate(events[sid]):
            expected += assembler.apply(event.model_dump_json().encode(), 0, offset).segments
    replayed, report = await replay_bytes(settings, ReplayOptions())
    assert report.records == 3 * len(sessions) and not report.open_sessions
    assert replayed == sorted(s.model_dump_json().encode() for s in expected)


async def test_cli_replay_in_a_subprocess_and_to_a_file(
    recording: Recording, tmp_path: Path
) -> None:
    settings = recording.settings
    flags = ["--bootstrap-servers", settings.bootstrap_servers]
    flags += ["--topic-prefix", settings.topic_prefix, "--worker-group", settings.worker_group]
    done = subprocess.run(
        [sys.executable, "-m", "cli", "replay", "--finalize-open", *flags],
        capture_output=True,
        cwd=PROJECT_ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()
    assert sorted(done.stdout.splitlines()) == recording.live_bytes()
    summary = done.stderr.decode()
    assert f"segments: {len(recording.live)} in" in summary
    assert "dead letters (the live worker sends these to the DLQ): 2" in summary

    out = tmp_path / "segments.jsonl"
    assert await cli("replay", "--out", str(out), "--progress", "always", *flags) == 0
    assert sorted(out.read_bytes().splitlines()) == recording.live_bytes(
        lambda s: s.session_id != "delta"
    )
    assert await cli("replay", "--from-offset", "x:1", *flags) == 2  # a usage error, not a crash
    await assert_group_untouched(recording)


async def test_filters_by_session_and_instance(recording: Recording) -> None:
    settings = recording.settings
    replayed, report = await replay_bytes(settings, ReplayOptions(session="beta"))
    assert replayed == recording.live_bytes(lambda s: s.session_id == "beta")
    assert report.events == len(recording.positions["beta"])
    assert not report.dead_letters and not report.open_sessions
    # Only the partition the session's key hashes to was read; an unknown session reads all.
    assert list(report.ranges) == [recording.first_offset("beta")[0]]
    replayed, report = await replay_bytes(settings, ReplayOptions(session="nobody"))
    assert replayed == [] and len(report.ranges) == settings.steps_partitions

    # alpha's finalize (and its late step) carry no instance: they follow their session.
    replayed, report = await replay_bytes(settings, ReplayOptions(instance="prompt-A"))
    assert replayed == recording.live_bytes(lambda s: s.instance_id == "prompt-A")
    assert {s.session_id for s in map(SegmentFinalized.model_validate_json, replayed)} == {
        "alpha",
        "beta",
    }
    assert [n.reason for n in report.dead_letters] == [DeadLetterReason.LATE_STEP]

    both = ReplayOptions(session="gamma", instance="prompt-B")
    replayed, _ = await replay_bytes(settings, both)
    assert replayed == recording.live_bytes(lambda s: s.session_id == "gamma")
    replayed, report = await replay_bytes(settings, ReplayOptions(instance="nobody"))
    assert replayed == [] and report.events == 0
    await assert_group_untouched(recording)


async def test_from_offset_and_from_time(recording: Recording, tmp_path: Path) -> None:
    settings = recording.settings
    # From the time between the batches: exactly the second batch's sessions.
    second = recording.live_bytes(lambda s: s.session_id in {"epsilon", recording.zeta})
    replayed, report = await replay_bytes(settings, ReplayOptions(from_time=recording.boundary))
    assert replayed == second
    assert not report.dead_letters and not report.skipped
    assert parse_time(str(recording.boundary)) == recording.boundary
    iso = datetime.fromtimestamp(recording.boundary, UTC).isoformat()
    out = tmp_path / "second.jsonl"
    flags = ["--bootstrap-servers", settings.bootstrap_servers]
    flags += ["--topic-prefix", settings.topic_prefix, "--progress", "never"]
    assert await cli("replay", "--from-time", iso, "--out", str(out), *flags) == 0
    assert sorted(out.read_bytes().splitlines()) == second

    # One partition from zeta's first record: the sessions before it there are gone, the
    # other partitions are read from the beginning.
    partition, offset = recording.first_offset(recording.zeta)

    def kept(segment: SegmentFinalized) -> bool:
        p, o = recording.first_offset(segment.session_id)
        return p != partition or o >= offset

    options = ReplayOptions(from_offsets={partition: offset}, finalize_open=True)
    replayed, report = await replay_bytes(settings, options)
    assert replayed == recording.live_bytes(kept)
    assert report.ranges[partition][0] == offset
    assert "alpha" not in {SegmentFinalized.model_validate_json(r).session_id for r in replayed}
    # The same through the flag, and an offset for every partition past the end: nothing.
    assert (
        await cli("replay", "--from-offset", f"{partition}:{offset}", "--out", str(out), *flags)
        == 0
    )
    assert sorted(out.read_bytes().splitlines()) == recording.live_bytes(
        lambda s: kept(s) and s.session_id != "delta"
    )
    replayed, report = await replay_bytes(settings, ReplayOptions(from_offset=10_000))
    assert replayed == [] and report.records == 0

    # Starting inside a session: its TITO steps lack their parents, so it is partial, as for a
    # worker that meets a session without its start: dead letters, never a segment of its tail.
    b_partition, b_offset = recording.first_offset("beta")
    _, report = await replay_bytes(
        settings, ReplayOptions(from_offsets={b_partition: b_offset + 1}, session="beta")
    )
    assert report.segments == 0
    assert {n.reason for n in report.dead_letters} == {DeadLetterReason.PARTIAL_SESSION}
    await assert_group_untouched(recording)


async def test_replay_to_a_topic_publishes_what_the_worker_published(
    recording: Recording,
) -> None:
    settings = recording.settings
    target = f"{settings.topic_prefix}.replayed"
    report = await replay_to(settings, ReplayOptions(finalize_open=True), to_topic=target)
    assert report.segments == len(recording.live)
    published = await read_topic(settings, target)
    # Same bytes, same keys, and so the same partitions as the live segments topic.
    assert sorted((r.partition, r.key, r.value) for r in published) == sorted(
        (item.partition, item.key, item.value) for item in recording.live
    )
    await assert_group_untouched(recording)


async def test_build_settings_given_to_a_replay_reach_the_assembler(
    recording: Recording, tmp_path: Path
) -> None:
    """Replaying with other build settings (here a segment size limit) shows what they would
    have produced; the live segments stay what they were."""
    settings = recording.settings
    out = tmp_path / "sized.jsonl"
    flags = ["--bootstrap-servers", settings.bootstrap_servers, "--topic-prefix"]
    flags += [settings.topic_prefix, "--session", "alpha", "--progress", "never"]
    assert await cli("replay", "--max-segment-tokens", "6", "--out", str(out), *flags) == 0
    sized = [SegmentFinalized.model_validate_json(line) for line in out.read_bytes().splitlines()]
    [live] = [item.segment for item in recording.live if item.segment.session_id == "alpha"]
    assert live.finalize_reason == "finalized" and len(sized) > 1
    assert "size" in {s.finalize_reason for s in sized}
    assert sized[-1].token_ids[-3:] == live.token_ids[-3:]  # the last turn's completion
    await assert_group_untouched(recording)


async def test_inspect_finds_a_session_on_the_segments_topic_or_by_replaying_steps(
    recording: Recording, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = recording.settings
    found = await from_segments_topic(settings, "beta")
    assert sorted(item.segment.model_dump_json().encode() for item in found) == (
        recording.live_bytes(lambda s: s.session_id == "beta")
    )

    alpha = await from_steps_topic(settings, "alpha")
    [item] = alpha.loaded
    assert (
        item.segment.model_dump_json().encode()
        == recording.live_bytes(lambda s: s.session_id == "alpha")[0]
    )
    assert sorted(alpha.step_events) == ["alpha/1", "alpha/2", "alpha/3", "alpha/4"]
    view = build_view(item, TokenDecoder(None), alpha.step_events)
    assert view.version_names() == ["v2"] and view.steps[2].metadata["engine_request_id"] == "req-3"
    delta = await from_steps_topic(settings, "delta")
    assert delta.still_open == {item.segment.segment_id for item in delta.loaded} != set()

    flags = ["--bootstrap-servers", settings.bootstrap_servers, "--topic-prefix"]
    flags += [settings.topic_prefix, "--progress", "never", "--color", "never", "--no-decode"]
    assert await cli("inspect", "--session", "beta", *flags) == 0
    out = capsys.readouterr().out
    assert out.count("═══ segment") == 2 and "split_reason: fork" in out
    page = tmp_path / "delta.html"
    assert (
        await cli("inspect", "--session", "delta", "--from-steps", "--html", str(page), *flags) == 0
    )
    assert "still open: closed for viewing" in page.read_text(encoding="utf-8")
    assert await cli("inspect", "--session", "nobody", *flags) == 1
    await assert_group_untouched(recording)
