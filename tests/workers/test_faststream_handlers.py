"""The FastStream handlers of the worker and of the ingress's log follower, driven by FastStream's
in-memory ``TestKafkaBroker``: no Kafka, milliseconds. Only what a handler makes of the records
it is handed, and what it commits, is shown here; the same services on the real broker (tansu),
killed and rebalanced, are tests/e2e/test_fault.py and the end-to-end tests.

The in-memory broker has no consumer offsets API (its consumer only starts and stops), so the
worker's is :class:`OffsetsConsumer`: the assignment the group gave, and the commits made.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from faststream.kafka import TestKafkaBroker

from ingress.control.log_follower import LogFollower, control_log, ended_log
from schemas.control import AnyControl, Pause, Resume
from schemas.events import (
    SegmentFinalized,
    SessionBudget,
    SessionBudgeted,
    SessionEnded,
    SessionFinalized,
)
from tests.support.factories import THREE_TURNS, assemble
from titoflow.bus import TopicPartition
from titoflow.errors import PublishFailed
from titoflow.settings import Settings
from workers.partitions import PartitionLedger, Verdict
from workers.worker import Worker


class OffsetsConsumer:
    """The part of the consumer the worker's handler uses: its assignment, commits, lag."""

    def __init__(self, assigned: set[TopicPartition]) -> None:
        self.assigned = assigned
        self.commits: list[dict[TopicPartition, int]] = []

    def assignment(self) -> set[TopicPartition]:
        return set(self.assigned)

    async def commit(self, offsets: dict[TopicPartition, int]) -> None:
        self.commits.append(dict(offsets))

    def highwater(self, _tp: TopicPartition) -> int | None:
        return None


class CollectingPublisher:
    """Stands in for the acked publisher: collects (topic, key, value), or fails once."""

    def __init__(self) -> None:
        self.records: list[tuple[str, str, bytes]] = []
        self.fail = False

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None:
        if self.fail:
            raise PublishFailed("broker down (scripted)")
        self.records += records


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    # No tokenizer at model_path: the worker assembles concat segments, as the reference does.
    return Settings(bootstrap_servers="in-memory:9092", topic_prefix="fs", model_path=tmp_path)


class EveryRecord(PartitionLedger):
    """Partition 0 held from offset 0, every record applied: the in-memory broker numbers every
    record 0, so the real ledger would take each after the first as read already (the ledger's
    verdicts are tested on the real broker and in tests/workers/test_rebalance.py)."""

    def __init__(self) -> None:
        super().__init__()
        self.assign(0, 0)

    def verdict(self, partition: int, offset: int) -> Verdict:
        return Verdict.APPLY


def worker_for(settings: Settings) -> tuple[Worker, CollectingPublisher]:
    worker = Worker(settings)
    worker.ledger = EveryRecord()
    publisher = CollectingPublisher()
    worker.publisher = publisher  # type: ignore[assignment]
    return worker, publisher


FINALIZE = SessionFinalized(session_id="s", event_time=9.0, reward=1.0)


async def test_the_worker_handler_turns_a_batch_into_its_segment_then_commits(
    settings: Settings,
) -> None:
    worker, publisher = worker_for(settings)
    steps = settings.topic("steps")
    async with TestKafkaBroker(worker.steps.broker) as broker:
        consumer = OffsetsConsumer({TopicPartition(steps, 0)})
        worker.steps.subscriber.consumer = consumer
        events = [*THREE_TURNS, FINALIZE]
        await broker.publish_batch(*(e.model_dump_json().encode() for e in events), topic=steps)
    [(topic, key, value)] = publisher.records
    assert (topic, key) == (settings.topic("segments"), "i1")
    [expected] = assemble(THREE_TURNS)
    segment = SegmentFinalized.model_validate_json(value)
    assert segment.token_ids == expected.token_ids and segment.loss_mask == expected.loss_mask
    assert segment.logprobs == expected.logprobs and segment.reward == 1.0
    # The in-memory broker numbers every record 0: the session ended, so the commit passes it.
    assert consumer.commits == [{TopicPartition(steps, 0): 1}]


async def test_a_batch_that_fails_stops_the_worker_uncommitted(settings: Settings) -> None:
    worker, publisher = worker_for(settings)
    steps = settings.topic("steps")
    publisher.fail = True
    async with TestKafkaBroker(worker.steps.broker) as broker:
        consumer = OffsetsConsumer({TopicPartition(steps, 0)})
        worker.steps.subscriber.consumer = consumer
        events = [*THREE_TURNS, FINALIZE]
        await broker.publish_batch(*(e.model_dump_json().encode() for e in events), topic=steps)
        # FastStream would hand over the next batch; the worker takes none and commits none.
        publisher.fail = False
        await broker.publish_batch(FINALIZE.model_dump_json().encode(), topic=steps)
    assert publisher.records == [] and consumer.commits == []
    assert worker.steps.closing


async def test_the_follower_hands_each_event_on_in_log_order_and_skips_what_it_cannot_read(
    settings: Settings,
) -> None:
    follower = LogFollower(settings)
    control = control_log(follower)
    seen: list[AnyControl] = []
    control.subscribe(lambda event, _offset: seen.append(event))
    topic = control.topic
    records: list[Any] = [
        Pause(event_time=1.0, mode="abort").model_dump_json().encode(),
        b'{"type": "from_a_newer_titoflow", "schema_version": 9}',
        Resume(event_time=2.0).model_dump_json().encode(),
    ]
    async with TestKafkaBroker(follower.declare([TopicPartition(topic, 0)])) as broker:
        for record in records:
            await broker.publish(record, topic=topic, partition=0)
    assert [(type(e), e.event_time) for e in seen] == [(Pause, 1.0), (Resume, 2.0)]
    assert isinstance(seen[0], Pause) and seen[0].mode == "abort"


async def test_one_follower_applies_both_broadcast_logs_each_in_its_order_to_its_own_subscribers(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """The control and ended logs share one consumer: each record reaches its own topic's
    subscribers only, each topic's in log order, whatever the interleaving."""
    follower = LogFollower(settings)
    control, ended = control_log(follower), ended_log(follower)
    heard: list[tuple[str, str]] = []
    control.subscribe(lambda event, _offset: heard.append(("control", event.type)))
    ended.subscribe(lambda event, _offset: heard.append((event.session_id, event.type)))
    partitions = [
        TopicPartition(control.topic, 0),
        *(TopicPartition(ended.topic, p) for p in (0, 1)),
    ]
    async with TestKafkaBroker(follower.declare(partitions)) as broker:
        await broker.publish(Pause(event_time=1.0).model_dump_json().encode(), control.topic)
        for n, partition in enumerate((1, 0, 1)):
            budgeted = SessionBudgeted(session_id=f"s{n}", event_time=1.0, budget=SessionBudget())
            await broker.publish(
                budgeted.model_dump_json().encode(), ended.topic, partition=partition
            )
        await broker.publish(Resume(event_time=2.0).model_dump_json().encode(), control.topic)
        done = SessionEnded(session_id="s0", event_time=3.0, how="idle")
        await broker.publish(done.model_dump_json().encode(), ended.topic, partition=1)
    # The in-memory broker numbers no offsets; each log's order is the order heard.
    assert heard[0] == ("control", "pause") and heard[4] == ("control", "resume")
    assert [h for h in heard if h[0] != "control"] == [
        ("s0", "session_budgeted"),
        ("s1", "session_budgeted"),
        ("s2", "session_budgeted"),
        ("s0", "session_ended"),
    ]
    assert "skipping" not in caplog.text  # no record was handed to the other topic's adapter
