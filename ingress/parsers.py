"""Reasoning and tool calls out of generated text, incrementally, per model family.

Streaming and non-streaming share one code path (non-streaming is one ``feed`` of the whole text
and ``finish``), so both kinds of client see the same message. A malformed tool call is never
repaired or dropped: its text goes back to the client exactly as generated and ``parse_error``
says why. Parsing works on decoded text only; the recorded tokens are the engine's.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Mapping, Sequence
from enum import Enum, auto
from typing import Any

from ingress.output import (
    OutputDelta,
    OutputParser,
    ParsedOutput,
    ReasoningDelta,
    TextDelta,
    ToolCallDone,
)
from titoflow.tito.messages import ToolCall

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"


def tool_call_id(step_id: str, index: int, prefix: str = "call_") -> str:
    """Deterministic, so a replayed or retried step shows the client the same ids."""
    return prefix + hashlib.sha256(f"{step_id}/{index}".encode()).hexdigest()[:24]


class MalformedCall(ValueError):
    """A tool-call block that does not parse; the message says why."""


# Reads the inside of one <tool_call> block into (name, arguments), or raises MalformedCall.
BlockParser = Callable[[str], tuple[str, dict[str, Any]]]


def _parse_json_call(inner: str) -> tuple[str, dict[str, Any]]:
    """Qwen3/Hermes: ``{"name": ..., "arguments": {...}}``."""
    try:
        payload = json.loads(inner)
    except json.JSONDecodeError as exc:
        raise MalformedCall(f"invalid JSON: {exc.msg} at char {exc.pos}") from None
    if not isinstance(payload, dict):
        raise MalformedCall("not a JSON object")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedCall('missing or non-string "name"')
    # A call without "arguments" is how some models call a tool that takes none.
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        raise MalformedCall('"arguments" is not an object')
    return name, arguments


_FUNCTION = re.compile(r"\s*<function=([^<>\s]+)>(.*)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^<>\n]+)>(.*?)</parameter>", re.DOTALL)
_JSON_TYPES = frozenset({"integer", "number", "boolean", "object", "array"})


def _schema_type(schema: object) -> str | None:
    """A property's JSON type; a nullable ``["integer", "null"]`` counts as its one other type."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def _parameter_types(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
    """tool name -> parameter name -> JSON type, from OpenAI function-tool schemas."""
    types: dict[str, dict[str, str]] = {}
    for tool in tools:
        function = tool.get("function")
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str):
            continue
        parameters = function.get("parameters")
        properties = parameters.get("properties") if isinstance(parameters, Mapping) else None
        if isinstance(properties, Mapping):
            types[function["name"]] = {
                key: kind for key, schema in properties.items() if (kind := _schema_type(schema))
            }
    return types


def _xml_value(raw: str, kind: str | None) -> Any:
    """The template writes each value between newlines; non-string types are JSON when valid."""
    value = raw.removeprefix("\n").removesuffix("\n")
    if kind in _JSON_TYPES:
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _xml_call_parser(tools: Sequence[Mapping[str, Any]]) -> BlockParser:
    """Qwen3-coder: ``<function=NAME><parameter=P>VALUE</parameter>...</function>``."""
    types = _parameter_types(tools)

    def parse(inner: str) -> tuple[str, dict[str, Any]]:
        function = _FUNCTION.fullmatch(inner)
        if function is None:
            raise MalformedCall("expected one <function=NAME>...</function>")
        name, body = function.group(1), function.group(2)
        kinds = types.get(name, {})
        arguments: dict[str, Any] = {}
        at = 0
        while parameter := _PARAMETER.match(body, at):
            key = parameter.group(1)
            if key in arguments:
                raise MalformedCall(f"parameter {key!r} given twice")
            arguments[key] = _xml_value(parameter.group(2), kinds.get(key))
            at = parameter.end()
        if body[at:].strip():
            raise MalformedCall(f"unexpected text in <function={name}>: {body[at:][:40]!r}")
        return name, arguments

    return parse


def _json_family(tools: Sequence[Mapping[str, Any]]) -> BlockParser:
    return _parse_json_call


_FAMILIES: dict[str, Callable[[Sequence[Mapping[str, Any]]], BlockParser]] = {
    "qwen3": _json_family,
    "qwen3_coder": _xml_call_parser,
}
PARSER_FAMILIES: tuple[str, ...] = tuple(_FAMILIES)


def make_parser(
    family: str,
    step_id: str,
    *,
    id_prefix: str = "call_",
    tools: Sequence[Mapping[str, Any]] = (),
    parse_tools: bool = True,
    reasoning_open: bool = False,
) -> OutputParser:
    """A fresh parser for one turn.

    ``parse_tools=False`` (tool_choice "none", or no tools offered) leaves ``<tool_call>`` blocks
    as text; ``reasoning_open`` says the generation prompt already opened ``<think>``.
    """
    if family not in _FAMILIES:
        raise ValueError(f"unknown parser family {family!r}; known: {', '.join(PARSER_FAMILIES)}")
    return TaggedParser(
        step_id,
        _FAMILIES[family](tools),
        id_prefix=id_prefix,
        parse_tools=parse_tools,
        reasoning_open=reasoning_open,
    )


