"""What a turn streams back to a wire adapter, whatever the API: text and reasoning deltas as
tokens arrive, each tool call once it is complete, and finally the durable result."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from titoflow.tito.messages import ToolCall


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class ReasoningDelta:
    text: str


@dataclass(frozen=True)
class ToolCallDone:
    """A complete, parsed tool call; ``index`` counts tool calls within the turn from 0."""

    index: int
    call: ToolCall


OutputDelta = TextDelta | ReasoningDelta | ToolCallDone


@dataclass(frozen=True)
class ParsedOutput:
    """The whole turn's output. ``content`` is the concatenation of its text deltas, so a
    streaming and a non-streaming client see the same message."""

    content: str
    reasoning: str | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    parse_error: str | None = None


class OutputParser(Protocol):
    """Incremental reasoning/tool-call parser for one turn, fed decoded text as it arrives.

    Text that may still become part of a tag (``"<tool_"``) is held back; a tool call block is
    buffered until it closes and then emitted as :class:`ToolCallDone`. A block that does not
    parse, or never closes, is released as plain text and reported in ``parse_error`` — never
    dropped, never repaired.
    """

    def feed(self, text: str) -> list[OutputDelta]: ...

    def finish(self) -> tuple[list[OutputDelta], ParsedOutput]:
        """Flush what is held back; return the last deltas and the summary of the turn."""
        ...
