"""Qwen3 (Hermes-style JSON calls), Qwen3-Coder (XML calls) and Qwen3.5/3.6 (Qwen3-Coder's XML
calls, reasoning on): ``<think>`` reasoning, each call in a ``<tool_call>`` block, ``<|im_end|>``
ending the turn.

The template drops the reasoning of assistant turns before the last user message: re-rendering
history would not give the tokens the model sampled, which is why the chain keeps them (TITO).

Qwen3 models often open a ``<tool_call>`` before closing their reasoning (``<think>R<tool_call>
...``, the ``</think>`` late or never): the call's opening ends the reasoning, as in vLLM's qwen3
reasoning parser, and its calls are calls. A block missing its ``</tool_call>`` is closed by the
next block's opening or the output's end (as vLLM's hermes parser reads one the output ends
inside): a complete JSON call in it is a call, a cut one a parse error.

Qwen3-Coder models often bend their XML: a ``<function=…>`` block without the ``<tool_call>``
wrapper, a ``</parameter>`` skipped before the next ``<parameter=``, a ``</tool_call>`` skipped
before the next ``<tool_call>``, a block the output ends inside, several functions in one
block. Each of these is read as the call it plainly is (as vLLM's qwen3_coder parser reads
it). What would need a guess is refused with ``parse_error`` (a value whose end is unknown, a
parameter given twice, text between parameters), never dropped: a call-shaped output is
never lost silently.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
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
from titoflow.tito.families.tagged import BlockParser, TaggedParser, Tags, one_call
from titoflow.tito.output import OutputParser

TAGS = Tags()


_JSON_CALL_KEYS = frozenset({"name", "arguments"})


def _parse_json_call(inner: str) -> tuple[str, dict[str, Any]]:
    """Qwen3/Hermes: ``{"name": ..., "arguments": {...}}``."""
    payload = parse_json_object(inner, "not a JSON object")
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        raise MalformedCall('missing or non-string "name"')
    # Any other key ("parameters" above all) would carry arguments the call then lost.
    if not _JSON_CALL_KEYS.issuperset(payload):
        raise MalformedCall(f"unexpected keys {sorted(set(payload) - _JSON_CALL_KEYS)}")
    # A call without "arguments" is how some models call a tool that takes none.
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        raise MalformedCall('"arguments" is not an object')
    return name, arguments


_FUNCTION_OPEN = re.compile(r"\s*<function=([^<>\s]+)>")
_PARAMETER_OPEN = re.compile(r"\s*<parameter=([^<>\n]+)>")
FUNCTION_OPEN = "<function="
FUNCTION_CLOSE = "</function>"
PARAMETER_OPEN = "<parameter="
PARAMETER_CLOSE = "</parameter>"
_JSON_TYPES = frozenset({"integer", "number", "boolean", "object", "array"})


def _schema_type(schema: object) -> str | None:
    """A property's JSON type; a nullable ``["integer", "null"]`` (or ``anyOf``/``oneOf`` of one
    type and null) counts as its one other type."""
    if not isinstance(schema, Mapping):
        return None
    kind = schema.get("type")
    alternatives = schema.get("anyOf", schema.get("oneOf"))
    if kind is None and isinstance(alternatives, list):
        kind = [a.get("type") if isinstance(a, Mapping) else None for a in alternatives]
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def parameter_types(tools: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, str]]:
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


# Qwen3-Coder's template writes scalars with Jinja's ``string`` filter: Python's spelling.
_PYTHON_SCALARS = {"True": True, "False": False, "None": None}


def typed_value(value: str, kind: str | None) -> Any:
    """A value written as text: non-string types are JSON (or Python's ``True``/``False``/
    ``None``, as the template writes them) when valid, else the text itself."""
    if kind in _JSON_TYPES and value in _PYTHON_SCALARS:
        return _PYTHON_SCALARS[value]
    if kind in _JSON_TYPES:
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


@dataclass(frozen=True)
class XmlCalls:
    """Calls written as tags: ``call_open`` naming the function, each parameter opened by
    ``parameter_open`` naming it and closed by ``parameter_close``, the call by ``call_close``
    (Qwen3-Coder's and Seed-OSS's ``<function=NAME><parameter=K>``, MiniMax-M2's ``<invoke
    name="NAME"><parameter name="K">``). A block holds one call or more; its last closer may be
    missing (the block's end closes it). A value is typed by the tool's schema; one whose
    ``</parameter>`` was skipped ends at the next ``parameter_marker``; one running into the
    call's closer or the block's end has no known end: refused, as is a parameter given twice or
    text between parameters. The patterns' first matching group is the name."""

    call_open: re.Pattern[str]
    parameter_open: re.Pattern[str]
    parameter_marker: str
    call_close: str
    expected: str  # a call's opener as errors name it
    in_call: str  # "unexpected text in …", formatted with the call's name
    empty: str  # the error of a block without a call
    trim_newlines: bool  # Qwen3-Coder's template writes each value between newlines

    def _value_end(self, body: str, start: int, key: str) -> tuple[int, int]:
        """(end of the value starting at ``start``, where reading resumes)."""
        ends = {
            marker: at
            for marker in (PARAMETER_CLOSE, self.parameter_marker, self.call_close)
            if (at := body.find(marker, start)) >= 0
        }
        first = min(ends, key=ends.__getitem__) if ends else None
        if first == PARAMETER_CLOSE:
            return ends[first], ends[first] + len(PARAMETER_CLOSE)
        if first == self.parameter_marker:
            return ends[first], ends[first]
        raise MalformedCall(f"parameter {key!r} not closed")

    def parser(self, tools: Sequence[Mapping[str, Any]]) -> BlockParser:
        types = parameter_types(tools)

        def call(inner: str, at: int) -> tuple[str, dict[str, Any], int]:
            opening = self.call_open.match(inner, at)
            if opening is None:
                raise MalformedCall(f"expected {self.expected}: {inner[at:].strip()[:40]!r}")
            name, at = _first_group(opening), opening.end()
            kinds = types.get(name, {})
            arguments: dict[str, Any] = {}
            while parameter := self.parameter_open.match(inner, at):
                key = _first_group(parameter)
                if key in arguments:
                    raise MalformedCall(f"parameter {key!r} given twice")
                end, at = self._value_end(inner, parameter.end(), key)
                raw = inner[parameter.end() : end]
                if self.trim_newlines:
                    raw = raw.removeprefix("\n").removesuffix("\n")
                arguments[key] = typed_value(raw, kinds.get(key))
            rest = inner[at:].lstrip()
            if rest.startswith(self.call_close):
                return name, arguments, len(inner) - len(rest) + len(self.call_close)
            if rest:
                raise MalformedCall(
                    f"unexpected text in {self.in_call.format(name)}: {rest[:40]!r}"
                )
            return name, arguments, len(inner)

        def parse(inner: str) -> list[tuple[str, Any]]:
            calls: list[tuple[str, Any]] = []
            at = 0
            while inner[at:].strip():
                name, arguments, at = call(inner, at)
                calls.append((name, arguments))
            if not calls:
                raise MalformedCall(self.empty)
            return calls

        return parse


def _first_group(match: re.Match[str]) -> str:
    return next(group for group in match.groups() if group is not None)


CODER_CALLS = XmlCalls(
    call_open=_FUNCTION_OPEN,
    parameter_open=_PARAMETER_OPEN,
    parameter_marker=PARAMETER_OPEN,
    call_close=FUNCTION_CLOSE,
    expected="<function=NAME>",
    in_call="<function={}>",
    empty="expected <function=NAME>...</function>",
    trim_newlines=True,
)


def _hermes_parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(
        options, one_call(_parse_json_call), TAGS, implicit_close=True, call_ends_reasoning=True
    )


CODER_TAGS = Tags(bare_open=FUNCTION_OPEN, bare_close=FUNCTION_CLOSE)


def _coder_parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(options, CODER_CALLS.parser(options.tools), CODER_TAGS, implicit_close=True)


def _qwen35_parser(options: ParserOptions) -> OutputParser:
    """Qwen3-Coder's calls after reasoning that a ``<tool_call>`` ends, as vLLM's ``qwen3``
    reasoning parser (which serves Qwen3.5 with the ``qwen3_coder`` tool parser) ends it."""
    return TaggedParser(
        options,
        CODER_CALLS.parser(options.tools),
        CODER_TAGS,
        implicit_close=True,
        call_ends_reasoning=True,
    )


def _call_block(
    token_id: TokenLookup, opening: str, inner: dict[str, Any], closing: str, tags: Tags = TAGS
) -> Any:
    return g.sequence(
        [
            g.literal(tags.call_open, token_id),
            g.text(opening),
            inner,
            g.text(closing),
            g.literal(tags.call_close, token_id),
        ]
    )


def _hermes_call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>``"""
    bodies = [
        g.sequence(
            [
                # A JSON string body: quotes and backslashes in a name stay parseable.
                g.text(json.dumps(name, ensure_ascii=False) + ', "arguments": '),
                g.arguments(parameters, "json"),
            ]
        )
        for name, parameters in functions
    ]
    return _call_block(token_id, '\n{"name": ', g.one_of(bodies), "}\n")  # type: ignore[no-any-return]


def xml_call(tags: Tags, functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n`` between
    ``tags``' call markers: string values raw text, other values JSON (xgrammar's "qwen_xml"
    style)."""
    inner = g.any_call(
        functions,
        "<function=NAME>",
        "<>=",
        lambda name, parameters: [g.text(name + ">\n"), g.arguments(parameters, "qwen_xml")],
    )
    opening, closing = "\n" + FUNCTION_OPEN, FUNCTION_CLOSE + "\n"
    return _call_block(token_id, opening, inner, closing, tags)  # type: ignore[no-any-return]


def _xml_call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``"""
    return xml_call(TAGS, functions, token_id)


def _is_qwen3(template: str) -> bool:
    return "<|im_start|>" in template and "<tool_call>" in template


def _is_qwen3_coder(template: str) -> bool:
    return _is_qwen3(template) and "<function=" in template and "<parameter=" in template


def _is_qwen35(template: str) -> bool:
    """Qwen3-Coder's call format in a reasoning, vision-language template (Qwen3-Coder's own
    writes no ``<think>``; Qwen3-VL's calls are JSON)."""
    return _is_qwen3_coder(template) and "<think>" in template and "<|vision_start|>" in template


_HISTORY = (
    "drops the reasoning of assistant turns before the last user message, and writes an empty "
    "<think></think> block only in turns after it"
)

QWEN3 = Family(
    name="qwen3",
    summary="Qwen3 (and Qwen2.5/QwQ-style Hermes templates): JSON calls in <tool_call>",
    detect=_is_qwen3,
    parser=_hermes_parser,
    grammar=Grammar(call=_hermes_call),
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=_HISTORY,
    divergences=("reasoning_dropped",),
    tools_stand_in=True,
)

QWEN3_CODER = Family(
    name="qwen3_coder",
    summary="Qwen3-Coder: XML calls <function=NAME><parameter=P> in <tool_call>",
    detect=_is_qwen3_coder,
    parser=_coder_parser,
    grammar=Grammar(call=_xml_call),
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=_HISTORY,
    divergences=("reasoning_dropped",),
    tools_stand_in=True,
)

QWEN35 = Family(
    name="qwen35",
    summary="Qwen3.5/3.6: Qwen3-Coder's XML calls in <tool_call>, <think> opened by the prompt",
    detect=_is_qwen35,
    parser=_qwen35_parser,
    grammar=Grammar(call=_xml_call),
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=(
        "drops the reasoning of assistant turns before the last user message, and writes a "
        "<think> block (empty without reasoning) in every turn after it"
    ),
    divergences=("reasoning_dropped",),
    later_system=False,
    tools_stand_in=True,
)