def _partial_tag(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that could still grow into ``tag``."""
    for size in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:size]):
            return size
    return 0


class _State(Enum):
    START = auto()  # the output may still open with <think>
    REASONING = auto()
    AFTER_THINK = auto()  # whitespace right after </think> is dropped
    CONTENT = auto()
    CALL = auto()  # inside <tool_call>, buffered until </tool_call>


class TaggedParser:
    """``<think>`` reasoning, then content with ``<tool_call>`` blocks read by ``parse_block``.

    Each state consumes what it can decide from ``_buf`` and keeps the rest, so the deltas depend
    only on the text so far, never on how it was chunked.
    """

    def __init__(
        self,
        step_id: str,
        parse_block: BlockParser,
        *,
        id_prefix: str,
        parse_tools: bool,
        reasoning_open: bool,
    ) -> None:
        self._step_id = step_id
        self._parse_block = parse_block
        self._id_prefix = id_prefix
        self._parse_tools = parse_tools
        self._state = _State.REASONING if reasoning_open else _State.START
        self._thinking = reasoning_open  # a reasoning block was opened
        self._buf = ""  # received, not yet emitted or dropped
        # Trailing content whitespace: emitted once more content follows, dropped before a tool
        # call and at the end, so the gaps between calls never become content.
        self._ws = ""
        self._scanned = 0  # in CALL, where a "</tool_call>" could still start in _buf
        self._blocks = 0  # <tool_call> blocks seen, parsed or not
        self._out: list[OutputDelta] = []
        self._reasoning: list[str] = []
        self._content: list[str] = []
        self._calls: list[ToolCall] = []
        self._error: str | None = None

    def feed(self, text: str) -> list[OutputDelta]:
        self._buf += text
        while self._step(final=False):
            pass
        return self._take()

    def finish(self) -> tuple[list[OutputDelta], ParsedOutput]:
        while self._step(final=True):
            pass
        summary = ParsedOutput(
            content="".join(self._content),
            reasoning="".join(self._reasoning) if self._thinking else None,
            tool_calls=list(self._calls),
            parse_error=self._error,
        )
        return self._take(), summary

    def _take(self) -> list[OutputDelta]:
        out, self._out = self._out, []
        return out

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
        opening = self._buf.lstrip()
        if opening.startswith(THINK_OPEN):
            self._buf = opening[len(THINK_OPEN) :]
            self._thinking = True
            return self._enter(_State.REASONING)
        if not final and THINK_OPEN.startswith(opening):  # nothing yet, or "<thi": undecided
            return False
        return self._enter(_State.CONTENT)

    def _reason(self, final: bool) -> bool:
        end = self._buf.find(THINK_CLOSE)
        if end >= 0:
            self._emit_reasoning(self._buf[:end].rstrip("\n"))
            self._buf = self._buf[end + len(THINK_CLOSE) :]
            return self._enter(_State.AFTER_THINK)
        # Newlines are held back until we know they are not the ones before </think>.
        held = 0 if final else _partial_tag(self._buf, THINK_CLOSE)
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
        start = self._buf.find(CALL_OPEN) if self._parse_tools else -1
        if start >= 0:
            self._emit_content(self._buf[:start])
            self._buf = self._buf[start:]
            self._scanned = len(CALL_OPEN)
            return self._enter(_State.CALL)
        held = _partial_tag(self._buf, CALL_OPEN) if self._parse_tools and not final else 0
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

    def _call(self, final: bool) -> bool:
        end = self._buf.find(CALL_CLOSE, self._scanned)
        if end >= 0:
            block = self._buf[: end + len(CALL_CLOSE)]
            self._buf = self._buf[len(block) :]
            self._close_block(block)
            return self._enter(_State.CONTENT)
        if final:
            self._fail(self._blocks, "not closed")
            self._emit_text(self._ws + self._buf)  # exactly as generated, trailing space too
            self._ws = self._buf = ""
            return False
        # Tool calls can be long; do not rescan what cannot hold the closing tag.
        self._scanned = max(self._scanned, len(self._buf) - len(CALL_CLOSE) + 1)
        return False

    def _close_block(self, block: str) -> None:
        number = self._blocks
        self._blocks += 1
        try:
            name, arguments = self._parse_block(block[len(CALL_OPEN) : -len(CALL_CLOSE)])
        except MalformedCall as exc:
            self._fail(number, str(exc))
            self._emit_content(block)
            return
        index = len(self._calls)
        call = ToolCall(
            id=tool_call_id(self._step_id, index, self._id_prefix),
            name=name,
            arguments=json.dumps(arguments, ensure_ascii=False),
        )
        self._calls.append(call)
        self._out.append(ToolCallDone(index, call))
        self._ws = ""

    def _fail(self, number: int, why: str) -> None:
        if self._error is None:  # the first failure is the turn's parse error
            self._error = f"<tool_call> block {number}: {why}"
