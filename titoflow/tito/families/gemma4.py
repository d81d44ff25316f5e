"""Gemma 4 (google/gemma-4-*-it) with its own tool tokens, as Google's chat template writes it
and vLLM's ``gemma4`` tool and reasoning parsers read it. Turns are ``<|turn>ROLE\\n…<turn|>\\n``
(the assistant's role is ``model``); reasoning is a channel, calls are blocks with Gemma's own
argument syntax (bare keys, strings quoted by the ``<|"|>`` token, other values as written)::

    <|turn>model
    <|channel>thought
    …reasoning…<channel|><|tool_call>call:get_weather{city:<|"|>Paris<|"|>,days:3}<tool_call|><|tool_response>

The model ends a call turn by sampling ``<|tool_response>``; the template writes each tool
message's result into that same model turn (``response:NAME{…}<tool_response|>``) and the
model's answer continues it, ended by ``<turn|>``. Thinking is switched on by
``enable_thinking`` (``<|think|>`` in the system turn).

The parser is :class:`TaggedParser` under Gemma's markers: reasoning after ``<|channel>thought``
(vLLM strips the same ``thought\\n`` prefix), a ``<|tool_call>`` opened before ``<channel|>``
ends the reasoning (as vLLM's state machine does), each block read by :func:`read_call`. A
block the output ends inside, or the next block opens inside, is read as closed there (Gemma 4
models write ``<turn|>`` for ``<tool_call|>``, vLLM's ``gemma4_utils`` notes, and the stop token
is not in the text). A block or value that does not parse (no ``call:`` prefix, a value the
template never writes, an unterminated string) goes back as generated with ``parse_error``:
vLLM's parser reads what it can of such a block and passes bare values on as strings, titoflow
refuses rather than guess.

History: the template keeps the reasoning only of model turns after the last user message and
writes it with a newline before ``<channel|>``; it trims content and writes a call's arguments
with keys sorted. Text beside calls is written after the tool results, the turn closed there
and no new one opened by the generation prompt: not what the model sampled, nor a prompt it
continues (``content_with_calls`` off).

Forced calls: xgrammar (0.2.8) has no structural-tag style for values quoted by ``<|"|>`` (its
own Gemma 4 builtin is disabled for that reason), so the grammar is composed of its elements
(:func:`_call`): markers by id, keys in the template's sorted order, each value written as the
template writes it under the parameter's schema. It ends at ``<tool_call|>``: ``<|tool_response>``
is a stop token of the request, and xgrammar masks a request's stop token wherever the grammar
itself asks for it (the grammar is not complete there), so a grammar that wrote it would leave
no token to sample.
"""

from __future__ import annotations

import json
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
from titoflow.tito.families.tagged import TaggedParser, Tags, one_call
from titoflow.tito.output import OutputParser

QUOTE = '<|"|>'
RESULTS = "<|tool_response>"  # what the model samples after its calls, asking for their results
TAGS = Tags(
    think_open="<|channel>thought",
    think_close="<channel|>",
    call_open="<|tool_call>",
    call_close="<tool_call|>",
)
_NAME = re.compile(r"call:([A-Za-z_][\w.\-]*)\{")
_KEY = re.compile(r"[A-Za-z_][\w.\-]*")
_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?")
# ``null`` as the template writes it; ``None`` as Gemma 4's earlier revisions wrote it.
_WORDS: dict[str, Any] = {"true": True, "false": False, "null": None, "None": None}


class _Reader:
    """Gemma's argument syntax over one block's text, refusing what the template never writes."""

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def fail(self, why: str) -> MalformedCall:
        return MalformedCall(f"{why} at offset {self.at}")

    def skip_space(self) -> None:
        # The template writes none; the model may, and vLLM's parser skips it too.
        while self.at < len(self.text) and self.text[self.at] in " \t\n":
            self.at += 1

    def expect(self, token: str) -> None:
        self.skip_space()
        if not self.text.startswith(token, self.at):
            raise self.fail(f"expected {token!r}")
        self.at += len(token)

    def key(self) -> str:
        self.skip_space()
        if self.text.startswith(QUOTE, self.at):  # a nested object's key, quoted by the model
            return self.string()
        found = _KEY.match(self.text, self.at)
        if found is None:
            raise self.fail("expected a key")
        self.at = found.end()
        return found.group()

    def string(self) -> str:
        self.expect(QUOTE)
        end = self.text.find(QUOTE, self.at)
        if end < 0:
            raise self.fail("unterminated string")
        value, self.at = self.text[self.at : end], end + len(QUOTE)
        return value

    def members(self, close: str) -> dict[str, Any]:
        """``k:v,…`` up to and including ``close``."""
        result: dict[str, Any] = {}
        self.skip_space()
        if self.text.startswith(close, self.at):
            self.at += len(close)
            return result
        while True:
            key = self.key()
            if key in result:
                raise self.fail(f"argument {key!r} given twice")
            self.expect(":")
            result[key] = self.value()
            self.skip_space()
            if self.text.startswith(close, self.at):
                self.at += len(close)
                return result
            self.expect(",")

    def value(self) -> Any:
        self.skip_space()
        text, at = self.text, self.at
        if text.startswith(QUOTE, at):
            return self.string()
        if text.startswith("{", at):
            self.at += 1
            return self.members("}")
        if text.startswith("[", at):
            self.at += 1
            items: list[Any] = []
            self.skip_space()
            if text.startswith("]", self.at):
                self.at += 1
                return items
            while True:
                items.append(self.value())
                self.skip_space()
                if text.startswith("]", self.at):
                    self.at += 1
                    return items
                self.expect(",")
        for word, meaning in _WORDS.items():
            if text.startswith(word, at):
                self.at += len(word)
                return meaning
        number = _NUMBER.match(text, at)
        if number is None:
            raise self.fail("expected a value")
        self.at = number.end()
        whole = number.group()
        return float(whole) if number.group(1) or number.group(2) else int(whole)


