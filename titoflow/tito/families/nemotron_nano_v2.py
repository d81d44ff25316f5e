"""NVIDIA Nemotron Nano v2 (NVIDIA-Nemotron-Nano-9B-v2/12B-v2): turns opened by
``<SPECIAL_10>System`` / ``<SPECIAL_11>User`` / ``<SPECIAL_11>Assistant`` and an assistant turn
closed by ``<SPECIAL_12>``; reasoning in ``<think>…</think>``, which the generation prompt opens
(``<think>\\n\\n``) unless a system or user message says ``/no_think`` (then it writes the empty
``<think></think>``); and each turn's calls as one JSON list::

    <TOOLCALL>[{"name": "NAME", "arguments": {...}}, ...]</TOOLCALL>

The list is read as Mistral's ``[TOOL_CALLS]`` list (:func:`titoflow.tito.families.mistral.
parse_calls`: a non-empty JSON list of ``{name, arguments}`` objects, or one such object), the
optional ``id`` that format allows dropped: Nemotron writes none. A list the output ends inside
(no ``</TOOLCALL>``) is read as closed there when its JSON is whole. What is not such a list
is refused with ``parse_error``: a call-shaped output is never lost silently. A ``<TOOLCALL>``
opened before ``</think>`` ends the reasoning (the reasoning's own closer, come after, is
dropped): a forced call starts right after the ``<think>`` the prompt opened, and models open
calls while thinking. vLLM's ``deepseek_r1`` reasoning parser (which NVIDIA's own Nano v2
reasoning plugin subclasses) ends the reasoning at ``</think>`` only, and would keep such a call
as reasoning.

History: the template drops every assistant turn's reasoning (the text up to ``</think>``)
and writes its content stripped of surrounding whitespace, so re-rendering history would not
give the sampled tokens; the chain keeps them. It writes a system message after the first
nowhere (it reads only the first message as the system prompt).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import Family, Function, Grammar, ParserOptions, TokenLookup
from titoflow.tito.families.mistral import parse_calls
from titoflow.tito.families.tagged import TaggedParser, Tags
from titoflow.tito.output import OutputParser

TAGS = Tags(call_open="<TOOLCALL>", call_close="</TOOLCALL>")


def _block(inner: str) -> list[tuple[str, Any]]:
    return [(name, arguments) for name, arguments, _ in parse_calls(inner)]


def _parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(options, _block, TAGS, implicit_close=True, call_ends_reasoning=True)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``{"name": "NAME", "arguments": {...}}`` as the template writes a call."""
    bodies = [g.sequence([*g.json_object_call(f, "arguments"), g.text("}")]) for f in functions]
    return g.one_of(bodies)


def _is_nemotron_nano_v2(template: str) -> bool:
    return "<SPECIAL_11>Assistant" in template and "<TOOLCALL>" in template


NEMOTRON_NANO_V2 = Family(
    name="nemotron_nano_v2",
    summary="Nemotron Nano v2: <think> reasoning (/think, /no_think), <TOOLCALL>[JSON list]",
    detect=_is_nemotron_nano_v2,
    parser=_parser,
    grammar=Grammar(
        call=_call,
        separator=", ",
        prefix=lambda token_id: [g.literal(TAGS.call_open, token_id), g.text("[")],
        suffix=lambda token_id: [g.text("]"), g.literal(TAGS.call_close, token_id)],
    ),
    reasoning_opener="<think>",
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history=(
        "drops every assistant turn's reasoning, writes its content stripped of surrounding "
        "whitespace, and ignores a system message after the first"
    ),
    divergences=("reasoning_dropped", "whitespace_trimmed"),
    tools_stand_in=True,
)
