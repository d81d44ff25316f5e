"""The event bus: the only module that imports aiokafka (the services use the names it exports).

Every client built here is tuned for what was measured against tansu and holds for Kafka too:
no idempotent producer and no transactions (tansu rejects InitProducerId), short group session
timeouts (joins take about half the session timeout), and bounded waits everywhere, because the
ingress must answer a scaffold (200 or a retryable 503) within ``publish_timeout_s``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any, Protocol

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import ConsumerRecord as ConsumerRecord
from aiokafka import TopicPartition as TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import CommitFailedError as CommitFailedError
from aiokafka.errors import KafkaError as KafkaError
from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.producer.message_accumulator import BatchBuilder
from faststream import AckPolicy
from faststream.kafka import KafkaBroker, KafkaPublishMessage
from faststream.kafka.subscriber.usecase import LogicSubscriber
from faststream.message import StreamMessage

from titoflow.settings import Settings
from titoflow.shutdown import drain_budget

# The client types and errors the services name (imported as X as X above) are theirs to import
# from here: this module stays the only one that imports aiokafka (tests/project/test_layering.py).
Consumer = AIOKafkaConsumer
RebalanceListener = ConsumerRebalanceListener

log = logging.getLogger("titoflow.bus")

# Kafka error code for "Topic with this name already exists" in a CreateTopics response.
_TOPIC_ALREADY_EXISTS = 36
# A single tansu broker or a test Kafka cannot replicate further; a real cluster with
# min.insync.replicas > 1 needs topics created by its operators (ensure_topics then only checks).
_REPLICATION_FACTOR = 1
# How long ensure_topics waits for freshly created topics to show up in metadata (Kafka creates
# them asynchronously; tansu at once).
_TOPIC_VISIBLE_TIMEOUT_S = 10.0
HEALTH_TIMEOUT_S = 1.5
# tansu holds every fetch for the full max wait even when records are there (Kafka answers as
# soon as fetch_min_bytes are in), so aiokafka's 500 ms default put 0.5 s on every hop: measured
# with bench/pipeline.py, finalize→segment p50 went from 1.2 s to 17 ms. An idle consumer then
# polls 50 times a second, which costs the broker next to nothing.
FETCH_MAX_WAIT_MS = 20
SESSION_TIMEOUT_MS = 6000
HEARTBEAT_INTERVAL_MS = 1000
# No linger: aiokafka keeps one produce request in flight per broker and packs everything that
# arrives meanwhile into the next one, so bursts batch by themselves, while any linger is added
# in full to every isolated publish (measured: 1 ms linger = +1 ms per step, no throughput
# gain). asyncio sets TCP_NODELAY on its sockets, so no Nagle delay either.
LINGER_MS = 0
# One batch per partition is in flight at a time, and a record larger than the batch size gets a
# batch to itself. With aiokafka's 16 KiB default, 2000 concurrent 20 KB steps needed one round
# trip each and timed out; 1 MiB (Kafka's default message.max.bytes) sent them in 0.4 s.
MAX_BATCH_BYTES = 1024 * 1024


class BrokerUnavailable(Exception):
    """The broker did not acknowledge in time (or could not be reached): answer retryably."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class EventTooLarge(Exception):
    """The event exceeds ``max_event_bytes``: retrying cannot help."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class TopicLayoutError(Exception):
    """An existing topic cannot serve titoflow as configured (too few partitions, or a control
    topic that is not a single totally ordered partition)."""


def _wanted_partitions(settings: Settings) -> dict[str, int]:
    return {
        settings.topic("steps"): settings.steps_partitions,
        settings.topic("segments"): settings.segments_partitions,
        # Control is a broadcast log every ingress applies in one total order: one partition.
        settings.topic("control"): 1,
        settings.topic("recompute"): settings.recompute_partitions,
        settings.topic("dlq"): settings.dlq_partitions,
        settings.topic("ended"): settings.ended_partitions,
    }


def _retention_settings(settings: Settings) -> dict[str, tuple[str, float]]:
    """Each topic whose retention titoflow sets: the setting that holds it, and its seconds.
    Control and recompute keep the broker's (docs/operations.md, "Retention")."""
    return {
        settings.topic("steps"): ("steps_retention_s", settings.steps_retention_s),
        settings.topic("segments"): ("segments_retention_s", settings.segments_retention_s),
        settings.topic("dlq"): ("dlq_retention_s", settings.dlq_retention_s),
        settings.topic("ended"): ("ended_retention_s", settings.ended_retention_s),
    }


