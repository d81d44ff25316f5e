"""The session's log as the turn logic sees it: the events it holds and how they get there.

Invariant: :data:`Publish` returns only once the broker acknowledged the event (``app.py``
publishes with acks=all, keyed by the session, so a session's events keep their order) and
raises otherwise; callers change no state that depends on an event before it returned.
:data:`PublishTogether` does the same for several steps of one session at once, all or none:
they are appended as one record batch, so a failure leaves none of them recorded.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from schemas.events import (
    SessionBudgeted,
    SessionDiscarded,
    SessionEnded,
    SessionFinalized,
    SessionOpened,
    StepRecorded,
)

SessionEvent = (
    SessionOpened
    | StepRecorded
    | SessionFinalized
    | SessionDiscarded
    | SessionEnded
    | SessionBudgeted
)
Publish = Callable[[SessionEvent], Awaitable[None]]
PublishTogether = Callable[[Sequence[StepRecorded]], Awaitable[None]]
