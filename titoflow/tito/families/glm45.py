"""GLM-4.5 / GLM-4.6 (and GLM-4.7, GLM-5 and GLM-5.1, which write the same tags without the
newlines):
``[gMASK]<sop>`` once, turns opened by ``<|system|>``, ``<|user|>``, ``<|assistant|>`` and
``<|observation|>`` (the tool results), ``<think>…</think>`` reasoning, and each tool call as
``<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>`` with
string values raw and every other value JSON.

An assistant turn has no end-of-turn token: the model stops by sampling the next turn's opener,
``<|observation|>`` after tool calls and ``<|user|>`` after an answer (GLM-4.5's
``generation_config.json`` lists both beside ``<|endoftext|>``). The template writes that opener
only when the next message comes, so the token that ends a chain is also the first token of the
next message's rendering; the renderer matches them (docs/models.md).

History: the template keeps the reasoning of assistant turns after the last user message and
writes ``<think></think>`` in its place for every turn before it (GLM-4.7 and GLM-5: ``</think>``,
also for a turn after it without reasoning), strips content and reasoning, and re-serializes
tool-call arguments (``tojson``: ``", "`` and ``": "`` separators, non-ASCII kept); the chain keeps
what was sampled. GLM-5.1's template, thinking on, writes the last answer after the last user
message with an empty ``<think></think>`` and every earlier one with ``</think>``: a new user
message rewrites the previous answer's think block, so that prompt is rendered in full
(``think_block_moved``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import (
    Family,
    Function,
    Grammar,
    MalformedCall,
    ParserOptions,
    TokenLookup,
)
from titoflow.tito.families.qwen3 import _schema_type, parameter_types, typed_value
from titoflow.tito.families.tagged import TaggedParser, Tags, one_call
from titoflow.tito.output import OutputDelta, OutputParser, ParsedOutput

TAGS = Tags()  # <think></think> and <tool_call></tool_call>, as Qwen3's
ARG_KEY, ARG_KEY_END = "<arg_key>", "</arg_key>"
ARG_VALUE, ARG_VALUE_END = "<arg_value>", "</arg_value>"

_NAME = re.compile(r"\s*([^\s<>]+)\s*")
_ARGUMENT = re.compile(r"\s*<arg_key>([^<>]+)</arg_key>\s*<arg_value>(.*?)</arg_value>", re.DOTALL)


def _block_parser(tools: Sequence[Mapping[str, Any]]) -> Any:
    """``NAME`` then ``<arg_key>K</arg_key><arg_value>V</arg_value>`` pairs, whitespace between
    them optional (GLM-4.5 writes newlines, GLM-4.7 none). A key is the parameter's name, the
    whitespace around it layout (as vLLM reads it); a value is kept exactly as written (the
    template writes it raw, without padding) and typed by the tool's schema: JSON for
    non-string parameters when it parses, else the text."""
    types = parameter_types(tools)

    def parse(inner: str) -> tuple[str, dict[str, Any]]:
        first = inner.find(ARG_KEY)
        head = inner if first < 0 else inner[:first]
        name = _NAME.fullmatch(head)
        if name is None:
            raise MalformedCall(f"expected NAME before the arguments, got {head[:40]!r}")
        kinds = types.get(name.group(1), {})
        arguments: dict[str, Any] = {}
        at = len(head)
        while argument := _ARGUMENT.match(inner, at):
            key, value = argument.group(1).strip(), argument.group(2)
            if not key:
                raise MalformedCall("an empty argument name")
            if ARG_KEY in value or ARG_VALUE in value:  # its </arg_value> is missing
                raise MalformedCall(f"argument {key!r} runs into the next one")
            if key in arguments:
                raise MalformedCall(f"argument {key!r} given twice")
            arguments[key] = typed_value(value, kinds.get(key))
            at = argument.end()
        if inner[at:].strip():
            raise MalformedCall(f"unexpected text in the call: {inner[at:][:40]!r}")
        return name.group(1), arguments

    return parse


class _LeadingSpaceDropped:
    """The template writes ``\\n`` before a turn's reasoning, content and first call (GLM-4.5)
    and strips the content: whitespace before the first character is layout, never content."""

    def __init__(self, inner: OutputParser) -> None:
        self._inner = inner
        self._leading = True

    def feed(self, text: str) -> list[OutputDelta]:
        if self._leading:
            text = text.lstrip()
            if not text:
                return []
            self._leading = False
        return self._inner.feed(text)

    def finish(self) -> tuple[list[OutputDelta], ParsedOutput]:
        return self._inner.finish()


def _parser(options: ParserOptions) -> OutputParser:
    """GLM-4.7 often opens a call before closing its reasoning, which vLLM's GLM parser reads as
    the reasoning's end: so does this one. A call missing its ``</tool_call>`` is closed by the
    next call or the output's end (the model sampled ``<|observation|>`` after its last
    ``</arg_value>``): its complete arguments make a call, a cut one a parse error."""
    block = one_call(_block_parser(options.tools))
    tagged = TaggedParser(options, block, TAGS, implicit_close=True, call_ends_reasoning=True)
    return _LeadingSpaceDropped(tagged)


# GLM-4.5 writes a newline before each tag of a call, GLM-4.7 none: either, never more.
_LAYOUT_SPACE = g.one_of([g.text("\n"), g.text("")])
_STRING_END_EXCLUDES = [ARG_VALUE_END]


def _value(schema: Any, token_id: TokenLookup) -> dict[str, Any]:
    """``<arg_value>V</arg_value>``: a string parameter's value raw (any text up to the closing
    tag, one of its enum, or up to ``maxLength`` characters other than ``<``, so that the value
    ends where the schema says), any other one JSON under the property's schema."""
    opening, closing = g.literal(ARG_VALUE, token_id), g.literal(ARG_VALUE_END, token_id)
    kind = _schema_type(schema)
    if kind in (None, "string"):
        enum = schema.get("enum") if isinstance(schema, Mapping) else None
        if isinstance(enum, list) and enum and all(isinstance(v, str) for v in enum):
            return g.sequence([opening, g.one_of([g.text(v) for v in enum]), closing])
        bound = schema.get("maxLength") if isinstance(schema, Mapping) else None
        if isinstance(bound, int) and bound >= 0:
            bounded = {"type": "regex", "pattern": f"[^<]{{0,{bound}}}"}
            return g.sequence([opening, bounded, closing])
        return {
            "type": "tag",
            "begin": opening,
            "content": {"type": "any_text", "excludes": _STRING_END_EXCLUDES},
            "end": closing,
        }
    return g.sequence([opening, g.arguments(schema, "json"), closing])