def retention_ms(seconds: float) -> str:
    """A retention setting as Kafka's ``retention.ms`` (-1: forever)."""
    return "-1" if seconds == -1 else str(int(seconds * 1000))


def _topic_configs(settings: Settings, name: str) -> dict[str, str]:
    # Kafka's 1 MB default is smaller than a long agent step or segment.
    configs = {"max.message.bytes": str(settings.max_event_bytes)}
    if name == settings.topic("ended"):
        # Replicas read it whole at start: one record per session (the latest), for a while.
        configs["cleanup.policy"] = "compact,delete"
    retention = _retention_settings(settings).get(name)
    if retention is not None:
        configs["retention.ms"] = retention_ms(retention[1])
    return configs


def producer_request_timeout_ms(publish_timeout_s: float) -> int:
    """aiokafka's request timeout for a publish budget of ``publish_timeout_s``.

    aiokafka fails a batch only once it is older than ``request_timeout_ms`` *and* an attempt
    failed, and one attempt against a hung broker can cost a connect, an ApiVersions exchange
    and the produce request, each bounded by ``request_timeout_ms``; a metadata refresh between
    attempts can cost one more. Measured on a SIGSTOPped tansu: the first failure came after 1x,
    a send on a fresh connection after 2x. A quarter of the budget keeps even the 3x worst case
    plus retry backoffs inside it, so aiokafka has given up (and will not retry) before the
    caller's outer timeout answers 503.
    """
    return max(1, int(publish_timeout_s * 1000 / 4))


async def create_topics(settings: Settings, wanted: dict[str, int]) -> dict[str, int]:
    """Create the topics of ``wanted`` (name → partitions) that do not exist yet; return the
    partition count each one has now. An existing topic is left as it is; one whose retention is
    not its setting's gets a warning naming the setting."""
    timeout_ms = producer_request_timeout_ms(settings.publish_timeout_s)
    admin = AIOKafkaAdminClient(
        bootstrap_servers=settings.bootstrap_servers, request_timeout_ms=timeout_ms
    )
    try:
        await admin.start()
        response = await admin.create_topics(
            [
                NewTopic(
                    name, count, _REPLICATION_FACTOR, topic_configs=_topic_configs(settings, name)
                )
                for name, count in wanted.items()
            ]
        )
        for topic_error in response.to_object()["topic_errors"]:
            code = topic_error["error_code"]
            if code not in (0, _TOPIC_ALREADY_EXISTS):
                raise TopicLayoutError(
                    f"creating topic {topic_error['topic']!r} failed with Kafka error {code}: "
                    f"{topic_error.get('error_message')}"
                )
        counts = await _partition_counts(admin, list(wanted))
        await _warn_on_other_retention(admin, settings, list(wanted))
        return counts
    except KafkaError as exc:
        raise BrokerUnavailable(
            f"cannot create topics on {settings.bootstrap_servers}: {exc!r}"
        ) from exc
    finally:
        await admin.close()


async def ensure_topics(settings: Settings) -> None:
    """Create the six topics with their configured partition counts and retentions; idempotent.

    An existing topic with more partitions than configured is accepted (keys still spread), one
    with fewer is not, and a control topic must have exactly one partition.
    """
    wanted = _wanted_partitions(settings)
    actual = await create_topics(settings, wanted)
    for name, count in wanted.items():
        have = actual[name]
        if name == settings.topic("control") and have != 1:
            raise TopicLayoutError(
                f"topic {name!r} has {have} partitions; the control log needs exactly 1"
            )
        if have < count:
            raise TopicLayoutError(
                f"topic {name!r} exists with {have} partitions, fewer than the {count} "
                "configured; add partitions to it or lower the setting"
            )


