"""Mistral's v11 instruct format of the tekken tokenizers (Mistral Small 3.2, Devstral Small
2507): the answer's text, then each call as ``[TOOL_CALLS]`` (a control token), the function's
name, ``[CALL_ID]`` and the call's id, ``[ARGS]`` and the arguments as a JSON object, up to
``</s>``::

    Let me look.[TOOL_CALLS]read_file[CALL_ID]a1B2c3D4e[ARGS]{"path": "a"}[TOOL_CALLS]run...

A family of its own rather than a mode of ``mistral``: the calls, the grammar that forces them
and the control tokens (``[ARGS]``, ``[CALL_ID]``, ranks 32 and 33) are all v11's, and no
template writes both formats. What it shares with v7 it takes from ``mistral``: the content
scan (the parser is v7's with its own call reader), the nine-character ids and the history
(tool list before the last user message, results as ``[TOOL_RESULTS]ID[TOOL_CONTENT]``).

Read as models and templates write them: the id is optional (v13's shape, and Devstral's
template, write ``NAME[ARGS]{...}``; the parser then gives the call its own id), and
``NAME{...}`` without ``[ARGS]`` is read as vLLM's Mistral parser reads it. Reasoning is not
parsed: Magistral Small 2506's template, which writes its ``<think>`` text back, is the
``magistral`` family; v13's ``[THINK]`` tokens stay content, as v13's templates write them.

Invariants: the parser's result depends only on the whole text, never its chunking (the calls
run to the end of the output and are read by ``finish``); a malformed call run goes back as text
exactly as generated, with ``parse_error``: a name that is empty or holds whitespace or
brackets, an id that is not nine letters or digits, arguments that are not one JSON object, or
text after them.
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
    MalformedCall,
    ParserOptions,
    TokenLookup,
)
from titoflow.tito.families.mistral import (
    ID_LENGTH,
    ID_PATTERN,
    MISTRAL,
    TOOL_CALLS,
    MistralParser,
    own_id,
)
from titoflow.tito.output import OutputParser

ARGS = "[ARGS]"
CALL_ID = "[CALL_ID]"
# A name runs to [CALL_ID], [ARGS] or the arguments' "{"; whatever else it holds is malformed.
_HEAD = re.compile(r"(?P<name>[^\[{]*)(?:\[CALL_ID\](?P<id>[^\[{]*))?(?P<args>\[ARGS\]|(?=\{))")
_NAME = re.compile(r"[^\s\[\]{}\"]+")


def parse_calls(text: str) -> list[tuple[str, dict[str, Any], str | None]]:
    """The calls of ``text``, what follows the output's first ``[TOOL_CALLS]``: (name,
    arguments, id as written or None) for each ``NAME[CALL_ID]ID[ARGS]{json}`` (the id and its
    marker optional, ``[ARGS]`` too before a ``{``), the calls separated by ``[TOOL_CALLS]``.

    Raises MalformedCall for anything else (see the module's invariants).
    """
    calls = []
    for number, part in enumerate(text.split(TOOL_CALLS)):
        head = _HEAD.match(part)
        if head is None:
            raise MalformedCall(f"call {number}: no {ARGS} after the name")
        name, written = head["name"], head["id"]
        if not _NAME.fullmatch(name):
            raise MalformedCall(f"call {number}: bad name {name[:40]!r}")
        if written is not None and not ID_PATTERN.fullmatch(written):
            raise MalformedCall(f"call {number}: id is not {ID_LENGTH} letters or digits")
        body = part[head.end() :].lstrip()
        try:
            arguments, end = json.JSONDecoder().raw_decode(body)
        except json.JSONDecodeError as exc:
            why = f"invalid JSON: {exc.msg} at char {exc.pos}"
            raise MalformedCall(f"call {number}: {why}") from None
        if not isinstance(arguments, dict):
            raise MalformedCall(f"call {number}: arguments are not a JSON object")
        if body[end:].strip():
            raise MalformedCall(f"call {number}: text after the arguments: {body[end:][:40]!r}")
        calls.append((name, arguments, written))
    return calls


class MistralV11Parser(MistralParser):
    """v7's scan and control tokens, v11's calls. ``[ARGS]`` and ``[CALL_ID]`` are call syntax,
    kept in content as ``[TOOL_CALLS]`` is (never a call without it)."""

    read_calls = staticmethod(parse_calls)


def _parser(options: ParserOptions) -> OutputParser:
    return MistralV11Parser(options)


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}`` as the template writes it, the markers by id;
    the id is sampled (nine letters or digits), so a forced call re-renders to its own tokens."""
    identifier = {"type": "regex", "pattern": ID_PATTERN.pattern}
    bodies = [
        g.sequence(
            [
                g.text(name),
                g.literal(CALL_ID, token_id),
                identifier,
                g.literal(ARGS, token_id),
                g.arguments(parameters, "json"),
            ]
        )
        for name, parameters in functions
    ]
    return g.sequence([g.literal(TOOL_CALLS, token_id), g.one_of(bodies)])


def _is_mistral_v11(template: str) -> bool:
    """A Mistral template that writes ``[TOOL_CALLS]NAME…[ARGS]`` (v7's write a JSON list)."""
    return "[INST]" in template and TOOL_CALLS in template and ARGS in template


MISTRAL_V11 = Family(
    name="mistral_v11",
    summary=(
        "Mistral tekken v11 (Small 3.2, Devstral Small 2507): "
        "[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{json} per call, 9-character call ids"
    ),
    detect=_is_mistral_v11,
    parser=_parser,
    # Each call opens with its own [TOOL_CALLS]: nothing between or around them.
    grammar=Grammar(call=_call, separator=""),
    decode_special_tokens=True,
    native_call_id=own_id,
    history=(
        "as the mistral family's: every past turn as sampled, but [AVAILABLE_TOOLS] only before "
        "the last user message (a new user turn in a conversation with tools is rendered in "
        "full, a new chain); a call the model wrote without an id is rendered back with the "
        "parser's. Small 3.2's own checkpoint template also writes a calling turn as its calls "
        "alone (the text before them dropped)"
    ),
    assistant_starts=MISTRAL.assistant_starts,
    # The last one only under Small 3.2's checkpoint template (templates/mistral_small_3_2.jinja).
    divergences=("tools_moved", "tool_call_id_added", "call_content_dropped"),
    tools_stand_in=True,
)
