"""The event bus against a real broker: topics, acknowledged publishes, groups, broker outages."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from cli.dev.broker import start_tansu
from cli.dev.procs import ManagedProcess, free_port
from titoflow.bus import (
    BrokerUnavailable,
    EventTooLarge,
    Publisher,
    StreamPublisher,
    TopicLayoutError,
    ensure_topics,
    make_consumer,
    service_broker,
)
from titoflow.settings import Settings

# Only keeps a broken test from hanging the run; no assertion depends on it.
HANG_GUARD_S = 60.0
# A short publish budget keeps the outage tests quick; nothing asserts how long a call took.
OUTAGE_PUBLISH_TIMEOUT_S = 2.0


async def read(consumer: AIOKafkaConsumer, count: int) -> list[ConsumerRecord]:
    records: list[ConsumerRecord] = []
    async with asyncio.timeout(HANG_GUARD_S):
        while len(records) < count:
            batch = await consumer.getmany(timeout_ms=500)
            for partition_records in batch.values():
                records.extend(partition_records)
    return records


@pytest.fixture
def own_brokers() -> Iterator[list[ManagedProcess]]:
    """Brokers a test starts for itself (to kill them); stopped at the end whatever happened."""
    procs: list[ManagedProcess] = []
    yield procs
    for proc in procs:
        proc.stop()


def outage_settings(bootstrap: str) -> Settings:
    return Settings(
        bootstrap_servers=bootstrap,
        topic_prefix="outage",
        publish_timeout_s=OUTAGE_PUBLISH_TIMEOUT_S,
    )


async def test_topics_have_configured_partition_counts(settings: Settings) -> None:
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        await consumer.topics()  # refreshes metadata for all topics
        counts = {
            name: len(consumer.partitions_for_topic(settings.topic(name)) or ())
            for name in ("steps", "segments", "control", "dlq", "ended")
        }
    finally:
        await consumer.stop()
    assert counts == {
        "steps": settings.steps_partitions,
        "segments": settings.segments_partitions,
        "control": 1,
        "dlq": settings.dlq_partitions,
        "ended": settings.ended_partitions,
    }


async def test_ensure_topics_is_idempotent(settings: Settings) -> None:
    await ensure_topics(settings)


async def test_ensure_topics_rejects_an_existing_topic_with_fewer_partitions(
    settings: Settings,
) -> None:
    more = settings.model_copy(update={"steps_partitions": settings.steps_partitions + 1})
    with pytest.raises(TopicLayoutError, match="fewer than"):
        await ensure_topics(more)


async def test_ensure_topics_rejects_a_control_topic_with_several_partitions(
    settings: Settings,
) -> None:
    fresh = settings.model_copy(update={"topic_prefix": settings.topic_prefix + "-ctl"})
    admin = AIOKafkaAdminClient(bootstrap_servers=fresh.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(fresh.topic("control"), 2, 1)])
    finally:
        await admin.close()
    with pytest.raises(TopicLayoutError, match="exactly 1"):
        await ensure_topics(fresh)


async def topic_configs(settings: Settings, names: list[str]) -> dict[str, dict[str, str]]:
    """Each topic's configs as the broker describes them."""
    admin = AIOKafkaAdminClient(bootstrap_servers=settings.bootstrap_servers)
    await admin.start()
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names]
        )
    finally:
        await admin.close()
    return {
        resource["resource_name"]: {
            entry["config_names"]: entry["config_value"] for entry in resource["config_entries"]
        }
        for response in responses
        for resource in response.to_object()["resources"]
    }


