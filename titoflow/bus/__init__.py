"""The event bus: the only package that imports aiokafka or FastStream
(tests/project/test_layering.py). The services, the trainer client and the commands use the
names exported here, and see titoflow's errors only (:mod:`titoflow.bus.errors`).

- :mod:`~titoflow.bus.topics`: the topics' layout, created or checked;
- :mod:`~titoflow.bus.producer`: the acknowledged publisher;
- :mod:`~titoflow.bus.consumer`: aiokafka consumers with the shared options, and
  :func:`~titoflow.bus.consumer.read_to_end`;
- :mod:`~titoflow.bus.options` and :mod:`~titoflow.bus.partitioning`: the clients' settings, and
  where a key's records go;
- :mod:`~titoflow.bus.stream`: FastStream's broker, batch subscribers and publisher;
- :mod:`~titoflow.bus.subscription`: a consumer group's batch subscriber run as a service;
- :mod:`~titoflow.bus.follower`: whole topics read on every replica;
- :mod:`~titoflow.bus.dead_letter`: records no service could use, sent on with why;
- :mod:`~titoflow.bus.asyncapi`: the AsyncAPI document of every topic.
"""

from titoflow.bus.consumer import (
    Consumer,
    ConsumerRecord,
    RebalanceListener,
    TopicPartition,
    end_offsets,
    existing_partitions,
    make_consumer,
    pin_to_end,
    read_to_end,
    start_consumer,
)
from titoflow.bus.dead_letter import send_to_dlq
from titoflow.bus.errors import (
    BrokerUnavailable,
    CommitFailedError,
    EventTooLarge,
    ReadStalled,
    TopicLayoutError,
)
from titoflow.bus.follower import LogReader
from titoflow.bus.partitioning import home_partition
from titoflow.bus.producer import Publisher, RecordPublisher
from titoflow.bus.stream import Broker, StreamPublisher, batch_records, service_broker
from titoflow.bus.subscription import Batch, BatchSubscription
from titoflow.bus.topics import create_topics, ensure_topics

__all__ = [
    "Batch",
    "BatchSubscription",
    "Broker",
    "BrokerUnavailable",
    "CommitFailedError",
    "Consumer",
    "ConsumerRecord",
    "EventTooLarge",
    "LogReader",
    "Publisher",
    "ReadStalled",
    "RebalanceListener",
    "RecordPublisher",
    "StreamPublisher",
    "TopicLayoutError",
    "TopicPartition",
    "batch_records",
    "create_topics",
    "end_offsets",
    "ensure_topics",
    "existing_partitions",
    "home_partition",
    "make_consumer",
    "pin_to_end",
    "read_to_end",
    "send_to_dlq",
    "service_broker",
    "start_consumer",
]
