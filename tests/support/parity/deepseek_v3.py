"""DeepSeek-V3.1's cases for the parser parity test. titoflow's ``deepseek_v3`` family writes
V3.1's calls (``NAME<｜tool▁sep｜>{JSON}`` in a ``<｜tool▁calls▁begin｜>`` section), which is
vLLM's ``deepseek_v31`` tool parser's format (its ``deepseek_v3`` one reads V3/R1's, a type and a
fenced JSON block); vLLM serves V3.1 with that tool parser and the ``deepseek_v3`` reasoning
parser, which without the request's ``thinking`` switch (so here) passes the output through as
content: V3.1 calls tools in non-thinking mode. The thinking-mode case ends its reasoning before
the section, so both readings of it agree.

The tokenizer is the real V3.1 vocabulary; vLLM's environment loads it as the Llama class its
config names (ids unlike the file's, tests/titoflow/tito/test_tokenizer_parity.py), which the
parsers do not read: they look up the markers, single added tokens either way."""

from __future__ import annotations

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
    read_file_keys_swapped,
    tool,
)

B, E = "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>"
CB, SEP, CE = "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>"

DEEPSEEK_TOOLS = [
    tool("foo", {"x": {"type": "integer"}}),  # the functions vLLM's V3.1 parser tests call
    tool("bar", {"y": {"type": "integer"}}),
    GET_WEATHER,
    READ_FILE,
]


def ds_call(name: str, arguments: str) -> str:
    return f"{CB}{name}{SEP}{arguments}{CE}"


# vLLM tests/tool_parsers/test_deepseekv31_tool_parser.py, commit
# 100fe7e0c14678963aafa5e53001099f761e0f26, model outputs verbatim.
DEEPSEEK_VLLM = [
    Case("vllm_with_tool", "normal text" + B + ds_call("foo", '{"x":1}') + E),
    Case(
        "vllm_with_multiple_tools",
        "some prefix text"
        + B
        + ds_call("foo", '{"x":1}')
        + ds_call("bar", '{"y":2}')
        + E
        + " some suffix text",
    ),
    Case("vllm_unparsable_block_cut_off", "Let me look that up." + B + "get_weather"),
    Case("vllm_unparsable_block_no_call_markers", B + "foo" + SEP + '{"x":1}' + E),
]

WEATHER = ds_call("get_weather", '{"city": "Paris"}')
READ = ds_call("read_file", READ_ARGUMENTS)

# What V3.1 (and V3.1-Terminus, V3.2-Exp) commonly write around their calls.
DEEPSEEK_MALFORMED = [
    Case("section_end_missing", f"Checking.{B}{WEATHER}{READ}"),
    Case("whitespace_between_markers", f"{B}\n{WEATHER}\n{READ}\n{E}\n"),
    Case("two_sections", f"{B}{WEATHER}{E}Then:{B}{READ}{E}"),
    Case("text_after_the_section", f"{B}{READ}{E} I will wait for the result."),
    Case("thinking_then_calls", f"Look it up.</think>Checking.{B}{WEATHER}{E}", True),
    Case("unicode_arguments", B + ds_call("get_weather", '{"city": "北京 🌧"}') + E),
    Case("pretty_printed_arguments", B + ds_call("get_weather", '{\n  "city": "Paris"\n}') + E),
    Case("call_cut_off", f"{B}{WEATHER}{READ[:30]}"),
    Case("name_padded", B + ds_call(" get_weather", '{"city": "Paris"}') + E),
    Case("arguments_not_an_object", B + ds_call("get_weather", "[1]") + E),
    Case("arguments_invalid_json", B + ds_call("get_weather", '{"city": "Paris"') + E),
    Case("call_end_missing", f"{B}{WEATHER.removesuffix(CE)}{READ}{E}"),
    Case("call_outside_a_section", f"Checking.{WEATHER}"),
]


def deepseek_bases() -> list[tuple[str, bool]]:
    return [
        (f"{B}{WEATHER}{E}", False),
        (f"Let me check both.{B}{WEATHER}{READ}{E}", False),
        (f"{B}{READ}{E}", False),
        (f"Look it up.</think>Checking.{B}{READ}{WEATHER}{E}", True),
    ]


deepseek_mutate = mutator(
    B,
    [E, CE, CB, SEP, B],
    r"｜>|\}",
    reorder=read_file_keys_swapped,
    other=lambda text, rng: text + rng.choice([" Done.", "\n\nI'll wait.", E]),  # text after
)


def ds_spans(text: str) -> list[str]:
    """The text of each call: from a call's begin marker to the next begin or end marker."""
    return [re.split(f"{CB}|{CE}", rest)[0] for rest in text.split(CB)[1:]]


def ds_cut_in_a_call(text: str) -> bool:
    """The output ends inside a call (nothing ends the last one begun) or inside a marker."""
    return text.rfind(CB) > text.rfind(CE) or re.search(r"<[^>]*$", text) is not None


def ds_markers_unpaired(text: str) -> bool:
    """A call in the section missing one of its markers."""
    section = text[text.find(B) :]
    return not section.count(CB) == section.count(SEP) == section.count(CE)


def ds_newline_dropped(text: str, calls: list[Call]) -> bool:
    """A call holding a newline, which vLLM's call pattern (no DOTALL) does not cross: vLLM
    extracts fewer calls than the section holds."""
    spans = ds_spans(text[text.find(B) :])
    return any("\n" in span for span in spans) and len(calls) < len(spans)


DEEPSEEK_DIFFERENCES = (
    Difference(
        "cut_off_call",
        "the output ends inside a call or a marker: vLLM extracts the whole calls before it; "
        "titoflow "
        "returns the section as text with parse_error (its calls are read together, when the "
        "section is whole)",
        lambda text, calls: ds_cut_in_a_call(text),
    ),
    Difference(
        "newline_in_a_call",
        "a call holding a newline (pretty-printed arguments, or one after a marker): vLLM's "
        "call pattern stops at a newline, so it drops the call, keeping the others; titoflow "
        "reads the JSON as written",
        ds_newline_dropped,
        refusal=False,
    ),
    Difference(
        "call_marker_missing",
        "a call missing its begin, separator or end marker: vLLM's pattern reads on to the next "
        "call's marker (a name or arguments holding the next call) or skips the call; titoflow "
        "refuses the section rather than guess where the call ends",
        lambda text, calls: ds_markers_unpaired(text),
    ),
    Difference(
        "name_padded",
        "whitespace around a call's name: vLLM keeps it in the name, which then names no tool; "
        "titoflow refuses the section",
        lambda text, calls: any(name != name.strip() for name, _ in calls),
    ),
    Difference(
        "arguments_not_a_json_object",
        "vLLM passes a call's arguments through as written, invalid JSON or not an object; "
        "titoflow's calls carry a JSON object (what clients parse), so it refuses the section",
        lambda text, calls: any(not json_object(arguments) for _, arguments in calls),
    ),
)


FAMILY = Family(
    "deepseek_v3",
    "deepseek_v31",
    "deepseek_v3",
    DEEPSEEK_TOOLS,
    (B, CB),
    DEEPSEEK_DIFFERENCES,
    DEEPSEEK_VLLM + DEEPSEEK_MALFORMED,
    mutants(deepseek_bases(), deepseek_mutate, 80),
)

READS = {
    "section_end_missing": ["get_weather", "read_file"],
    "whitespace_between_markers": ["get_weather", "read_file"],
    "two_sections": ["get_weather", "read_file"],
    "pretty_printed_arguments": ["get_weather"],
}
