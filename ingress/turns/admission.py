"""Whether a call may reach the engine, how many tokens it may ask for, and the sampling the
rollout driver forces on its session (:mod:`ingress.turns.sampling`), in three phases the
service calls in order: :meth:`Admission.enter` (before rendering: budget, bounds in flight, an
open session), :meth:`Admission.fit` (the prompt known: step limit, max_tokens, token budget
and the driver's sampling in one clamp), :meth:`Admission.admit` (the pause gate, the session
still open, the weight version).

Invariants:
- Every refusal (a session that already ended, the session's step limit or budget, the context
  window, this replica's bound on generations in flight, a pause held past its time, with
  partial rollout off weights other than those the chain started on) is raised before the
  engine is called, so a refused call publishes nothing and leaves every chain as it was.
- A call's place among the engines' bound is reserved here too, before rendering, so that
  concurrent calls cannot all pass and a stream is refused before its status line (the pool
  refuses again when it picks an engine at its limit, the last word).
- A call admitted holds one :class:`Slot` of :class:`InFlight` (a place per sample of a chat
  request's ``n``, each with its engine reservation) until it ends, however it ends
  (answered, failed, cancelled, its stream dropped): the slot's release is idempotent and the
  service releases it on every path. A call beyond the bound is refused at once (429 with
  ``Retry-After``), not queued: the engine queues already, and every scaffold's SDK retries.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from operator import attrgetter
from typing import Protocol, TypeVar

from ingress.turns import sampling
from ingress.turns.budgets import SessionBudgets
from ingress.turns.ended_sessions import EndedSessions
from ingress.turns.prompts import PreparedCall
from ingress.turns.service_options import ServiceOptions
from ingress.turns.turn import ChatTurn, TokenCall
from titoflow.errors import (
    ContextOverflow,
    InvalidRequest,
    Overloaded,
    SessionStepLimit,
    TrajectoryVersionChanged,
)

R = TypeVar("R", ChatTurn, TokenCall)


class Control(Protocol):
    """The control plane as the service sees it
    (:class:`ingress.control.control_state.PauseGate`)."""

    @property
    def version(self) -> str | None: ...

    async def admit(self) -> None: ...


class Capacity(Protocol):
    """The engines' room as admission sees it (:class:`titoflow.engine.pool.EnginePool`): a
    place reserved for the call, or :class:`Overloaded`; calling the result frees it."""

    def reserve(self) -> Callable[[], None]: ...


class Slot:
    """One admitted generation's place in flight (and its engine reservation, ``also``):
    released once, whichever path releases it."""

    __slots__ = ("_also", "_owner", "_places")

    def __init__(
        self, owner: InFlight, also: Callable[[], None] | None = None, places: int = 1
    ) -> None:
        self._owner: InFlight | None = owner
        self._also = also
        self._places = places

    def release(self) -> None:
        if self._owner is not None:
            self._owner.count -= self._places
            self._owner = None
            if self._also is not None:
                self._also()


class InFlight:
    """Generations in flight on this replica, bounded by ``limit`` (0: unbounded)."""

    def __init__(self, limit: int, retry_after_s: int = 1) -> None:
        self.limit = limit
        self.retry_after_s = retry_after_s
        self.count = 0

    def acquire(self, also: Callable[[], None] | None = None, places: int = 1) -> Slot:
        """A slot of ``places`` generations, or :class:`Overloaded` at the bound; ``also`` (the
        call's engine reservations) is called when the slot is released, or at once when it is
        refused. More places than the bound are a bad request: no retry could pass."""
        if self.limit and self.count + places > self.limit:
            if also is not None:
                also()
            if places > self.limit:
                raise InvalidRequest(
                    f"n={places} samples exceed this replica's bound of {self.limit} "
                    "generations in flight (TITOFLOW_MAX_IN_FLIGHT)",
                    "n",
                )
            raise Overloaded(
                f"this ingress replica has {self.count} generations in flight, its bound "
                "(TITOFLOW_MAX_IN_FLIGHT): retry after the Retry-After seconds",
                "replica",
                self.retry_after_s,
            )
        self.count += places
        return Slot(self, also, places)


_ROLE = attrgetter("role")


def turn_number(turn: ChatTurn) -> int:
    """The call's place in its conversation, read from the call alone (so every replica reads
    the same): one more than the assistant turns its history holds."""
    return 1 + list(map(_ROLE, turn.messages)).count("assistant")  # C loops: docs/benchmarks.md §9


@dataclass(frozen=True)
class Admission:
    options: ServiceOptions
    control: Control | None  # None: never paused, no weight version announced
    ended: EndedSessions
    # Unbounded unless the service is given the replica's (tests and benchmarks).
    budgets: SessionBudgets = field(default_factory=lambda: SessionBudgets(sys.maxsize))
    in_flight: InFlight = field(default_factory=lambda: InFlight(0))
    engines: Capacity | None = None  # None: the engines' room is not bounded

    def enter(self, session_id: str, turn: Callable[[], int], samples: int = 1) -> Slot:
        """Phase one, before any rendering, so a refusal costs next to nothing: a call of
        ``session_id`` (its ``turn()``-th in its conversation, counted only for a session with
        a turn budget) of ``samples`` engine calls, within its budget and the bounds on calls
        in flight, of a session still open. The caller releases the slot when the call ends."""
        self.budgets.check(session_id, turn, time.time())
        if self.engines is None:
            slot = self.in_flight.acquire(places=samples)
        elif samples == 1:
            slot = self.in_flight.acquire(also=self.engines.reserve())
        else:
            reserved: list[Callable[[], None]] = []

            def free_all() -> None:
                for free in reserved:
                    free()

            try:
                for _ in range(samples):
                    reserved.append(self.engines.reserve())
            except Overloaded:
                free_all()
                raise
            slot = self.in_flight.acquire(free_all, samples)
        try:
            self.ended.refuse_if_ended(session_id)
        except BaseException:
            slot.release()
            raise
        return slot

    def fit(self, call: PreparedCall[R]) -> PreparedCall[R]:
        """Phase two, the prompt known: the call within its session's step limit, and in one
        clamp its max_tokens (:meth:`max_tokens`) and the sampling the driver forces on the
        session in place of the caller's."""
        session_id = call.request.session.session_id
        parent = call.parent
        if parent is not None and 0 < self.options.max_steps_per_session <= parent.depth:
            raise SessionStepLimit(
                f"session {session_id} reached its limit of "
                f"{self.options.max_steps_per_session} steps"
            )
        asked = call.params.max_tokens
        granted = self.max_tokens(asked, len(call.prompt), session_id)
        params = call.params if granted == asked else replace(call.params, max_tokens=granted)
        overrides = self.budgets.overrides(session_id)
        if overrides is not None:
            params = sampling.overridden(params, overrides, call.step_id)
        return call if params is call.params else replace(call, params=params)

    def max_tokens(self, asked: int | None, prompt_len: int, session_id: str) -> int:
        """What a call may generate: asked (or the default), capped (the deployment's cap, the
        driver's for the session), clamped to the room left in the context window (or refused,
        by the context policy), then to what the session's token budget leaves."""
        room = self.options.max_model_len - prompt_len
        wanted = asked or self.options.default_max_tokens
        if self.options.max_tokens_cap:
            wanted = min(wanted, self.options.max_tokens_cap)
        overrides = self.budgets.overrides(session_id)
        if overrides is not None and overrides.max_tokens is not None:
            wanted = min(wanted, overrides.max_tokens)
        if room <= 0 or (self.options.context_policy == "refuse" and wanted > room):
            raise ContextOverflow(
                f"the prompt has {prompt_len} tokens and asks for {wanted} more; the model's "
                f"context is {self.options.max_model_len} tokens",
                prompt_tokens=prompt_len,
                limit=self.options.max_model_len,
            )
        return self.budgets.max_tokens(session_id, min(wanted, room), prompt_len)

    async def admit(self, call: PreparedCall[R]) -> str | None:
        """Phase three, last before the engine: wait while generation is paused (bounded), then
        check the session is still open and the weights the call will run on (a version
        announced during the wait counts); return their version."""
        if self.control is None:
            return None
        session_id = call.request.session.session_id
        await self.control.admit()
        self.ended.refuse_if_ended(session_id)  # it may have ended while the call waited
        current = self.control.version
        first = call.parent.first_version if call.parent else None
        if self.options.partial_rollout or current is None or first is None or current == first:
            return current
        raise TrajectoryVersionChanged(
            f"session {session_id} started on weights {first!r}; they are now {current!r} "
            "and partial rollout is off: start a new session",
            first_version=first,
            current_version=current,
        )
