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
from titoflow.tito.families.qwen3 import XmlCalls
from titoflow.tito.families.tagged import TaggedParser, Tags
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
# vLLM's parser takes a name double-quoted, single-quoted or bare; the template double-quotes it.
_NAME = r"""(?:"([^"]*)"|'([^']*)'|([^\s>"']+))"""
_INVOKE_OPEN = re.compile(r"\s*<invoke name=" + _NAME + r">")
_PARAMETER_OPEN = re.compile(r"\s*<parameter name=" + _NAME + r"\s*>")


# A section's ``<invoke>`` blocks, one call each, the last one's ``</invoke>`` possibly missing; a
# value is kept exactly as written (the template writes it inline: whitespace in it is data).
_SECTION = XmlCalls(
    call_open=_INVOKE_OPEN,
    parameter_open=_PARAMETER_OPEN,
    parameter_marker=PARAMETER_OPEN,
    call_close=INVOKE_CLOSE,
    expected='<invoke name="NAME">',
    in_call="<invoke name={!r}>",
    empty="an empty <minimax:tool_call> section",
    trim_newlines=False,
)


def _parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(
        options,
        _SECTION.parser(options.tools),
        TAGS,
        implicit_close=True,
        call_ends_reasoning=True,  # as vLLM's minimax_m2 reasoning parser ends it there
    )


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<invoke name="NAME">\\n<parameter name="K">V</parameter>\\n…</invoke>\\n``: string
    values raw, other values JSON (xgrammar's "minimax_xml" style)."""
    return g.any_call(
        functions,
        '<invoke name="NAME">',
        '<>"',
        lambda name, parameters: [
            g.text(f"<invoke name={json.dumps(name, ensure_ascii=False)}>\n"),
            g.arguments(parameters, "minimax_xml"),
            g.text(INVOKE_CLOSE + "\n"),
        ],
    )


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
