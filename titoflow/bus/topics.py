"""The six topics' layout: created with their partition counts and retentions when missing,
checked when present.

Invariant: titoflow never alters an existing topic (its operators may have meant it, and tansu
has no AlterConfigs): one with fewer partitions than configured, or a control topic of more than
one, is refused with :class:`TopicLayoutError`; one with another retention is named in a warning.
"""

from __future__ import annotations

import asyncio
import logging

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError

from titoflow.bus.errors import BrokerUnavailable, TopicLayoutError
from titoflow.bus.options import producer_request_timeout_ms
from titoflow.settings import Settings

log = logging.getLogger("titoflow.bus")

# Kafka error code for "Topic with this name already exists" in a CreateTopics response.
_TOPIC_ALREADY_EXISTS = 36
# A single tansu broker or a test Kafka cannot replicate further; a real cluster with
# min.insync.replicas > 1 needs topics created by its operators (ensure_topics then only checks).
_REPLICATION_FACTOR = 1
# How long ensure_topics waits for freshly created topics to show up in metadata (Kafka creates
# them asynchronously; tansu at once).
_TOPIC_VISIBLE_TIMEOUT_S = 10.0


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
