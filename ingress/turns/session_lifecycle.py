"""A session's opening and end on its log, as the rollout driver asks for them.

Invariant: a session ends once, and is not reopened. A budget or sampling overrides set at open
are on ``<prefix>.ended`` (for every replica) before the session's opening is on its log, and
this replica applies them from then on. Its end is claimed on this replica before
it is published (a concurrent second end is refused) and released if the publish fails (the
driver's retry gets through); its cached chains are forgotten only once the end is on the
session's log, and then ``<prefix>.ended`` tells every replica.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Literal

from ingress.turns.budgets import SessionBudgets
from ingress.turns.chains import ChainStore
from ingress.turns.ended_sessions import EndedSessions
from ingress.turns.session_log import Publish
from ingress.turns.turn import SessionRef
from schemas.events import (
    SamplingOverrides,
    SessionBudget,
    SessionBudgeted,
    SessionDiscarded,
    SessionEnded,
    SessionFinalized,
    SessionOpened,
    SessionOptions,
)
from titoflow.engine.groups import RoutingKeys


@dataclass(frozen=True)
class SessionLifecycle:
    publish: Publish
    chains: ChainStore
    ended: EndedSessions
    budgets: SessionBudgets
    routing: RoutingKeys

    async def open_session(
        self,
        session: SessionRef,
        channel: str | None,
        metadata: dict[str, Any],
        options: SessionOptions,
        budget: SessionBudget | None = None,
        sampling: SamplingOverrides | None = None,
    ) -> SessionOpened:
        self.ended.refuse_if_ended(session.session_id)  # an ended session is not reopened
        budget = budget or SessionBudget()
        sampling = sampling or SamplingOverrides()
        event = SessionOpened(
            session_id=session.session_id,
            event_time=time.time(),
            instance_id=session.instance_id,
            channel=channel,
            metadata=metadata,
            options=options,
            budget=budget,
            sampling=sampling,
        )
        # Group routing: every replica must know the instance a session was opened with.
        instance = session.instance_id if self.routing.by_instance else None
        if budget or sampling or instance:
            # First: a failed publish leaves no session opened without its budget, overrides or
            # routing.
            budgeted = SessionBudgeted(
                session_id=event.session_id,
                event_time=event.event_time,
                budget=budget,
                sampling=sampling,
                instance_id=instance,
            )
            await self.publish(budgeted)
            self.budgets.record(budgeted)
        await self.publish(event)
        self.routing.opened(event.session_id, event.instance_id)
        return event

    async def finalize(
        self,
        session: SessionRef,
        metadata: dict[str, Any],
        reward: float | None = None,
        reward_components: dict[str, float] | None = None,
    ) -> SessionFinalized:
        event = SessionFinalized(
            session_id=session.session_id,
            event_time=time.time(),
            reward=reward,
            reward_components=reward_components or {},
            metadata=metadata,
        )
        await self._end(event, "finalized")
        return event

    async def discard(self, session: SessionRef, metadata: dict[str, Any]) -> SessionDiscarded:
        event = SessionDiscarded(
            session_id=session.session_id, event_time=time.time(), metadata=metadata
        )
        await self._end(event, "discarded")
        return event

    async def _end(
        self, event: SessionFinalized | SessionDiscarded, how: Literal["finalized", "discarded"]
    ) -> None:
        """End a session once: refused if it already ended (here or on any replica that
        published it); the end goes to the session's log, then to ``<prefix>.ended``."""
        end = SessionEnded(session_id=event.session_id, event_time=event.event_time, how=how)
        self.ended.claim(end)
        try:
            await self.publish(event)
        except BaseException:
            self.ended.release(end)  # nothing ended: the driver's retry must be let through
            raise
        self.chains.forget(event.session_id)
        # The session did end (workers will apply it); a failure here is the driver's cue to
        # retry, which this replica answers with 409 and another one with a dead letter.
        await self.publish(end)