async def test_topics_are_created_with_the_retention_of_their_settings(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    """What the broker reports back (tansu stores and describes retention.ms; it does not delete
    by it: Kafka does), and an idempotent second call warns about nothing."""
    names = {name: settings.topic(name) for name in ("steps", "segments", "dlq", "ended")}
    configs = await topic_configs(settings, list(names.values()))
    day = 86_400_000
    assert {name: configs[topic]["retention.ms"] for name, topic in names.items()} == {
        "steps": str(7 * day),
        "segments": str(7 * day),
        "dlq": str(30 * day),
        "ended": str(7 * day),
    }
    assert configs[names["ended"]]["cleanup.policy"] == "compact,delete"
    with caplog.at_level(logging.WARNING, logger="titoflow.bus"):
        await ensure_topics(settings)
    assert caplog.records == []
    forever = settings.model_copy(
        update={"topic_prefix": settings.topic_prefix + "-kept", "segments_retention_s": -1}
    )
    await ensure_topics(forever)
    kept = await topic_configs(forever, [forever.topic("segments")])
    assert kept[forever.topic("segments")]["retention.ms"] == "-1"


async def test_an_existing_topic_with_another_retention_gets_one_line_and_is_left_alone(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    fresh = settings.model_copy(update={"topic_prefix": settings.topic_prefix + "-old"})
    hour_ms = "3600000"
    admin = AIOKafkaAdminClient(bootstrap_servers=fresh.bootstrap_servers)
    await admin.start()
    try:
        await admin.create_topics(
            [NewTopic(fresh.topic("steps"), 8, 1, topic_configs={"retention.ms": hour_ms})]
        )
    finally:
        await admin.close()
    with caplog.at_level(logging.WARNING, logger="titoflow.bus"):
        await ensure_topics(fresh)
    [line] = [r.getMessage() for r in caplog.records]
    assert f"topic {fresh.topic('steps')!r} has retention.ms={hour_ms}" in line
    assert "TITOFLOW_STEPS_RETENTION_S=604800" in line and "retention.ms=604800000" in line
    assert "\n" not in line
    configs = await topic_configs(fresh, [fresh.topic("steps")])
    assert configs[fresh.topic("steps")]["retention.ms"] == hour_ms


async def test_publish_returns_the_acked_position_and_consumer_reads_it_back(
    settings: Settings,
) -> None:
    publisher = Publisher(settings)
    await publisher.start()
    try:
        partition, offset = await publisher.publish(
            settings.topic("steps"), "session-1", b"payload", {"event": "StepRecorded", "v": "1"}
        )
    finally:
        await publisher.stop()

    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(settings.topic("steps"), partition)
        consumer.assign([tp])
        consumer.seek(tp, offset)
        (record,) = await read(consumer, 1)
    finally:
        await consumer.stop()
    assert (record.partition, record.offset) == (partition, offset)
    assert record.key == b"session-1"
    assert record.value == b"payload"
    assert [(k, v) for k, v in record.headers] == [("event", b"StepRecorded"), ("v", b"1")]


async def test_same_key_same_partition_in_publish_order(settings: Settings) -> None:
    publisher = Publisher(settings)
    try:
        same = [
            await publisher.publish(settings.topic("steps"), "session-a", b"%d" % i)
            for i in range(5)
        ]
        others = {
            (await publisher.publish(settings.topic("steps"), f"session-{i}", b"x"))[0]
            for i in range(20)
        }
    finally:
        await publisher.stop()
    assert len({partition for partition, _ in same}) == 1
    offsets = [offset for _, offset in same]
    assert offsets == sorted(set(offsets))
    # The key decides the partition, so different sessions spread over the topic.
    assert len(others) > 1


async def test_records_published_together_are_appended_whole_or_not_at_all(
    settings: Settings,
) -> None:
    topic = settings.topic("steps")
    small = settings.model_copy(update={"max_event_bytes": 64 * 1024})
    publisher = Publisher(small)
    try:
        partition, first = await publisher.publish(topic, "session-t", b"before")
        await publisher.publish_together(topic, "session-t", [b"a", b"b", b"c"])
        half = b"x" * (small.max_event_bytes // 2 + 1)  # each fits alone, not both together
        with pytest.raises(EventTooLarge):
            await publisher.publish_together(topic, "session-t", [b"d", half, half])
        assert (await publisher.publish(topic, "session-t", b"after"))[0] == partition
    finally:
        await publisher.stop()
    consumer = make_consumer(settings, group_id=None)
    await consumer.start()
    try:
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek(tp, first)
        records = await read(consumer, 5)
    finally:
        await consumer.stop()
    # Same partition, in order, contiguous: the refused batch left nothing, not even its "d".
    assert [r.value for r in records] == [b"before", b"a", b"b", b"c", b"after"]
    assert [r.offset for r in records] == list(range(first, first + 5))
    assert {r.key for r in records} == {b"session-t"}


async def read_topic(settings: Settings, topic: str, count: int) -> list[ConsumerRecord]:
    consumer = make_consumer(settings, topic, group_id=None)
    await consumer.start()
    try:
        return await read(consumer, count)
    finally:
        await consumer.stop()


async def test_stream_publisher_puts_each_key_where_a_plain_publish_does_in_order(
    settings: Settings,
) -> None:
    # Records of 20 KB under a 64 KiB event limit: a partition's records take several batches.
    small = settings.model_copy(update={"max_event_bytes": 64 * 1024})
    segments, ended = small.topic("segments"), small.topic("ended")
    records = [
        (topic, f"session-{k}", b"%s-%d-%d" % (topic.encode(), k, i) + b"x" * 20_000)
        for i in range(4)
        for k in range(6)
        for topic in (segments, ended)
    ]
    too_large = (segments, "session-big", b"y" * (small.max_event_bytes + 1))
    broker = service_broker(small, logging.getLogger("test.bus"))
    await broker.start()
    try:
        publisher = StreamPublisher(broker, small)
        with pytest.raises(EventTooLarge):
            await publisher.publish_many([records[0], too_large])
        await publisher.publish_many(records)
    finally:
        await broker.stop()
    plain = Publisher(small)
    try:
        home = {
            (topic, key): (await plain.publish(topic, key, b"probe"))[0]
            for topic, key, _ in records
        }
    finally:
        await plain.stop()
    for topic in (segments, ended):
        mine = [r for r in records if r[0] == topic]
        read_back = await read_topic(small, topic, len(mine) + 6)  # and the six probes
        got = [r for r in read_back if r.value != b"probe"]
        # Nothing of the refused call (not even the record that fit), each record once, each
        # key in its plain publish's partition with its records in the order handed over.
        assert sorted(r.value for r in got) == sorted(value for _, _, value in mine)
        for (of_topic, key), partition in home.items():
            if of_topic != topic:
                continue
            of_key = [r for r in got if r.key == key.encode()]
            assert {r.partition for r in of_key} == {partition}
            assert [r.value for r in of_key] == [v for t, k, v in mine if k == key]


async def test_group_resumes_from_committed_offset_after_restart(settings: Settings) -> None:
    topic = settings.topic("steps")
    group = f"{settings.topic_prefix}-workers"
    publisher = Publisher(settings)
    try:
        positions = [await publisher.publish(topic, "one-session", b"%d" % i) for i in range(6)]
    finally:
        await publisher.stop()
    partition = positions[0][0]
    tp = TopicPartition(topic, partition)

    first = make_consumer(settings, topic, group_id=group)
    await first.start()
    try:
        records = await read(first, 6)
        assert [r.value for r in records] == [b"%d" % i for i in range(6)]
        # Commit only what is "done" (the first three), as a worker commits below its oldest
        # open session; then crash-like stop without committing the rest.
        await first.commit({tp: records[2].offset + 1})
    finally:
        await first.stop()

    second = make_consumer(settings, topic, group_id=group)
    await second.start()
    try:
        assert await second.committed(tp) == records[2].offset + 1
        resumed = await read(second, 3)
    finally:
        await second.stop()
    assert [r.value for r in resumed] == [b"3", b"4", b"5"]
    assert resumed[0].offset == records[3].offset


async def test_healthy_on_a_live_broker(settings: Settings) -> None:
    publisher = Publisher(settings)
    try:
        assert await publisher.healthy()
    finally:
        await publisher.stop()


async def test_publish_raises_broker_unavailable_when_the_broker_dies(
    tmp_path: Path, own_brokers: list[ManagedProcess]
) -> None:
    proc, bootstrap = start_tansu(tmp_path)
    own_brokers.append(proc)
    settings = outage_settings(bootstrap)
    await ensure_topics(settings)
    publisher = Publisher(settings)
    try:
        await publisher.publish(settings.topic("steps"), "s", b"before")
        proc.kill()
        with pytest.raises(BrokerUnavailable):
            await publisher.publish(settings.topic("steps"), "s", b"after")
        assert not await publisher.healthy()
    finally:
        await publisher.stop()


async def test_publisher_that_failed_to_start_connects_once_a_broker_is_up(
    tmp_path: Path, own_brokers: list[ManagedProcess]
) -> None:
    port = free_port()  # nothing listens here until the broker below starts
    settings = outage_settings(f"127.0.0.1:{port}")
    publisher = Publisher(settings)
    try:
        with pytest.raises(BrokerUnavailable):
            await publisher.start()
        with pytest.raises(BrokerUnavailable):
            await publisher.publish(settings.topic("steps"), "s", b"while down")
        assert not await publisher.healthy()

        proc, _ = start_tansu(tmp_path, port=port)
        own_brokers.append(proc)
        await ensure_topics(settings)
        partition, offset = await publisher.publish(settings.topic("steps"), "s", b"up")
        assert await publisher.healthy()
    finally:
        await publisher.stop()
    assert partition in range(settings.steps_partitions)
    assert offset == 0  # the publish that failed left nothing behind
