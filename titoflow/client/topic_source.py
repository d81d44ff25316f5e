"""The segments topic as a plain (blocking) iterator, for a data loader that is not async.

A thread runs a :class:`~titoflow.client.consumer.SegmentConsumer` on its own event loop and
hands its records (segments and discard notices, repeats dropped), each with its partition and
offset, over a bounded queue.

Invariant: a pass (:class:`TopicStream`) yields every record the consumer yields, in its order,
and ``None`` whenever nothing arrived for ``poll_s`` (so that a caller waiting on groups or partial
rows can act on its timeouts); an error of the consumer is raised from the iterator; closing the
iterator stops the consumer and its thread. Nothing is committed unless the caller calls
:meth:`TopicStream.commit` (through the consumer's own loop), and never past what the caller took
from the queue: what sat in the queue comes again after a crash.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from schemas.events import SegmentFinalized, SessionDiscarded
from titoflow.client.consumer import SegmentConsumer
from titoflow.settings import Settings

Record = SegmentFinalized | SessionDiscarded
COMMIT_MARGIN_S = 5.0


@dataclass(frozen=True)
class Delivered:
    event: Record
    partition: int
    offset: int


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
        resume: Mapping[str, Any] | None = None,
        poll_s: float = 1.0,
        queue_size: int = 64,
    ) -> None:
        """``group_id``: the trainer's consumer group (None: the whole topic, nothing committed).
        ``resume``: what ``SegmentDataset.checkpoint()`` gave your last checkpoint (its
        ``offsets`` resume the partitions there rather than at the group's offsets, its ``done``
        offsets are skipped: see docs/trainer.md "With PyTorch")."""
        if resume and group_id is None:
            raise ValueError("resume continues a consumer group: give a group_id too")
        self.settings = settings
        self.group_id = group_id
        self.resume = resume
        self.poll_s = poll_s
        self.queue_size = queue_size

    def __iter__(self) -> TopicStream:
        return self.open(self.resume)

    def open(self, resume: Mapping[str, Any] | None) -> TopicStream:
        """A pass whose partitions start at ``resume``'s offsets (None: the group's)."""
        start = {int(p): int(o) for p, o in (resume or {}).get("offsets", {}).items()}
        return TopicStream(self, start)


class TopicStream(Iterator[Delivered | None]):
    """One pass over the topic: a consumer on its thread, until closed."""

    def __init__(self, source: TopicSource, start_offsets: dict[int, int]) -> None:
        self._source = source
        self._start_offsets = start_offsets
        self._handoff: queue.Queue[Delivered | _Failed | _Done] = queue.Queue(source.queue_size)
        self._consumer: SegmentConsumer | None = None
        self._loop = asyncio.new_event_loop()
        self._task = self._loop.create_task(self._pump())
        self._thread = threading.Thread(
            target=self._loop.run_until_complete,
            args=(self._task,),
            name="titoflow-segments",
            daemon=True,
        )
        self._thread.start()
        self._closed = False

    def __next__(self) -> Delivered | None:
        if self._closed:
            raise StopIteration
        try:
            item = self._handoff.get(timeout=self._source.poll_s)
        except queue.Empty:
            return None
        if isinstance(item, _Failed):
            self.close()
            raise item.error
        if isinstance(item, _Done):
            self.close()
            raise StopIteration
        return item

    def commit(self, offsets: Mapping[int, int]) -> None:
        """Commit each partition of ``offsets`` up to that offset (at most what was taken from
        the consumer); blocks until the broker answered (``SegmentConsumer.commit``'s errors)."""
        if self._closed or not self._thread.is_alive():
            raise RuntimeError("this pass over the topic has stopped: nothing to commit")
        future = asyncio.run_coroutine_threadsafe(self._commit(dict(offsets)), self._loop)
        # The consumer's commit gives up after publish_timeout_s; this bounds a loop that stopped
        # meanwhile (its consumer failed), which would never run the commit.
        future.result(timeout=self._source.settings.publish_timeout_s + COMMIT_MARGIN_S)

    async def _commit(self, offsets: dict[int, int]) -> None:
        if self._consumer is not None:  # None: not started, so nothing was taken either
            await self._consumer.commit(offsets)

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join()
        self._loop.close()

    def __del__(self) -> None:
        # A data loader drops its iterator without closing it: stop the thread all the same.
        if not getattr(self, "_closed", True):
            self.close()

    async def _pump(self) -> None:
        source = self._source
        try:
            async with SegmentConsumer(
                source.settings, source.group_id, start_offsets=self._start_offsets
            ) as consumer:
                self._consumer = consumer
                async for record in consumer.records():
                    _, partition, offset = consumer.position
                    await self._hand(Delivered(record, partition, offset))
            await self._hand(_Done())
        except asyncio.CancelledError:
            return
        except Exception as exc:
            await self._hand(_Failed(exc))

    async def _hand(self, item: Delivered | _Failed | _Done) -> None:
        # Never block the loop (the consumer's heartbeats run on it, and close() cancels on it).
        while True:
            try:
                self._handoff.put_nowait(item)
                return
            except queue.Full:
                await asyncio.sleep(0.01)
