"""Magistral on Mistral's v13 tekken format (Magistral Small 2507 and 2509, Magistral Medium
1.2): a reasoning block between the ``[THINK]`` and ``[/THINK]`` control tokens at the start of
the output, then the answer's text and each call as ``[TOOL_CALLS]NAME[ARGS]{json}``, with no
call id, up to ``</s>``::

    [THINK]The file is a.[/THINK]Let me look.[TOOL_CALLS]read_file[ARGS]{"path": "a"}

A family of its own rather than ``magistral`` or ``mistral_v11``: v13 adds the two reasoning
tokens (ranks 34 and 35), drops the call ids from calls and results, and writes the tool list
before the first user message, not the last, so its template, grammar and history are neither
v11's. The template (mistral-common's own for v13 with thinking) writes every assistant turn's
reasoning back as ``[THINK]R[/THINK]`` before its content, the calls without ids and the tools
once, first: the history is what was sampled, append-only. The parser is ``magistral``'s with
v13's markers (vLLM's ``mistral`` reasoning parser reads both the same way: a ``[TOOL_CALLS]``
inside the reasoning ends it), and its calls are ``mistral_v11``'s reader's, which takes the
id-less shape; a call gets the parser's own nine-character id, which no history writes.

Invariants: ``magistral``'s (the result depends on the whole text only, never its chunking; a
malformed call run goes back as text exactly as generated, with ``parse_error``; inside the
reasoning only ``[/THINK]`` and, with tools, ``[TOOL_CALLS]`` are read).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from titoflow.tito.families import grammar as g
from titoflow.tito.families.base import Family, Function, Grammar, ParserOptions, TokenLookup
from titoflow.tito.families.magistral import MagistralParser
from titoflow.tito.families.mistral import TOOL_CALLS
from titoflow.tito.families.mistral_v11 import ARGS, MISTRAL_V11
from titoflow.tito.output import OutputParser

THINK_OPEN = "[THINK]"
THINK_CLOSE = "[/THINK]"
# What only the v13 thinking template writes: an assistant turn's reasoning, as the tokens.
_WRITES_REASONING = "'[THINK]' ~ block['thinking']"


class MagistralV13Parser(MagistralParser):
    """A leading ``[THINK]`` block as reasoning, then the content and the calls."""

    opener = THINK_OPEN
    closer = THINK_CLOSE


def _parser(options: ParserOptions) -> OutputParser:
    return MagistralV13Parser(options)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``[TOOL_CALLS]NAME[ARGS]{...}`` as the template writes it, the markers by id."""
    bodies = [
        g.sequence([g.text(name), g.literal(ARGS, token_id), g.arguments(parameters, "json")])
        for name, parameters in functions
    ]
    return g.sequence([g.literal(TOOL_CALLS, token_id), g.one_of(bodies)])


def _is_magistral_v13(template: str) -> bool:
    """A v11-shaped template (``[TOOL_CALLS]NAME[ARGS]``) that writes reasoning as ``[THINK]``."""
    return MISTRAL_V11.detect(template) and _WRITES_REASONING in template


MAGISTRAL_V13 = Family(
    name="magistral_v13",
    summary=(
        "Magistral on Mistral tekken v13 (Small 2507/2509, Medium 1.2): [THINK]…[/THINK] "
        "control tokens, then [TOOL_CALLS]NAME[ARGS]{json} calls without ids"
    ),
    detect=_is_magistral_v13,
    parser=_parser,
    # Each call opens with its own [TOOL_CALLS]; the template writes nothing after [/THINK].
    grammar=Grammar(call=_call, separator="", reasoning_layout=("", "")),
    decode_special_tokens=True,
    reasoning_tags=(THINK_OPEN, THINK_CLOSE),
    assistant_starts=MISTRAL_V11.assistant_starts,
    tools_stand_in=True,
)