def read_call(inner: str) -> tuple[str, dict[str, Any]]:
    """``call:NAME{k:v,…}``, the inside of one ``<|tool_call>`` block, as (name, arguments)."""
    head = _NAME.match(inner)
    if head is None:
        raise MalformedCall("expected call:NAME{")
    reader = _Reader(inner)
    reader.at = head.end()
    arguments = reader.members("}")
    reader.skip_space()
    if reader.at != len(inner):
        raise reader.fail("text after the arguments")
    return head.group(1), arguments


def _parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(
        options, one_call(read_call), TAGS, implicit_close=True, call_ends_reasoning=True
    )


# Integers and numbers as the parser reads them (JSON's, which the template writes).
_INTEGER = r"-?(0|[1-9][0-9]*)"
_FLOAT = _INTEGER + r"(\.[0-9]+)?([eE][+-]?[0-9]+)?"
# A free-form value (no schema, or an object without properties) nests at most this deep.
_FREE_DEPTH = 2


def _value(schema: Any, token_id: TokenLookup, depth: int = _FREE_DEPTH) -> dict[str, Any]:
    """One value as the template's ``format_argument`` writes it under ``schema``: a string
    between ``<|"|>`` tokens, numbers and ``true``/``false``/``null`` as JSON, an object's
    declared keys bare and sorted, a list's items under ``items``."""
    if schema is True or schema == {}:
        return _free(token_id, depth)
    if not isinstance(schema, Mapping):
        raise ValueError(f"cannot write a value of schema {schema!r}")
    if "enum" in schema or "const" in schema:
        choices = schema["enum"] if "enum" in schema else [schema["const"]]
        return g.one_of([_constant(v, token_id) for v in choices])
    alternatives = schema.get("anyOf", schema.get("oneOf"))
    if isinstance(alternatives, list):
        return g.one_of([_value(a, token_id, depth) for a in alternatives])
    kind = schema.get("type")
    if isinstance(kind, list):
        return g.one_of([_value({**schema, "type": k}, token_id, depth) for k in kind])
    if kind == "string":
        return _string(schema, token_id)
    if kind in ("integer", "number"):
        return {"type": "regex", "pattern": _INTEGER if kind == "integer" else _FLOAT}
    if kind == "boolean":
        return g.one_of([g.text("true"), g.text("false")])
    if kind == "null":
        return g.text("null")
    if kind == "array":
        return _delimited("[", _value(schema.get("items", True), token_id, depth), "]")
    if kind == "object" or (kind is None and "properties" in schema):
        if "properties" not in schema:
            return _free(token_id, depth)
        return g.sequence([g.text("{"), _members(schema, token_id, depth), g.text("}")])
    if kind is None and not set(schema) - {"description", "title", "default", "examples"}:
        return _free(token_id, depth)
    raise ValueError(f"cannot write a value of schema {dict(schema)!r}")


def _string(schema: Mapping[str, Any], token_id: TokenLookup) -> dict[str, Any]:
    """``<|"|>…<|"|>``: up to ``maxLength`` characters other than ``<`` (so that the value ends
    where the schema says), else any text up to the closing quote; a marker's text excluded,
    since the vocabulary's markers are text to xgrammar."""
    quote = g.literal(QUOTE, token_id)
    bound = schema.get("maxLength")
    if isinstance(bound, int) and bound >= 0:
        bounded = {"type": "regex", "pattern": f"[^<]{{0,{bound}}}"}
        return g.sequence([quote, bounded, quote])
    content = {"type": "any_text", "excludes": [QUOTE, TAGS.call_open, TAGS.call_close]}
    edge = g.tag_edge(QUOTE, token_id)
    return {"type": "tag", "begin": edge, "content": content, "end": edge}


def _constant(value: Any, token_id: TokenLookup) -> dict[str, Any]:
    if isinstance(value, str):
        quote = g.literal(QUOTE, token_id)
        return g.sequence([quote, g.text(value), quote]) if value else g.sequence([quote, quote])
    if value is None or isinstance(value, bool):
        return g.text({None: "null", True: "true", False: "false"}[value])
    if isinstance(value, (int, float)):
        return g.text(json.dumps(value))
    raise ValueError(f"cannot write the constant {value!r}")


