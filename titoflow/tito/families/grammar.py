"""Forced tool calls (``tool_choice`` "required" or a named function) by the engine's own
constrained decoding, in the model family's own format.

The policy may answer in plain text when a client demands a tool call. Rather than prefilling or
injecting text (the recorded tokens must be exactly the ones the engine sampled), the ingress asks
vLLM to sample under a grammar that only admits a well-formed call in the family's format,
followed by the end-of-turn token.

vLLM 0.32 takes the grammar as ``sampling_params.structured_outputs.structural_tag``: a JSON text
in xgrammar's structural-tag language (the default "auto" backend picks xgrammar; it runs on
CPU). When the grammar is complete, xgrammar only admits the request's stop tokens, so the call
is always followed by the end of the turn. Arguments are constrained by each tool's JSON schema
(properties in declared order, no extra properties). Tag tokens that are single tokens of the
vocabulary are named by id, so the model cannot spell them in pieces, which a template rendering
never does. Facts and timings: docs/engine.md.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any, Literal

from titoflow.tito.families.base import Family, Function, TokenLookup

ToolChoice = Literal["auto", "none", "required", "named"]

# At most one whitespace character where JSON / XML syntax allows whitespace (not inside
# string values): admits the templates' ``{"a": 1, "b": 2}`` and compact JSON, but stops a
# weak policy from filling the call with blank space.
MAX_WHITESPACE = 1

# Parameters of a tool that declares none: an empty argument list, as in OpenAI's API.
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def tool_call_constraint(
    family: Family,
    tools: Sequence[dict[str, Any]],
    choice: ToolChoice,
    name: str | None,
    token_id: TokenLookup,
    *,
    parallel: bool = False,
    reasoning: bool = False,
) -> dict[str, Any] | None:
    """The ``sampling_params`` entries that force a tool call, or None when nothing is forced.

    ``choice`` "required" admits a call of any of ``tools``; "named" only of the tool ``name``.
    ``parallel`` admits further calls after the first; by default exactly one call ends the
    turn. ``reasoning`` admits a leading reasoning block (a prompt rendered with thinking on
    leaves it to the model); otherwise the output starts with the call.

    Raises ValueError for a family without a grammar, an unknown choice, a named tool missing
    from ``tools``, "required" without tools, or a tool the family's format cannot express.
    """
    if choice in ("auto", "none"):
        return None
    grammar = family.grammar
    if grammar is None:
        raise ValueError(f"model family {family.name!r} has no tool-call grammar")
    functions = [function_of(tool) for tool in tools]
    if choice == "named":
        selected = [f for f in functions if f[0] == name]
        if not selected:
            raise ValueError(f"tool_choice names {name!r}, which is not among the tools")
        selected = selected[:1]
    elif choice == "required":
        if not functions:
            raise ValueError('tool_choice "required" needs at least one tool')
        selected = functions
    else:
        raise ValueError(f"unknown tool_choice {choice!r}")
    call = grammar.call(selected, token_id)
    body: dict[str, Any] = call
    if parallel:
        gap = [text(grammar.separator)] if grammar.separator else []
        more = sequence([*gap, call])
        body = sequence([call, {"type": "star", "content": more}])
    body = sequence([*grammar.prefix(token_id), body, *grammar.suffix(token_id)])
    if reasoning:
        if family.reasoning_tags is None:
            raise ValueError(f"model family {family.name!r} has no reasoning block")
        opening, closing = family.reasoning_tags
        think: dict[str, Any] = {
            "type": "tag",
            "begin": tag_edge(opening, token_id),
            # Without the exclusion the free text would swallow the closing tag and never end.
            "content": {"type": "any_text", "excludes": [closing]},
            "end": tag_edge(closing, token_id),
        }
        before, after = grammar.reasoning_layout
        lead, trail = [text(before)] if before else [], [text(after)] if after else []
        body = sequence([sequence([*lead, think, *trail]), body])
    tag = json.dumps(
        {"type": "structural_tag", "format": body}, ensure_ascii=False, separators=(",", ":")
    )
    return {"structured_outputs": {"structural_tag": tag}}


def function_of(tool: dict[str, Any]) -> Function:
    """(name, parameters schema) of an OpenAI function tool (or a bare function object)."""
    function = tool.get("function", tool)
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError(f"not a function tool: {tool!r}")
    parameters = function.get("parameters")
    if parameters is None or parameters == {}:
        parameters = _NO_PARAMETERS
    if not isinstance(parameters, (dict, bool)):
        raise ValueError(f"tool {function['name']!r}: parameters must be a JSON schema")
    return function["name"], parameters


def any_call(
    functions: Sequence[Function],
    form: str,
    delimiters: str,
    call: Callable[[str, dict[str, Any] | bool], list[dict[str, Any]]],
) -> dict[str, Any]:
    """A call of one of ``functions``, as ``call(name, parameters)`` writes it; a name that a
    call written as ``form`` cannot carry (empty, or holding whitespace or one of the format's
    ``delimiters``) is refused (ValueError)."""
    bodies = []
    for name, parameters in functions:
        if not name or any(c.isspace() or c in delimiters for c in name):
            raise ValueError(f"tool name {name!r} cannot be written as {form}")
        bodies.append(sequence(call(name, parameters)))
    return one_of(bodies)


def text(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def token(token_id: int) -> dict[str, Any]:
    return {"type": "token", "token": token_id}


def literal(value: str, token_id: TokenLookup) -> dict[str, Any]:
    """``value`` as its single token where the vocabulary has one, else as text."""
    found = token_id(value)
    return token(found) if found is not None else text(value)


def tag_edge(value: str, token_id: TokenLookup) -> dict[str, Any] | str:
    """A ``tag`` element's begin or end: ``value``'s single token, else ``value`` itself (xgrammar
    takes a string or a token there, not a ``const_string`` element: Gemma 4's
    ``<|channel>thought`` is two tokens)."""
    found = token_id(value)
    return token(found) if found is not None else value


def arguments(parameters: dict[str, Any] | bool, style: str = "json") -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": parameters,
        "style": style,
        "max_whitespace_cnt": MAX_WHITESPACE,
    }


def sequence(elements: list[dict[str, Any]]) -> dict[str, Any]:
    return elements[0] if len(elements) == 1 else {"type": "sequence", "elements": elements}


def one_of(alternatives: list[dict[str, Any]]) -> dict[str, Any]:
    return alternatives[0] if len(alternatives) == 1 else {"type": "or", "elements": alternatives}


def json_object_call(function: Function, arguments_key: str) -> list[dict[str, Any]]:
    """``{"name": "NAME", "<arguments_key>": {...}``, a call as a JSON object left open for the
    family's own ending; the name a JSON string, so quotes and backslashes in it stay
    parseable."""
    name, parameters = function
    return [
        text('{"name": ' + json.dumps(name, ensure_ascii=False) + f', "{arguments_key}": '),
        arguments(parameters, "json"),
    ]
