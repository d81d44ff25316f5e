"""Trainer side: read finalized segments from ``<prefix>.segments``, each exactly once.

Workers deliver at least once (a crash replays open sessions), and a replayed segment carries
the same ``segment_id``; this consumer drops the repeats. Usage::

    async with SegmentConsumer(settings, group_id="trainer") as segments:
        async for segment in segments:
            ...
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from types import TracebackType

from schemas.events import SegmentFinalized
from titoflow.bus import make_consumer
from titoflow.settings import Settings

DEDUPE_WINDOW = 1_000_000


class SegmentConsumer:
    def __init__(
        self, settings: Settings, group_id: str | None = None, dedupe_window: int = DEDUPE_WINDOW
    ) -> None:
        """``group_id=None`` reads the whole topic without committing (inspection, tests)."""
        self._group_id = group_id
        self._consumer = make_consumer(settings, settings.topic("segments"), group_id=group_id)
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._dedupe_window = dedupe_window
        self.duplicates_dropped = 0
        self.position: tuple[str, int, int] = (
            "",
            -1,
            -1,
        )  # (topic, partition, offset) last yielded

    async def __aenter__(self) -> SegmentConsumer:
        await self._consumer.start()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._consumer.stop()

    def _first_time(self, segment_id: str) -> bool:
        if segment_id in self._seen:
            self.duplicates_dropped += 1
            return False
        self._seen[segment_id] = None
        if len(self._seen) > self._dedupe_window:
            self._seen.popitem(last=False)
        return True

    async def __aiter__(self) -> AsyncIterator[SegmentFinalized]:
        while True:
            batch = await self._consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                for record in records:
                    segment = SegmentFinalized.model_validate_json(record.value)
                    if self._first_time(segment.segment_id):
                        self.position = (record.topic, record.partition, record.offset)
                        yield segment
                # Committed once the caller took every segment of the batch (at least once).
                if self._group_id is not None:
                    await self._consumer.commit({tp: records[-1].offset + 1})