def _plain_properties(parameters: Any) -> dict[str, Any] | None:
    """A plain object schema's properties (what the per-argument grammar can express)."""
    if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
        return None
    properties = parameters.get("properties", {})
    combined = ("$ref", "allOf", "anyOf", "oneOf", "patternProperties")
    if not isinstance(properties, Mapping) or any(k in parameters for k in combined):
        return None
    return dict(properties)


def _arguments(parameters: Any, token_id: TokenLookup) -> dict[str, Any]:
    """Each declared property in order, ``<arg_key>K</arg_key><arg_value>V</arg_value>`` with
    the four tags named by id (a rendering never spells them in pieces); the optional ones may
    be left out, no other key written. A schema that is not a plain object falls back to
    xgrammar's "glm_xml" style (same layout, tags as text)."""
    properties = _plain_properties(parameters)
    if properties is None:
        return g.arguments(parameters, "glm_xml")
    required = set(parameters.get("required", ()))
    elements: list[dict[str, Any]] = []
    for key, schema in properties.items():
        pair = g.sequence(
            [
                _LAYOUT_SPACE,
                g.literal(ARG_KEY, token_id),
                g.text(key),
                g.literal(ARG_KEY_END, token_id),
                _LAYOUT_SPACE,
                _value(schema, token_id),
            ]
        )
        elements.append(pair if key in required else g.one_of([pair, g.text("")]))
    return g.sequence([*elements, _LAYOUT_SPACE])


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``\n<tool_call>NAME`` + the arguments + ``</tool_call>``: GLM-4.5 writes a newline before
    each call (after the prompt's ``<think></think>``, the model's ``</think>`` or the call
    before), GLM-4.7 none."""
    bodies = []
    for name, parameters in functions:
        if not name or any(c in name for c in "<>") or any(c.isspace() for c in name):
            raise ValueError(f"tool name {name!r} cannot be written as <tool_call>NAME")
        bodies.append(g.sequence([g.text(name), _arguments(parameters, token_id)]))
    return g.sequence(
        [
            _LAYOUT_SPACE,
            g.literal(TAGS.call_open, token_id),
            g.one_of(bodies),
            g.literal(TAGS.call_close, token_id),
        ]
    )


def _is_glm45(template: str) -> bool:
    return "[gMASK]<sop>" in template and "<arg_key>" in template and "<tool_call>" in template


GLM45 = Family(
    name="glm45",
    summary="GLM-4.5/4.6/4.7/5/5.1: <tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value>",
    detect=_is_glm45,
    parser=_parser,
    # Each call carries its own leading newline (optional): no separator between calls.
    grammar=Grammar(call=_call, separator="", reasoning_layout=("\n", "")),
    # The opener the model samples to end its turn; <|user|> is the renderer's terminator.
    stop_tokens=("<|observation|>", "<|endoftext|>"),
    decode_special_tokens=True,  # <think>, <tool_call>, <arg_key>… are special tokens
    # GLM-4.7's generation prompt ends with <think> (thinking on); GLM-4.5's never does.
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=(
        "keeps reasoning only in assistant turns after the last user message (<think></think> "
        "before it), strips content and reasoning, re-serializes non-string arguments with "
        "tojson; with enable_thinking=false appends /nothink to every user message (GLM-4.7, "
        "GLM-5: </think> in place of a dropped or empty think block; GLM-5.1, thinking on: an "
        "empty <think></think> in the last answer after the last user message only)"
    ),
    divergences=("reasoning_dropped", "turn_end_mismatch", "think_block_moved"),
    tools_stand_in=True,
)
