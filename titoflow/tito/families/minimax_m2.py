"""MiniMax-M2 (M2.1 and M2.5 write the same): turns opened by ``]~b]ai``/``]~b]user``/
``]~b]tool`` and closed by ``[e~[``, reasoning in ``<think>…</think>`` (the generation prompt
opens it), and each turn's calls in one section::

    <minimax:tool_call>
    <invoke name="NAME">
    <parameter name="K">V</parameter>
    </invoke>
    </minimax:tool_call>

with string values written raw and every other value as JSON.

The parser reads a section as vLLM's ``minimax_m2`` parser does: a section opened before
``</think>`` ends the reasoning, an ``<invoke>`` written without its section is a call, a
section or an ``<invoke>`` the output ends inside is closed there, a ``</parameter>`` skipped
before the next ``<parameter`` ends the value there, and a value is typed by the tool's schema
(JSON where it parses, else the text). What would need a guess is refused with ``parse_error``
(a value whose end is unknown, a parameter given twice, text between parameters): a
call-shaped output is never lost silently.

History: the template keeps the reasoning of assistant turns after the last user message only
(and writes no block for a turn without reasoning), so re-rendering history would not give the
sampled tokens; the chain keeps them. It writes a system message after the first nowhere.
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
from titoflow.tito.families.qwen3 import parameter_types, typed_value
from titoflow.tito.families.tagged import BlockParser, TaggedParser, Tags
from titoflow.tito.output import OutputParser

INVOKE_OPEN = "<invoke name="
INVOKE_CLOSE = "</invoke>"
# An <invoke> written without its section is a call too (vLLM's parser reads it as one).
TAGS = Tags(
    call_open="<minimax:tool_call>",
    call_close="</minimax:tool_call>",
    bare_open=INVOKE_OPEN,
    bare_close=INVOKE_CLOSE,
)
PARAMETER_OPEN = "<parameter name="
PARAMETER_CLOSE = "</parameter>"
# vLLM's parser takes a name double-quoted, single-quoted or bare; the template double-quotes it.
_NAME = r"""(?:"([^"]*)"|'([^']*)'|([^\s>"']+))"""
_INVOKE_OPEN = re.compile(r"\s*<invoke name=" + _NAME + r">")
_PARAMETER_OPEN = re.compile(r"\s*<parameter name=" + _NAME + r"\s*>")


def _name(match: re.Match[str]) -> str:
    return next(group for group in match.groups() if group is not None)


def _value_end(body: str, start: int, key: str) -> tuple[int, int]:
    """(end of the value starting at ``start``, where reading resumes): at its
    ``</parameter>``, or at the next ``<parameter name=`` when the model skipped the closer. A
    value running into ``</invoke>`` or the section's end has no known end: refused."""
    ends = {
        marker: at
        for marker in (PARAMETER_CLOSE, PARAMETER_OPEN, INVOKE_CLOSE)
        if (at := body.find(marker, start)) >= 0
    }
    first = min(ends, key=ends.__getitem__) if ends else None
    if first == PARAMETER_CLOSE:
        return ends[first], ends[first] + len(PARAMETER_CLOSE)
    if first == PARAMETER_OPEN:
        return ends[first], ends[first]
    raise MalformedCall(f"parameter {key!r} not closed")


def _section_parser(tools: Sequence[Mapping[str, Any]]) -> BlockParser:
    """A section's ``<invoke>`` blocks, one call each; the last one's ``</invoke>`` may be
    missing (the section's end closes it). A value is kept exactly as written (the template
    writes it inline, so whitespace in it is data) and typed by the tool's schema."""
    types = parameter_types(tools)

    def invoke(inner: str, at: int) -> tuple[str, dict[str, Any], int]:
        opening = _INVOKE_OPEN.match(inner, at)
        if opening is None:
            raise MalformedCall(f'expected <invoke name="NAME">: {inner[at:].strip()[:40]!r}')
        name, at = _name(opening), opening.end()
        kinds = types.get(name, {})
        arguments: dict[str, Any] = {}
        while parameter := _PARAMETER_OPEN.match(inner, at):
            key = _name(parameter)
            if key in arguments:
                raise MalformedCall(f"parameter {key!r} given twice")
            end, at = _value_end(inner, parameter.end(), key)
            arguments[key] = typed_value(inner[parameter.end() : end], kinds.get(key))
        rest = inner[at:].lstrip()
        if rest.startswith(INVOKE_CLOSE):
            return name, arguments, len(inner) - len(rest) + len(INVOKE_CLOSE)
        if rest:
            raise MalformedCall(f"unexpected text in <invoke name={name!r}>: {rest[:40]!r}")
        return name, arguments, len(inner)

    def parse(inner: str) -> list[tuple[str, Any]]:
        calls: list[tuple[str, Any]] = []
        at = 0
        while inner[at:].strip():
            name, arguments, at = invoke(inner, at)
            calls.append((name, arguments))
        if not calls:
            raise MalformedCall("an empty <minimax:tool_call> section")
        return calls

    return parse


def _parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(
        options,
        _section_parser(options.tools),
        TAGS,
        implicit_close=True,
        call_ends_reasoning=True,  # as vLLM's minimax_m2 reasoning parser ends it there
    )


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<invoke name="NAME">\\n<parameter name="K">V</parameter>\\n…</invoke>\\n``: string
    values raw, other values JSON (xgrammar's "minimax_xml" style)."""
    bodies = []
    for name, parameters in functions:
        if not name or any(c in name for c in '<>"') or any(c.isspace() for c in name):
            raise ValueError(f'tool name {name!r} cannot be written as <invoke name="NAME">')
        bodies.append(
            g.sequence(
                [
                    g.text(f"<invoke name={json.dumps(name, ensure_ascii=False)}>\n"),
                    g.arguments(parameters, "minimax_xml"),
                    g.text(INVOKE_CLOSE + "\n"),
                ]
            )
        )
    return g.one_of(bodies)


def _is_minimax_m2(template: str) -> bool:
    return "]~b]ai" in template and "<minimax:tool_call>" in template


MINIMAX_M2 = Family(
    name="minimax_m2",
    summary='MiniMax-M2/M2.1/M2.5: <minimax:tool_call><invoke name="NAME"><parameter name="K">',
    detect=_is_minimax_m2,
    parser=_parser,
    grammar=Grammar(
        call=_call,
        separator="",  # each <invoke> ends with its own newline
        prefix=lambda token_id: [g.literal(TAGS.call_open, token_id), g.text("\n")],
        suffix=lambda token_id: [g.literal(TAGS.call_close, token_id)],
    ),
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=(
        "keeps reasoning only in assistant turns after the last user message; writes a newline "
        "before [e~[ after a turn's calls (Unsloth's copy; MiniMax's own file does not, nor "
        "does the model or a forced call)"
    ),
    divergences=("reasoning_dropped", "call_end_spaced"),
    tools_stand_in=True,
)
