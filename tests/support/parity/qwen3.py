"""Qwen3's cases for the parser parity test. vLLM serves Qwen3 with the ``hermes`` tool parser
(JSON calls in ``<tool_call>``) after its ``qwen3`` reasoning parser (thinking enabled, its
default): the reasoning parser hands the tool parser the content, and a ``<tool_call>`` opened
before ``</think>`` ends the reasoning there. The tokenizer is Qwen3's own."""

from __future__ import annotations

import json
import re

from tests.support.parity import (
    GET_WEATHER,
    READ_ARGUMENTS,
    READ_FILE,
    Call,
    Case,
    Difference,
    Family,
    json_object,
    mutants,
    mutator,
    recovery_cases,
    tool,
)

QWEN3_TOOLS = [
    # The functions vLLM's hermes parser tests call.
    tool("final_answer", {"trigger": {"type": "boolean"}}),
    tool("get_current_temperature", {"location": {"type": "string"}, "unit": {"type": "string"}}),
    GET_WEATHER,
    tool("search", {"q": {"type": "string"}}),
    tool("get_db_config", {"param": {"type": "string"}}),
    tool("f", {"x": {"type": "integer"}}),
    READ_FILE,
    tool("list_dir", {}),
]

# vLLM tests/tool_parsers/test_hermes_tool_parser.py, commit
# 0eb73d6a09be117cdd0d4da4d6239321001c0d0c, model outputs verbatim.
FINAL = '<tool_call>\n{"name": "final_answer", "arguments": {"trigger": true}}\n</tool_call>'
HERMES_VLLM = [
    Case(
        "vllm_just_forward_text",
        "This is some prior text that has nothing to do with tool calling.",
    ),
    Case("vllm_failure_case_bug_19056", FINAL),
    Case(
        "vllm_streaming",
        '<tool_call>{"name": "get_current_temperature","arguments": {"location":"San Francisco, '
        'California, United States", "unit": "celsius"}}</tool_call>',
    ),
    Case(
        "vllm_tool_call_with_stream_interval",
        '<tool_call>{"name": "get_current_temperature", "arguments": {"location": "San '
        'Francisco", "unit": "celsius"}}</tool_call>',
    ),
    Case(
        "vllm_content_then_tool_call",
        'Sure, let me check the weather.<tool_call>{"name": "get_weather", "arguments": {"city": '
        '"NYC"}}</tool_call>',
    ),
    Case(
        "vllm_multiple_tool_calls",
        '<tool_call>{"name": "search", "arguments": {"q": "cats"}}</tool_call>'
        '<tool_call>{"name": "search", "arguments": {"q": "dogs"}}</tool_call>',
    ),
    Case("vllm_non_streaming_no_tool_call", "This is not a tool call."),
    Case("vllm_tool_call_until_eos", FINAL.removesuffix("\n</tool_call>")),
    Case("vllm_tool_call_invalid_json", FINAL.removesuffix("}\n</tool_call>")),
    Case(
        "vllm_serialized_arguments",
        '<tool_call>\n{"name": "get_db_config", "arguments": "{\\"param\\": '
        '\\"max_connections\\"}"}\n</tool_call>',
    ),
    Case(
        "vllm_bare_string_arguments",
        '<tool_call>\n{"name": "do_thing", "arguments": "hello"}\n</tool_call>',
    ),
    Case(
        "vllm_string_arguments_looking_structured",
        "<tool_call>" + json.dumps({"name": "f", "arguments": "{hello world}"}) + "</tool_call>",
    ),
    Case(
        "vllm_content_and_tool_call_in_single_chunk",
        'Hi!<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>',
    ),
]

# vLLM's recovery outputs with Qwen3's JSON block where that test has Qwen3-Coder's XML one.
RECOVERY_BLOCK = '<tool_call>\n{"name": "Finish", "arguments": {"answer": "204"}}\n</tool_call>'
QWEN3_REASONING_VLLM = recovery_cases(RECOVERY_BLOCK, full=False)


def qwen3_call(name: str, arguments: str) -> str:
    return f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'


READ = qwen3_call("read_file", READ_ARGUMENTS)
READ_OBJECT = READ.removeprefix("<tool_call>\n").removesuffix("\n</tool_call>")
WEATHER = qwen3_call("get_weather", '{"city": "Tokyo"}')

# What Qwen3 models commonly write around their calls.
QWEN3_MALFORMED = [
    Case("call_before_think_close", f"<think>\nI should read it.\n{READ}\n</think>\n\n"),
    Case("calls_before_think_close_then_text", f"<think>Both.\n{READ}\n{WEATHER}</think>Done."),
    Case("call_in_never_closed_think", f"<think>\nLet me read it.\n\n{READ}"),
    Case("prompt_opened_think_call_before_close", f"Plan.\n{READ}\n</think>", True),
    Case("call_after_prompt_opened_think", f"Plan.\n</think>\n\n{READ}", True),
    Case("no_newlines_in_block", '<tool_call>{"name": "list_dir", "arguments": {}}</tool_call>'),
    Case("closer_missing_at_the_end", "<think>r</think>\n\n" + READ.removesuffix("</tool_call>")),
    Case("closer_missing_before_next_call", READ.removesuffix("</tool_call>") + WEATHER),
    Case("call_without_arguments", '<tool_call>\n{"name": "list_dir"}\n</tool_call>'),
    Case("parameters_for_arguments", READ.replace('"arguments"', '"parameters"')),
    Case("call_cut_off", "<think>r</think>\n\n" + READ[:50]),
    Case("one_bad_block_of_two", f"{READ}\n{WEATHER.replace('}}', '}')}"),
    Case("text_after_calls", f"{READ}\nI'll wait for the result."),
    Case("call_mentioned_in_reasoning", f"<think>I will use <tool_call> next.</think>\n\n{READ}"),
]


