"""DeepSeek-V3.1 (and V3.1-Terminus, V3.2-Exp): hybrid thinking switched by the template's
``thinking`` flag, tool calls as a section of ``NAME<｜tool▁sep｜>{JSON}`` calls between
single-token markers, ``<｜end▁of▁sentence｜>`` ending every assistant turn.

Generated text, with ``thinking`` the prompt ends ``<｜Assistant｜><think>``, without it
``<｜Assistant｜></think>`` (after a tool result the prompt ends ``<｜tool▁output▁end｜>`` either
way, and the model answers right after it)::

    reasoning</think>answer<｜end▁of▁sentence｜>                                   (thinking)
    text<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris"}
        <｜tool▁call▁end｜><｜tool▁call▁begin｜>...<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>

The markers are added tokens of the vocabulary but not special ones, so the text decoded with
special tokens skipped still holds them (``decode_special_tokens`` stays off). The template
concatenates each call's arguments as text, so calls keep the arguments exactly as written.

History (what re-rendering gives instead of what was sampled): the template never writes
reasoning, so every assistant turn, the latest included, renders as
``<｜Assistant｜></think>`` + content (the part after the first ``</think>`` if the content holds
one) + ``<｜end▁of▁sentence｜>``: a turn sampled in thinking mode loses its reasoning and the
``<think>`` its prompt ended with becomes ``</think>``. A turn that follows tool results has no
``<｜Assistant｜>`` header at all; every system message is hoisted to the top of the prompt,
joined by blank lines.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
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
from titoflow.tito.families.tagged import TaggedParser, Tags
from titoflow.tito.output import OutputDelta, OutputParser, ParsedOutput

CALLS_BEGIN = "<｜tool▁calls▁begin｜>"
CALLS_END = "<｜tool▁calls▁end｜>"
CALL_BEGIN = "<｜tool▁call▁begin｜>"
CALL_END = "<｜tool▁call▁end｜>"
TOOL_SEP = "<｜tool▁sep｜>"
MARKERS = (CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, TOOL_SEP)
# The section of calls is the parser's "block": its calls are read when it closes.
TAGS = Tags(call_open=CALLS_BEGIN, call_close=CALLS_END)


def parse_call(inner: str) -> tuple[str, str]:
    """``NAME<｜tool▁sep｜>ARGS`` (the inside of one call) into the name and the arguments'
    JSON text as written, which must be an object."""
    name, sep, arguments = inner.partition(TOOL_SEP)
    if not sep:
        raise MalformedCall(f"no {TOOL_SEP} after the name")
    if not name or name != name.strip():
        raise MalformedCall(f"bad tool name {name!r}")
    parse_json_object(arguments, "arguments are not a JSON object")
    return name, arguments


def parse_section(inner: str) -> list[tuple[str, str]]:
    """The calls between ``<｜tool▁calls▁begin｜>`` and ``<｜tool▁calls▁end｜>``: one or more
    ``<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>``, whitespace between them tolerated."""
    calls: list[tuple[str, str]] = []
    at = 0
    while True:
        rest = inner[at:].lstrip()
        if not rest:
            break
        if not rest.startswith(CALL_BEGIN):
            raise MalformedCall(f"expected {CALL_BEGIN}, found {rest[:40]!r}")
        start = len(inner) - len(rest) + len(CALL_BEGIN)
        end = inner.find(CALL_END, start)
        if end < 0:
            raise MalformedCall(f"call {len(calls)}: {CALL_BEGIN} not closed")
        try:
            calls.append(parse_call(inner[start:end]))
        except MalformedCall as exc:
            raise MalformedCall(f"call {len(calls)}: {exc}") from None
        at = end + len(CALL_END)
    if not calls:
        raise MalformedCall("no call in the section")
    return calls


class _SectionParser(TaggedParser):
    """Reasoning up to ``</think>``, then content in which a section of calls is one block: its
    calls come out together when ``<｜tool▁calls▁end｜>`` closes it, or the next section's
    opening or the output's end does (the model stopped after its last call's end marker, which
    vLLM's parser reads as the section's end too). A malformed section, a cut call included,
    goes back as text, exactly as generated, like any malformed block; so does a call written
    outside any section (which vLLM does not read either), reported in ``parse_error``."""

    def finish(self) -> tuple[list[OutputDelta], ParsedOutput]:
        deltas, parsed = super().finish()
        if self._parse_tools and parsed.parse_error is None and CALL_BEGIN in parsed.content:
            parsed = replace(parsed, parse_error=f"{CALL_BEGIN} outside a {CALLS_BEGIN} section")
        return deltas, parsed


def _parser(options: ParserOptions) -> OutputParser:
    return _SectionParser(options, parse_section, TAGS, implicit_close=True)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}<｜tool▁call▁end｜>``, the markers by id."""
    bodies = []
    for name, parameters in functions:
        if not name or name != name.strip() or any(m in name for m in MARKERS):
            raise ValueError(f"tool name {name!r} cannot be written before {TOOL_SEP}")
        bodies.append(
            g.sequence(
                [g.text(name), g.literal(TOOL_SEP, token_id), g.arguments(parameters, "json")]
            )
        )
    return g.sequence(
        [g.literal(CALL_BEGIN, token_id), g.one_of(bodies), g.literal(CALL_END, token_id)]
    )


def _is_deepseek_v3(template: str) -> bool:
    """The V3.1 call format (``NAME<｜tool▁sep｜>``), not V3/R1's (``TYPE<｜tool▁sep｜>NAME`` and
    a fenced JSON block): the template writes the name right before the separator."""
    compact = "".join(template.split())
    return (
        "<｜Assistant｜>" in template
        and CALLS_BEGIN in template
        and "['name']+'<｜tool▁sep｜>'" in compact
    )


DEEPSEEK_V3 = Family(
    name="deepseek_v3",
    summary="DeepSeek-V3.1/V3.1-Terminus/V3.2-Exp: NAME<｜tool▁sep｜>{JSON} calls in a "
    "<｜tool▁calls▁begin｜> section, <think> opened by the template's thinking switch",
    detect=_is_deepseek_v3,
    parser=_parser,
    grammar=Grammar(
        call=_call,
        separator="",  # "chain them directly without separators or spaces"
        prefix=lambda token_id: [g.literal(CALLS_BEGIN, token_id)],
        suffix=lambda token_id: [g.literal(CALLS_END, token_id)],
    ),
    decode_special_tokens=False,
    tool_arguments_text=True,
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=(
        "never writes reasoning: every assistant turn, the latest included, renders as "
        "<｜Assistant｜></think> + content after its first </think> + <｜end▁of▁sentence｜>, so a "
        "turn sampled with thinking loses its reasoning and its prompt's <think> becomes "
        "</think>; a turn after tool results has no <｜Assistant｜> header; system messages are "
        "hoisted to the top"
    ),
    assistant_starts=("<｜Assistant｜>", "<｜tool▁output▁end｜>"),
    divergences=("reasoning_dropped", "system_moved"),
    tools_stand_in=True,
)
