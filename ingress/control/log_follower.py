"""Follows the broadcast logs on every ingress replica (``<prefix>.control`` and
``<prefix>.ended``): each whole topic, from the beginning, through one reader
(:class:`titoflow.bus.LogReader`: one consumer, no group, nothing committed).

At start it applies every partition up to the end offsets it finds (so a replica started during
a pause is paused, and knows which sessions ended, before it serves), then follows; the reader
waits out broker outages. Each event goes to every subscriber of its topic in log order (per
partition); a subscriber is a plain callable that must not block (start a task for slow work).
Records it cannot decode (an unknown type or schema version) are logged and skipped: events from
newer titoflows must not stop older replicas.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Generic, TypeVar

from pydantic import TypeAdapter, ValidationError

from schemas.control import AnyControl, control_adapter
from schemas.events import SessionBudgeted, SessionEnded, ended_adapter
from titoflow.bus import Broker, BrokerUnavailable, ConsumerRecord, LogReader, TopicPartition
from titoflow.settings import Settings

log = logging.getLogger("titoflow.follow")

E = TypeVar("E")
RETRY_S = 1.0


class FollowedTopic(Generic[E]):
    """One followed topic: how its records decode, and who hears of its events."""

    def __init__(self, topic: str, adapter: TypeAdapter[E]) -> None:
        self.topic = topic
        self._adapter = adapter
        self._subscribers: list[Callable[[E, int], None]] = []  # (event, offset)

    def subscribe(self, subscriber: Callable[[E, int], None]) -> None:
        self._subscribers.append(subscriber)

    def apply(self, record: ConsumerRecord) -> None:
        try:
            event = self._adapter.validate_json(record.value or b"")
        except ValidationError as exc:
            log.warning("skipping %s record @%d: %s", self.topic, record.offset, exc)
            return
        for subscriber in self._subscribers:
            subscriber(event, record.offset)


class LogFollower:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._topics: dict[str, FollowedTopic[Any]] = {}
        self._reader = LogReader(settings, self._apply, log)

    def follow(self, topic: str, adapter: TypeAdapter[E]) -> FollowedTopic[E]:
        """Follow ``topic`` too (before :meth:`start`); its events are decoded by ``adapter``."""
        followed = FollowedTopic(topic, adapter)
        self._topics[topic] = followed
        return followed

    async def start(self, timeout_s: float) -> bool:
        """Apply every followed log up to its current end; whether that worked within
        ``timeout_s`` (if not, :meth:`run` keeps trying and the replica serves meanwhile, as
        without a broker)."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._reader.catch_up(list(self._topics))
        except (TimeoutError, BrokerUnavailable) as exc:
            log.warning("%s not read at start: %r", ", ".join(self._topics), exc)
            return False
        return True

    async def run(self) -> None:
        """Follow the logs until cancelled: connect (retrying while the broker is away), then
        the reader follows."""
        while not self._reader.connected:
            try:
                await self._reader.connect(list(self._topics))
            except BrokerUnavailable as exc:
                log.warning("%s unreadable, retrying: %r", ", ".join(self._topics), exc)
                await asyncio.sleep(RETRY_S)
        await asyncio.Event().wait()

    def declare(self, partitions: list[TopicPartition]) -> Broker:
        """The broker whose subscriber follows ``partitions`` (not started; a test drives it
        with FastStream's in-memory ``TestKafkaBroker``)."""
        return self._reader.declare(partitions)

    def _apply(self, record: ConsumerRecord) -> None:
        self._topics[record.topic].apply(record)

    async def stop(self) -> None:
        await self._reader.stop()


def control_log(follower: LogFollower) -> FollowedTopic[AnyControl]:
    """``<prefix>.control``: pause, resume, weight versions and engine changes, one order."""
    control = follower.follow(follower.settings.topic("control"), control_adapter)
    control.subscribe(lambda event, offset: log.info("control event @%d: %s", offset, event.type))
    return control


def ended_log(follower: LogFollower) -> FollowedTopic[SessionEnded | SessionBudgeted]:
    """``<prefix>.ended``: how and when sessions ended, and the budgets they were opened with."""
    return follower.follow(follower.settings.topic("ended"), ended_adapter)
