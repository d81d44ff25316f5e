"""Where a keyed record goes: its key's home partition, as the producers' default partitioner
puts it, and record batches per partition.

Invariant: a key lands in the partition a plain publish of it would (murmur2, as Kafka's Java
client and aiokafka use), so a session's records stay in order whichever publisher sent them.
"""

from __future__ import annotations

from aiokafka.errors import MessageSizeTooLargeError
from aiokafka.partitioner import DefaultPartitioner

from titoflow.bus.options import MAX_BATCH_BYTES


def home_partition(key: str, partitions: list[int]) -> int:
    """The partition a producer with the default partitioner (murmur2, as Kafka's Java client
    and aiokafka use) puts ``key`` in, among all of a topic's ``partitions``."""
    chosen: int = DefaultPartitioner()(key.encode(), partitions, partitions)
    return chosen


def topic_names(records: list[tuple[str, str, bytes]]) -> str:
    """The topics (topic, key, value) ``records`` go to, for an error message."""
    return ", ".join(sorted({topic for topic, _, _ in records}))


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
