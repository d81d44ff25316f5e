"""Forced tool calls (``tool_choice`` "required" or a named function) by the engine's own
constrained decoding.

The tiny policy, like any policy, may answer in plain text when a client demands a tool call.
Rather than prefilling or injecting text (the recorded tokens must be exactly the ones the
engine sampled), the ingress asks vLLM to sample under a grammar that only admits a
well-formed call in the model family's own format, followed by the end-of-turn token.

vLLM 0.32 takes the grammar as ``sampling_params.structured_outputs.structural_tag``: a JSON
text in xgrammar's structural-tag language (the default "auto" backend picks xgrammar; it runs
on CPU). When the grammar is complete, xgrammar only admits the request's stop tokens, so the
call is always followed by ``<|im_end|>`` (when it is the EOS or in ``stop_token_ids``).
Arguments are constrained by each tool's JSON schema (properties in declared order, no extra
properties). Facts and timings: ``/tmp/constraints_findings.md`` at the time of writing,
summarised in docs/engine.md.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, Literal

ToolChoice = Literal["auto", "none", "required", "named"]

FAMILIES = ("qwen3", "qwen3_coder")

# ``<tool_call>`` and ``</tool_call>`` are single (non-special) tokens in the Qwen3 and
# Qwen3-Coder vocabularies. The grammar names them by id so the model cannot spell them in
# pieces (``<``, ``tool``, ``_call``, ``>``), which a template rendering never does.
TOOL_CALL_OPEN_ID = 151657
TOOL_CALL_CLOSE_ID = 151658
THINK_OPEN_ID = 151667
THINK_CLOSE_ID = 151668

# At most one whitespace character where JSON / XML syntax allows whitespace (not inside
# string values): admits the templates' ``{"a": 1, "b": 2}`` and compact JSON, but stops a
# weak policy from filling the call with blank space.
_MAX_WHITESPACE = 1

# Parameters of a tool that declares none: an empty argument list, as in OpenAI's API.
_NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}


def tool_call_constraint(
    tools: Sequence[dict[str, Any]],
    choice: ToolChoice,
    name: str | None,
    family: str,
    *,
    parallel: bool = False,
    reasoning: bool = False,
) -> dict[str, Any] | None:
    """The ``sampling_params`` entries that force a tool call, or None when nothing is forced.

    ``choice`` "required" admits a call of any of ``tools``; "named" only of the tool ``name``.
    ``parallel`` admits further calls after the first (newline-separated, as the templates
    render them); by default exactly one call ends the turn. ``reasoning`` admits a leading
    ``<think>…</think>`` block (a Qwen3 prompt rendered with thinking on leaves it to the model);
    otherwise the output starts with ``<tool_call>``.

    Raises ValueError for an unknown family or choice, a named tool missing from ``tools``,
    "required" without tools, or a tool the family's format cannot express.
    """
    if family not in FAMILIES:
        raise ValueError(f"no tool-call format for model family {family!r}")
    if choice in ("auto", "none"):
        return None
    functions = [_function(tool) for tool in tools]
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
    call = _hermes_call(selected) if family == "qwen3" else _xml_call(selected)
    body: dict[str, Any] = call
    if parallel:
        more = {"type": "sequence", "elements": [_text("\n"), call]}
        body = {"type": "sequence", "elements": [call, {"type": "star", "content": more}]}
    if reasoning:
        think: dict[str, Any] = {
            "type": "tag",
            "begin": _token(THINK_OPEN_ID),
            # Without the exclusion the free text would swallow "</think>" and never end.
            "content": {"type": "any_text", "excludes": ["</think>"]},
            "end": _token(THINK_CLOSE_ID),
        }
        think = {"type": "sequence", "elements": [think, _text("\n\n")]}
        body = {"type": "sequence", "elements": [think, body]}
    tag = json.dumps(
        {"type": "structural_tag", "format": body}, ensure_ascii=False, separators=(",", ":")
    )
    return {"structured_outputs": {"structural_tag": tag}}


def _function(tool: dict[str, Any]) -> tuple[str, dict[str, Any] | bool]:
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


def _text(value: str) -> dict[str, Any]:
    return {"type": "const_string", "value": value}


def _token(token_id: int) -> dict[str, Any]:
    return {"type": "token", "token": token_id}


def _arguments(parameters: dict[str, Any] | bool, style: str) -> dict[str, Any]:
    return {
        "type": "json_schema",
        "json_schema": parameters,
        "style": style,
        "max_whitespace_cnt": _MAX_WHITESPACE,
    }


def _one_of(alternatives: list[dict[str, Any]]) -> dict[str, Any]:
    return alternatives[0] if len(alternatives) == 1 else {"type": "or", "elements": alternatives}


def _hermes_call(functions: list[tuple[str, dict[str, Any] | bool]]) -> dict[str, Any]:
    """``<tool_call>\\n{"name": "NAME", "arguments": {...}}\\n</tool_call>``"""
    bodies = [
        {
            "type": "sequence",
            "elements": [
                # A JSON string body: quotes and backslashes in a name stay parseable.
                _text(json.dumps(name, ensure_ascii=False) + ', "arguments": '),
                _arguments(parameters, "json"),
            ],
        }
        for name, parameters in functions
    ]
    return {
        "type": "sequence",
        "elements": [
            _token(TOOL_CALL_OPEN_ID),
            _text('\n{"name": '),
            _one_of(bodies),
            _text("}\n"),
            _token(TOOL_CALL_CLOSE_ID),
        ],
    }


def _xml_call(functions: list[tuple[str, dict[str, Any] | bool]]) -> dict[str, Any]:
    """``<tool_call>\\n<function=NAME>\\n<parameter=P>\\nVALUE\\n</parameter>\\n</function>\\n</tool_call>``

    String values are raw text, other values JSON (xgrammar's "qwen_xml" style).
    """
    bodies = []
    for name, parameters in functions:
        if not name or any(c in name for c in "<>=") or any(c.isspace() for c in name):
            raise ValueError(f"tool name {name!r} cannot be written as <function=NAME>")
        bodies.append(
            {
                "type": "sequence",
                "elements": [_text(name + ">\n"), _arguments(parameters, "qwen_xml")],
            }
        )
    return {
        "type": "sequence",
        "elements": [
            _token(TOOL_CALL_OPEN_ID),
            _text("\n<function="),
            _one_of(bodies),
            _text("</function>\n"),
            _token(TOOL_CALL_CLOSE_ID),
        ],
    }
