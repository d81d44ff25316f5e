"""Segments → groups of one instance's rollouts, each complete when its driver says so.

A group is the rollouts a driver launched for one prompt (instance), for group-relative
advantages (GRPO, RLOO). titoflow does not know how many that is: the driver does, and says so
either to the collector (``group_size=n``) or in band, as the ``group_size`` metadata of the
sessions it opens (``RolloutClient.open(metadata={"group_size": n})``), which every segment and
discard notice of those sessions carries. A session has ended once its ``last_of_session``
segment or its discard notice arrived (a session can yield several segments, or none).

Invariant: a group is handed out once, when as many of its sessions have ended as its size, or
as incomplete (``complete=False``) when ``timeout_s`` passed since its first event or the source
ended; an instance id seen again after its group was handed out starts a new group (a prompt
sampled again in a later step). Segments marked ``unused_sample`` are left out unless asked for.
A session without an instance id is a group of its own.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from schemas.events import SegmentFinalized, SessionDiscarded
from titoflow.client.batch import instance_key

GROUP_SIZE_KEY = "group_size"


@dataclass
class Group:
    key: str  # the instance id, else the session id
    segments: list[SegmentFinalized] = field(default_factory=list)
    ended_sessions: set[str] = field(default_factory=set)
    size: int = 1  # sessions expected
    complete: bool = False  # False: handed out by the timeout or at the end of the source
    first_at: float = 0.0


class GroupCollector:
    def __init__(
        self,
        group_size: int | None = None,
        timeout_s: float | None = None,
        size_key: str = GROUP_SIZE_KEY,
        unused_samples: bool = False,
    ) -> None:
        """``group_size``: sessions per instance, when the sessions' ``size_key`` metadata does
        not say; ``timeout_s``: hand out a group that long after its first event even if
        incomplete (None: wait)."""
        if group_size is not None and group_size < 1:
            raise ValueError("group_size must be at least 1")
        self._group_size = group_size
        self._timeout_s = timeout_s
        self._size_key = size_key
        self._unused_samples = unused_samples
        self._open: dict[str, Group] = {}

    def _size(self, event: SegmentFinalized | SessionDiscarded) -> int:
        if event.instance_id is None:
            return 1
        said = event.metadata.get(self._size_key)
        if isinstance(said, int) and not isinstance(said, bool) and said >= 1:
            return said
        if said is not None:
            raise ValueError(
                f"session {event.session_id}: metadata {self._size_key}={said!r} is not a "
                "positive int"
            )
        if self._group_size is None:
            raise ValueError(
                f"session {event.session_id} of instance {event.instance_id}: no group size; "
                f"open sessions with metadata {{{self._size_key!r}: n}} or pass group_size=n"
            )
        return self._group_size

    def add(self, event: SegmentFinalized | SessionDiscarded, now: float) -> Group | None:
        """Take one event of the segments topic; the group it completes, if any."""
        key = instance_key(event)
        group = self._open.get(key)
        if group is None:
            group = self._open[key] = Group(key, size=self._size(event), first_at=now)
        if isinstance(event, SegmentFinalized):
            if self._unused_samples or not event.unused_sample:
                group.segments.append(event)
            if not event.last_of_session:
                return None
        group.ended_sessions.add(event.session_id)
        if len(group.ended_sessions) < group.size:
            return None
        del self._open[key]
        group.complete = True
        return group

    def expired(self, now: float) -> list[Group]:
        """Groups whose time ran out, handed out incomplete."""
        if self._timeout_s is None:
            return []
        late = [g for g in self._open.values() if now - g.first_at >= self._timeout_s]
        for group in late:
            del self._open[group.key]
        return late

    def flush(self) -> list[Group]:
        """Every open group, incomplete (the source ended)."""
        groups = list(self._open.values())
        self._open.clear()
        return groups
