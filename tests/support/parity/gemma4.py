"""Gemma 4's cases for the parser parity test. vLLM serves Gemma 4 with its ``gemma4`` tool and
reasoning parsers (one state machine, :mod:`vllm.parser.gemma4`), given the family's stand-in
tokenizer (the ``gemma3`` directory's vocabulary, where every Gemma 4 marker and the ``<|"|>``
quote is one token, as the parser's token-id terminals need)."""

from __future__ import annotations

import json
import random
from typing import Any

from tests.support.parity import (
    Call,
    Case,
    Difference,
    Family,
    cut_after,
    drop_one,
    json_object,
    mutants,
    space_after,
    swap_two,
    tool,
)

Q = '<|"|>'
OPEN, CLOSE = "<|tool_call>", "<tool_call|>"
GEMMA4_TOOLS = [
    tool("get_weather", {"location": {"type": "string"}, "unit": {"type": "string"}}),
    tool("get_time", {"location": {"type": "string"}}),
    tool(
        "complex_function",
        {"nested": {"type": "object"}, "list": {"type": "array", "items": {"type": "string"}}},
    ),
    tool(
        "set_status",
        {
            "is_active": {"type": "boolean"},
            "count": {"type": "integer"},
            "score": {"type": "number"},
        },
    ),
    tool("get-weather", {"location": {"type": "string"}}),
    tool("weather.get", {"location": {"type": "string"}}),
    tool("get_status", {}),
    tool(
        "run",
        {
            "command": {"type": "string"},
            "timeout": {"type": "integer"},
            "env": {"type": "object"},
            "paths": {"type": "array", "items": {"type": "string"}},
        },
    ),
]

# vLLM tests/tool_parsers/test_gemma4_tool_parser.py, commit
# 727934e7882769d03892a70a9f65cd4be6998083, model outputs verbatim.
LONDON = f"{OPEN}call:get_weather{{location:{Q}London{Q}}}{CLOSE}"
GEMMA4_VLLM = [
    Case("vllm_no_tool_calls", "Hello, how can I help you today?"),
    Case("vllm_single_tool_call", LONDON),
    Case(
        "vllm_multiple_arguments",
        f"{OPEN}call:get_weather{{location:{Q}San Francisco{Q},unit:{Q}celsius{Q}}}{CLOSE}",
    ),
    Case(
        "vllm_text_before_tool_call",
        f"Let me check the weather for you. {OPEN}call:get_weather{{location:{Q}Paris{Q}}}{CLOSE}",
    ),
    Case(
        "vllm_multiple_tool_calls",
        f"{LONDON}{OPEN}call:get_time{{location:{Q}London{Q}}}{CLOSE}",
    ),
    Case(
        "vllm_nested_arguments",
        f"{OPEN}call:complex_function{{nested:{{inner:{Q}value{Q}}},"
        f"list:[{Q}a{Q},{Q}b{Q}]}}{CLOSE}",
    ),
    Case(
        "vllm_tool_call_with_number_and_boolean",
        f"{OPEN}call:set_status{{is_active:true,count:42,score:3.14}}{CLOSE}",
    ),
    Case("vllm_incomplete_tool_call", f"{OPEN}call:get_weather{{location:{Q}London"),
    Case("vllm_hyphenated_function_name", LONDON.replace("get_weather", "get-weather")),
    Case("vllm_dotted_function_name", LONDON.replace("get_weather", "weather.get")),
    Case("vllm_no_arguments", f"{OPEN}call:get_status{{}}{CLOSE}"),
]

