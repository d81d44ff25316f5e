"""Reading a topic from the beginning in tests, without a consumer group."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TypeVar

from pydantic import TypeAdapter

from titoflow.bus import make_consumer
from titoflow.settings import Settings

T = TypeVar("T")


async def read_until(
    settings: Settings,
    topic: str,
    adapter: TypeAdapter[T],
    done: Callable[[list[T]], bool],
    timeout_s: float = 60.0,
) -> list[T]:
    """Every event of ``topic`` read so far once ``done(events)`` holds; TimeoutError otherwise."""
    consumer = make_consumer(settings, topic, group_id=None)
    await consumer.start()
    events: list[T] = []
    try:
        async with asyncio.timeout(timeout_s):
            while not done(events):
                batch = await consumer.getmany(timeout_ms=500)
                for records in batch.values():
                    events += [adapter.validate_json(r.value) for r in records]
    finally:
        await consumer.stop()
    return events
