"""Hermes 3's cases for the parser parity test. vLLM serves Hermes 2 Pro and Hermes 3 with its
``hermes`` tool parser and no reasoning parser (Hermes 3 writes no reasoning block); its parser
tests were written for these models' outputs. The calls are Qwen3's JSON blocks, so the cases
are vLLM's hermes ones and Qwen3's malformed ones without reasoning, and Qwen3's declared
differences hold as they are. The tokenizer is the family's stand-in (Llama 3's vocabulary with
Hermes' markers, cli/dev/tokenizers/hermes.py)."""

from __future__ import annotations

from tests.support.parity import Case, Family, mutants
from tests.support.parity.qwen3 import (
    HERMES_VLLM,
    QWEN3_DIFFERENCES,
    QWEN3_TOOLS,
    READ,
    READ_OBJECT,
    WEATHER,
    qwen3_mutate,
)

# What Hermes models commonly write around their calls: Qwen3's malformed outputs less the
# reasoning ones, the keys in the order Hermes 2 Pro's model card shows its calls, and text
# before the calls (which Hermes 3's template drops from history).
HERMES_MALFORMED = [
    Case("no_newlines_in_block", '<tool_call>{"name": "list_dir", "arguments": {}}</tool_call>'),
    Case("closer_missing_at_the_end", READ.removesuffix("</tool_call>")),
    Case("closer_missing_before_next_call", READ.removesuffix("</tool_call>") + WEATHER),
    Case("call_without_arguments", '<tool_call>\n{"name": "list_dir"}\n</tool_call>'),
    Case("parameters_for_arguments", READ.replace('"arguments"', '"parameters"')),
    Case("call_cut_off", READ[:50]),
    Case("one_bad_block_of_two", f"{READ}\n{WEATHER.replace('}}', '}')}"),
    Case("text_after_calls", f"{READ}\nI'll wait for the result."),
    Case(
        "arguments_before_name",
        '<tool_call>\n{"arguments": {"city": "Tokyo"}, "name": "get_weather"}\n</tool_call>',
    ),
    Case("text_before_calls", f"Let me check both.\n{READ}\n{WEATHER}"),
]


def hermes_bases() -> list[tuple[str, bool]]:
    return [
        (READ, False),
        (f"{READ}\n{WEATHER}", False),
        (f"Checking.\n{WEATHER}", False),
        (READ.replace(READ_OBJECT, READ_OBJECT.replace(", ", ",")), False),
    ]


FAMILY = Family(
    "hermes",
    "hermes",
    None,
    QWEN3_TOOLS,
    ("<tool_call>",),
    QWEN3_DIFFERENCES,
    HERMES_VLLM + HERMES_MALFORMED,
    mutants(hermes_bases(), qwen3_mutate, 80),
)

READS = {
    "vllm_tool_call_until_eos": ["final_answer"],
    "no_newlines_in_block": ["list_dir"],
    "closer_missing_at_the_end": ["read_file"],
    "closer_missing_before_next_call": ["read_file", "get_weather"],
    "arguments_before_name": ["get_weather"],
    "text_before_calls": ["read_file", "get_weather"],
}
