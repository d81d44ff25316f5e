"""Llama 3's cases for the parser parity test. vLLM serves Llama 3.1/3.2/3.3 with the
``llama3_json`` tool parser alone (the family does not reason); its tokenizer is Meta's own
vocabulary, where ``<|python_tag|>`` is the special token vLLM's parser looks up."""

from __future__ import annotations

import json
import random
from typing import Any

from tests.support.parity import (
    GET_WEATHER,
    READ_FILE,
    Case,
    Difference,
    Family,
    json_object,
    mutants,
    mutator,
    tool,
)

TAG = "<|python_tag|>"

LLAMA3_TOOLS = [
    # The functions vLLM's llama3_json parser tests call.
    tool("getOpenIncidentsTool", {}),
    tool("searchTool", {"query": {"type": "string"}, "limit": {"type": "integer"}}),
    tool("complexTool", {"level1": {"type": "object"}}),
    READ_FILE,
    GET_WEATHER,
    tool("list_dir", {}),
]

# vLLM tests/tool_parsers/test_llama3_json_tool_parser.py, commit
# 1e499e36c5828a75c6ca8b76631d264be1187005, model outputs verbatim.
SEARCH_1 = '{"name": "searchTool", "parameters": {"query": "test1"}}'
INCIDENTS = '{"name": "getOpenIncidentsTool", "parameters": {}}'
SEARCH_2 = '{"name": "searchTool", "parameters": {"query": "test2"}}'
SEARCH = '{"name": "searchTool", "parameters": {"query": "test"}}'
LLAMA3_VLLM = [
    Case(
        "vllm_simple",
        'Here is the result: {"name": "getOpenIncidentsTool", "parameters": {}} Would you like '
        "to know more?",
    ),
    Case(
        "vllm_with_arguments",
        '{"name": "searchTool", "parameters": {"query": "test query", "limit": 10}}',
    ),
    Case("vllm_no_json", "This is just some text without any tool calls"),
    Case("vllm_invalid_json", '{"name": "invalidTool", "parameters": {invalid json}'),
    Case("vllm_with_arguments_key", '{"name": "searchTool", "arguments": {"query": "test"}}'),
    Case("vllm_multiple_json", f"{SEARCH_1}; {INCIDENTS}; {SEARCH_2}"),
    Case("vllm_multiple_json_with_whitespace", f"{SEARCH_1} ; {INCIDENTS} ; {SEARCH_2}"),
    Case(
        "vllm_multiple_json_with_surrounding_text",
        f"Here are the results: {SEARCH_1}; {INCIDENTS}; {SEARCH_2} Would you like to know more?",
    ),
    Case(
        "vllm_deeply_nested_json",
        '{"name": "complexTool", "parameters": {"level1": {"level2": {"level3": {"level4": '
        '{"value": "deep"}}}}}}',
    ),
    Case(
        "vllm_multiple_with_deep_nesting",
        '{"name": "simpleTool", "parameters": {"value": "test"}}; {"name": "complexTool", '
        '"parameters": {"config": {"database": {"connection": {"pool": {"size": 10}}}}}}',
    ),
    Case(
        "vllm_quotes_and_brackets_in_string",
        '{"name": "searchTool", "parameters": {"query": "test {value} [complex]","nested": '
        '{"inner": "more {brackets}"}}}',
    ),
    Case(
        "vllm_escaped_quotes_in_nested_json",
        '{"name": "parserTool", "parameters": {"text": "He said \\"Hello {world}\\""}}',
    ),
    Case("vllm_missing_name_key", '{"parameters": {}}'),
    Case("vllm_missing_parameters_and_arguments_key", '{"name": "toolWithoutParams"}'),
    Case("vllm_brace_in_trailing_text", f"{SEARCH} I used {{searchTool}} for this."),
    Case(
        "vllm_json_fragment_in_trailing_text",
        f'{SEARCH} The arguments I passed were {{"query": "test"}}',
    ),
    # test_extract_tool_calls_streaming_parallel_separators (streamed there; whole here)
    *(
        Case(f"vllm_parallel_separator_{n}", SEARCH_1 + separator + INCIDENTS)
        for n, separator in enumerate(["; ", ";", ";\n", "\n"])
    ),
]

READ = '{"name": "read_file", "parameters": {"path": "src/a.py", "line": 3}}'
WEATHER = '{"name": "get_weather", "parameters": {"city": "Tokyo"}}'

