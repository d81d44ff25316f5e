"""Mistral's cases for the parser parity test. Its tokenizer is the real tekken vocabulary
converted to a Hugging Face tokenizer (not vLLM's ``MistralTokenizer``): with no ``[ARGS]`` token in
it, vLLM's Mistral parser runs in its pre-v11 mode, ``[TOOL_CALLS]`` + a JSON list or object, which
is the v7 format (Small 3.1) titoflow parses; vLLM's v11 cases (``[TOOL_CALLS]NAME{...}``) are then
no call on either side."""

from __future__ import annotations

import json
import random
import re
from typing import Any

from tests.support.parity import (
    READ_FILE,
    Case,
    Difference,
    Family,
    Mutate,
    mutants,
    mutator,
    read_file_keys_swapped,
    tool,
)

MISTRAL_TOOLS = [
    # The functions vLLM's Mistral parser tests call.
    tool("add", {"a": {"type": "number"}, "b": {"type": "number"}}),
    tool("multiply", {"a": {"type": "number"}, "b": {"type": "number"}}),
    tool(
        "get_current_weather",
        {"city": {"type": "string"}, "state": {"type": "string"}, "unit": {"type": "string"}},
    ),
    tool("get_age", {"name": {"type": "string"}}),
    tool("bash", {"command": {"type": "string"}}),
    READ_FILE,
]

# vLLM tests/tool_parsers/test_mistral_tool_parser.py, commit
# ff583b3c92c19db2692a77174b104068526b6e07, model outputs verbatim: the pre-v11 cases
# (test_extract_tool_calls_pre_v11_tokenizer, test_extract_tool_calls_streaming_pre_v11_tokenizer)
# and, read by the pre-v11 mode our tokenizer puts vLLM in, v11 ones (test_extract_tool_calls).
SF = '{"city": "San Francisco", "state": "CA", "unit": "celsius"}'
MISTRAL_VLLM = [
    Case("vllm_no_tools", "This is a test"),
    Case("vllm_single_tool_add", '[TOOL_CALLS][{"name": "add", "arguments":{"a": 3.5, "b": 4}}]'),
    Case(
        "vllm_single_tool_weather",
        '[TOOL_CALLS] [{"name": "get_current_weather", "arguments":' + SF + "}]",
    ),
    Case(
        "vllm_argument_before_name",
        '[TOOL_CALLS] [{"arguments":' + SF + ', "name": "get_current_weather"}]',
    ),
    Case(
        "vllm_argument_before_name_and_name_in_argument",
        '[TOOL_CALLS] [{"arguments":{"name": "John Doe"}, "name": "get_age"}]',
    ),
    Case(
        "vllm_streaming_single_tool_add",
        '[TOOL_CALLS]  [ {"name":"add" , "arguments" : {"a": 3, "b": 4} } ]',
    ),
    Case(
        "vllm_streaming_single_tool_add_strings",
        '[TOOL_CALLS] [{"name": "add", "arguments":{"a": "3", "b": "4"}}]',
    ),
    Case(
        "vllm_streaming_multiple_tools",
        '[TOOL_CALLS] [{"name": "add", "arguments": {"a": 3.5, "b": 4}}, '
        '{"name": "get_current_weather", "arguments":' + SF + "}]",
    ),
    Case(
        "vllm_streaming_multiple_tools_arguments_first",
        '[TOOL_CALLS] [{"arguments": {"a": 3.5, "b": 4}, "name": "add"}, '
        '{"arguments":' + SF + ', "name": "get_current_weather"}]',
    ),
    Case("vllm_v11_single_tool_add", '[TOOL_CALLS]add_this_and_that{"a": 3.5, "b": 4}'),
    Case(
        "vllm_v11_multiple_tool_calls",
        '[TOOL_CALLS]add{"a": 3.5, "b": 4}[TOOL_CALLS]multiply{"a": 3, "b": 6}',
    ),
]

MISTRAL_READ = (
    '{"name": "read_file", "arguments": {"path": "src/a.py", "line": 3}, "id": "a1B2c3D4e"}'
)
MISTRAL_WEATHER = '{"name": "get_current_weather", "arguments": ' + SF + ', "id": "Zz9Yy8Xx7"}'

# What Mistral models (and Small 3.1's own template) commonly write.
MISTRAL_MALFORMED = [
    Case("space_before_list", f"[TOOL_CALLS] [{MISTRAL_READ}]"),
    Case("bare_call_object", f"[TOOL_CALLS]{MISTRAL_READ}"),
    Case("bare_call_object_after_space", f"Reading.[TOOL_CALLS] {MISTRAL_READ}\n"),
    Case("content_then_calls", f"Let me look.[TOOL_CALLS][{MISTRAL_READ}, {MISTRAL_WEATHER}]"),
    Case("no_id_no_arguments", '[TOOL_CALLS][{"name": "get_age"}]'),
    Case("call_cut_off", f"[TOOL_CALLS][{MISTRAL_READ[:40]}"),
    Case("text_after_the_list", f"[TOOL_CALLS][{MISTRAL_READ}] I will wait."),
    Case("second_marker_list", f"[TOOL_CALLS][{MISTRAL_READ}][TOOL_CALLS][{MISTRAL_WEATHER}]"),
    Case(
        "arguments_as_a_json_string",
        '[TOOL_CALLS][{"name": "get_age", "arguments": "{\\"name\\": \\"Ann\\"}"}]',
    ),
    Case(
        "openai_style_id", MISTRAL_READ.replace("a1B2c3D4e", "call_0").join(["[TOOL_CALLS][", "]"])
    ),
    Case("call_without_a_name", '[TOOL_CALLS][{"arguments": {"name": "Ann"}}]'),
    Case(
        "extra_key",
        MISTRAL_READ.replace('{"name"', '{"type": "function", "name"').join(["[TOOL_CALLS][", "]"]),
    ),
]


