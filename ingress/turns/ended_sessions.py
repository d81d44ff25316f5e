"""Which sessions ended, how and when: a session ends once.

Fed by ``<prefix>.ended`` (every replica follows it) and, at once, by this replica's own
finalizes and discards. The first end of a session stands: a later end, a reopening and a
scaffold's call on the session are refused with :class:`~titoflow.errors.SessionAlreadyEnded`
naming it, never answered with a 200 that changes nothing (or whose step no worker would take).
The record is bounded (the most recent ends), like the topic's retention.
"""

from __future__ import annotations

import datetime
from collections import OrderedDict

from schemas.events import SessionEnded
from titoflow.errors import SessionAlreadyEnded

_SAID = {
    "finalized": "finalized by the rollout driver",
    "discarded": "discarded by the rollout driver",
    "idle": "finalized by a worker after its idle timeout, without a reward",
}


class EndedSessions:
    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._ends: OrderedDict[str, SessionEnded] = OrderedDict()

    def record(self, end: SessionEnded, _offset: int = -1) -> None:
        """Remember ``end`` unless the session already ended (the first end stands)."""
        if end.session_id in self._ends:
            return
        self._ends[end.session_id] = end
        while len(self._ends) > self._kept:
            self._ends.popitem(last=False)

    def get(self, session_id: str) -> SessionEnded | None:
        return self._ends.get(session_id)

    def claim(self, end: SessionEnded) -> None:
        """Record ``end`` now, before it is published, so that a concurrent second end on this
        replica is refused; raises :class:`SessionAlreadyEnded` if the session already ended."""
        self.refuse_if_ended(end.session_id)
        self.record(end)

    def release(self, end: SessionEnded) -> None:
        """Undo :meth:`claim` when the end could not be published (the driver will retry)."""
        if self._ends.get(end.session_id) is end:
            del self._ends[end.session_id]

    def refuse_if_ended(self, session_id: str) -> None:
        """Raise :class:`SessionAlreadyEnded`, naming how and when, if the session ended."""
        end = self._ends.get(session_id)
        if end is None:
            return
        when = datetime.datetime.fromtimestamp(end.event_time, datetime.UTC)
        raise SessionAlreadyEnded(
            f"session {session_id!r} already ended: {_SAID[end.how]} at "
            f"{when.isoformat(timespec='milliseconds')}",
            how=end.how,
            ended_at=end.event_time,
        )