async def _warn_on_other_retention(
    admin: AIOKafkaAdminClient, settings: Settings, names: list[str]
) -> None:
    """One warning line per topic whose ``retention.ms`` is not its setting's. titoflow never
    alters an existing topic: its operators may have meant it (and tansu has no AlterConfigs)."""
    retained = _retention_settings(settings)
    described = [n for n in names if n in retained]
    if not described:
        return
    responses = await admin.describe_configs(
        [ConfigResource(ConfigResourceType.TOPIC, name) for name in described]
    )
    for response in responses:
        for resource in response.to_object()["resources"]:
            name = resource["resource_name"]
            if resource["error_code"] != 0 or name not in retained:
                continue
            setting, seconds = retained[name]
            entries = {e["config_names"]: e["config_value"] for e in resource["config_entries"]}
            have, want = entries.get("retention.ms"), retention_ms(seconds)
            if have != want:
                variable = f"TITOFLOW_{setting.upper()}"
                log.warning(
                    "topic %r has retention.ms=%s, not %s as %s=%g says; titoflow does not "
                    "alter existing topics: alter it (kafka-configs.sh --alter --entity-type "
                    "topics --entity-name %s --add-config retention.ms=%s) or set %s to match",
                    name,
                    have if have is not None else "unset (the broker's default)",
                    want,
                    variable,
                    seconds,
                    name,
                    want,
                    variable,
                )


async def _partition_counts(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, int]:
    """Partition count of each topic, waiting until metadata lists every one of them.

    Only called for topics that exist, because a metadata request for a missing topic makes
    tansu (and Kafka with auto.create.topics.enable) create it with default settings.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + _TOPIC_VISIBLE_TIMEOUT_S
    while True:
        described = await admin.describe_topics(names)
        counts = {
            t["topic"]: len(t["partitions"])
            for t in described
            if t["error_code"] == 0 and t["partitions"]
        }
        if all(name in counts for name in names):
            return counts
        if loop.time() > deadline:
            missing = sorted(set(names) - set(counts))
            raise TopicLayoutError(f"topics {missing} not visible in metadata after creation")
        await asyncio.sleep(0.2)


async def existing_partitions(consumer: AIOKafkaConsumer, topic: str) -> list[TopicPartition]:
    """The partitions of ``topic``, none if it does not exist. All topics' metadata is asked
    for first, because a metadata request naming a missing topic makes some brokers create it."""
    if topic not in await consumer.topics():
        return []
    return [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or ())]


def home_partition(key: str, partitions: list[int]) -> int:
    """The partition a producer with the default partitioner (murmur2, as Kafka's Java client
    and aiokafka use) puts ``key`` in, among all of a topic's ``partitions``."""
    chosen: int = DefaultPartitioner()(key.encode(), partitions, partitions)
    return chosen


async def pin_to_end(consumer: AIOKafkaConsumer, timeout_s: float) -> None:
    """Wait for a group-less consumer's assignment, then fix every partition's position at its
    end now: left to the first fetch, "the end" would be wherever the log is then, past what was
    published in between. On tansu a partition's end is the first record of its last
    multi-record batch, so that batch is read again (docs/debugging.md)."""
    async with asyncio.timeout(timeout_s):
        while not consumer.assignment():
            await asyncio.sleep(0.05)
    partitions = list(consumer.assignment())
    await consumer.seek_to_end(*partitions)
    for tp in partitions:
        await consumer.position(tp)


@contextlib.contextmanager
def translated_errors(settings: Settings, topic: str, size: int) -> Iterator[None]:
    """aiokafka's failures to publish as BrokerUnavailable (retryable) or EventTooLarge (not)."""
    try:
        yield
    except TimeoutError as exc:
        raise BrokerUnavailable(
            f"no ack from {settings.bootstrap_servers} for {topic!r} "
            f"within {settings.publish_timeout_s}s"
        ) from exc
    except MessageSizeTooLargeError as exc:
        raise EventTooLarge(
            f"{size} bytes exceed max_event_bytes={settings.max_event_bytes}"
        ) from exc
    except KafkaError as exc:
        raise BrokerUnavailable(f"publishing to {topic!r} failed: {exc!r}") from exc


def _topics(records: list[tuple[str, str, bytes]]) -> str:
    return ", ".join(sorted({topic for topic, _, _ in records}))


