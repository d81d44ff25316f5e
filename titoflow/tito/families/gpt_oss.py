"""gpt-oss: OpenAI's harmony format. A generation is a run of messages, each a header, then
``<|message|>`` and a body up to ``<|end|>`` (``<|call|>`` after a tool call, ``<|return|>``
after the final answer; the engine stops on those two and the ingress removes the stop token)::

    <|channel|>analysis<|message|>REASONING<|end|><|start|>assistant<|channel|>commentary
    to=functions.NAME <|constrain|>json<|message|>{"arg": 1}

The generation prompt ends with ``<|start|>assistant``, so the first header has no role. A header
names the channel (``<|channel|>analysis``: reasoning; ``final``: the answer; ``commentary``:
a preamble, or a call when addressed ``to=functions.NAME``), the recipient (before or after the
channel: the model writes it after, the official template before) and the content type
(``<|constrain|>json`` as the model writes it, ``json`` as the template does). As openai-harmony
reads a header, whitespace between its parts is free, and the channel may be written again after
the recipient (gpt-oss does: ``<|channel|>commentary to=functions.NAME<|channel|>commentary``).

Invariants: the parser's result depends only on the whole text, never on its chunking (a body
is released up to where an end marker could still start, a header and a call's body are held
until they end). Only a header makes a call: text inside a body is never one. A call that does
not parse goes back as text, its message exactly as generated, with ``parse_error``; nothing is
repaired. With tools on, so does a message addressed to anything but ``functions.NAME``, an
addressed header (``to=``) that does not parse or never reaches ``<|message|>``, and a body
holding ``<|start|>`` (a message begun before the last one ended: kept as its text, as harmony
reads it). The model stops at its first ``<|call|>``, so a turn holds at most one call.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import (
    Family,
    Function,
    Grammar,
    MalformedCall,
    ParserOptions,
    TokenLookup,
    parse_json_object,
)
from titoflow.tito.families.incremental import IncrementalParser, partial_marker
from titoflow.tito.output import (
    OutputParser,
    ReasoningDelta,
    TextDelta,
)

START = "<|start|>"
CHANNEL = "<|channel|>"
MESSAGE = "<|message|>"
CONSTRAIN = "<|constrain|>"
END = "<|end|>"
CALL = "<|call|>"
RETURN = "<|return|>"
ENDS = (END, CALL, RETURN)
FUNCTIONS = "functions."

# ROLE? (to=RECIPIENT)? (<|channel|>CHANNEL)? (to=RECIPIENT)? (<|channel|>CHANNEL)?
# (<|constrain|>?TYPE)?, whitespace free between the parts; the role is possessive so that
# "assistantto=x" stays one (unknown) role, as harmony splits it.
_HEADER = re.compile(
    r"\s*(?P<role>(?!to=)[^\s<]*+)?"
    r"(?:\s*to=(?P<before>[^\s<]+))?"
    r"\s*(?:<\|channel\|>(?P<channel>[^\s<]+))?"
    r"(?:\s+to=(?P<after>[^\s<]+))?"
    r"(?:\s*<\|channel\|>(?P<again>[^\s<]+))?"
    r"(?:\s*(?:<\|constrain\|>)?(?P<type>[^\s<]+))?"
    r"\s*"
)


@dataclass(frozen=True)
class Header:
    role: str
    channel: str | None
    recipient: str | None


def parse_header(text: str) -> Header | None:
    """A message header (what precedes ``<|message|>``), or None if it is not one."""
    found = _HEADER.fullmatch(text)
    if found is None or (found["before"] and found["after"]):
        return None
    if found["again"] is not None and found["again"] != found["channel"]:
        return None  # two channels: which one is meant is a guess
    return Header(found["role"] or "", found["channel"], found["before"] or found["after"])


def parse_arguments(body: str) -> dict[str, Any]:
    """A call's body: one JSON object (the format's ``json`` content type)."""
    return parse_json_object(body, "the arguments are not a JSON object")


class _Kind(Enum):
    REASONING = auto()
    CONTENT = auto()
    CALL = auto()  # buffered, parsed when the message ends
    TEXT = auto()  # a call not parsed (tools off, or not a function): buffered, released raw


class _State(Enum):
    HEADER = auto()
    BODY = auto()
    BETWEEN = auto()  # after a message's end: <|start|> or stray text


class HarmonyParser(IncrementalParser):
    """Messages of one generation: analysis → reasoning, final and preambles → content,
    ``to=functions.NAME`` → a tool call."""

    def __init__(self, options: ParserOptions) -> None:
        super().__init__(options)
        self._state = _State.HEADER
        self._started = False  # this message's header began with <|start|> (not the first one)
        self._raw = ""  # this message as generated, up to its body
        self._kind = _Kind.CONTENT
        self._name = ""
        self._scanned = 0  # in a held body, where an end marker could still start in _buf
        self._thinking = False  # an analysis message was opened
        self._messages = 0

    def _step(self, final: bool) -> bool:
        """Advance as far as the buffer allows; True if the state changed (step again)."""
        match self._state:
            case _State.HEADER:
                return self._header(final)
            case _State.BODY:
                return self._body(final)
            case _State.BETWEEN:
                return self._between(final)

    def _header(self, final: bool) -> bool:
        at = self._buf.find(MESSAGE)
        cuts = [
            (i, m) for m in (*ENDS, START) if (i := self._buf.find(m)) >= 0 and (at < 0 or i < at)
        ]
        if cuts:  # the message ended, or another began, before a body: it was text
            i, marker = min(cuts)
            end = i if marker == START else i + len(marker)
            self._unread_header(self._buf[:i], "its header ends without <|message|>")
            self._text(self._raw + self._buf[:end])
            self._raw, self._buf = "", self._buf[end:]
            return self._enter(_State.BETWEEN)
        if at < 0:
            if final:
                self._unread_header(self._buf, "the output ends in its header")
                self._text(self._raw + self._buf)
                self._raw = self._buf = ""
            return False
        text = self._buf[:at]
        self._raw += self._buf[: at + len(MESSAGE)]
        self._buf = self._buf[at + len(MESSAGE) :]
        self._kind = self._classify(text)
        self._scanned = 0
        return self._enter(_State.BODY)

    def _classify(self, text: str) -> _Kind:
        header = parse_header(text)
        if header is None or header.role != ("assistant" if self._started else ""):
            # Not a header of the model's own message: its text, unread.
            self._unread_header(text, "its header does not parse as the model's")
            return _Kind.TEXT
        if header.recipient is not None and header.recipient != "all":
            name = header.recipient.removeprefix(FUNCTIONS)
            if self._parse_tools and name != header.recipient and name:
                self._name = name
                return _Kind.CALL
            self._fail(f"it is addressed to {header.recipient!r}, not to functions.NAME")
            return _Kind.TEXT
        if header.channel == "analysis":
            self._thinking = True
            return _Kind.REASONING
        return _Kind.CONTENT

    def _body(self, final: bool) -> bool:
        ends = [(i, e) for e in ENDS if (i := self._buf.find(e, self._scanned)) >= 0]
        if ends:
            at, marker = min(ends)
            body, self._buf = self._buf[:at], self._buf[at + len(marker) :]
            self._close(body, marker)
            return self._enter(_State.BETWEEN)
        if final:  # the stop token that ended it was removed: the output ends the message
            body, self._buf = self._buf, ""
            self._close(body, "")
            return False
        held = partial_marker(self._buf, (*ENDS, START))  # START: so _stream sees it whole
        if self._kind in (_Kind.REASONING, _Kind.CONTENT):
            self._stream(self._buf[: len(self._buf) - held])
            self._buf = self._buf[len(self._buf) - held :]
        else:  # a call's body can be long: do not rescan what cannot hold an end marker
            self._scanned = len(self._buf) - held
        return False

    def _stream(self, text: str) -> None:
        if not text:
            return
        if START in text:  # kept as this body's text, as harmony reads it
            self._fail("<|start|> in its body: a message began before it ended")
        if self._kind is _Kind.REASONING:
            self._reasoning.append(text)
            self._out.append(ReasoningDelta(text))
        else:
            self._text(text)

    def _close(self, body: str, marker: str) -> None:
        if self._kind in (_Kind.REASONING, _Kind.CONTENT):
            self._stream(body)
        elif self._kind is _Kind.TEXT:
            self._text(self._raw + body + marker)
        else:
            try:
                arguments = parse_arguments(body)
            except MalformedCall as exc:
                if self._error is None:  # the first failure is the turn's parse error
                    self._error = f"harmony message {self._messages} (call to {self._name}): {exc}"
                self._text(self._raw + body + marker)
            else:
                self._add_call(self._name, arguments)
        self._raw = ""
        self._messages += 1

    def _between(self, final: bool) -> bool:
        if self._buf.startswith(START):
            self._buf = self._buf[len(START) :]
            self._raw, self._started = START, True
            return self._enter(_State.HEADER)
        if not final and START.startswith(self._buf):  # nothing yet, or "<|sta": undecided
            return False
        # Stray text between messages: read as a header without <|start|>, so it is released
        # as text unless a message body follows it.
        self._raw, self._started = "", False
        return self._enter(_State.HEADER) if self._buf else False

    def _unread_header(self, header: str, why: str) -> None:
        """A header left as text fails the turn if it addresses a recipient: a call not read."""
        if "to=" in header:
            self._fail(why)

    def _fail(self, why: str) -> None:
        if self._parse_tools and self._error is None:  # the first failure is the turn's error
            self._error = f"harmony message {self._messages}: {why}"

    def _enter(self, state: _State) -> bool:
        self._state = state
        return True

    def _text(self, text: str) -> None:
        if text:
            self._content.append(text)
            self._out.append(TextDelta(text))


def _harmony_parser(options: ParserOptions) -> OutputParser:
    return HarmonyParser(options)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}``, the form
    the model was trained to write (the engine's stop on ``<|call|>`` ends it). A forced call
    starts with it, as other families' forced calls start without reasoning: a free analysis
    message before it would end only when the model chose to write ``<|end|>``."""
    calls = g.any_call(
        functions,
        "to=functions.NAME",
        "<",
        lambda name, parameters: [
            g.text(name + " "),
            g.literal(CONSTRAIN, token_id),
            g.text("json"),
            g.literal(MESSAGE, token_id),
            g.arguments(parameters, "json"),
        ],
    )
    return g.sequence([g.literal(CHANNEL, token_id), g.text("commentary to=" + FUNCTIONS), calls])


def _is_gpt_oss(template: str) -> bool:
    return all(marker in template for marker in (START, CHANNEL, MESSAGE, "<|call|>"))


GPT_OSS = Family(
    name="gpt_oss",
    summary="gpt-oss (harmony): channels analysis/commentary/final, calls to=functions.NAME",
    detect=_is_gpt_oss,
    parser=_harmony_parser,
    grammar=Grammar(call=_call),
    stop_tokens=(RETURN, CALL),
    decode_special_tokens=True,
    reasoning_key="thinking",
    history_closers=("<|end|>",),
    max_calls_per_turn=1,
    content_with_calls=False,
    history=(
        "writes a call as <|start|>assistant to=functions.NAME<|channel|>commentary json"
        "<|message|> with the arguments re-serialized (the model writes the recipient after the "
        "channel and <|constrain|>json); drops the analysis of every turn once a later turn "
        "answers without a call, and always that of a final answer; ends a past final answer "
        "with <|end|> where the model sampled <|return|>; writes a calling turn's content as "
        "analysis, and only the first call of a turn"
    ),
    divergences=("call_header_rewritten", "analysis_dropped", "return_as_end"),
    tools_stand_in=True,
)
