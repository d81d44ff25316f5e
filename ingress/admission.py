"""Whether a call may reach the engine, and how many tokens it may ask for.

Invariant: every refusal (a session that already ended, the session's step limit, the context
window, a pause held past its time, with partial rollout off weights other than those the chain
started on) is raised before the engine is called, so a refused call publishes nothing and leaves
every chain as it was.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from ingress.chains import Chain
from ingress.ended_sessions import EndedSessions
from ingress.service_options import ServiceOptions
from titoflow.errors import ContextOverflow, SessionStepLimit, TrajectoryVersionChanged


class Control(Protocol):
    """The control plane as the service sees it (:class:`ingress.control_state.PauseGate`)."""

    @property
    def version(self) -> str | None: ...

    async def admit(self) -> None: ...


@dataclass(frozen=True)
class Admission:
    options: ServiceOptions
    control: Control | None  # None: never paused, no weight version announced
    ended: EndedSessions

    def check_open(self, session_id: str) -> None:
        """A session the driver (or a worker's idle timeout) ended takes no more calls: their
        steps would reach no segment, so the scaffold is told (409) instead."""
        self.ended.refuse_if_ended(session_id)

    def check_step_limit(self, session_id: str, parent: Chain) -> None:
        if 0 < self.options.max_steps_per_session <= parent.depth:
            raise SessionStepLimit(
                f"session {session_id} reached its limit of "
                f"{self.options.max_steps_per_session} steps"
            )

    def max_tokens(self, asked: int | None, prompt_len: int) -> int:
        """What a call may generate: asked (or the default), capped, and clamped to the room
        left in the context window (or refused, by the context policy)."""
        room = self.options.max_model_len - prompt_len
        wanted = asked or self.options.default_max_tokens
        if self.options.max_tokens_cap:
            wanted = min(wanted, self.options.max_tokens_cap)
        if room <= 0 or (self.options.context_policy == "refuse" and wanted > room):
            raise ContextOverflow(
                f"the prompt has {prompt_len} tokens and asks for {wanted} more; the model's "
                f"context is {self.options.max_model_len} tokens",
                prompt_tokens=prompt_len,
                limit=self.options.max_model_len,
            )
        return min(wanted, room)

    async def admit(self, session_id: str, parent: Chain | None) -> str | None:
        """Wait while generation is paused (bounded), then check the weights the call will run
        on (a version announced during the wait counts); return their version."""
        if self.control is None:
            return None
        await self.control.admit()
        self.check_open(session_id)  # it may have ended while the call waited for a resume
        current = self.control.version
        first = parent.first_version if parent else None
        if self.options.partial_rollout or current is None or first is None or current == first:
            return current
        raise TrajectoryVersionChanged(
            f"session {session_id} started on weights {first!r}; they are now {current!r} "
            "and partial rollout is off: start a new session",
            first_version=first,
            current_version=current,
        )
