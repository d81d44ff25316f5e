"""Kimi K2's cases for the parser parity test. vLLM's Kimi parsers are given a stand-in
tokenizer (Qwen3's vocabulary with Kimi's markers added as special tokens, Kimi's own vocabulary
being in no package): they read the markers from it as single special tokens, as from Kimi's, so it
loads as is; token ids differ from Kimi's, which the text parsing compared here does not read.
vLLM's output goes through its Kimi reasoning parser first (reasoning enabled, its default), its
tool parser then reading the content, as vLLM serves it."""

from __future__ import annotations

import random
import re

from tests.support.parity import (
    GET_WEATHER,
    READ_ARGUMENTS,
    READ_FILE,
    Case,
    Difference,
    Family,
    json_object,
    mutants,
    mutator,
    read_file_keys_swapped,
)

S, E = "<|tool_calls_section_begin|>", "<|tool_calls_section_end|>"
B, A, C = "<|tool_call_begin|>", "<|tool_call_argument_begin|>", "<|tool_call_end|>"

KIMI_TOOLS = [
    GET_WEATHER,
    READ_FILE,
]

# vLLM tests/tool_parsers/test_kimi_k2_tool_parser.py, commit
# 42fa4c096d406754b7e5c6d93835fe390487c8af (test_extract_tool_calls*), model outputs verbatim.
KIMI_VLLM = [
    Case(
        "vllm_no_tools",
        "This is a test",
    ),
    Case(
        "vllm_tool_call_with_content_before",
        "I'll help you check the weather. <|tool_calls_section_begin|> <|tool_call_begin|>\n"
        'functions.get_weather:0 <|tool_call_argument_begin|> {"city": "Beijing"} '
        "<|tool_call_end|> <|tool_calls_section_end|>",
    ),
    Case(
        "vllm_multi_tool_call_with_content_before",
        "I'll help you check the weather. <|tool_calls_section_begin|> <|tool_call_begin|>\n"
        'functions.get_weather:0 <|tool_call_argument_begin|> {"city": "Beijing"} '
        "<|tool_call_end|> <|tool_call_begin|>\n"
        'functions.get_weather:1 <|tool_call_argument_begin|> {"city": "Shanghai"} '
        "<|tool_call_end|> <|tool_calls_section_end|>",
    ),
    Case(
        "vllm_concatenated_tool_calls_bug_fix",
        "I'll get the weather and news for LA today. First, let me get the weather using Los "
        "Angeles coordinates, and then get the latest news. <|tool_calls_section_begin|>"
        "<|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"latitude": 34.0522, "longitude": -118.2437}<|tool_call_end|>'
        "<|tool_call_begin|>functions.get_news:1<|tool_call_argument_begin|>"
        '{"content": "Los Angeles today"}<|tool_call_end|><|tool_calls_section_end|>',
    ),
    Case(
        "vllm_three_concatenated_tool_calls",
        "I'll help you with multiple tasks. <|tool_calls_section_begin|><|tool_call_begin|>"
        'functions.get_weather:0<|tool_call_argument_begin|>{"city": "New York"}'
        "<|tool_call_end|><|tool_call_begin|>functions.get_news:1<|tool_call_argument_begin|>"
        '{"topic": "technology"}<|tool_call_end|><|tool_call_begin|>functions.send_email:2'
        '<|tool_call_argument_begin|>{"to": "user@example.com", "subject": "Daily Update"}'
        "<|tool_call_end|><|tool_calls_section_end|>",
    ),
    Case(
        "vllm_mixed_spacing_tool_calls",
        "Mixed spacing test. <|tool_calls_section_begin|> <|tool_call_begin|> functions.test:0 "
        "<|tool_call_argument_begin|> {} <|tool_call_end|><|tool_call_begin|>functions.test2:1"
        "<|tool_call_argument_begin|>{}<|tool_call_end|> <|tool_calls_section_end|>",
    ),
    Case(
        "vllm_angle_brackets_in_json",
        "I need to process HTML content. <|tool_calls_section_begin|><|tool_call_begin|>"
        "functions.process_html:0<|tool_call_argument_begin|>"
        '{"html": "<div>content</div>", "text": "normal text"}<|tool_call_end|>'
        "<|tool_calls_section_end|>",
    ),
    Case(
        "vllm_newlines_in_json",
        "I need to process formatted JSON. <|tool_calls_section_begin|><|tool_call_begin|>"
        "functions.process_data:0<|tool_call_argument_begin|>{\n"
        '  "name": "test",\n  "value": 123,\n  "nested": {\n    "key": "value"\n  }\n}'
        "<|tool_call_end|><|tool_calls_section_end|>",
    ),
    Case(
        "vllm_invalid_json",
        "I'll help you check the weather. <|tool_calls_section_begin|> <|tool_call_begin|>\n"
        'functions.invalid_get_weather:0 <|tool_call_argument_begin|> {"city": "Beijing" '
        "<|tool_call_end|> <|tool_call_begin|>\n"
        'functions.valid_get_weather:1 <|tool_call_argument_begin|> {"city": "Shanghai"} '
        "<|tool_call_end|> <|tool_calls_section_end|>",
    ),
    Case(
        "vllm_invalid_funcall",
        "I'll help you check the weather. <|tool_calls_section_begin|> <|tool_call_begin|>\n"
        'functions.invalid_get_weather.0 <|tool_call_argument_begin|> {"city": "Beijing"} '
        "<|tool_call_end|> <|tool_call_begin|>\n"
        'functions.valid_get_weather:1 <|tool_call_argument_begin|> {"city": "Shanghai"} '
        "<|tool_call_end|> <|tool_calls_section_end|>",
    ),
    # test_tool_call_end_and_section_end_same_chunk (streamed there; its text here whole)
    Case(
        "vllm_id_without_functions_prefix",
        "Let me help. <|tool_calls_section_begin|><|tool_call_begin|>get_weather:0 "
        '<|tool_call_argument_begin|> {"city": "Paris"} <|tool_call_end|>'
        "<|tool_calls_section_end|> Done",
    ),
]