def _delimited(opening: str, item: dict[str, Any], closing: str) -> dict[str, Any]:
    """``opening`` + zero or more ``item`` separated by commas + ``closing``."""
    more = {"type": "star", "content": g.sequence([g.text(","), item])}
    return g.sequence(
        [g.text(opening), g.one_of([g.sequence([item, more]), g.text("")]), g.text(closing)]
    )


def _free(token_id: TokenLookup, depth: int) -> dict[str, Any]:
    """Any value, nested objects and lists at most ``depth`` deep (a structural tag has no
    recursion); an object's keys bare, as the template writes a call's nested keys."""
    scalars = [_string({}, token_id), {"type": "regex", "pattern": _FLOAT}]
    scalars += [g.text(word) for word in ("true", "false", "null")]
    if depth == 0:
        return g.one_of(scalars)
    inner = _free(token_id, depth - 1)
    member = g.sequence([{"type": "regex", "pattern": _KEY.pattern}, g.text(":"), inner])
    return g.one_of([*scalars, _delimited("{", member, "}"), _delimited("[", inner, "]")])


def _members(schema: Mapping[str, Any], token_id: TokenLookup, depth: int) -> dict[str, Any]:
    """``k:v,…``: the declared properties in the template's order (Jinja's ``dictsort``,
    case-insensitive), the required ones always, the optional ones where chosen, commas only
    between those written; no undeclared key."""
    properties = schema.get("properties", {})
    if not isinstance(properties, Mapping):
        raise ValueError(f"properties must be a mapping: {properties!r}")
    required = set(schema.get("required", ()))
    pairs: list[tuple[dict[str, Any], bool]] = []
    for key, value in sorted(properties.items(), key=lambda item: str(item[0]).lower()):
        if not _KEY.fullmatch(key):
            raise ValueError(f"argument {key!r} cannot be written as a bare key")
        written = g.sequence([g.text(f"{key}:"), _value(value, token_id, depth)])
        pairs.append((written, key in required))

    def after(start: int) -> list[dict[str, Any]]:
        """The members from ``start`` on, one already written before them."""
        tail = []
        for written, needed in pairs[start:]:
            pair = g.sequence([g.text(","), written])
            tail.append(pair if needed else g.one_of([pair, g.text("")]))
        return tail

    def first(start: int) -> dict[str, Any]:
        """The members from ``start`` on, none written yet."""
        if start == len(pairs):
            return g.text("")
        written, needed = pairs[start]
        here = g.sequence([written, *after(start + 1)])
        return here if needed else g.one_of([here, first(start + 1)])

    return first(0)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<|tool_call>call:NAME{k:v,…}<tool_call|>``, the markers by id; the model's
    ``<|tool_response>`` after it is the request's stop token, not the grammar's."""
    bodies = []
    for name, parameters in functions:
        if not _KEY.fullmatch(name):
            raise ValueError(f"tool name {name!r} cannot be written as call:NAME")
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise ValueError(f"tool {name!r}: its parameters must be an object schema")
        arguments = _members(parameters, token_id, _FREE_DEPTH)
        bodies.append(g.sequence([g.text(f"call:{name}{{"), arguments, g.text("}")]))
    return g.sequence(
        [
            g.literal(TAGS.call_open, token_id),
            g.one_of(bodies),
            g.literal(TAGS.call_close, token_id),
        ]
    )


def _is_gemma4(template: str) -> bool:
    return "<|turn>" in template and "<|tool_call>call:" in template


GEMMA4 = Family(
    name="gemma4",
    summary='Gemma 4: <|channel>thought reasoning, <|tool_call>call:NAME{k:<|"|>v<|"|>}',
    detect=_is_gemma4,
    parser=_parser,
    # Calls follow one another; the reasoning channel closes right before the first.
    grammar=Grammar(call=_call, separator="", reasoning_layout=("", "")),
    # The model ends a call turn by asking for the results; <turn|> ends a text turn.
    stop_tokens=(RESULTS, "<eos>"),
    decode_special_tokens=True,  # every marker, the string quote too, is a special token
    # The template writes a call turn's text after the tool results and closes the turn there,
    # and its generation prompt then opens none: text beside calls is not written as sampled.
    content_with_calls=False,
    # After tool results with thinking on, the generation prompt opens the thought channel.
    reasoning_opener=TAGS.think_open,
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    # The model's turn goes on after the tool results, with no opener of its own.
    assistant_starts=("<tool_response|>",),
    history=(
        "keeps the reasoning only of model turns after the last user message (written with a "
        "newline before <channel|>), trims content, writes arguments with keys sorted, and writes "
        "a call turn's text after the tool results"
    ),
    divergences=("reasoning_dropped",),
    tools_stand_in=True,
)