class Publisher:
    """Publishes events and reports success only once the broker acknowledged them (acks=all).

    ``publish`` either returns the record's (partition, offset) or raises ``BrokerUnavailable``
    within ``settings.publish_timeout_s``; by then aiokafka has already given up on the record
    (see ``producer_request_timeout_ms``), so it is not retried behind the caller's back. A
    Publisher whose broker was unreachable at start connects again on the next call.
    """

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._timeout_s = settings.publish_timeout_s
        self._request_timeout_ms = producer_request_timeout_ms(settings.publish_timeout_s)
        self._producer: AIOKafkaProducer | None = None
        # Serializes (re)starting, so concurrent first publishes share one producer.
        self._lock = asyncio.Lock()

    async def start(self) -> None:
        """Connect within ``publish_timeout_s``; raises ``BrokerUnavailable`` otherwise."""
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._ensure_producer()
        except TimeoutError as exc:
            raise BrokerUnavailable(
                f"no connection to {self._settings.bootstrap_servers} within {self._timeout_s}s"
            ) from exc

    async def _ensure_producer(self) -> AIOKafkaProducer:
        async with self._lock:
            if self._producer is not None:
                return self._producer
            producer = AIOKafkaProducer(
                bootstrap_servers=self._settings.bootstrap_servers,
                acks="all",
                # tansu rejects InitProducerId; duplicates from retries are handled downstream
                # (at-least-once, content-derived ids).
                enable_idempotence=False,
                linger_ms=LINGER_MS,
                max_batch_size=MAX_BATCH_BYTES,
                max_request_size=self._settings.max_event_bytes,
                request_timeout_ms=self._request_timeout_ms,
            )
            # On failure release the sockets and leave self._producer unset, so the next call
            # connects afresh instead of reusing a client that never bootstrapped.
            try:
                await producer.start()
            except (KafkaError, OSError) as exc:
                await producer.stop()
                raise BrokerUnavailable(
                    f"cannot connect to {self._settings.bootstrap_servers}: {exc!r}"
                ) from exc
            except asyncio.CancelledError:
                await producer.stop()
                raise
            self._producer = producer
            return producer

    async def publish(
        self, topic: str, key: str, value: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, int]:
        """Append one record; return (partition, offset) once the broker acknowledged it."""
        kafka_headers = [(k, v.encode()) for k, v in (headers or {}).items()]
        with translated_errors(self._settings, topic, len(value)):
            async with asyncio.timeout(self._timeout_s):
                producer = await self._ensure_producer()
                metadata = await producer.send_and_wait(
                    topic, value, key=key.encode(), headers=kafka_headers
                )
        return int(metadata.partition), int(metadata.offset)

    async def publish_together(self, topic: str, key: str, values: list[bytes]) -> None:
        """Append ``values`` under ``key`` as one record batch, in order, and return once the
        broker acknowledged it: a broker appends a batch whole or not at all, so either every
        record is durable or none is (no transaction needed). The batch may be as large as one
        event may (``max_event_bytes``); larger is ``EventTooLarge``, nothing appended."""
        size = sum(map(len, values))
        with translated_errors(self._settings, topic, size):
            async with asyncio.timeout(self._timeout_s):
                producer = await self._ensure_producer()
                partitions = sorted(await producer.partitions_for(topic))
                # Uncompressed, as the producer's own batches are (it is made without one).
                batch = BatchBuilder(self._settings.max_event_bytes, 0)
                for value in values:
                    if batch.append(timestamp=None, key=key.encode(), value=value) is None:
                        raise MessageSizeTooLargeError(f"{len(values)} records, {size} bytes")
                batch.close()
                partition = home_partition(key, partitions)
                await (await producer.send_batch(batch, topic, partition=partition))

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None:
        """Append (topic, key, value) records, all in flight at once, and return once the broker
        acknowledged every one (within ``publish_timeout_s`` for the lot).

        Records are handed to the producer in the given order, so those sharing a partition are
        appended in that order; awaiting each ack before sending the next would cost a broker
        round trip per record.
        """
        if not records:
            return
        largest = max(len(value) for _, _, value in records)
        with translated_errors(self._settings, _topics(records), largest):
            async with asyncio.timeout(self._timeout_s):
                producer = await self._ensure_producer()
                acks = [
                    await producer.send(topic, value, key=key.encode())
                    for topic, key, value in records
                ]
                await asyncio.gather(*acks)

    async def healthy(self) -> bool:
        """Whether a broker answers a metadata request now (bounded by ``HEALTH_TIMEOUT_S``)."""
        try:
            async with asyncio.timeout(HEALTH_TIMEOUT_S):
                producer = await self._ensure_producer()
                await producer.client.fetch_all_metadata()
        except (TimeoutError, KafkaError, BrokerUnavailable):
            return False
        return True

    async def stop(self) -> None:
        """Flush what is pending (each record resolves within aiokafka's bounds) and close."""
        async with self._lock:
            producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


