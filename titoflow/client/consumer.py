"""Trainer side: read finalized segments from ``<prefix>.segments``, each exactly once.

Workers deliver at least once (a crash replays open sessions), and a replayed segment carries
the same ``segment_id``; this consumer drops the repeats. Usage::

    async with SegmentConsumer(settings, group_id="trainer") as segments:
        async for segment in segments:
            ...

The topic also carries ``SessionDiscarded`` notices (a session that yields no segment);
iterating gives segments only, :meth:`SegmentConsumer.records` gives both.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from types import TracebackType

from schemas.events import SegmentFinalized, SessionDiscarded, segments_topic_adapter
from titoflow.bus import make_consumer, pin_to_end
from titoflow.settings import Settings

DEDUPE_WINDOW = 1_000_000
ASSIGNMENT_TIMEOUT_S = 30.0


class SegmentConsumer:
    def __init__(
        self,
        settings: Settings,
        group_id: str | None = None,
        dedupe_window: int = DEDUPE_WINDOW,
        from_end: bool = False,
        unused_samples: bool = False,
    ) -> None:
        """``group_id=None`` reads the whole topic without committing (inspection, tests);
        with ``from_end`` too, only what is published after ``__aenter__`` returned (a rollout
        driver waiting for the sessions it is about to run; on tansu also the last batch before
        it, see ``pin_to_end``). Iterating skips segments marked ``unused_sample`` (a client's
        retry, an unpicked best-of-n candidate: the reward was not earned through them) unless
        ``unused_samples``; :meth:`records` yields every one."""
        self._unused_samples = unused_samples
        self._group_id = group_id
        self._from_end = from_end and group_id is None
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
        if self._from_end:
            await pin_to_end(self._consumer, ASSIGNMENT_TIMEOUT_S)
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
        async for record in self.records():
            if isinstance(record, SegmentFinalized) and (
                self._unused_samples or not record.unused_sample
            ):
                yield record

    async def records(self) -> AsyncIterator[SegmentFinalized | SessionDiscarded]:
        """Segments and discard notices, each once (a notice's id is its session's)."""
        while True:
            batch = await self._consumer.getmany(timeout_ms=1000)
            for tp, records in batch.items():
                for record in records:
                    event = segments_topic_adapter.validate_json(record.value)
                    key = (
                        event.segment_id
                        if isinstance(event, SegmentFinalized)
                        else f"discarded:{event.session_id}"
                    )
                    if self._first_time(key):
                        self.position = (record.topic, record.partition, record.offset)
                        yield event
                # Committed once the caller took every segment of the batch (at least once).
                if self._group_id is not None:
                    await self._consumer.commit({tp: records[-1].offset + 1})
