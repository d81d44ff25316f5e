"""The segments topic as a plain (blocking) iterator, for a data loader that is not async.

A thread runs a :class:`~titoflow.client.consumer.SegmentConsumer` on its own event loop and
hands its records (segments and discard notices, repeats dropped) over a bounded queue.

Invariant: the iterator yields every record the consumer yields, in its order, and ``None``
whenever nothing arrived for ``poll_s`` (so that a caller waiting on groups or partial rows can
act on its timeouts); an error of the consumer is raised from the iterator; closing the iterator
stops the consumer and its thread. The consumer commits a batch once it handed it over: at most
``queue_size`` records plus what the caller holds are committed before the caller used them.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator
from dataclasses import dataclass

from schemas.events import SegmentFinalized, SessionDiscarded
from titoflow.client.consumer import SegmentConsumer
from titoflow.settings import Settings

Record = SegmentFinalized | SessionDiscarded


@dataclass(frozen=True)
class _Failed:
    error: BaseException


class _Done:
    """The consumer stopped."""


class TopicSource:
    def __init__(
        self,
        settings: Settings,
        group_id: str | None,
        *,
        poll_s: float = 1.0,
        queue_size: int = 64,
    ) -> None:
        """``group_id``: the trainer's consumer group (None: the whole topic, nothing committed).
        Several data-loader workers iterating one source in one group split its partitions, and
        each partition holds whole instances (the topic's key)."""
        self.settings = settings
        self.group_id = group_id
        self.poll_s = poll_s
        self.queue_size = queue_size

    @property
    def shards_itself(self) -> bool:
        """Consumers of one group split the partitions between them."""
        return self.group_id is not None

    def __iter__(self) -> Iterator[Record | None]:
        handoff: queue.Queue[Record | _Failed | _Done] = queue.Queue(self.queue_size)
        loop = asyncio.new_event_loop()
        task = loop.create_task(self._pump(handoff))
        thread = threading.Thread(
            target=loop.run_until_complete, args=(task,), name="titoflow-segments", daemon=True
        )
        thread.start()
        try:
            while True:
                try:
                    item = handoff.get(timeout=self.poll_s)
                except queue.Empty:
                    yield None
                    continue
                if isinstance(item, _Failed):
                    raise item.error
                if isinstance(item, _Done):
                    return
                yield item
        finally:
            loop.call_soon_threadsafe(task.cancel)
            thread.join()
            loop.close()

    async def _pump(self, handoff: queue.Queue[Record | _Failed | _Done]) -> None:
        try:
            async with SegmentConsumer(self.settings, self.group_id) as consumer:
                async for record in consumer.records():
                    # Never block the loop (the consumer's heartbeats run on it).
                    while True:
                        try:
                            handoff.put_nowait(record)
                            break
                        except queue.Full:
                            await asyncio.sleep(0.01)
        except asyncio.CancelledError:
            return
        except Exception as exc:
            handoff.put(_Failed(exc))
            return
        handoff.put(_Done())