def consumer_options(settings: Settings) -> dict[str, Any]:
    """The consumer settings proven against tansu, for aiokafka and FastStream subscribers alike.

    Offsets are committed explicitly (a worker commits only below its oldest open session), and
    a group without committed offsets starts from the beginning of the log.
    """
    return {
        "session_timeout_ms": SESSION_TIMEOUT_MS,
        "heartbeat_interval_ms": HEARTBEAT_INTERVAL_MS,
        "fetch_max_wait_ms": FETCH_MAX_WAIT_MS,
        "auto_offset_reset": "earliest",
        "max_partition_fetch_bytes": settings.max_event_bytes,
        "fetch_max_bytes": max(settings.max_event_bytes, 50 * 1024 * 1024),
    }


def make_consumer(
    settings: Settings, *topics: str, group_id: str | None, **overrides: Any
) -> AIOKafkaConsumer:
    """An unstarted consumer with :func:`consumer_options`, committing only when told to."""
    options: dict[str, Any] = {
        "bootstrap_servers": settings.bootstrap_servers,
        "group_id": group_id,
        "enable_auto_commit": False,
        **consumer_options(settings),
    }
    options.update(overrides)
    return AIOKafkaConsumer(*topics, **options)


# How long a FastStream batch fetch waits for records. Its subscriber sleeps this long again
# after an empty fetch, so it bounds the latency an idle service adds to the next record
# (500 ms put half a second on finalize→segment, bench/pipeline.py).
BATCH_WAIT_MS = FETCH_MAX_WAIT_MS


async def undecoded(message: StreamMessage[Any]) -> Any:
    """A FastStream decoder that leaves record values as bytes. Without it every record would be
    JSON-parsed before the handler runs (no content-type header: FastStream tries JSON), and
    then parsed again into its event model: 8 % more worker CPU a step (bench/pipeline.py)."""
    return message.body


def service_broker(
    settings: Settings, logger: logging.Logger, publishes: bool = True
) -> KafkaBroker:
    """A FastStream broker for a Kafka service: its subscribers take :func:`consumer_options`,
    its producer the settings :class:`Publisher` uses (acks=all, no idempotence, no linger, the
    event size limit); topics are never
    auto-created (``ensure_topics`` owns their layout), and per-message lines are at DEBUG.
    ``publishes=False``: no producer at all."""
    return KafkaBroker(
        settings.bootstrap_servers,
        consumer_only=not publishes,
        acks="all",
        enable_idempotence=False,
        linger_ms=LINGER_MS,
        max_batch_size=MAX_BATCH_BYTES,
        max_request_size=settings.max_event_bytes,
        # No request_timeout_ms: the broker's clients share it, and a consumer's JoinGroup waits
        # for the whole rebalance (shorter, it times out and never joins). A publish that gets
        # no ack in publish_timeout_s fails its batch, whose service then stops: a record that
        # lands later is a duplicate, which consumers drop by id.
        allow_auto_create_topics=False,
        logger=logger,
        log_level=logging.DEBUG,
        # A handler runs at most one batch; stopping waits for it (its publish and commit) for
        # the drain share of the shutdown grace, then cancels it uncommitted.
        graceful_timeout=drain_budget(settings.shutdown_grace_s),
    )


def batch_subscriber(
    broker: KafkaBroker, settings: Settings, *topics: str, **options: Any
) -> LogicSubscriber[Any]:
    """A batch subscriber with the services' settings: :func:`consumer_options`, manual
    acknowledgement (what is committed, if anything, is the service's call), record values left
    as bytes (:func:`undecoded`), the batch wait at ``BATCH_WAIT_MS``; ``options`` add the rest
    (group, listener, partitions, batch size)."""
    subscriber: LogicSubscriber[Any] = broker.subscriber(
        *topics,
        batch=True,
        ack_policy=AckPolicy.MANUAL,
        batch_timeout_ms=BATCH_WAIT_MS,
        decoder=undecoded,
        **consumer_options(settings),
        **options,
    )
    return subscriber


def batch_records(message: StreamMessage[Any]) -> tuple[ConsumerRecord, ...]:
    """The records of a batch subscriber's message (a tuple from Kafka, a list from FastStream's
    in-memory test broker)."""
    records = message.raw_message
    return tuple(records) if isinstance(records, tuple | list) else (records,)


class RecordPublisher(Protocol):
    """What publishes a service's records: :class:`Publisher` (the ingress) or
    :class:`StreamPublisher` (the FastStream services)."""

    async def publish(self, topic: str, key: str, value: bytes) -> tuple[int, int]: ...

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None: ...