# What Llama 3.x models commonly write instead.
LLAMA3_MALFORMED = [
    Case("python_tag_call", TAG + READ),
    Case("arguments_for_parameters", READ.replace("parameters", "arguments")),
    Case("type_function_first", READ.replace('{"name"', '{"type": "function", "name"')),
    Case("whitespace_around", f"\n\n{READ}\n"),
    Case("calls_on_separate_lines", f"{READ}\n{WEATHER}"),
    Case("python_tag_calls_semicolon", f"{TAG}{READ};{WEATHER}"),
    Case("text_before_call", f"I'll read the file.\n\n{READ}"),
    Case("fenced_call", f"```json\n{READ}\n```"),
    Case("text_then_python_tag", f"Let me check.{TAG}{WEATHER}"),
    Case("calls_as_a_json_list", f"[{READ}, {WEATHER}]"),
    Case("text_after_call", f"{READ}\n\nI'll wait for the result."),
    Case("call_without_parameters", '{"name": "list_dir"}'),
    Case("parameters_as_a_json_string", '{"name": "get_weather", "parameters": "{\\"city\\": 1}"}'),
    Case("extra_key", READ.replace('{"name"', '{"id": "call_0", "name"')),
    Case("call_cut_off", READ[:40]),
]


def llama3_bases() -> list[tuple[str, bool]]:
    return [
        (READ, False),
        (TAG + WEATHER, False),
        (f"{READ}; {WEATHER}", False),
        (READ.replace("parameters", "arguments"), False),
    ]


def prose(text: str, rng: random.Random) -> str:
    """Text before or after the calls, or a separator after the last."""
    if rng.random() < 0.5:
        return rng.choice(["Sure! ", "Let me check.\n\n", "```json\n"]) + text
    return text + rng.choice([" Done.", "\n\nI'll wait.", "\n```", ";"])


llama3_mutate = mutator(
    "",  # cut anywhere: the output is the call list
    ["}", '"', ";", TAG],
    r"[{,:;]|\|>",
    reorder=lambda text, rng: text.replace(
        '"path": "src/a.py", "line": 3', '"line": 3, "path": "src/a.py"'
    ),
    other=prose,
)


def llama3_objects(text: str) -> tuple[list[Any], str]:
    """The JSON values the message opens with (after the tag), separated by ``;`` or
    whitespace, and the text after them."""
    body = text.strip().removeprefix(TAG)
    values: list[Any] = []
    decoder = json.JSONDecoder()
    while True:
        body = body.lstrip()
        try:
            value, end = decoder.raw_decode(body)
        except ValueError:
            return values, body
        values.append(value)
        body = body[end:].lstrip().removeprefix(";")


def call_keys(value: Any) -> bool:
    return isinstance(value, dict) and set(value) <= {"type", "name", "parameters", "arguments"}


LLAMA3_DIFFERENCES = (
    Difference(
        "call_inside_text",
        "the message is not the calls alone (text or a code fence before them, a JSON list): "
        "vLLM takes every JSON object anywhere in the text as a call and drops the text; the "
        "template writes a call as the whole message, so titoflow returns the text with "
        "parse_error rather than guess an example or a quote was meant as a call",
        lambda text, calls: not text.strip().removeprefix(TAG).startswith("{"),
    ),
    Difference(
        "text_after_the_calls",
        "text after the calls: vLLM reads the JSON objects in it and drops the rest; titoflow "
        "refuses rather than lose what the model wrote (the template writes the calls alone)",
        lambda text, calls: bool(llama3_objects(text)[1].strip()),
    ),
    Difference(
        "arguments_not_a_json_object",
        "vLLM passes a call's parameters through as written, a JSON string; titoflow's calls "
        "carry the object the template renders back",
        lambda text, calls: any(not json_object(arguments) for _, arguments in calls),
    ),
    Difference(
        "unknown_call_keys",
        "vLLM ignores keys besides name and parameters (or arguments); titoflow refuses them, "
        "the template not writing them back",
        lambda text, calls: any(not call_keys(v) for v in llama3_objects(text)[0]),
    ),
    Difference(
        "call_without_parameters",
        "a call object with neither parameters nor arguments: vLLM fails on the missing key and "
        "drops every call of the output; titoflow reads it as a call taking no arguments, as "
        "models call a tool that takes none",
        lambda text, calls: (
            not calls
            and any(
                isinstance(v, dict) and "name" in v and not {"parameters", "arguments"} & set(v)
                for v in llama3_objects(text)[0]
            )
        ),
        refusal=False,
    ),
)


FAMILY = Family(
    "llama3",
    "llama3_json",
    None,  # Llama 3 has no reasoning block
    LLAMA3_TOOLS,
    ('{"name"',),
    LLAMA3_DIFFERENCES,
    LLAMA3_VLLM + LLAMA3_MALFORMED,
    mutants(llama3_bases(), llama3_mutate, 80),
)

READS = {
    "python_tag_call": ["read_file"],
    "arguments_for_parameters": ["read_file"],
    "type_function_first": ["read_file"],
    "whitespace_around": ["read_file"],
    "calls_on_separate_lines": ["read_file", "get_weather"],
    "python_tag_calls_semicolon": ["read_file", "get_weather"],
    "vllm_parallel_separator_3": ["searchTool", "getOpenIncidentsTool"],
}
