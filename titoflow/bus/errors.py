"""The bus's errors: what a publish, a topic layout or a broker connection failed with, in
titoflow's terms.

Invariant: no aiokafka or FastStream exception leaves the package where a caller would have to
tell them apart; the bus translates them here, once (``CommitFailedError``, the one a trainer
catches by name, is the client's own to raise and is exported as it is).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from aiokafka.errors import CommitFailedError as CommitFailedError
from aiokafka.errors import KafkaError, MessageSizeTooLargeError

from titoflow.settings import Settings


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


class ReadStalled(Exception):
    """A read to a partition's end stopped advancing short of it: the log changed under it
    (retention deleted records, or the topic was recreated)."""


@contextlib.contextmanager
def unreachable(what: str) -> Iterator[None]:
    """A client's failure to reach the broker (``what`` it was doing) as BrokerUnavailable."""
    try:
        yield
    except (KafkaError, OSError) as exc:
        raise BrokerUnavailable(f"{what}: {exc!r}") from exc


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