class StreamPublisher:
    """:class:`Publisher`'s contract on a FastStream broker's producer (started and stopped with
    the broker, i.e. the service's FastStream application): ``publish_many`` hands records over
    in order, all in flight at once, and returns once the broker acknowledged every one, within
    ``publish_timeout_s``, or raises BrokerUnavailable / EventTooLarge. Values are exactly the
    events' bytes; FastStream adds a ``correlation_id`` header (one per record batch)."""

    def __init__(self, broker: KafkaBroker, settings: Settings) -> None:
        self._broker = broker
        self._settings = settings

    async def publish(self, topic: str, key: str, value: bytes) -> tuple[int, int]:
        with translated_errors(self._settings, topic, len(value)):
            async with asyncio.timeout(self._settings.publish_timeout_s):
                metadata = await self._broker.publish(value, topic, key=key.encode())
        return int(metadata.partition), int(metadata.offset)

    async def publish_many(self, records: list[tuple[str, str, bytes]]) -> None:
        """One FastStream ``publish_batch`` per partition (several when its records exceed one
        batch), each record in its key's home partition as the producer's partitioner would put
        it. FastStream's per-message ``publish`` (a command, its middlewares, a correlation id
        and headers for each record) cost 1.8x aiokafka's ``send`` in CPU per 2 KB record; its
        batch path costs about what ``send`` does (bench/publish.py, docs/benchmarks.md §4i)."""
        if not records:
            return
        largest = max(len(value) for _, _, value in records)
        with translated_errors(self._settings, _topics(records), largest):
            async with asyncio.timeout(self._settings.publish_timeout_s):
                batches = partition_batches(
                    records,
                    {topic: await self._partitions(topic) for topic in {t for t, _, _ in records}},
                    self._settings.max_event_bytes,
                )
                acks = [
                    await self._broker.publish_batch(
                        *(KafkaPublishMessage(value, key=key) for key, value in batch),
                        topic=topic,
                        partition=partition,
                        no_confirm=True,
                    )
                    for topic, partition, batch in batches
                ]
                await asyncio.gather(*acks)

    async def _partitions(self, topic: str) -> list[int]:
        # The partitions the broker's own producer knows (and refreshes), so a key lands where
        # a plain publish of it would. FastStream 0.7 has no public accessor for its producer.
        producer: AIOKafkaProducer = self._broker.config.producer._producer.producer  # type: ignore[attr-defined]
        return sorted(await producer.partitions_for(topic))


# What a record adds to its batch besides its key and value (lengths, offsets, FastStream's
# correlation-id header), and a batch besides its records; generous, so a batch never overflows.
_RECORD_OVERHEAD = 128
_BATCH_OVERHEAD = 256


def partition_batches(
    records: list[tuple[str, str, bytes]], partitions: dict[str, list[int]], max_event_bytes: int
) -> list[tuple[str, int, list[tuple[bytes, bytes]]]]:
    """(topic, partition, [(key, value)]) batches of ``records``, each record in its key's home
    partition (:func:`home_partition`) and the records of a partition in their given order; a
    batch stays within the producer's batch size and ``max_event_bytes`` (a broker's limit on a
    record batch) unless one record alone is larger. A record larger than ``max_event_bytes``
    fails the lot before anything is sent (``MessageSizeTooLargeError``), as the producer's
    ``send`` would fail it."""
    limit = min(MAX_BATCH_BYTES, max_event_bytes)
    open_batches: dict[tuple[str, int], tuple[list[tuple[bytes, bytes]], int]] = {}
    done: list[tuple[str, int, list[tuple[bytes, bytes]]]] = []
    for topic, key, value in records:
        encoded = key.encode()
        size = len(encoded) + len(value) + _RECORD_OVERHEAD
        if len(encoded) + len(value) > max_event_bytes:
            raise MessageSizeTooLargeError(f"a record of {len(value)} bytes to {topic!r}")
        where = (topic, home_partition(key, partitions[topic]))
        batch, used = open_batches.get(where, ([], _BATCH_OVERHEAD))
        if batch and used + size > limit:
            done.append((*where, batch))
            batch, used = [], _BATCH_OVERHEAD
        batch.append((encoded, value))
        open_batches[where] = (batch, used + size)
    return done + [(*where, batch) for where, (batch, _) in open_batches.items()]