def mistral_bases() -> list[tuple[str, bool]]:
    return [
        (f"[TOOL_CALLS][{MISTRAL_READ}]", False),
        (f"Let me check.[TOOL_CALLS][{MISTRAL_READ}, {MISTRAL_WEATHER}]", False),
        (f"[TOOL_CALLS] [{MISTRAL_WEATHER}]", False),
    ]


def mistral_mutator(closers: list[str], spaced: str, own: Mutate) -> Mutate:
    """Both Mistral formats' mutations: the output cut after its first ``[TOOL_CALLS]``, one of
    ``closers`` dropped, whitespace after a match of ``spaced``, the ``read_file`` arguments'
    keys swapped, and the format's ``own``."""
    return mutator("[TOOL_CALLS]", closers, spaced, read_file_keys_swapped, own)


def text_after_the_calls(text: str, rng: random.Random) -> str:
    """Words after the calls, or another marker with nothing after it (both Mistral formats)."""
    return text + rng.choice([" Done.", "\n\nI'll wait.", "[TOOL_CALLS]"])


def bare_or_text_after(text: str, rng: random.Random) -> str:
    if rng.choice([True, False]):  # a lone call without its list
        return re.sub(r"\[TOOL_CALLS\](\s*)\[(\{[^\[\]]*\})\]", r"[TOOL_CALLS]\1\2", text)
    return text_after_the_calls(text, rng)


mistral_mutate = mistral_mutator(
    ["]", "}", '"', "[TOOL_CALLS]"], r"\[TOOL_CALLS\]|[\[{,:]", bare_or_text_after
)


def mistral_payload(text: str) -> list[Any]:
    """The call objects of the first JSON value after the first ``[TOOL_CALLS]`` (none if it is
    not JSON): what the declared differences look at."""
    body = text.partition("[TOOL_CALLS]")[2].lstrip()
    try:
        value = json.JSONDecoder().raw_decode(body)[0]
    except ValueError:
        return []
    return [c for c in (value if isinstance(value, list) else [value]) if isinstance(c, dict)]


def mistral_trailing(text: str) -> bool:
    """Text (another marker too) after the first JSON value behind ``[TOOL_CALLS]``."""
    body = text.partition("[TOOL_CALLS]")[2].lstrip()
    try:
        end = json.JSONDecoder().raw_decode(body)[1]
    except ValueError:
        return False
    return bool(body[end:].strip())


MISTRAL_DIFFERENCES = (
    Difference(
        "text_after_the_calls",
        "the calls run to the end of the output (mistral-common's format, the forced-call "
        "grammar): vLLM reads the first JSON value and drops what follows it, a second "
        "[TOOL_CALLS] list included; titoflow refuses rather than lose what the model wrote",
        lambda text, calls: mistral_trailing(text),
    ),
    Difference(
        "arguments_as_a_json_string",
        "vLLM passes string arguments through as written; titoflow's calls carry the object "
        "that the template renders back (a string would be re-rendered as a JSON string)",
        lambda text, calls: any(isinstance(c.get("arguments"), str) for c in mistral_payload(text)),
    ),
    Difference(
        "id_not_nine_alphanumerics",
        "the id is rendered back into history and the template rejects any but nine letters or "
        "digits; vLLM ignores the id written (it makes its own)",
        lambda text, calls: any(
            "id" in c and not re.fullmatch(r"[A-Za-z0-9]{9}", str(c["id"]))
            for c in mistral_payload(text)
        ),
    ),
    Difference(
        "call_without_a_name",
        "vLLM extracts a call with an empty name; titoflow refuses a call it cannot name",
        lambda text, calls: any(name == "" for name, _ in calls),
    ),
    Difference(
        "unknown_call_keys",
        "vLLM ignores keys besides name, arguments and id; titoflow refuses them, the template "
        "not writing them back",
        lambda text, calls: any(
            set(c) - {"name", "arguments", "id"} for c in mistral_payload(text)
        ),
    ),
)


FAMILY = Family(
    "mistral",
    "mistral",
    None,  # v7 (Small 3.1) has no reasoning block
    MISTRAL_TOOLS,
    ("[TOOL_CALLS]",),
    MISTRAL_DIFFERENCES,
    MISTRAL_VLLM + MISTRAL_MALFORMED,
    mutants(mistral_bases(), mistral_mutate, 80),
)

# The outputs these models commonly write that are calls, without error (the bugs of issue 37).
READS = {
    "space_before_list": ["read_file"],
    "bare_call_object": ["read_file"],
    "bare_call_object_after_space": ["read_file"],
}
