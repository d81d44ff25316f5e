"""Sessions that ended here, and the offset a consumer may commit.

Invariants:
- An ended session leaves a tombstone (how and when it ended; the latest ``MAX_TOMBSTONES``):
  a step for it is late, not the start of a new session, and a second end names the first.
- A commit point never falls inside a session: no session, open or ended, has events both below
  and at or above it. A worker that restarts there reads every session it meets from its first
  event and rebuilds byte-identical segments (dropped downstream as duplicates), never a tail
  of a finished session dressed as a new one.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass

MAX_TOMBSTONES = 100_000


@dataclass(frozen=True)
class Ended:
    """How and when a session ended here (a tombstone)."""

    partition: int
    how: str  # finalized, discarded or idle
    at: float


class EndedSessions:
    def __init__(self) -> None:
        self._ended: OrderedDict[str, Ended] = OrderedDict()
        # Offsets [first, last] of ended sessions per partition, kept while a commit point
        # could still fall inside them (see commit_offset).
        self._spans: dict[int, dict[str, tuple[int, int]]] = {}

    def __contains__(self, session_id: str) -> bool:
        return session_id in self._ended

    def __getitem__(self, session_id: str) -> Ended:
        return self._ended[session_id]

    def add(self, session_id: str, ended: Ended, span: tuple[int, int]) -> None:
        """Record an end, and the offsets ``[first, last]`` of the session's events so far."""
        self._ended[session_id] = ended
        while len(self._ended) > MAX_TOMBSTONES:
            self._ended.popitem(last=False)
        self._spans.setdefault(ended.partition, {})[session_id] = span

    def seen(self, session_id: str, offset: int) -> None:
        """Stretch an ended session's span to an event of it at ``offset``."""
        ended = self._ended.get(session_id)
        if ended is None:
            return
        spans = self._spans.get(ended.partition, {})
        span = spans.get(session_id)
        if span is not None:
            spans[session_id] = (span[0], max(span[1], offset))

    def forget(self, partitions: set[int]) -> None:
        """Drop what is known of these partitions' sessions."""
        for session_id in [s for s, e in self._ended.items() if e.partition in partitions]:
            del self._ended[session_id]
        for partition in partitions:
            self._spans.pop(partition, None)

    def commit_offset(self, partition: int, next_offset: int, open_starts: Iterable[int]) -> int:
        """The offset a consumer may commit for ``partition`` after reading up to
        ``next_offset``, given the first offsets of the sessions still open in it."""
        spans = [(first, float("inf")) for first in open_starts]
        closed = self._spans.get(partition, {})
        spans += [(first, float(last)) for first, last in closed.values()]
        commit, moved = next_offset, True
        while moved:
            straddling = [first for first, last in spans if first < commit <= last]
            moved = bool(straddling)
            commit = min(straddling, default=commit)
        for session_id in [s for s, (_, last) in closed.items() if last < commit]:
            del closed[session_id]  # wholly below the commit point: it can never straddle it
        return commit
