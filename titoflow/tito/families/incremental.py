"""What every family's output parser shares: text is fed as it is decoded, buffered, and
consumed by the family's ``_advance`` as far as it can decide; deltas and the turn's summary
accumulate as it goes.

Invariant: a parser's output depends on the text so far, never on how it was chunked: each
family's ``_advance`` keeps in ``_buf`` exactly what it cannot decide yet (a marker's possible
beginning, :func:`partial_marker`), and ``finish`` decides the rest. Non-streaming is one
``feed`` of the whole text and ``finish``, so both kinds of client see the same message.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from titoflow.tito.families.base import ParserOptions, tool_call_id
from titoflow.tito.messages import ToolCall
from titoflow.tito.output import OutputDelta, ParsedOutput, ToolCallDone


def partial_marker(text: str, markers: Iterable[str]) -> int:
    """Length of the longest end of ``text`` that could still grow into one of ``markers``."""
    markers = tuple(markers)
    for size in range(min(max(map(len, markers)) - 1, len(text)), 0, -1):
        if any(marker.startswith(text[-size:]) for marker in markers):
            return size
    return 0


class IncrementalParser:
    """The buffer, the deltas and the summary; a family's parser writes ``_advance``."""

    def __init__(self, options: ParserOptions) -> None:
        self._step_id = options.step_id
        self._id_prefix = options.id_prefix
        self._parse_tools = options.parse_tools
        self._thinking = options.reasoning_open  # a reasoning block was opened
        self._buf = ""  # received, not yet emitted or dropped
        self._out: list[OutputDelta] = []
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._error: str | None = None

    def feed(self, text: str) -> list[OutputDelta]:
        self._buf += text
        self._advance(final=False)
        return self._take()

    def finish(self) -> tuple[list[OutputDelta], ParsedOutput]:
        self._advance(final=True)
        summary = ParsedOutput(
            content="".join(self._content),
            reasoning="".join(self._reasoning) if self._thinking else None,
            tool_calls=list(self._calls),
            parse_error=self._error,
        )
        return self._take(), summary

    def _add_call(self, name: str, arguments: Any, call_id: str | None = None) -> None:
        """Record and emit the turn's next call: ``arguments`` as parsed (or as the model wrote
        them, text), its id the model's own where the format has them, else the step's."""
        index = len(self._calls)
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        call_id = call_id or tool_call_id(self._step_id, index, self._id_prefix)
        call = ToolCall(id=call_id, name=name, arguments=arguments)
        self._calls.append(call)
        self._out.append(ToolCallDone(index, call))

    def _open_reasoning(self, opener: str, final: bool) -> bool | None:
        """Whether the output opens with ``opener`` (leading whitespace aside): if so it is
        consumed and the turn is thinking; None while the text so far could still become it."""
        opening = self._buf.lstrip()
        if opening.startswith(opener):
            self._buf = opening[len(opener) :]
            self._thinking = True
            return True
        if not final and opener.startswith(opening):  # nothing yet, or "<thi": undecided
            return None
        return False

    def _take(self) -> list[OutputDelta]:
        out, self._out = self._out, []
        return out

    def _advance(self, final: bool) -> None:
        """Consume what ``_buf`` decides (all of it when ``final``)."""
        while self._step(final):
            pass

    def _step(self, final: bool) -> bool:
        """One state's move; True if the state changed (step again)."""
        raise NotImplementedError