def kimi_call(name: str, index: int, arguments: str) -> str:
    return f"{B}functions.{name}:{index}{A}{arguments}{C}"


WEATHER = kimi_call("get_weather", 0, '{"city": "Tokyo"}')
READ = kimi_call("read_file", 1, READ_ARGUMENTS)

# What K2-Thinking and K2.5 commonly write around their calls.
KIMI_MALFORMED = [
    Case("section_before_think_close", f"<think>I should check.{S}{WEATHER}{E}"),
    Case("section_before_late_think_close", f"<think>Plan: {S}{WEATHER}{READ}{E}</think>"),
    Case("section_before_think_close_then_text", f"<think>Hm{S}{WEATHER}{E}\n</think>Done."),
    Case("k25_prompt_opened_think", f"Let me look.{S}{WEATHER}{E}", reasoning_open=True),
    Case("section_never_closed", f"<think>r</think>{S}{WEATHER}{READ}"),
    Case("section_never_closed_in_reasoning", f"<think>r{S}{WEATHER}"),
    Case("call_cut_off", f"<think>r</think>{S}{WEATHER}{B}functions.read_file:1{A}" + '{"pa'),
    Case("whitespace_between_markers", f"<think>r</think>\n{S}\n {WEATHER} \n{READ}\n{E}\n"),
    Case("arguments_not_an_object", f"{S}{kimi_call('get_weather', 0, '[1]')}{E}"),
    Case("call_outside_a_section", f"<think>r</think>{WEATHER}"),
]


def kimi_bases() -> list[tuple[str, bool]]:
    one = f"{S}{WEATHER}{E}"
    two = f"{S}{WEATHER}{READ}{E}"
    return [
        (f"<think>Let me check.</think>Checking.{one}", False),
        (f"<think>Two files.</think>{two}", False),
        (f"<think>Both.{two}", False),
        (f"Plan.</think>{one}", True),
        (f"Sure.{two}", False),
    ]


def late_think(text: str, rng: random.Random) -> str:
    """The reasoning closed after the section rather than before it."""
    if "</think>" in text:
        text = text.replace("</think>", "", 1)
        return text.replace(E, E + "</think>", 1)
    return text


kimi_mutate = mutator(
    S, [E, C, "</think>", S], r"\|>|\}", reorder=read_file_keys_swapped, other=late_think
)


def kimi_header_ids(text: str) -> list[str]:
    pattern = re.escape(B) + "(.*?)" + re.escape(A)
    return [m.group(1).strip() for m in re.finditer(pattern, text, re.DOTALL)]


def kimi_cut_in_a_call(text: str) -> bool:
    """The output ends inside a call: nothing closes the last one begun."""
    return text.rfind(B) > max(text.rfind(C), text.rfind(E))


KIMI_DIFFERENCES = (
    Difference(
        "cut_off_call",
        "the output ends inside a call (its id or arguments cut): vLLM extracts it anyway (a "
        "name like 'functions' or 'fun', arguments {} or cut JSON); titoflow keeps the whole "
        "calls before it and returns the cut one as text with parse_error",
        lambda text, calls: kimi_cut_in_a_call(text),
    ),
    Difference(
        "arguments_not_a_json_object",
        "vLLM passes a call's arguments through as written, invalid JSON (a cut-off call) or "
        "not an object; titoflow's calls carry a JSON object (what the template renders and "
        "clients parse), so it refuses the section",
        lambda text, calls: any(not json_object(arguments) for _, arguments in calls),
    ),
    Difference(
        "id_not_functions_name_idx",
        "the call id is rendered back into history verbatim and Kimi models write "
        "functions.NAME:IDX (the forced-call grammar too); vLLM takes NAME:IDX or drops a call "
        "whose id it cannot read (keeping the others); titoflow refuses the section",
        lambda text, calls: any(
            not re.fullmatch(r"functions\.[^\s<>]+:\d+", h) for h in kimi_header_ids(text)
        ),
    ),
)


FAMILY = Family(
    "kimi_k2",
    "kimi_k2",
    "kimi_k2",
    KIMI_TOOLS,
    (S, B),
    KIMI_DIFFERENCES,
    KIMI_VLLM + KIMI_MALFORMED,
    mutants(kimi_bases(), kimi_mutate, 80),
)

READS = {
    "section_before_think_close": ["get_weather"],
    "section_before_late_think_close": ["get_weather", "read_file"],
    "section_before_think_close_then_text": ["get_weather"],
    "k25_prompt_opened_think": ["get_weather"],
    "section_never_closed": ["get_weather", "read_file"],
    "section_never_closed_in_reasoning": ["get_weather"],
    "whitespace_between_markers": ["get_weather", "read_file"],
}