RUN = f"{OPEN}call:run{{command:{Q}ls -la{Q},timeout:30}}{CLOSE}"
REASONED = f"<|channel>thought\nFirst list the files.<channel|>{RUN}"
# What Gemma 4 writes, and what its template's history shows it.
GEMMA4_MALFORMED = [
    Case("reasoning_then_call", REASONED),
    Case("call_inside_reasoning", f"<|channel>thought\nI will list. {RUN}"),
    Case("reasoning_opened_by_the_prompt", f"list them\n<channel|>{RUN}", reasoning_open=True),
    Case("text_after_call", RUN + "Listed."),
    Case("null_argument", f"{OPEN}call:run{{command:{Q}ls{Q},timeout:null}}{CLOSE}"),
    Case(
        "nested_values",
        f"{OPEN}call:run{{command:{Q}a{Q},env:{{A:{Q}1{Q},B:{Q}x{Q}}},paths:[{Q}a.py{Q}]}}{CLOSE}",
    ),
    Case("nested_bare_values", f"{OPEN}call:run{{command:{Q}a{Q},env:{{DEBUG:true,N:2}}}}{CLOSE}"),
    Case(
        "quotes_and_braces_in_a_string", f"{OPEN}call:run{{command:{Q}echo '{{}}' \"x\"{Q}}}{CLOSE}"
    ),
    Case("json_quotes", f'{OPEN}call:run{{command:"ls"}}{CLOSE}'),
    Case("without_call_prefix", f"{OPEN}run{{command:{Q}ls{Q}}}{CLOSE}"),
    Case("bare_call", f"call:run{{command:{Q}ls{Q}}}"),
    Case("unclosed_block", RUN.removesuffix(CLOSE)),
    Case("undeclared_tool", f"{OPEN}call:delete_everything{{path:{Q}/{Q}}}{CLOSE}"),
]


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def _bare_as_string(_: str, calls: list[Call]) -> bool:
    """vLLM passes a bare value (number, boolean, null) on as a string where the schema does
    not type it: inside an object or array, or of a parameter the tool does not declare."""
    for _name, arguments in calls:
        if not json_object(arguments):
            continue
        for text in _strings(json.loads(arguments)):
            try:
                if not isinstance(json.loads(text), (dict, list, str)):
                    return True
            except ValueError:
                continue
    return False


def _unclosed(text: str, _: list[Call]) -> bool:
    """A call block the output ends inside (no ``<tool_call|>``): vLLM reads what it can."""
    return text.count(OPEN) > text.count(CLOSE)


def _opened_inside(text: str, _: list[Call]) -> bool:
    """A call block the next ``<|tool_call>`` opens inside (its ``<tool_call|>`` missing)."""
    return any(CLOSE not in block for block in text.split(OPEN)[1:-1])


def _unquoted(text: str, _: list[Call]) -> bool:
    """A block whose string quotes do not pair up, or a value the template never writes
    (``"ls"``, a bare word): vLLM takes the rest of the text, titoflow refuses."""
    blocks = [b.split(CLOSE)[0] for b in text.split(OPEN)[1:]]
    return any(b.count(Q) % 2 or '"' in b.replace(Q, "") or "call:" not in b for b in blocks)


GEMMA4_DIFFERENCES = (
    Difference(
        "bare_values_typed",
        "titoflow reads the number, boolean or null the template wrote; vLLM passes a bare "
        "value the schema does not type on as a string",
        _bare_as_string,
        refusal=False,
    ),
    Difference(
        "unclosed_call_refused",
        "a call the output ends inside may be cut anywhere: titoflow refuses it, vLLM reads "
        "what it can",
        _unclosed,
    ),
    Difference(
        "next_call_closes_the_block",
        "titoflow reads a block the next <|tool_call> opens inside as closed there; vLLM reads "
        "the next call's text as an argument of the first",
        _opened_inside,
        refusal=False,
    ),
    Difference(
        "malformed_value_refused",
        "a string whose quote does not close, a value the template never writes, or a block "
        "without call:: titoflow refuses it, vLLM reads what it can",
        _unquoted,
    ),
)


def gemma4_mutate(text: str, rng: random.Random) -> str:
    kind = rng.randrange(6)
    if kind == 0:
        return cut_after(text, OPEN, rng)
    if kind == 1:
        return drop_one(text, CLOSE, rng)
    if kind == 2:
        return drop_one(text, Q, rng)
    if kind == 3:
        return space_after(text, r"[,{]", rng)
    if kind == 4:
        return swap_two(text, r"\w+:(?:<\|\"\|>[^<]*<\|\"\|>|\d+)", rng)
    return text.replace(CLOSE, CLOSE + "\n", 1)


def gemma4_bases() -> list[tuple[str, bool]]:
    two = f"{RUN}{OPEN}call:get_time{{location:{Q}Paris{Q}}}{CLOSE}"
    return [(RUN, False), (two, False), (REASONED, False), (GEMMA4_VLLM[2].text, False)]


FAMILY = Family(
    "gemma4",
    "gemma4",
    "gemma4",
    GEMMA4_TOOLS,
    (OPEN,),
    GEMMA4_DIFFERENCES,
    GEMMA4_VLLM + GEMMA4_MALFORMED,
    mutants(gemma4_bases(), gemma4_mutate, 80),
)

READS = {
    "reasoning_then_call": ["run"],
    "call_inside_reasoning": ["run"],
    "reasoning_opened_by_the_prompt": ["run"],
    "text_after_call": ["run"],
    "null_argument": ["run"],
    "nested_values": ["run"],
    "nested_bare_values": ["run"],
    "quotes_and_braces_in_a_string": ["run"],
}
