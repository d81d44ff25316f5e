"""A parser for formats that write reasoning between two tags and each tool call between two
other tags, the inside of a call read by a family's block parser (Qwen3's ``<think>`` and
``<tool_call>``, GLM's, ...).

A family may also write a call without its wrapper (Qwen3-Coder's bare ``<function=…>``, which
its models emit often): ``Tags.bare_open``/``bare_close`` name that block, and a stray wrapper
closer right after it is dropped. With ``implicit_close`` a block's missing closer is implied:
by the next block's opening (a block cannot hold another), or by the output's end (the model
stopped before its closer), the block then read as if closed there, not refused outright.
With ``call_ends_reasoning`` a call block opened before ``</think>`` ends the reasoning (Qwen3
models open calls while thinking; vLLM's qwen3 reasoning parser ends it there too), and the
reasoning's own ``</think>``, come after, is dropped rather than shown as text.

Invariants: the deltas depend on the text only, never on its chunking (each state keeps what
it cannot decide, :mod:`titoflow.tito.families.incremental`). A malformed tool call is never
repaired or dropped: its text goes back to the client exactly as generated and ``parse_error``
says why, so a call-shaped output is never lost silently. Inside reasoning nothing else is a
call.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from titoflow.tito.families.base import MalformedCall, ParserOptions
from titoflow.tito.families.incremental import IncrementalParser, partial_marker
from titoflow.tito.output import ReasoningDelta, TextDelta

# Reads the inside of one tool-call block into (name, arguments), or raises MalformedCall.
CallParser = Callable[[str], tuple[str, Any]]
# Reads the inside of one block into its calls (a block may hold several: DeepSeek's section).
BlockParser = Callable[[str], Sequence[tuple[str, Any]]]


def one_call(parse: CallParser) -> BlockParser:
    """The block parser of a format that writes one call per block."""
    return lambda inner: [parse(inner)]


@dataclass(frozen=True)
class Tags:
    """The markers; ``bare_open``/``bare_close`` delimit a call written without the
    ``call_*`` wrapper (the block handed to the block parser then includes them)."""

    think_open: str = "<think>"
    think_close: str = "</think>"
    call_open: str = "<tool_call>"
    call_close: str = "</tool_call>"
    bare_open: str | None = None
    bare_close: str | None = None


class _State(Enum):
    START = auto()  # the output may still open a reasoning block
    REASONING = auto()
    AFTER_THINK = auto()  # whitespace right after </think> is dropped
    CONTENT = auto()
    CALL = auto()  # inside a call block, buffered until it closes


class TaggedParser(IncrementalParser):
    """Reasoning between ``tags.think_*``, then content with call blocks between ``tags.call_*``
    read by ``parse_block``."""

    def __init__(
        self,
        options: ParserOptions,
        parse_block: BlockParser,
        tags: Tags,
        implicit_close: bool = False,
        call_ends_reasoning: bool = False,
    ) -> None:
        super().__init__(options)
        self._parse_block = parse_block
        self._tags = tags
        self._implicit_close = implicit_close
        # The markers that end the reasoning.
        self._reasoning_ends = [tags.think_close]
        if call_ends_reasoning and self._parse_tools:
            self._reasoning_ends.append(tags.call_open)
        # A call ended the reasoning before its </think>: that closer may still come.
        self._late_close = False
        self._openers = [tags.call_open] + ([tags.bare_open] if tags.bare_open else [])
        self._bare = False  # the CALL block is a bare one (no wrapper)
        self._after_bare = False  # a bare block just closed: a stray wrapper closer may follow
        self._state = _State.REASONING if options.reasoning_open else _State.START
        # Trailing content whitespace: emitted once more content follows, dropped before a tool
        # call and at the end, so the gaps between calls never become content.
        self._ws = ""
        self._scanned = 0  # in CALL, where the closing tag could still start in _buf
        self._blocks = 0  # call blocks seen, parsed or not

    def _step(self, final: bool) -> bool:
        """Advance as far as the buffer allows; True if the state changed (step again)."""
        match self._state:
            case _State.START:
                return self._start(final)
            case _State.REASONING:
                return self._reason(final)
            case _State.AFTER_THINK:
                self._buf = self._buf.lstrip()
                return self._enter(_State.CONTENT) if self._buf else False
            case _State.CONTENT:
                return self._text_or_call(final)
            case _State.CALL:
                return self._call(final)

    def _enter(self, state: _State) -> bool:
        self._state = state
        return True

    def _start(self, final: bool) -> bool:
        opened = self._open_reasoning(self._tags.think_open, final)
        if opened is None:
            return False
        return self._enter(_State.REASONING if opened else _State.CONTENT)

    def _reason(self, final: bool) -> bool:
        found = [(at, m) for m in self._reasoning_ends if (at := self._buf.find(m)) >= 0]
        if found:
            end, marker = min(found)
            self._emit_reasoning(self._buf[:end].rstrip("\n"))
            if marker == self._tags.think_close:
                self._buf = self._buf[end + len(marker) :]
                return self._enter(_State.AFTER_THINK)
            self._buf = self._buf[end:]  # the call's opening, read as content next
            self._late_close = True
            return self._enter(_State.CONTENT)
        # Newlines are held back until we know they are not the ones before </think>.
        held = 0 if final else partial_marker(self._buf, self._reasoning_ends)
        body = self._buf[: len(self._buf) - held].rstrip("\n")
        self._emit_reasoning(body)
        self._buf = self._buf[len(body) :]
        return False

    def _emit_reasoning(self, text: str) -> None:
        if not self._reasoning:  # the newline right after <think> is layout, not reasoning
            text = text.lstrip("\n")
        if text:
            self._reasoning.append(text)
            self._out.append(ReasoningDelta(text))

    def _text_or_call(self, final: bool) -> bool:
        if self._after_bare and self._stray_closer(final):
            return False
        found = [(at, o) for o in self._openers if (at := self._buf.find(o)) >= 0]
        late = self._buf.find(self._tags.think_close) if self._late_close else -1
        if late >= 0 and (not found or late < min(found)[0]):
            # Whitespace around it is layout, as around an on-time </think>.
            self._emit_content(self._buf[:late])
            self._ws = ""
            self._buf = self._buf[late + len(self._tags.think_close) :]
            self._late_close = False
            return self._enter(_State.AFTER_THINK)
        if found and self._parse_tools:
            start, opener = min(found)
            self._emit_content(self._buf[:start])
            self._buf = self._buf[start:]
            self._bare = opener != self._tags.call_open
            self._scanned = len(opener)
            return self._enter(_State.CALL)
        opening = self._openers + ([self._tags.think_close] if self._late_close else [])
        held = partial_marker(self._buf, opening) if self._parse_tools and not final else 0
        self._emit_content(self._buf[: len(self._buf) - held])
        self._buf = self._buf[len(self._buf) - held :]
        return False

    def _emit_content(self, text: str) -> None:
        text = self._ws + text
        body = text.rstrip()
        self._ws = text[len(body) :]
        if body:
            self._emit_text(body)

    def _emit_text(self, text: str) -> None:
        self._content.append(text)
        self._out.append(TextDelta(text))

    def _stray_closer(self, final: bool) -> bool:
        """After a bare block, drop a wrapper closer the model wrote as if it had opened one
        (``</function>\n</tool_call>``); True while that cannot be decided yet."""
        rest = self._buf.lstrip()
        if rest.startswith(self._tags.call_close):
            self._buf = rest[len(self._tags.call_close) :]
        elif not final and self._tags.call_close.startswith(rest):
            return True
        self._after_bare = False
        return False

    def _closer(self) -> str:
        if self._bare and self._tags.bare_close:
            return self._tags.bare_close
        return self._tags.call_close

    def _next_opening(self) -> int:
        """Where the next block opens inside this one's buffer (closing it), or -1. A wrapped
        block holds bare openers (``<function=``) by design, so only the wrapper counts. The
        late ``</think>`` of a call that ended the reasoning closes it too (the model closed its
        reasoning, not its call)."""
        if not self._implicit_close:
            return -1
        openers = self._openers if self._bare else [self._tags.call_open]
        if self._late_close:
            openers = [*openers, self._tags.think_close]
        found = [at for o in openers if (at := self._buf.find(o, self._scanned)) >= 0]
        return min(found, default=-1)

    def _call(self, final: bool) -> bool:
        closer = self._closer()
        end = self._buf.find(closer, self._scanned)
        following = self._next_opening()
        if following >= 0 and (end < 0 or following < end):  # the next block closes this one
            block, self._buf = self._buf[:following], self._buf[following:]
            self._close_block(block, closed=False)
            return self._enter(_State.CONTENT)
        if end >= 0:
            block = self._buf[: end + len(closer)]
            self._buf = self._buf[len(block) :]
            self._close_block(block, closed=True)
            self._after_bare = self._bare
            return self._enter(_State.CONTENT)
        if final and self._implicit_close:  # the output ended inside the block: read it as closed
            block, self._buf = self._buf, ""
            self._close_block(block, closed=False)
            return self._enter(_State.CONTENT)
        if final:
            self._fail(self._blocks, "not closed")
            self._emit_text(self._ws + self._buf)  # exactly as generated, trailing space too
            self._ws = self._buf = ""
            return False
        # Tool calls can be long; do not rescan what cannot hold the closing tag (or an opening).
        longest = max(len(closer), *map(len, self._openers))
        self._scanned = max(self._scanned, len(self._buf) - longest + 1)
        return False

    def _close_block(self, block: str, closed: bool) -> None:
        number = self._blocks
        self._blocks += 1
        try:
            if self._bare:  # the bare block's own tags are the block parser's to read
                inner = block
            else:
                end = len(block) - (len(self._tags.call_close) if closed else 0)
                inner = block[len(self._tags.call_open) : end]
            calls = self._parse_block(inner)
        except MalformedCall as exc:
            self._fail(number, str(exc) if closed else f"not closed, and {exc}")
            if closed:
                self._emit_content(block)
            else:
                self._emit_text(self._ws + block)  # exactly as generated, trailing space too
                self._ws = ""
            return
        for name, arguments in calls:
            self._add_call(name, arguments)
        self._ws = ""

    def _fail(self, number: int, why: str) -> None:
        if self._error is None:  # the first failure is the turn's parse error
            self._error = f"{self._tags.call_open} block {number}: {why}"
