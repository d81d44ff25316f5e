"""Llama 3.1, 3.2 and 3.3 (one format): header-delimited turns ended by ``<|eot_id|>``, and
custom tool calls written as the assistant message's whole content, in JSON::

    <|start_header_id|>assistant<|end_header_id|>

    {"name": "read_file", "parameters": {"path": "a"}}<|eot_id|>

The model may open a call with ``<|python_tag|>`` (then it usually ends with ``<|eom_id|>``,
which ends the generation too), write ``"arguments"`` for ``"parameters"``, and put several
calls in one message separated by ``;`` (or by whitespace alone, as vLLM's llama3_json parser
reads them too). Tool results come back in the ``ipython`` role. There is no reasoning block.

Invariants: the parser's result depends only on the whole text, never on its chunking: the
output is a call only when all of it is (it starts with ``{`` or the tag), so a possible call is
buffered to the end and content is released as soon as its first character rules a call out.
Text that is a call attempt but does not parse goes back exactly as generated with
``parse_error``; JSON that is no call attempt (no ``"name"``) is content. An object opening as
a call (``{"name":``) inside text stays text, with ``parse_error``: the template writes a call as
the whole message, and reading one out of text would guess it was not an example or a quote.
With tools not parsed, every output is content. The special tokens, kept by the decoding
(``<|python_tag|>`` is one), are dropped from content as a decoding that skips them would.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import (
    Family,
    Function,
    Grammar,
    ParserOptions,
    TokenLookup,
)
from titoflow.tito.families.incremental import IncrementalParser
from titoflow.tito.output import OutputParser, TextDelta

PYTHON_TAG = "<|python_tag|>"
# Every special token of the Llama 3 vocabulary (Meta's named ones and the reserved slots).
_SPECIAL = re.compile(
    r"<\|(?:begin_of_text|end_of_text|finetune_right_pad_id|step_id|start_header_id|"
    r"end_header_id|eom_id|eot_id|python_tag|image|reserved_special_token_\d+)\|>"
)
# The end of a text that may still grow into a special token: "<", "<|", "<|eot_i", "<|eot_id|".
_SPECIAL_START = re.compile(r"<(?:\|[a-z0-9_]*\|?)?\Z")
# A JSON object that opens as a call: the template and Meta's own tools write "name" (or
# "type": "function") first.
_CALL_START = re.compile(r'\{\s*"(?:name|type)"\s*:')
# The same, anywhere in text that is not the whole message.
_NAMED_OBJECT = re.compile(r'\{\s*"name"\s*:')
_CALL_KEYS = frozenset({"type", "name", "parameters", "arguments"})
_DECODER = json.JSONDecoder()


class NotACall(ValueError):
    """JSON that is not a call (content), or a call attempt that does not parse (malformed)."""

    def __init__(self, why: str, attempt: bool) -> None:
        super().__init__(why)
        self.attempt = attempt


def _call_of(value: object, number: int) -> tuple[str, dict[str, Any]]:
    if not isinstance(value, dict):
        raise NotACall(f"call {number}: not a JSON object", attempt=False)
    attempt = "name" in value
    name = value.get("name")
    if not isinstance(name, str) or not name:
        raise NotACall(f'call {number}: missing or non-string "name"', attempt)
    if not _CALL_KEYS.issuperset(value):
        extra = sorted(set(value) - _CALL_KEYS)
        raise NotACall(f"call {number}: unexpected keys {extra}", attempt)
    if value.get("type", "function") != "function":
        raise NotACall(f'call {number}: "type" is not "function"', attempt)
    if "parameters" in value and "arguments" in value:
        raise NotACall(f'call {number}: both "parameters" and "arguments"', attempt)
    # The template writes "parameters"; fine-tunes often write "arguments"; a tool without
    # parameters may be called with neither.
    arguments = value.get("parameters", value.get("arguments", {}))
    if not isinstance(arguments, dict):
        raise NotACall(f'call {number}: "parameters" is not an object', attempt)
    return name, arguments


def parse_calls(text: str) -> list[tuple[str, dict[str, Any]]]:
    """The calls of a whole message: JSON objects separated by ``;`` or whitespace, optionally
    after ``<|python_tag|>``. Raises :class:`NotACall`."""
    body = text.lstrip()
    tagged = body.startswith(PYTHON_TAG)
    if tagged:
        body = body[len(PYTHON_TAG) :]
    calls: list[tuple[str, dict[str, Any]]] = []
    at = 0
    while True:
        at = len(body) - len(body[at:].lstrip())
        try:
            value, at = _DECODER.raw_decode(body, at)
        except json.JSONDecodeError as exc:
            attempt = tagged or bool(calls) or _CALL_START.match(body, at) is not None
            raise NotACall(f"invalid JSON: {exc.msg} at char {exc.pos}", attempt) from None
        try:
            calls.append(_call_of(value, len(calls)))
        except NotACall as exc:
            exc.attempt = exc.attempt or tagged or bool(calls)
            raise
        rest = body[at:].lstrip()
        if not rest:
            return calls
        if rest.startswith(";"):
            at = len(body) - len(rest) + 1
            if not body[at:].strip():  # a separator after the last call ends nothing more
                return calls
        elif not rest.startswith("{"):
            raise NotACall(f"unexpected text after call {len(calls) - 1}", attempt=True)


class Llama3Parser(IncrementalParser):
    """Content, or the whole output as calls (see the module's invariants). Llama 4's
    pythonic calls keep the same rules: a subclass names its openers, special tokens, calls
    in text and reads the calls."""

    OPENERS: tuple[str, ...] = ("{", PYTHON_TAG)  # what a whole-message call starts with
    SPECIAL: re.Pattern[str] = _SPECIAL
    CALL_IN_TEXT: re.Pattern[str] = _NAMED_OBJECT
    CALL_IN_TEXT_ERROR = "tool call: a call-shaped JSON object inside text"

    def _parse_calls(self, text: str) -> list[tuple[str, dict[str, Any]]]:
        return parse_calls(text)

    def __init__(self, options: ParserOptions) -> None:
        super().__init__(options)
        self._thinking = False  # Llama 3 has no reasoning block
        self._decided = False  # whether the output is content (else possibly calls, buffered)
        self._calls_possible = False
        self._ws = ""  # trailing content whitespace, emitted once more content follows
        self._started = False  # content was emitted (leading whitespace is dropped)

    def _advance(self, final: bool) -> None:
        if not self._decided:
            head = self._buf.lstrip()
            if self._parse_tools and head.startswith(self.OPENERS):
                self._calls_possible = self._decided = True
            elif (
                self._parse_tools
                and not final
                and any(opener.startswith(head) for opener in self.OPENERS)
            ):
                return  # nothing yet, or "<|pyth": undecided
            else:
                self._decided = True
        if self._calls_possible:
            if final:
                self._finish_calls()
                self._check_content()
            return
        held = 0
        if not final and (partial := _SPECIAL_START.search(self._buf)) is not None:
            held = len(self._buf) - partial.start()
        self._emit_content(self._buf[: len(self._buf) - held])
        self._buf = self._buf[len(self._buf) - held :]
        if final:
            self._check_content()

    def _check_content(self) -> None:
        """Text holding a call-shaped object carries ``parse_error``: never a silently lost call."""
        content = "".join(self._content)
        if self._parse_tools and self._error is None and self.CALL_IN_TEXT.search(content):
            self._error = self.CALL_IN_TEXT_ERROR

    def _emit_content(self, raw: str) -> None:
        # No special token spans the cut: their names hold no "<" (see _SPECIAL_START).
        text = self._ws + self.SPECIAL.sub("", raw)
        if not self._started:
            text = text.lstrip()  # the template trims content
        body = text.rstrip()
        self._ws = text[len(body) :]
        if body:
            self._started = True
            self._emit_text(body)

    def _emit_text(self, text: str) -> None:
        self._content.append(text)
        self._out.append(TextDelta(text))

    def _finish_calls(self) -> None:
        text, self._buf = self._buf, ""
        try:
            calls = self._parse_calls(text)
        except NotACall as exc:
            if exc.attempt:
                self._error = f"tool call: {exc}"
                self._emit_text(text)  # exactly as generated
            else:
                self._emit_content(text)
            return
        for name, arguments in calls:
            self._add_call(name, arguments)


def _parser(options: ParserOptions) -> OutputParser:
    return Llama3Parser(options)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``{"name": "NAME", "parameters": {...}}``, as the template writes a call."""
    bodies = [g.sequence([*g.json_object_call(f, "parameters"), g.text("}")]) for f in functions]
    return g.one_of(bodies)


def _is_llama3(template: str) -> bool:
    return "<|start_header_id|>" in template and "<|eot_id|>" in template


LLAMA3 = Family(
    name="llama3",
    summary="Llama 3.1/3.2/3.3: JSON calls as the whole assistant message, ipython tool results",
    detect=_is_llama3,
    parser=_parser,
    # Parallel calls are written "; "-separated, but the official template renders only one.
    grammar=Grammar(call=_call, separator="; "),
    # <|eom_id|> ends a message whose tool result continues the turn; <|end_of_text|> is the
    # vocabulary's EOS. Meta's generation stops on both, besides <|eot_id|>.
    stop_tokens=("<|eom_id|>", "<|end_of_text|>"),
    decode_special_tokens=True,
    max_calls_per_turn=1,
    content_with_calls=False,
    history=(
        "renders an assistant turn that calls a tool as the call alone: its content is "
        "dropped, a <|python_tag|> the model opened the call with too, and the turn ends with "
        "<|eot_id|> even where the model ended it with <|eom_id|>; it renders one call per "
        "turn and rejects a turn with several. Tool results are written as JSON strings"
    ),
    divergences=("call_content_dropped", "python_tag_dropped"),
    tools_stand_in=True,
)