def qwen3_bases() -> list[tuple[str, bool]]:
    return [
        (f"<think>\nLet me check.\n</think>\n\n{READ}", False),
        (f"<think>\nTwo calls.\n</think>\n\nChecking both.\n{READ}\n{WEATHER}", False),
        (f"<think>\nBoth.\n{READ}\n{WEATHER}\n</think>", False),
        (f"Plan.\n</think>\n\n{WEATHER}", True),
        (READ, False),
    ]


qwen3_mutate = mutator(
    "<tool_call>",
    ("</tool_call>", "</think>", "<tool_call>", "}"),
    r"</?(tool_call|think)>|[{,:]",
    # The keys in another order.
    lambda text, rng: text.replace(
        READ_OBJECT, '{"arguments": {"line": 3, "path": "src/a.py"}, "name": "read_file"}'
    ),
)


def hermes_blocks(text: str) -> list[str]:
    """The insides of the blocks vLLM's hermes parser reads in the content (its own regex, on
    the text from the first ``<tool_call>``: a ``<tool_call>`` in reasoning ends it there)."""
    start = text.find("<tool_call>")
    content = text[start:].replace("</think>", "") if start >= 0 else ""
    return [
        a or b
        for a, b in re.findall(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", content, re.DOTALL)
    ]


def json_or_none(inner: str) -> object:
    try:
        return json.loads(inner)
    except ValueError:
        return None


def hermes_readable(inner: str) -> bool:
    """vLLM reads a call in a block's inside: a JSON object with "name" and "arguments"."""
    value = json_or_none(inner)
    return isinstance(value, dict) and "name" in value and "arguments" in value


def vllm_drops_all(text: str, calls: list[Call]) -> bool:
    """vLLM extracts no call because a block is no call it can read (it reads all or none)."""
    blocks = hermes_blocks(text)
    return not calls and not all(map(hermes_readable, blocks))


QWEN3_DIFFERENCES = (
    Difference(
        "arguments_not_a_json_object",
        "vLLM passes a call's string arguments through as a JSON string; titoflow's calls "
        "carry the JSON object the template renders back, so it refuses the block",
        lambda text, calls: any(not json_object(arguments) for _, arguments in calls),
    ),
    Difference(
        "closer_missing_mid_output",
        "a block missing its </tool_call> with another block after it: vLLM reads the first "
        "block on to the next one's closer, cannot read that as JSON and drops every call of the "
        "output; titoflow ends the block where the next opens, the calls as written",
        lambda text, calls: (
            vllm_drops_all(text, calls)
            and any(re.search(r"\}\s*<tool_call>", b) for b in hermes_blocks(text))
        ),
        refusal=False,
    ),
    Difference(
        "call_without_arguments",
        'a call object without "arguments": vLLM fails on the missing key and drops every call '
        "of the output; titoflow reads it as a call taking no arguments, as models call a tool "
        "that takes none",
        lambda text, calls: (
            vllm_drops_all(text, calls)
            and any(
                isinstance(o := json_or_none(b), dict) and set(o) == {"name"}
                for b in hermes_blocks(text)
            )
        ),
        refusal=False,
    ),
    Difference(
        "one_bad_block_drops_all",
        "a block vLLM cannot read (invalid JSON, cut off, no call object) makes it drop every "
        "call of the output; titoflow keeps the calls whose blocks parse and returns the bad one "
        "as text with parse_error",
        vllm_drops_all,
        refusal=False,
    ),
)


FAMILY = Family(
    "qwen3",
    "hermes",
    "qwen3",
    QWEN3_TOOLS,
    ("<tool_call>",),
    QWEN3_DIFFERENCES,
    HERMES_VLLM + QWEN3_REASONING_VLLM + QWEN3_MALFORMED,
    mutants(qwen3_bases(), qwen3_mutate, 80),
)

READS = {
    "vllm_embedded_tool_call_promoted_from_reasoning": ["Finish"],
    "vllm_existing_content_preserved_after_promotion": ["Finish"],
    "vllm_truncated_reasoning_recovers_tool_call": ["Finish"],
    "vllm_tool_call_until_eos": ["final_answer"],
    "call_before_think_close": ["read_file"],
    "calls_before_think_close_then_text": ["read_file", "get_weather"],
    "call_in_never_closed_think": ["read_file"],
    "prompt_opened_think_call_before_close": ["read_file"],
    "no_newlines_in_block": ["list_dir"],
    "closer_missing_at_the_end": ["read_file"],
    "closer_missing_before_next_call": ["read_file", "get_weather"],
}
