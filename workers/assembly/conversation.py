"""A segment's conversation, message by message, as the client sees it.

Invariant: two messages have the same key exactly when they differ in nothing a client keeps:
reasoning is left out (clients drop it) and tool-call arguments compare as JSON values. So a
history the client sends back unchanged matches the turns recorded for it, and an edited one
does not.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


def message_key(message: dict[str, Any]) -> tuple[Any, ...]:
    """A message as the conversation sees it."""
    calls = tuple(
        (
            call.get("id"),
            call["function"]["name"],
            json.dumps(call["function"].get("arguments"), sort_keys=True),
        )
        for call in message.get("tool_calls") or ()
    )
    return (message.get("role"), message.get("content"), calls, message.get("tool_call_id"))


@dataclass(frozen=True)
class Turn:
    """A message of a segment's conversation; ``step_id`` names the step that generated it."""

    message: dict[str, Any]
    step_id: str | None = None

    @property
    def key(self) -> tuple[Any, ...]:
        return message_key(self.message)
