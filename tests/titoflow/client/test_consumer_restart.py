"""A trainer SIGKILLed mid-stream, again and again, trains on every segment exactly once.

Real parts: the session's broker (tests/support/kafka_fixtures.py), the trainer as its own process
(tests/support/consumer_trainer.py: checkpoint a segment with ``SegmentConsumer.offsets()``, then
``commit()``), killed at seeded random moments while a producer keeps publishing segments and,
as a worker's redelivery does, publishes runs of recent ones again (same key, same bytes, within
the dedupe horizon). Checked: each segment is in the trainer's checkpoint exactly once, the
group's committed offsets end where the checkpoint does, and some repeats had their first copy
before a restart (so the read-back of the tail, not the in-memory set, had to drop them).
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections import Counter, deque
from pathlib import Path
from typing import Any

import pytest

from cli.dev.procs import ManagedProcess, stop_all
from schemas.events import SegmentFinalized
from tests.support.consumer_trainer import committed_offsets, load_checkpoint_lines
from tests.support.factories import step_segment
from tests.support.topics import read_topic
from titoflow.bus import CommitFailedError, Publisher
from titoflow.client.consumer import SegmentConsumer
from titoflow.settings import PROJECT_ROOT, Settings

SEED = 28
KILLS = 5
BATCH_SIZE = 4
HORIZON_S = 5.0
# A repeat comes at most this long after its first copy: inside the horizon, as the horizon's
# definition asks of the real workers (docs/trainer.md).
REPEAT_WITHIN_S = 2.0
# Generous bounds on a trainer's start (interpreter, imports, joining the group: a killed member
# holds the group until its session times out, 6 s) and on the last life's catching up.
FIRST_LINE_TIMEOUT_S = 60.0
FINAL_TIMEOUT_S = 120.0


def segment(n: int) -> SegmentFinalized:
    return step_segment(
        str(n), ([1], [2, n], [-0.5, -0.25]), event_time=float(n), instance_id=f"prompt-{n % 5}"
    )


class Producer:
    """Publishes segments as workers do: each once, and now and then a run of the last few
    again, as a worker re-emits the sessions above its commit point. ``copies``: per id."""

    def __init__(self, settings: Settings, rng: random.Random) -> None:
        self.publisher = Publisher(settings)
        self.topic = settings.topic("segments")
        self.rng = rng
        self.copies: Counter[str] = Counter()
        self.recent: deque[tuple[float, SegmentFinalized]] = deque()

    async def publish(self, segment: SegmentFinalized) -> None:
        value = segment.model_dump_json().encode()
        await self.publisher.publish(self.topic, segment.instance_id or "", value)
        self.copies[segment.segment_id] += 1

    async def fresh(self) -> None:
        fresh = segment(len(self.copies))
        await self.publish(fresh)
        now = time.monotonic()
        self.recent.append((now, fresh))
        while now - self.recent[0][0] > REPEAT_WITHIN_S:
            self.recent.popleft()

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.fresh()
            if self.rng.random() < 0.15:
                start = self.rng.randrange(len(self.recent))
                for _, again in list(self.recent)[start : start + self.rng.randint(1, 5)]:
                    await self.publish(again)
            await asyncio.sleep(self.rng.uniform(0.02, 0.1))


def start_trainer(settings: Settings, checkpoint: Path, life: int) -> ManagedProcess:
    argv = [sys.executable, "-m", "tests.support.consumer_trainer", settings.bootstrap_servers]
    argv += [settings.topic_prefix, str(checkpoint), str(life), str(BATCH_SIZE), str(HORIZON_S)]
    return ManagedProcess(
        f"trainer-{life}",
        argv,
        checkpoint.parent / f"trainer-{life}.log",
        env={"PYTHONPATH": str(PROJECT_ROOT)},
        cwd=PROJECT_ROOT,
    )


def trained_ids(lines: list[dict[str, Any]]) -> list[str]:
    return [segment_id for line in lines for segment_id in line["ids"]]


async def first_line_of(trainer: ManagedProcess, checkpoint: Path, life: int) -> None:
    async with asyncio.timeout(FIRST_LINE_TIMEOUT_S):
        while not any(line["life"] == life for line in load_checkpoint_lines(checkpoint)):
            assert trainer.alive(), trainer.log_tail()
            await asyncio.sleep(0.05)


def repeats_behind_restarts(lines: list[dict[str, Any]], records: list[Any]) -> int:
    """Repeats a life met whose first copy lay before the offset it resumed at."""
    first_at: dict[str, tuple[int, int]] = {}
    repeats = []
    for record in records:
        key = SegmentFinalized.model_validate_json(record.value).segment_id
        at = (record.partition, record.offset)
        if key in first_at:
            repeats.append((first_at[key], at))
        else:
            first_at[key] = at
    count = 0
    lives = sorted({line["life"] for line in lines})
    for life in lives[1:]:
        before = [line for line in lines if line["life"] < life]
        resumed = {int(p): o for p, o in (before[-1]["offsets"] if before else {}).items()}
        reached = {
            int(p): o for p, o in [li for li in lines if li["life"] == life][-1]["offsets"].items()
        }
        count += sum(
            first[1] < resumed.get(p, 0) <= offset < reached.get(p, 0)
            for first, (p, offset) in repeats
        )
    return count


async def test_a_trainer_killed_mid_stream_trains_on_every_segment_once(
    settings: Settings, tmp_path: Path
) -> None:
    rng = random.Random(SEED)
    checkpoint = tmp_path / "checkpoint.jsonl"
    producer = Producer(settings, random.Random(rng.random()))
    stop = asyncio.Event()
    producing = asyncio.create_task(producer.run(stop))
    trainers: list[ManagedProcess] = []
    try:
        for life in range(KILLS):
            trainers.append(start_trainer(settings, checkpoint, life))
            await first_line_of(trainers[-1], checkpoint, life)
            await asyncio.sleep(rng.uniform(0.0, 1.5))  # mid-stream: segments keep arriving
            await asyncio.to_thread(trainers[-1].kill)  # SIGKILL
        stop.set()
        await producing
        trainers.append(start_trainer(settings, checkpoint, KILLS))
        # The last life trains on what is left; fresh segments complete its last batch, and
        # give it one to train (and so commit) when the killed life had trained on everything.
        async with asyncio.timeout(FINAL_TIMEOUT_S):
            while (
                untrained := set(producer.copies)
                - set(trained_ids(lines := load_checkpoint_lines(checkpoint)))
            ) or not any(line["life"] == KILLS for line in lines):
                assert trainers[-1].alive(), trainers[-1].log_tail()
                if len(untrained) < BATCH_SIZE:
                    await producer.fresh()
                await asyncio.sleep(0.5)
            lines = load_checkpoint_lines(checkpoint)
            final = {int(p): o for p, o in lines[-1]["offsets"].items()}
            while await committed_offsets(settings, sorted(final)) != final:
                await asyncio.sleep(0.2)  # the last commit follows the last checkpoint
    finally:
        stop.set()
        await producer.publisher.stop()
        stop_all([t for t in trainers if t.alive()], timeout_s=5)

    trained = Counter(trained_ids(lines))
    assert {k: n for k, n in trained.items() if n > 1} == {}, "trained on more than once"
    assert set(trained) == set(producer.copies), "never trained on"

    records = await read_topic(settings, settings.topic("segments"))
    behind = repeats_behind_restarts(lines, records)
    copies = producer.copies
    per_life = Counter(line["life"] for line in lines)
    print(
        f"\nkills={KILLS} segments={len(copies)} records={sum(copies.values())} "
        f"repeats={sum(copies.values()) - len(copies)} trained_once={len(trained)} "
        f"repeats_behind_a_restart={behind} batches_per_life={dict(sorted(per_life.items()))}"
    )
    assert behind > 0, "no repeat straddled a restart: the read-back went untested"


async def test_a_commit_after_partitions_were_taken_away_says_so(settings: Settings) -> None:
    """A member joining the group takes partitions from one that handed segments out and has
    not committed them (a rebalance revokes every partition): its next commit() raises rather
    than commit the rest and leave the caller believing all was committed."""
    producer = Producer(settings, random.Random(SEED))
    try:
        for _ in range(20):  # keys on partitions 1, 2 and 4: each member gets some
            await producer.fresh()
    finally:
        await producer.publisher.stop()
    first = SegmentConsumer(settings, group_id="trainers")
    second = SegmentConsumer(settings, group_id="trainers")
    async with first, asyncio.timeout(60):
        await anext(aiter(first))
        async with second:
            await anext(aiter(second))  # the group has rebalanced: second holds partitions
            with pytest.raises(CommitFailedError, match="reassigned"):
                await first.commit()
            await first.commit()  # said once; nothing is left to commit


async def test_commits_and_resumes_need_a_group(settings: Settings) -> None:
    with pytest.raises(ValueError, match="group_id"):
        SegmentConsumer(settings, start_offsets={0: 5})
    async with SegmentConsumer(settings) as inspecting:
        with pytest.raises(RuntimeError, match="group"):
            await inspecting.commit()
