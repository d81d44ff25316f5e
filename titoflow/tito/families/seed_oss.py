"""Seed-OSS (ByteDance-Seed/Seed-OSS-36B-Instruct): turns opened by ``<seed:bos>ROLE`` and
closed by ``<seed:eos>``, reasoning in ``<seed:think>…</seed:think>`` (which the model opens
itself; a thinking budget makes it write ``<seed:cot_budget_reflect>`` notes inside), and each
call in its own block, Qwen3-Coder's XML with Seed's wrapper::

    <seed:tool_call>
    <function=NAME>
    <parameter=K>V</parameter>
    </function>
    </seed:tool_call>

with string values written raw and every other value with Jinja's ``string`` filter (Python's
spelling: ``True``, ``{'k': None}``), which the parser reads back by the tool's schema.

The parser is Qwen3.5's (the block parser of :mod:`titoflow.tito.families.qwen3`) under Seed's
tags, as vLLM's ``seed_oss`` parser is its ``qwen3`` one under them: a ``<seed:tool_call>``
opened before ``</seed:think>`` ends the reasoning, a bare ``<function=…>`` block is a call, a
block the output ends inside is closed there; what would need a guess is refused with
``parse_error`` (a value whose end is unknown, a parameter given twice, text between
parameters): a call-shaped output is never lost silently.

History: the template keeps every turn's reasoning but writes it and the content trimmed of
surrounding whitespace, so re-rendering history gives the sampled tokens only where the model
wrote none there; the chain keeps them.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping, Sequence
from typing import Any

from titoflow.tito.families.base import Family, Function, Grammar, ParserOptions, TokenLookup
from titoflow.tito.families.qwen3 import (
    CODER_CALLS,
    FUNCTION_CLOSE,
    FUNCTION_OPEN,
    parameter_types,
    xml_call,
)
from titoflow.tito.families.tagged import BlockParser, TaggedParser, Tags
from titoflow.tito.output import OutputParser

TAGS = Tags(
    think_open="<seed:think>",
    think_close="</seed:think>",
    call_open="<seed:tool_call>",
    call_close="</seed:tool_call>",
    bare_open=FUNCTION_OPEN,
    bare_close=FUNCTION_CLOSE,
)


_CONTAINERS = {"object": dict, "array": list}


def _block_parser(tools: Sequence[Mapping[str, Any]]) -> BlockParser:
    """Qwen3-Coder's block parser, then an object or array value that is not JSON read as the
    Python literal the template writes (its ``string`` filter gives ``{'k': True}``): what a
    model trained on it writes back. Only a literal of the schema's type that JSON can hold
    counts; anything else stays the text, as vLLM passes it on."""
    parse, types = CODER_CALLS.parser(tools), parameter_types(tools)

    def typed(kind: str | None, value: Any) -> Any:
        container = _CONTAINERS.get(kind or "")
        if container is None or not isinstance(value, str):
            return value
        try:
            literal = ast.literal_eval(value)
            json.dumps(literal, allow_nan=False)  # no set, bytes, tuple key or infinity in it
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            return value
        return literal if isinstance(literal, container) else value

    def read(inner: str) -> list[tuple[str, Any]]:
        calls = []
        for name, arguments in parse(inner):
            kinds = types.get(name, {})
            calls.append((name, {k: typed(kinds.get(k), v) for k, v in arguments.items()}))
        return calls

    return read


def _parser(options: ParserOptions) -> OutputParser:
    return TaggedParser(
        options,
        _block_parser(options.tools),
        TAGS,
        implicit_close=True,
        call_ends_reasoning=True,  # as vLLM's seed_oss parser ends it there
    )


def _call(functions: Sequence[Function], token_id: TokenLookup) -> dict[str, Any]:
    """``<seed:tool_call>\\n<function=NAME>\\n<parameter=K>V</parameter>\\n…</function>\\n
    </seed:tool_call>``: string values raw, other values JSON (xgrammar's "qwen_xml" style)."""
    return xml_call(TAGS, functions, token_id)


def _is_seed_oss(template: str) -> bool:
    return "<seed:bos>" in template and "<seed:tool_call>" in template


SEED_OSS = Family(
    name="seed_oss",
    summary="Seed-OSS: <seed:think> reasoning, Qwen3-Coder's XML calls in <seed:tool_call>",
    detect=_is_seed_oss,
    parser=_parser,
    grammar=Grammar(call=_call, reasoning_layout=("", "\n")),  # the template's layout
    reasoning_tags=(TAGS.think_open, TAGS.think_close),
    history="keeps every turn's reasoning, but writes it and the content trimmed of whitespace",
    divergences=("whitespace_trimmed",),
    tools_stand_in=True,
)
